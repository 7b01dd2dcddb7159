package e2e

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/internal/harness"
)

// The exit statuses of pgworker wait that scripts rely on (pgworker wait
// --help).
const (
	waitAllDone    = 0
	waitSomeFailed = 3
)

// TestDataSetChain pushes a data set of 1,000 objects through three stages
// chained with --then (input bucket → B1 → B2 → B3), two pgworker run
// processes per stage. While it runs, the enqueue of stage 1 is killed with
// one chunk in the database and the next one on its way, and then run
// again; and the stage-2 worker that holds a given row is killed with -9.
// pgworker wait exits 0, every object has exactly one row per stage with
// exactly one done attempt, and pgworker results lists every row with
// outputs whose sha256 matches the objects in MinIO.
func TestDataSetChain(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, b1, b2, b3 := s.Bucket(), s.Bucket(), s.Bucket(), s.Bucket()
	const objects, chunk = 1000, 100
	keys := make([]string, objects)
	inputs := make(map[string][]byte, objects)
	for i := range keys {
		keys[i] = fmt.Sprintf("obj-%04d", i)
		inputs[keys[i]] = fmt.Appendf(nil, "object %d\n", i)
	}
	if errs := parallel(objects, 8, func(i int) error { return s.TryPut(in, keys[i], inputs[keys[i]]) }); len(errs) > 0 {
		t.Fatal(errs[0])
	}

	// Stage 2 copies too, except that the first attempt at the object in
	// the middle of the listing (queued by the second enqueue) stops and
	// says which slot holds it: the test kills that slot's process.
	gateObj := keys[objects/2]
	held, gate := filepath.Join(s.Dir, "held"), filepath.Join(s.Dir, "gate")
	if err := syscall.Mkfifo(gate, 0o600); err != nil {
		t.Fatal(err)
	}
	stage2 := s.script("stage2", `case "$PGWORKER_SOURCE" in
*/`+gateObj+`)
	if mkdir `+shq(held)+` 2>/dev/null; then
		echo $$ > `+shq(held+"/pid")+`
		echo "$PGWORKER_WORKER_ID" > `+shq(held+"/worker")+`
		read line < `+shq(gate)+`
		exit 1
	fi
	;;
esac
exec cp -- "$1" "$2"
`)
	stores := map[string]string{"stage1": b1, "stage2": b2, "stage3": b3}
	stages := []struct{ queue, exec, input, then string }{
		{"stage1", "cp -- {input} {output_dir}", in, "stage2"},
		{"stage2", stage2 + " {input} {output_dir}", b1, "stage3"},
		{"stage3", "cp -- {input} {output_dir}", b2, ""},
	}
	const slots = 3
	workers := map[string][]*proc{}
	for _, st := range stages {
		args := []string{"--queue", st.queue, "--exec", st.exec, "--slots", fmt.Sprint(slots),
			"--input-store", st.input, "--output-store", stores[st.queue],
			"--heartbeat", "250ms", "--lease-timeout", "3s"}
		if st.then != "" {
			args = append(args, "--then", st.then)
		}
		for range 2 {
			workers[st.queue] = append(workers[st.queue], s.start(args...))
		}
	}
	for _, st := range stages {
		for _, p := range workers[st.queue] {
			s.waitSlots(time.Minute, p.Pid(), slots, "active")
		}
	}

	// The enqueue is held at its chunks by a lock on files.batches, whose
	// row each chunk updates: the test lets exactly one chunk commit, and
	// kills the enqueue while its second chunk waits.
	enqueue := []string{"enqueue", "--queue", "stage1", "--batch", "chain", "--chunk-size", fmt.Sprint(chunk), "--from", in + "/"}
	first := s.lockBatches()
	start := time.Now()
	killed := s.Start("enqueue-1", nil, enqueue...)
	s.waitChunkBlocked("the first chunk")
	second := s.lockBatches()
	first.unlock()
	second.granted()
	orphan := s.waitChunkBlocked("the second chunk")
	if n := s.MustCount(`SELECT count(*) FROM files.files WHERE queue = 'stage1'`); n != chunk {
		t.Fatalf("%d rows of stage1 with the second chunk still open, want the first chunk's %d", n, chunk)
	}
	killed.Kill()
	second.unlock()
	s.WaitFor(time.Minute, "the killed enqueue's session to end", func(ctx context.Context) (bool, error) {
		n, err := s.Count(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, orphan)
		return n == 0, err
	})
	if n := s.MustCount(`SELECT count(*) FROM files.files WHERE queue = 'stage1'`); n != chunk {
		t.Fatalf("%d rows of stage1 after the enqueue was killed, want the first chunk's %d", n, chunk)
	}
	res := s.Pgworker(nil, enqueue...)
	want := fmt.Sprintf("queued %d, already there %d ", objects-chunk, chunk)
	if res.Code != 0 || !strings.HasPrefix(res.Stdout, want) {
		t.Fatalf("enqueue again: exit %d, stdout %q (want %q...), stderr %q", res.Code, res.Stdout, want, res.Stderr)
	}
	t.Logf("enqueue again: %s", strings.TrimSpace(res.Stdout))

	// A scheduler waits for the data set while the rest happens.
	waiter := s.Start("wait", nil, "wait", "--batch", "chain", "--interval", "5s")

	var holder string
	var gated int64
	s.WaitFor(3*time.Minute, "a stage-2 slot to hold the row of "+gateObj, func(ctx context.Context) (bool, error) {
		b, err := os.ReadFile(filepath.Join(held, "worker"))
		if err != nil || !bytes.HasSuffix(b, []byte("\n")) {
			return false, nil
		}
		holder = strings.TrimSpace(string(b))
		err = s.DB.QueryRow(ctx, `SELECT id FROM files.files WHERE queue = 'stage2' AND state = 'running'
			AND worker_id = $1 AND source LIKE $2`, holder, "%/"+gateObj).Scan(&gated)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	})
	var victim *proc
	for _, p := range workers["stage2"] {
		if strings.HasPrefix(holder, p.Prefix) {
			victim = p
		}
	}
	if victim == nil {
		t.Fatalf("slot %s is of no stage-2 process", holder)
	}
	ended := s.MustCount(`SELECT count(*) FROM files.files WHERE state = 'done'`)
	victim.Kill()
	lostRows := s.heldBy(victim.Pid())
	t.Logf("killed %s (pid %d) holding rows %v, with %d of %d rows done", victim.Name, victim.Pid(), lostRows, ended, 3*objects)
	// Its program dies with it (or, if it outlived it, is let go).
	pidText, err := os.ReadFile(filepath.Join(held, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	program := pids(string(pidText))
	s.waitFor(time.Minute, "the held program to end or be let go", func() bool {
		return len(program) != 1 || !alive(program[0]) || writeFIFO(gate)
	})

	if code := waiter.Wait(8 * time.Minute); code != waitAllDone {
		t.Fatalf("pgworker wait exited %d, want %d:\n%s", code, waitAllDone, waiter.LogTail(4000))
	}
	t.Logf("the data set ended %s after the first enqueue started", time.Since(start).Round(time.Millisecond))
	// The last row's end marked the batch finished in its own transaction,
	// also if other rows ended beside it: no reap was waited for.
	if n := s.MustCount(`SELECT count(*) FROM files.batches WHERE batch = 'chain' AND finished_at IS NOT NULL`); n != 1 {
		t.Errorf("batch chain has no finished_at once pgworker wait saw every row end")
	}
	wantEnd := fmt.Sprintf("batch chain ended: %d done, 0 failed, 0 cancelled of %d", 3*objects, 3*objects)
	if !strings.Contains(waiter.LogText(), wantEnd) {
		t.Errorf("pgworker wait said:\n%s\nwant %q", waiter.LogTail(4000), wantEnd)
	}
	// And once more, after the end: everything is there already.
	res = s.Pgworker(nil, enqueue...)
	if want := fmt.Sprintf("queued 0, already there %d ", objects); res.Code != 0 || !strings.HasPrefix(res.Stdout, want) {
		t.Errorf("enqueue after the end: exit %d, stdout %q (want %q...), stderr %q", res.Code, res.Stdout, want, res.Stderr)
	}

	// Exactly one row per object and stage, all done, in the batch.
	type queueCount struct {
		Queue           string
		Rows, Sources   int
		NotDone, Others int
	}
	counts := harness.Query(s.Harness, pgx.RowToStructByPos[queueCount], `SELECT queue, count(*)::int, count(DISTINCT source)::int,
		count(*) FILTER (WHERE state <> 'done')::int, count(*) FILTER (WHERE batch IS DISTINCT FROM 'chain')::int
		FROM files.files GROUP BY queue ORDER BY queue`)
	if len(counts) != 3 {
		t.Fatalf("rows per queue: %+v, want stage1, stage2 and stage3", counts)
	}
	for i, c := range counts {
		if c.Queue != stages[i].queue || c.Rows != objects || c.Sources != objects || c.NotDone != 0 || c.Others != 0 {
			t.Errorf("queue %s: %d rows, %d sources, %d not done, %d outside the batch; want %d rows and sources, all done in batch chain",
				c.Queue, c.Rows, c.Sources, c.NotDone, c.Others, objects)
		}
	}
	s.checkOneDoneAttempt()

	// The killed slot's rows were lost, and finished elsewhere.
	if n := s.MustCount(`SELECT count(*) FROM files.workers WHERE pid = $1 AND state <> 'dead'`, victim.Pid()); n != 0 {
		t.Errorf("%d slots of the killed process are not dead", n)
	}
	as := s.attempts(gated)
	if len(as) < 2 || !slices.ContainsFunc(as, func(a attempt) bool { return a.Outcome == "lost" && a.WorkerID == holder }) ||
		as[len(as)-1].Outcome != "done" || strings.HasPrefix(as[len(as)-1].WorkerID, victim.Prefix) {
		t.Errorf("row %d (held when its worker was killed): attempts %v by %v; want one lost by %s, then done by another process",
			gated, outcomes(as), workerIDs(as), holder)
	}
	// Its other rows were lost too, unless the completion it had sent was
	// still on its way to the database when it died.
	for _, id := range lostRows {
		as := s.attempts(id)
		if !slices.ContainsFunc(as, func(a attempt) bool {
			return strings.HasPrefix(a.WorkerID, victim.Prefix) && (a.Outcome == "lost" || a.Outcome == "done")
		}) {
			t.Errorf("row %d, held by the killed process: attempts %v by %v, none lost or done by it", id, outcomes(as), workerIDs(as))
		}
	}

	// Each object went through the three stages: the source of its row of
	// a stage is the key of the output of its row of the stage before.
	rows := map[string]map[string]row{}
	for _, r := range s.rows() {
		if rows[r.Queue] == nil {
			rows[r.Queue] = map[string]row{}
		}
		rows[r.Queue][r.Source] = r
	}
	for _, k := range keys {
		source := in + "/" + k
		for _, st := range stages {
			r, ok := rows[st.queue][source]
			if !ok {
				t.Errorf("%s: no row of %s with source %s", k, st.queue, source)
				break
			}
			m, err := r.manifest()
			if err != nil {
				t.Error(err)
				break
			}
			if len(m.Outputs) != 1 || path.Base(m.Outputs[0].Key) != k {
				t.Errorf("%s: row %d of %s has outputs %+v, want one named %s", k, r.ID, st.queue, m.Outputs, k)
				break
			}
			source = m.Outputs[0].Key
		}
	}

	// pgworker results lists every row with its outputs, whose checksums
	// are those of the objects in the stores.
	res = s.Pgworker(nil, "results", "--batch", "chain")
	if res.Code != 0 {
		t.Fatalf("results: exit %d, stderr %q", res.Code, res.Stderr)
	}
	lines := parseResults(t, res.Stdout)
	if len(lines) != 3*objects {
		t.Fatalf("results listed %d rows, want %d", len(lines), 3*objects)
	}
	seen := map[int64]bool{}
	for _, l := range lines {
		r, ok := rows[l.Queue][l.Source]
		if !ok || r.ID != l.ID || seen[l.ID] || l.State != "done" || l.Attempts < 1 || len(l.Outputs) != 1 {
			t.Fatalf("results line %+v: not one of the rows, or not done with one output", l)
		}
		seen[l.ID] = true
		if m, _ := r.manifest(); !slices.Equal(m.Outputs, l.Outputs) {
			t.Errorf("row %d: results lists outputs %+v, its manifest %+v", l.ID, l.Outputs, m.Outputs)
		}
	}
	errs := parallel(len(lines), 8, func(i int) error {
		l := lines[i]
		o := l.Outputs[0]
		obj := stores[l.Queue] + "/" + o.Key
		if o.URL != obj {
			return fmt.Errorf("row %d of %s: output URL %s, want %s in the stage's output store", l.ID, l.Queue, o.URL, obj)
		}
		b, err := s.get(obj)
		if err != nil {
			return fmt.Errorf("row %d: output %s: %w", l.ID, obj, err)
		}
		if sum := harness.SHA256Hex(b); sum != o.SHA256 || int64(len(b)) != o.Size {
			return fmt.Errorf("row %d: %s has %d bytes, sha256 %s; results says %d bytes, %s", l.ID, obj, len(b), sum, o.Size, o.SHA256)
		}
		if want := inputs[path.Base(o.Key)]; !bytes.Equal(b, want) {
			return fmt.Errorf("row %d: %s holds %q, want a copy of the input %q", l.ID, obj, b, want)
		}
		return nil
	})
	for i, err := range errs {
		if i == 10 {
			t.Errorf("... and %d more", len(errs)-10)
			break
		}
		t.Error(err)
	}
	res = s.Pgworker(nil, "results", "--batch", "chain", "--format", "csv")
	if recs, err := csv.NewReader(strings.NewReader(res.Stdout)).ReadAll(); res.Code != 0 || err != nil || len(recs) != 3*objects+1 {
		t.Errorf("results --format csv: exit %d, %d records (%v), want a header and %d rows", res.Code, len(recs), err, 3*objects)
	}
}

// TestDataSetChainFailure: in a two-stage chain, the first stage's program
// fails on one input, which has one attempt: the row ends failed and feeds
// nothing to the second stage, pgworker wait exits 3, and pgworker results
// --state failed lists the row with its error.
func TestDataSetChainFailure(t *testing.T) {
	t.Parallel()
	s := newStack(t)
	in, out := s.Bucket(), s.Bucket()
	const items = 20
	inputs := map[string][]byte{}
	for i := range items {
		k := fmt.Sprintf("item-%02d", i)
		inputs[k] = fmt.Appendf(nil, "item %d\n", i)
		s.Put(in, k, inputs[k])
	}
	bad := in + "/item-07"
	picky := s.script("picky", `if [ "$PGWORKER_SOURCE" = `+shq(bad)+` ]; then
	echo "picky: cannot digest $PGWORKER_SOURCE" >&2
	exit 3
fi
exec cp -- "$1" "$2"
`)
	// Both stages write to one store, so that one --download fetches all.
	s.start("--queue", "first", "--then", "second", "--exec", picky+" {input} {output_dir}", "--slots", "2",
		"--input-store", in, "--output-store", out)
	s.start("--queue", "second", "--exec", "cp -- {input} {output_dir}", "--slots", "2",
		"--input-store", out, "--output-store", out)

	res := s.Pgworker(nil, "enqueue", "--queue", "first", "--batch", "broken", "--max-attempts", "1", "--from", in)
	if want := fmt.Sprintf("queued %d, already there 0 ", items); res.Code != 0 || !strings.HasPrefix(res.Stdout, want) {
		t.Fatalf("enqueue: exit %d, stdout %q (want %q...), stderr %q", res.Code, res.Stdout, want, res.Stderr)
	}
	res = s.Pgworker(nil, "wait", "--batch", "broken", "--timeout", "90s")
	wantEnd := fmt.Sprintf("batch broken ended: %d done, 1 failed, 0 cancelled of %d", 2*items-2, 2*items-1)
	if res.Code != waitSomeFailed || !strings.Contains(res.Stdout, wantEnd) || !strings.Contains(res.Stderr, "1 failed") {
		t.Fatalf("wait: exit %d, stdout %q, stderr %q; want exit %d and %q", res.Code, res.Stdout, res.Stderr, waitSomeFailed, wantEnd)
	}

	if n := s.MustCount(`SELECT count(*) FROM files.files WHERE queue = 'second'`); n != items-1 {
		t.Errorf("%d rows in the second stage, want %d: one for each input but the failed one", n, items-1)
	}
	var failedID int64
	for _, r := range s.rows() {
		switch {
		case r.Source == bad:
			failedID = r.ID
			if as := s.attempts(r.ID); r.State != "failed" || r.Attempt != 1 || strings.Join(outcomes(as), ",") != "failed" {
				t.Errorf("row %d (%s): state %s, attempt %d, attempts %v; want failed after one failed attempt",
					r.ID, r.Source, r.State, r.Attempt, outcomes(as))
			}
		case r.State != "done":
			t.Errorf("row %d (%s, %s): %s, want done", r.ID, r.Queue, r.Source, r.State)
		}
	}
	s.checkOneDoneAttempt()

	res = s.Pgworker(nil, "results", "--batch", "broken", "--state", "failed")
	lines := parseResults(t, res.Stdout)
	if res.Code != 0 || len(lines) != 1 {
		t.Fatalf("results --state failed: exit %d, %d lines, stderr %q; want the failed row", res.Code, len(lines), res.Stderr)
	}
	l := lines[0]
	if l.ID != failedID || l.Queue != "first" || l.Source != bad || l.State != "failed" || l.Attempts != 1 || len(l.Outputs) != 0 ||
		l.LastError == nil || !strings.Contains(*l.LastError, "picky: cannot digest "+bad) || !strings.Contains(*l.LastError, "exit status 3") {
		t.Errorf("results --state failed: %+v (last_error %q); want row %d of first, failed after 1 attempt, no outputs, the program's error",
			l, deref(l.LastError), failedID)
	}
	res = s.Pgworker(nil, "results", "--batch", "broken", "--state", "failed", "--format", "csv")
	recs, err := csv.NewReader(strings.NewReader(res.Stdout)).ReadAll()
	if res.Code != 0 || err != nil || len(recs) != 2 || recs[1][2] != bad || recs[1][3] != "failed" || !strings.Contains(recs[1][6], "picky: cannot digest") {
		t.Errorf("results --state failed --format csv: exit %d, %q (%v); want a header and the failed row", res.Code, res.Stdout, err)
	}

	// Every row is listed, and --download fetches every output, checked.
	dir := filepath.Join(s.Dir, "download")
	res = s.Pgworker(nil, "results", "--batch", "broken", "--download", dir, "--output-store", out)
	lines = parseResults(t, res.Stdout)
	wantDownloaded := fmt.Sprintf("downloaded %d files", 2*items-2)
	if res.Code != 0 || len(lines) != 2*items-1 || !strings.Contains(res.Stderr, wantDownloaded) {
		t.Fatalf("results --download: exit %d, %d lines, stderr %q; want %d lines and %q", res.Code, len(lines), res.Stderr, 2*items-1, wantDownloaded)
	}
	for _, l := range lines {
		for _, o := range l.Outputs {
			b, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(o.Key)))
			if err != nil || harness.SHA256Hex(b) != o.SHA256 || !bytes.Equal(b, inputs[path.Base(o.Key)]) {
				t.Errorf("row %d: downloaded %s: %q (%v); want a copy of its input with sha256 %s", l.ID, o.Key, b, err, o.SHA256)
			}
		}
	}
}

