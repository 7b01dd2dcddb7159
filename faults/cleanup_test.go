//go:build linux

package faults

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestLockedOutputOnSmallDisk runs a worker as an ordinary user (nobody) on
// a 4 MiB work directory, with rows whose first attempt writes 600 KB,
// takes the permissions of its output directory away (chmod 000) and
// fails. Their directories are removed all the same, so the disk never
// fills: every row ends done, the healthy ones at their first attempt,
// and nothing is left in the work directory.
func TestLockedOutputOnSmallDisk(t *testing.T) {
	skipShort(t)
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root: to mount a small file system and run the worker as nobody")
	}
	const nobody = 65534
	rows := 45
	r := newRig(t, nil)
	r.putInputs(8)

	wd, err := os.MkdirTemp("", "pgworker-faults-small-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(wd) })
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o",
		fmt.Sprintf("size=4m,mode=0700,uid=%d,gid=%d", nobody, nobody), "tmpfs", wd).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", wd).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", wd, err, out)
		}
	})

	// The program, where nobody can read it.
	progDir, err := os.MkdirTemp("", "pgworker-faults-prog-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(progDir) })
	if err := os.Chmod(progDir, 0o755); err != nil {
		t.Fatal(err)
	}
	prog := filepath.Join(progDir, "lock-and-fail")
	script := `#!/bin/sh
# Every third row's first attempt leaves 600 KB behind locked directories.
in=$1 out=$2 id=$3 attempt=$4
if [ $((id % 3)) -eq 0 ] && [ "$attempt" -eq 1 ]; then
	mkdir "$out/locked" || exit 2
	head -c 300000 /dev/zero > "$out/junk"
	head -c 300000 /dev/zero > "$out/locked/junk"
	chmod 000 "$out/locked" "$out"
	exit 1
fi
cp "$in" "$out/" || exit 3
`
	if err := os.WriteFile(prog, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}

	w := r.startWorker(workerConfig{Slots: 2, WorkDir: wd,
		Credential: &syscall.Credential{Uid: nobody, Gid: nobody},
		Args:       []string{"--exec", prog + " {input} {output_dir} {id} {attempt}"}})
	r.enqueue(rows)
	r.WaitSettled(5 * time.Minute)
	r.stopAll()

	ctx := context.Background()
	if n := r.mustCount(`SELECT count(*) FROM files.files WHERE state <> 'done'`); n != 0 {
		var errs []string
		_ = r.strings(ctx, &errs, `SELECT DISTINCT last_error FROM files.files WHERE state <> 'done'`)
		t.Errorf("%d of %d rows did not end done: %q", n, rows, errs)
	}
	if n := r.mustCount(`SELECT count(*) FROM files.attempts WHERE file_id % 3 <> 0 AND outcome <> 'done'`); n != 0 {
		var errs []string
		_ = r.strings(ctx, &errs, `SELECT DISTINCT error FROM files.attempts WHERE file_id % 3 <> 0 AND outcome <> 'done'`)
		t.Errorf("healthy rows had %d attempts that did not end done: %q", n, errs)
	}
	if n := r.mustCount(`SELECT count(*) FROM files.attempts WHERE file_id % 3 = 0 AND outcome = 'failed'`); n != rows/3 {
		t.Errorf("%d failed attempts of the locking rows, want one each (%d)", n, rows/3)
	}
	left, err := os.ReadDir(wd)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	if len(names) > 0 {
		t.Errorf("left in the work directory: %s", strings.Join(names, " "))
	}
	if n := countLines(w.Log, `"msg":"remove work directory"`); n > 0 {
		t.Errorf("%d attempts' directories could not be removed:\n%s", n, lastLine(w.Log, `"msg":"remove work directory"`))
	}
}
