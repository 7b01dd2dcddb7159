package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// putInputs writes n small inputs named prefix-NNN into store and returns
// their keys.
func (s *stack) putInputs(store, prefix string, n int) []string {
	s.T.Helper()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%03d", prefix, i)
		s.Put(store, keys[i], []byte(keys[i]+"\n"))
	}
	return keys
}

// briefBackend works a moment on each row, so that the rows of several
// slots overlap, and writes one output.
func (s *stack) briefBackend() string {
	s.T.Helper()
	return s.script("brief", `sleep 0.05
echo "$PGWORKER_SOURCE" > "$PGWORKER_OUTPUT_DIR/out.txt"
`)
}

// sampleRunning makes every claim and every outcome of a row of queue
// record, in the transaction that makes it, the queue's running rows and
// its claimable ones (in table samples).
func (s *stack) sampleRunning(queues ...string) {
	s.T.Helper()
	s.Exec(`CREATE TABLE public.samples (
		seq bigint GENERATED ALWAYS AS IDENTITY, queue text, became text, running bigint, claimable jsonb)`)
	s.Exec(`CREATE FUNCTION public.sample() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN
			INSERT INTO public.samples (queue, became, running, claimable)
			SELECT NEW.queue, NEW.state,
			       (SELECT count(*) FROM files.files WHERE state = 'running' AND queue = NEW.queue),
			       (SELECT coalesce(jsonb_object_agg(q.queue, (SELECT count(*) FROM files.files f
			                 WHERE f.state = 'pending' AND f.queue = q.queue AND f.run_after <= now())), '{}')
			        FROM files.queues q);
			RETURN NULL;
		END $$`)
	s.Exec(`CREATE TRIGGER sample AFTER UPDATE OF state ON files.files
		FOR EACH ROW WHEN (NEW.queue = ANY ($$` + "{" + strings.Join(queues, ",") + "}" + `$$::text[]))
		EXECUTE FUNCTION public.sample()`)
}

// checkDoneOnce fails the test unless every row is done with exactly one
// done attempt.
func (s *stack) checkDoneOnce(want int) {
	s.T.Helper()
	if n := s.MustCount(`SELECT count(*) FROM files.files WHERE state = 'done'`); n != want {
		s.T.Fatalf("%d rows done, want %d", n, want)
	}
	if n := s.MustCount(`SELECT count(*) FROM files.files f WHERE (SELECT count(*) FROM files.attempts a
		WHERE a.file_id = f.id AND a.outcome = 'done') <> 1`); n != 0 {
		s.T.Fatalf("%d rows do not have exactly one done attempt", n)
	}
}

// TestMaxRunningAcrossProcesses: three `pgworker run` processes of four
// slots each serve a queue capped at 3 by `pgworker queue set`. Every claim
// and completion records the queue's running rows inside its transaction:
// none exceeds 3, the first claims reach 3, and each row is done once. The
// processes whose claims found the queue full wait for a notification,
// which only the ends of rows send: the run finishing at all shows it.
func TestMaxRunningAcrossProcesses(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	keys := s.putInputs(in, "lic", 45)
	s.sampleRunning("licensed")
	if res := s.Pgworker(nil, "queue", "set", "--max-running", "3", "licensed"); res.Code != 0 ||
		!strings.Contains(res.Stdout, "at most 3 running rows") {
		t.Fatalf("queue set: exit %d, stdout %q, stderr %q", res.Code, res.Stdout, res.Stderr)
	}
	s.Enqueue([]string{"--queue", "licensed"}, keys...)
	backend := s.briefBackend()
	for range 3 {
		s.start("--exec", backend, "--slots", "4", "--queue", "licensed", "--input-store", in, "--output-store", out)
	}
	s.WaitSettled(3 * time.Minute)
	s.checkDoneOnce(len(keys))

	if n := s.MustCount(`SELECT count(*) FROM public.samples WHERE became = 'running'`); n != len(keys) {
		t.Fatalf("%d claims sampled, want %d", n, len(keys))
	}
	if most := s.MustCount(`SELECT max(running) FROM public.samples`); most != 3 {
		t.Fatalf("at most %d rows of the queue ran at once, want the cap, 3", most)
	}
	var st struct {
		Queues []struct {
			Queue      string `json:"queue"`
			MaxRunning *int   `json:"max_running"`
		} `json:"queues"`
	}
	res := s.Pgworker(nil, "status", "--json")
	if err := json.Unmarshal([]byte(res.Stdout), &st); err != nil || len(st.Queues) != 1 ||
		st.Queues[0].MaxRunning == nil || *st.Queues[0].MaxRunning != 3 {
		t.Errorf("status --json does not show the cap (%v):\n%s", err, res.Stdout)
	}
}