// --- helpers ---

// resultLine is a line of pgworker results --format jsonl.
type resultLine struct {
	ID        int64    `json:"id"`
	Queue     string   `json:"queue"`
	Source    string   `json:"source"`
	State     string   `json:"state"`
	Attempts  int      `json:"attempts"`
	Outputs   []object `json:"outputs"`
	LastError *string  `json:"last_error"`
}

func parseResults(t *testing.T, out string) []resultLine {
	t.Helper()
	var lines []resultLine
	for _, text := range strings.Split(strings.TrimSuffix(out, "\n"), "\n") {
		if text == "" {
			continue
		}
		var l resultLine
		if err := json.Unmarshal([]byte(text), &l); err != nil {
			t.Fatalf("results line %q: %v", text, err)
		}
		lines = append(lines, l)
	}
	return lines
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func workerIDs(as []attempt) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.WorkerID
	}
	return out
}

// checkOneDoneAttempt checks that every done row has exactly one done
// attempt, whose result is the row's, that no row has more than one, and
// that no attempt failed unless its row did.
func (s *stack) checkOneDoneAttempt() {
	s.T.Helper()
	if n := s.MustCount(`SELECT count(*) FROM files.files f WHERE (SELECT count(*) FROM files.attempts a
		WHERE a.file_id = f.id AND a.outcome = 'done') <> (f.state = 'done')::int`); n != 0 {
		s.T.Errorf("%d rows do not have exactly one done attempt when done, none otherwise", n)
	}
	if n := s.MustCount(`SELECT count(*) FROM files.files f JOIN files.attempts a ON a.file_id = f.id AND a.outcome = 'done'
		WHERE f.result->>'worker_id' IS DISTINCT FROM a.worker_id OR (f.result->>'attempt')::int IS DISTINCT FROM a.attempt`); n != 0 {
		s.T.Errorf("%d rows have a result that is not their done attempt's", n)
	}
	if n := s.MustCount(`SELECT count(*) FROM files.attempts a JOIN files.files f ON f.id = a.file_id
		WHERE a.outcome = 'failed' AND f.state <> 'failed'`); n != 0 {
		s.T.Errorf("%d attempts failed at rows that did not", n)
	}
	type outcomeCount struct {
		Outcome string
		N       int
	}
	for _, c := range harness.Query(s.Harness, pgx.RowToStructByPos[outcomeCount],
		`SELECT outcome, count(*)::int FROM files.attempts GROUP BY outcome ORDER BY outcome`) {
		s.T.Logf("attempts %s: %d", c.Outcome, c.N)
	}
}

