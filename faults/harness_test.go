//go:build linux

package faults

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"math/big"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/minio/minio-go/v7"

	"github.com/pgworker/pgworker/internal/harness"
	"github.com/pgworker/pgworker/internal/miniotest"
)

// Timing of every worker: leases short enough that the scenarios do not
// take minutes, long enough for a loaded machine running -race binaries.
const (
	heartbeat    = time.Second
	leaseTimeout = 5 * time.Second
	// reapBound is the longest a dead worker's row may stay held: its lease
	// runs out at most leaseTimeout after the worker's last heartbeat, and
	// every live worker runs files.reap every 0.8 to 1.2 lease timeouts.
	reapBound = leaseTimeout + leaseTimeout*6/5
	// maxAttempts of the enqueued rows: lost and released attempts must not
	// exhaust it in any scenario.
	maxAttempts = 10
)

// rig is one scenario's world: a harness (its database, its bucket, the
// pgworker processes it runs), its inputs and the faults it injected.
type rig struct {
	*harness.Harness
	bucket string

	inputs map[string]input // by source

	mu       sync.Mutex
	nprocs   int
	trackers sync.WaitGroup
	faults   []*fault
	dead     map[string]bool // processes (node:pid:) with a slot ever seen dead

	stopWatch func()
}

// proc is a pgworker run process.
type proc = harness.Proc

type input struct {
	size int64
	sha  string
}

// rigConfig chooses what a rig runs against. The zero value: a fresh
// database on the shared test server and a bucket on the shared MinIO.
type rigConfig struct {
	// DatabaseURL is a migrated database (a private cluster's).
	DatabaseURL string
	// MinIO is a server of the scenario's own, to stop.
	MinIO *miniotest.Server
}

func newRig(t *testing.T, cfg *rigConfig) *rig {
	t.Helper()
	if cfg == nil {
		cfg = &rigConfig{}
	}
	if _, err := miniotest.Binary(); err != nil {
		t.Skip(err)
	}
	pgworker, _ := binaries(t)
	r := &rig{
		Harness: harness.New(t, pgworker, &harness.Config{DatabaseURL: cfg.DatabaseURL, MinIO: cfg.MinIO}),
		inputs:  map[string]input{},
	}
	r.bucket = strings.TrimPrefix(r.Bucket(), "s3://")
	// Registered after the database's and MinIO's cleanups: runs before them.
	t.Cleanup(r.cleanup)
	r.watchDead()
	return r
}

// watchDead notes, all through the scenario, every process with a slot in
// state dead: slots declared dead and revived by their next heartbeat leave
// no other trace.
func (r *rig) watchDead() {
	r.dead = map[string]bool{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	r.stopWatch = func() {
		cancel()
		<-done
	}
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
			rows, err := r.DB.Query(qctx, `SELECT DISTINCT split_part(worker_id, ':', 1) || ':' || split_part(worker_id, ':', 2) || ':'
				FROM files.workers WHERE state = 'dead'`)
			if err == nil {
				prefixes, err := pgx.CollectRows(rows, pgx.RowTo[string])
				if err == nil {
					r.mu.Lock()
					for _, p := range prefixes {
						r.dead[p] = true
					}
					r.mu.Unlock()
				}
			}
			qcancel()
			select {
			case <-ctx.Done():
			case <-time.After(harness.Poll):
			}
		}
	}()
}

// seenDead returns the processes of procs that had a slot declared dead.
func (r *rig) seenDead(procs ...*proc) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var names []string
	for _, p := range procs {
		if r.dead[p.Prefix] {
			names = append(names, p.Name)
		}
	}
	return names
}

// deadBesides fails the test if a slot of a process other than gone was
// ever declared dead: a live worker mistaken for a dead one.
func (r *rig) deadBesides(gone ...*proc) {
	r.T.Helper()
	var live []*proc
	for _, p := range r.Procs() {
		if !slices.Contains(gone, p) {
			live = append(live, p)
		}
	}
	if names := r.seenDead(live...); len(names) > 0 {
		r.T.Errorf("live workers had slots declared dead: %v", names)
	}
}

