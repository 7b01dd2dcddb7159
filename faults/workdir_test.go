//go:build linux

package faults

import (
	"context"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestWorkDir takes the worker's work directory away mid-run, twice: first
// it becomes unwritable (mode 0500; the worker runs as nobody when the test
// runs as root, whom modes do not stop), then it is replaced by a regular
// file. The slots that meet the fault say so in the log and wait for the
// directory; rows that outlast the wait go back to the queue with a clear
// error; none is lost, and the slots work again once the directory is back.
func TestWorkDir(t *testing.T) {
	skipShort(t)
	t.Parallel()
	rows := 200
	if full() {
		rows = 600
	}
	r := newRig(t, nil)
	r.putInputs(32)

	// The directory and the worker's user: one whom mode 0500 stops.
	wd, err := os.MkdirTemp("", "pgworker-faults-work-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = os.Chmod(wd, 0o700)
		os.RemoveAll(wd)
		os.RemoveAll(wd + ".away")
	})
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		u, err := user.Lookup("nobody")
		if err != nil {
			t.Skipf("running as root needs a nobody user to run the worker as: %v", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(wd, uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	w := r.startWorker(workerConfig{Slots: 2, WorkDir: wd, Credential: cred})
	r.enqueue(rows)

	// How long each fault lasts once a slot has met it. Within the
	// pipeline's wait for the work directory (30s) the rows wait in place;
	// the full form's second fault outlasts it, so that rows go back.
	holds := []time.Duration{3 * time.Second, 3 * time.Second}
	if full() {
		holds[1] = 40 * time.Second
	}
	type fault struct {
		name, errText  string
		inject, repair func() error
	}
	faults := []fault{
		{"unwritable (chmod 0500)", "permission denied",
			func() error { return os.Chmod(wd, 0o500) },
			func() error { return os.Chmod(wd, 0o700) }},
		// One atomic exchange, so that no slot sees the moment in between,
		// when there would be nothing at the path at all.
		{"replaced by a regular file", "not a directory",
			func() error {
				if err := os.WriteFile(wd+".away", []byte("not a directory\n"), 0o644); err != nil {
					return err
				}
				return exchange(wd+".away", wd)
			},
			func() error {
				if err := exchange(wd+".away", wd); err != nil {
					return err
				}
				return os.Remove(wd + ".away")
			}},
	}
	const unusable = `"msg":"work directory unusable`
	var notes []string
	for i, f := range faults {
		r.waitDone((i+1)*rows/(len(faults)+1), 5*time.Minute)
		seen := countLines(w.Log, unusable)
		at := time.Now()
		if err := f.inject(); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		r.WaitFor(time.Minute, f.name+": a slot meets the fault", func(context.Context) (bool, error) {
			return countLines(w.Log, unusable) > seen, nil
		})
		time.Sleep(holds[i]) // the length of the fault, not a synchronisation
		repaired := time.Now()
		if err := f.repair(); err != nil {
			t.Fatalf("repair %s: %v", f.name, err)
		}
		var released, failed int
		if err := r.DB.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE outcome = 'released'),
				count(*) FILTER (WHERE outcome = 'failed')
			FROM files.attempts WHERE finished_at > $1 AND finished_at < $2`,
			at, repaired.Add(5*time.Second)).Scan(&released, &failed); err != nil {
			t.Fatal(err)
		}
		logged := lastLine(w.Log, unusable)
		if !strings.Contains(logged, f.errText) {
			t.Errorf("%s: the worker logged %s, want the cause (%s)", f.name, logged, f.errText)
		}
		// Every attempt that met the fault says so.
		var errs []string
		if err := r.strings(context.Background(), &errs, `SELECT error FROM files.attempts
			WHERE finished_at > $1 AND finished_at < $2 AND outcome IN ('released', 'failed') ORDER BY id`,
			at, repaired.Add(5*time.Second)); err != nil {
			t.Fatal(err)
		}
		sample := ""
		for _, e := range errs {
			if !strings.Contains(e, f.errText) || !strings.Contains(e, wd) {
				t.Errorf("%s: an attempt ended with %q, which names neither the cause (%s) nor the work directory", f.name, e, f.errText)
			}
			sample = e
		}
		t.Logf("%s for %s: %d attempts released, %d failed; log: %s; row error: %q", f.name,
			repaired.Sub(at).Round(time.Millisecond), released, failed, logged, sample)
		note := fmt.Sprintf("%s for %s: %d attempts released, %d failed", f.name, repaired.Sub(at).Round(100*time.Millisecond), released, failed)
		if sample != "" {
			note += fmt.Sprintf(" (%q)", clipText(strings.ReplaceAll(sample, wd, "WORK_DIR"), 80))
		}
		notes = append(notes, note)
		r.track(f.name, at, 2*time.Minute, func(ctx context.Context) (bool, error) {
			n, err := r.Count(ctx, `SELECT count(*) FROM files.attempts
				WHERE starts_with(worker_id, $1) AND outcome = 'done' AND finished_at > $2`, w.Prefix, repaired)
			return n > 0, err
		})
		r.trackers.Wait()
	}
	r.WaitSettled(5 * time.Minute)
	r.stopAll()
	r.deadBesides()
	r.record(7, "work directory unusable mid-run (one worker, 2 slots)",
		fmt.Sprintf("%d × work directory fault", len(faults)), notes...)
}

// exchange swaps what two paths name in one step (renameat2's
// RENAME_EXCHANGE).
func exchange(a, b string) error {
	if err := unix.Renameat2(unix.AT_FDCWD, a, unix.AT_FDCWD, b, unix.RENAME_EXCHANGE); err != nil {
		return &os.LinkError{Op: "exchange", Old: a, New: b, Err: err}
	}
	return nil
}

// lastLine returns the last line of a file that contains s.
func lastLine(file, s string) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(string(b), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], s) {
			return lines[i]
		}
	}
	return ""
}

func clipText(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