// TestPreferredQueueThenStealing: one process of three slots serves gpu and
// cpu with --prefer. It takes gpu's rows while any is claimable, although
// cpu's are older and of higher priority: at every claim of a cpu row,
// recorded in its transaction, gpu had no claimable row. One gpu row's
// program waits until cpu rows run: once gpu has nothing left to claim, the
// slots left over take cpu's rows ("stealing").
func TestPreferredQueueThenStealing(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	cpu, gpu := s.putInputs(in, "cpu", 12), s.putInputs(in, "gpu", 12)
	hold := filepath.Join(s.Dir, "hold")
	if err := syscall.Mkfifo(hold, 0o600); err != nil {
		t.Fatal(err)
	}
	backend := s.script("held", `if [ "$PGWORKER_SOURCE" = `+gpu[0]+` ]; then read line < `+shq(hold)+` || exit 3; fi
echo "$PGWORKER_SOURCE" > "$PGWORKER_OUTPUT_DIR/out.txt"
`)
	s.sampleRunning("gpu", "cpu")
	s.Enqueue([]string{"--queue", "cpu", "--priority", "5"}, cpu...)
	s.Enqueue([]string{"--queue", "gpu"}, gpu...)
	s.start("--exec", backend, "--slots", "3", "--queue", "gpu", "--queue", "cpu", "--prefer",
		"--input-store", in, "--output-store", out)
	s.waitFor(time.Minute, "cpu rows done while a gpu row runs", func() bool {
		return s.MustCount(`SELECT count(*) FROM files.files WHERE queue = 'cpu' AND state = 'done'`) >= 2
	})
	if n := s.MustCount(`SELECT count(*) FROM files.files WHERE queue = 'gpu' AND state <> 'done'`); n != 1 {
		t.Fatalf("%d gpu rows not done while cpu rows run, want 1 (the held one)", n)
	}
	f, err := os.OpenFile(hold, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString("go\n"); err != nil {
		t.Fatal(err)
	}
	f.Close()
	s.WaitSettled(3 * time.Minute)
	s.checkDoneOnce(len(cpu) + len(gpu))

	if n := s.MustCount(`SELECT count(*) FROM public.samples WHERE became = 'running' AND queue = 'cpu'
		AND (claimable->>'gpu')::int > 0`); n != 0 {
		t.Fatalf("%d rows of cpu were claimed while gpu had claimable rows", n)
	}
}

// TestFairShareLetsASmallBatchThrough: while a batch of 120 rows drains
// through two slots of a fair-share queue, a batch of 5 is enqueued. The
// batches share the slots, so the small one is done while most of the large
// one's rows still wait; in order of id it would wait for all of them. (Each
// batch gets about one slot, so about as many rows of the large batch end
// meanwhile as the small one has, but the rows' lengths vary with the
// machine's load: the test asks for less than a quarter.)
func TestFairShareLetsASmallBatchThrough(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.FileStore("in"), s.FileStore("out")
	big, small := s.putInputs(in, "big", 120), s.putInputs(in, "small", 5)
	if res := s.Pgworker(nil, "queue", "set", "--fair-share", "on", "scans"); res.Code != 0 {
		t.Fatalf("queue set: exit %d, stderr %q", res.Code, res.Stderr)
	}
	s.Enqueue([]string{"--queue", "scans", "--batch", "big"}, big...)
	s.start("--exec", s.briefBackend(), "--slots", "2", "--queue", "scans", "--input-store", in, "--output-store", out)
	s.waitFor(time.Minute, "10 rows of the large batch done", func() bool {
		return s.MustCount(`SELECT count(*) FROM files.files WHERE batch = 'big' AND state = 'done'`) >= 10
	})
	s.Enqueue([]string{"--queue", "scans", "--batch", "small"}, small...)
	s.WaitSettled(3 * time.Minute)
	s.checkDoneOnce(len(big) + len(small))

	// Rows of the large batch that ended between the small batch's enqueue
	// and its last row's end: what the slots did, timed by the rows' own ends.
	const smallRows = `(SELECT min(created_at) AS enqueued, max(finished_at) AS ended FROM files.files WHERE batch = 'small')`
	between := s.MustCount(`SELECT count(*) FROM files.files f, ` + smallRows + ` s
		WHERE f.batch = 'big' AND f.finished_at > s.enqueued AND f.finished_at <= s.ended`)
	left := s.MustCount(`SELECT count(*) FROM files.files f, ` + smallRows + ` s
		WHERE f.batch = 'big' AND f.finished_at > s.ended`)
	t.Logf("%d rows of the large batch ended while the small one ran, %d after it", between, left)
	if 4*between >= between+left {
		t.Fatalf("the small batch waited for %d of the %d rows the large one had left", between, between+left)
	}
}