// putInputs uploads n input objects of 1 to 32 KiB of random bytes.
func (r *rig) putInputs(n int) {
	r.T.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range n {
		size, _ := rand.Int(rand.Reader, big.NewInt(31<<10))
		b := make([]byte, size.Int64()+1<<10)
		_, _ = rand.Read(b)
		name := fmt.Sprintf("obj-%03d.bin", i)
		if _, err := r.S3Client.PutObject(ctx, r.bucket, "in/"+name, bytes.NewReader(b), int64(len(b)), minio.PutObjectOptions{}); err != nil {
			r.T.Fatalf("upload input %s: %v", name, err)
		}
		r.inputs[name] = input{size: int64(len(b)), sha: harness.SHA256Hex(b)}
	}
}

// enqueue inserts n rows over the inputs, in one statement (one NOTIFY).
func (r *rig) enqueue(n int) {
	r.T.Helper()
	if len(r.inputs) == 0 {
		r.putInputs(32)
	}
	sources := make([]string, 0, len(r.inputs))
	for s := range r.inputs {
		sources = append(sources, s)
	}
	slices.Sort(sources)
	rows := make([]string, n)
	for i := range rows {
		rows[i] = sources[i%len(sources)]
	}
	r.exec(`INSERT INTO files.files (source, max_attempts) SELECT s, $2 FROM unnest($1::text[]) AS s`, rows, maxAttempts)
}

// exec runs a statement on the scenario's database, retrying while the
// database is away (some scenarios take it away).
func (r *rig) exec(sql string, args ...any) {
	r.T.Helper()
	err := r.retry(func(ctx context.Context) error {
		_, err := r.DB.Exec(ctx, sql, args...)
		return err
	})
	if err != nil {
		r.T.Fatalf("%s: %v", sql, err)
	}
}

// mustCount is Count for the test goroutine, retrying while the database is away.
func (r *rig) mustCount(sql string, args ...any) int {
	r.T.Helper()
	var n int
	err := r.retry(func(ctx context.Context) (err error) {
		n, err = r.Count(ctx, sql, args...)
		return err
	})
	if err != nil {
		r.T.Fatalf("%s: %v", sql, err)
	}
	return n
}

func (r *rig) retry(fn func(ctx context.Context) error) error {
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
		err := fn(ctx)
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(harness.Poll)
	}
}

// done is the number of rows done.
func (r *rig) done(ctx context.Context) (int, error) {
	return r.Count(ctx, `SELECT count(*) FROM files.files WHERE state = 'done'`)
}

// waitDone waits until at least n rows are done.
func (r *rig) waitDone(n int, timeout time.Duration) {
	r.T.Helper()
	r.WaitFor(timeout, fmt.Sprintf("%d rows done", n), func(ctx context.Context) (bool, error) {
		d, err := r.done(ctx)
		return d >= n, err
	})
}

// fault is one injected fault and how long the system took to recover.
type fault struct {
	name      string
	at        time.Time
	recovered time.Duration // 0 until recovered
	err       error
}

// track watches, in the background, for the recovery from a fault injected
// at at: cond holds once the system has recovered. verify waits for every
// tracker; one that does not recover within timeout fails the scenario.
func (r *rig) track(name string, at time.Time, timeout time.Duration, cond func(ctx context.Context) (bool, error)) *fault {
	f := &fault{name: name, at: at}
	r.mu.Lock()
	r.faults = append(r.faults, f)
	r.mu.Unlock()
	r.trackers.Add(1)
	go func() {
		defer r.trackers.Done()
		ok, err := r.Poll(at.Add(timeout), cond)
		r.mu.Lock()
		defer r.mu.Unlock()
		if ok {
			f.recovered = max(time.Since(at), time.Millisecond)
		} else {
			f.err = fmt.Errorf("%s: no recovery within %s (last error: %v)", name, timeout, err)
		}
	}()
	return f
}

// longest waits for the trackers and returns the longest recovery.
func (r *rig) longest() time.Duration {
	r.T.Helper()
	r.trackers.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	var d time.Duration
	for _, f := range r.faults {
		if f.err != nil {
			r.T.Error(f.err)
			continue
		}
		r.T.Logf("%s: recovered after %s", f.name, f.recovered.Round(time.Millisecond))
		d = max(d, f.recovered)
	}
	return d
}