// batchLock holds LOCK TABLE files.batches IN EXCLUSIVE MODE in a
// transaction of its own connection. Every statement that adds rows to a
// batch updates its row there, so nothing joins a batch while it is held.
type batchLock struct {
	s    *stack
	conn *pgx.Conn
	pid  int
	done chan error
}

// lockBatches takes the lock, or queues for it behind those waiting.
func (s *stack) lockBatches() *batchLock {
	s.T.Helper()
	ctx, cancel := s.ctx()
	defer cancel()
	conn, err := pgx.Connect(ctx, s.DatabaseURL)
	if err != nil {
		s.T.Fatal(err)
	}
	s.T.Cleanup(func() { conn.Close(context.Background()) })
	l := &batchLock{s: s, conn: conn, done: make(chan error, 1)}
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&l.pid); err != nil {
		s.T.Fatal(err)
	}
	go func() {
		_, err := conn.Exec(context.Background(), `BEGIN; LOCK TABLE files.batches IN EXCLUSIVE MODE`)
		l.done <- err
	}()
	s.WaitFor(time.Minute, "LOCK TABLE files.batches to be granted or waiting", func(ctx context.Context) (bool, error) {
		n, err := s.Count(ctx, `SELECT count(*) FROM pg_locks WHERE pid = $1 AND relation = 'files.batches'::regclass
			AND mode = 'ExclusiveLock'`, l.pid)
		return n == 1, err
	})
	return l
}