// workerConfig is one pgworker run process.
type workerConfig struct {
	Slots       int    // defaults to 3
	DatabaseURL string // defaults to the rig's
	ListenURL   string
	WorkDir     string // defaults to a directory of its own
	Args        []string
	// Credential runs the process as another user.
	Credential *syscall.Credential
}

// startWorker starts a pgworker run process.
func (r *rig) startWorker(cfg workerConfig) *proc {
	r.T.Helper()
	_, backend := binaries(r.T)
	r.mu.Lock()
	r.nprocs++
	name := fmt.Sprintf("worker-%02d", r.nprocs)
	r.mu.Unlock()
	if cfg.Slots == 0 {
		cfg.Slots = 3
	}
	if cfg.DatabaseURL == "" {
		cfg.DatabaseURL = r.DatabaseURL
	}
	if cfg.WorkDir == "" {
		cfg.WorkDir = filepath.Join(r.Dir, name+"-work")
	}
	args := []string{"run",
		"--exec", backend + " {input} {output_dir}",
		"--slots", strconv.Itoa(cfg.Slots),
		"--heartbeat", heartbeat.String(),
		"--lease-timeout", leaseTimeout.String(),
		"--drain-timeout", "20s",
		"--kill-grace", "2s",
		"--timeout", "1m",
		"--input-store", "s3://" + r.bucket + "/in",
		"--output-store", "s3://" + r.bucket + "/out",
		"--work-dir", cfg.WorkDir,
	}
	if cfg.ListenURL != "" {
		args = append(args, "--listen-url", cfg.ListenURL)
	}
	args = append(args, cfg.Args...)
	p := r.Start(name, &harness.ProcConfig{
		Env:         []string{"PGWORKER_DATABASE_URL=" + cfg.DatabaseURL},
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Credential: cfg.Credential},
	}, args...)
	// Started means its slots are registered.
	r.WaitFor(time.Minute, name+" registered", func(ctx context.Context) (bool, error) {
		if !p.Running() {
			return false, fmt.Errorf("%s exited: %v\n%s", name, p.Err(), tail(p.Log, 20))
		}
		n, err := r.Count(ctx, `SELECT count(*) FROM files.workers WHERE starts_with(worker_id, $1) AND state = 'active'`, p.Prefix)
		return n == cfg.Slots, err
	})
	return p
}

// stop stops p as an operator would (SIGTERM: drain) and checks that it
// exits cleanly.
func (r *rig) stop(p *proc) {
	r.T.Helper()
	if !p.Running() {
		return
	}
	p.Signal(syscall.SIGTERM)
	select {
	case <-p.Done():
	case <-time.After(time.Minute):
		p.Kill()
		r.T.Errorf("%s did not stop within a minute of SIGTERM\n%s", p.Name, tail(p.Log, 30))
		return
	}
	if err := p.Err(); err != nil {
		r.T.Errorf("%s exited with %v after SIGTERM\n%s", p.Name, err, tail(p.Log, 30))
	}
}

// stopAll stops every live process.
func (r *rig) stopAll() {
	r.T.Helper()
	live := r.Live()
	var wg sync.WaitGroup
	for _, p := range live {
		p.Signal(syscall.SIGTERM)
		wg.Go(func() {
			select {
			case <-p.Done():
			case <-time.After(time.Minute):
			}
		})
	}
	wg.Wait()
	for _, p := range live {
		r.stop(p)
	}
}

// cleanup stops the watcher and waits for the trackers. The harness has
// killed the processes and checked their logs by then: their cleanups were
// registered later.
func (r *rig) cleanup() {
	r.stopWatch()
	r.trackers.Wait()
}

// held returns the rows that worker processes with these id prefixes hold.
func (r *rig) held(ctx context.Context, prefixes ...string) ([]int64, error) {
	var ids []int64
	rows, err := r.DB.Query(ctx, `SELECT id FROM files.files
		WHERE state = 'running' AND EXISTS (SELECT 1 FROM unnest($1::text[]) p WHERE starts_with(worker_id, p))
		ORDER BY id`, prefixes)
	if err != nil {
		return nil, err
	}
	ids, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	return ids, err
}