// granted waits until the lock is held.
func (l *batchLock) granted() {
	l.s.T.Helper()
	select {
	case err := <-l.done:
		if err != nil {
			l.s.T.Fatalf("LOCK TABLE files.batches: %v", err)
		}
		l.done = nil
	case <-time.After(time.Minute):
		l.s.T.Fatal("LOCK TABLE files.batches was not granted within a minute")
	}
}

// unlock commits the lock's transaction.
func (l *batchLock) unlock() {
	l.s.T.Helper()
	if l.done != nil {
		l.granted()
	}
	ctx, cancel := l.s.ctx()
	defer cancel()
	if _, err := l.conn.Exec(ctx, `COMMIT`); err != nil {
		l.s.T.Fatal(err)
	}
}

// waitChunkBlocked waits until an enqueue's chunk waits for files.batches
// and returns the pid of its session.
func (s *stack) waitChunkBlocked(what string) int {
	s.T.Helper()
	var pid int
	s.WaitFor(time.Minute, what+" of the enqueue to wait for files.batches", func(ctx context.Context) (bool, error) {
		var err error
		pid, err = s.Count(ctx, `SELECT coalesce(min(a.pid), 0) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND l.relation = 'files.batches'::regclass AND NOT l.granted AND a.pid <> pg_backend_pid()
			  AND (a.query LIKE '%FROM pgworker_staged%' OR a.query ILIKE 'copy "files"."files"%')`)
		return pid != 0, err
	})
	return pid
}

// writeFIFO writes a line to the FIFO at p if a reader has it open.
func writeFIFO(p string) bool {
	// Without a reader, a non-blocking open for writing fails (ENXIO).
	f, err := os.OpenFile(p, os.O_WRONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return false
	}
	defer f.Close()
	_, err = f.WriteString("go\n")
	return err == nil
}