// allDone reports whether every row of ids is done.
func (r *rig) allDone(ids []int64) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		n, err := r.Count(ctx, `SELECT count(*) FROM files.files WHERE id = ANY ($1) AND state <> 'done'`, ids)
		return n == 0, err
	}
}

// progressAfter holds once a row has been completed after t, and every
// slot of the live processes has heartbeated after t.
func (r *rig) progressAfter(t time.Time) func(ctx context.Context) (bool, error) {
	return func(ctx context.Context) (bool, error) {
		var prefixes []string
		for _, p := range r.Live() {
			prefixes = append(prefixes, p.Prefix)
		}
		n, err := r.Count(ctx, `SELECT count(*) FROM files.files WHERE state = 'done' AND finished_at > $1`, t)
		if err != nil || n == 0 {
			return false, err
		}
		behind, err := r.Count(ctx, `SELECT count(*) FROM files.workers
			WHERE EXISTS (SELECT 1 FROM unnest($1::text[]) p WHERE starts_with(worker_id, p))
			  AND (last_heartbeat_at <= $2 OR state <> 'active')`, prefixes, t)
		return behind == 0, err
	}
}

// reapNow calls files.reap as a node that reaches the database first
// after an outage would, and returns how many rows it took back.
func (r *rig) reapNow() int {
	r.T.Helper()
	return r.mustCount(`SELECT files.reap()`)
}

// orphanNote says how many rows were claimed by a statement whose answer
// the fault lost, and were then released by the claimer's heartbeat.
func (r *rig) orphanNote() []string {
	r.T.Helper()
	n := r.mustCount(`SELECT count(*) FROM files.attempts WHERE outcome = 'released' AND error = 'not known to its worker'`)
	if n == 0 {
		return nil
	}
	return []string{fmt.Sprintf("%d claims whose answer the fault lost, released by the next heartbeats (\"not known to its worker\")", n)}
}

// listening counts the LISTEN connections of pgworker on the database: those
// that listen, and those quiet for the rest of a claim cooldown.
func (r *rig) listening(ctx context.Context) (int, error) {
	return r.Count(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'pgworker listener'
		  AND (query LIKE 'LISTEN%' OR query = 'UNLISTEN *')`)
}

// fleet is the i-th worker of a scenario's fleet: the first claims with a
// claim cooldown, so that its listener goes quiet between claims through
// the faults too, as in a fleet that trades pickup for fewer claims.
func fleet(i int) workerConfig {
	if i == 0 {
		return workerConfig{Args: []string{"--claim-cooldown", "100ms"}}
	}
	return workerConfig{}
}

// fleetNote says so in the report.
const fleetNote = "worker-01 with `--claim-cooldown 100ms` (its listener quiet between claims)"

// tail returns the last n lines of a file.
func tail(file string, n int) string {
	b, err := os.ReadFile(file)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// countLines counts the lines of a file that contain s.
func countLines(file, s string) int {
	f, err := os.Open(file)
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	n := 0
	for sc.Scan() {
		if strings.Contains(sc.Text(), s) {
			n++
		}
	}
	return n
}

// logFileIDs returns the file_id of each JSON log line of file that
// contains s.
func logFileIDs(file, s string) []int64 {
	f, err := os.Open(file)
	if err != nil {
		return nil
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var ids []int64
	for sc.Scan() {
		if !strings.Contains(sc.Text(), s) {
			continue
		}
		var line struct {
			FileID int64 `json:"file_id"`
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil {
			ids = append(ids, line.FileID)
		}
	}
	return ids
}

// logCount counts the lines containing s in the logs of procs.
func logCount(procs []*proc, s string) int {
	n := 0
	for _, p := range procs {
		n += countLines(p.Log, s)
	}
	return n
}

// outputPrefixes lists the attempt prefixes (id/attempt-token) that hold
// uploaded outputs.
func (r *rig) outputPrefixes(ctx context.Context) (map[string]bool, error) {
	out := map[string]bool{}
	for obj := range r.S3Client.ListObjects(ctx, r.bucket, minio.ListObjectsOptions{Prefix: "out/", Recursive: true}) {
		if obj.Err != nil {
			return nil, obj.Err
		}
		key := strings.TrimPrefix(obj.Key, "out/")
		out[path.Dir(key)] = true
	}
	return out, nil
}
