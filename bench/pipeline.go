package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgworker/pgworker/backend"
	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/pipeline"
	"github.com/pgworker/pgworker/worker"
)

// DefaultPipelineExec is PipelineConfig.Exec's default: the smallest backend
// that reads its input and writes an output, with no shell in between.
const DefaultPipelineExec = "cp {input} {output_dir}/out"

// The statements of the pipeline's bare queue: the round's rows in the table
// of SkipLocked, one row claimed at a time with FOR UPDATE SKIP LOCKED
// (committed asynchronously, as pgworker's claims are) and completed in a
// transaction of its own. The least any queue does around a row: it takes
// the row so that no one else runs it, and records that it is done.
const (
	sqlPipeBareLoad  = `INSERT INTO ` + skipSchema + `.files (queue, source) SELECT $1, unnest($2::text[])`
	sqlPipeBareClaim = `UPDATE ` + skipSchema + `.files f SET state = 'running', worker_id = $2, attempt = f.attempt + 1,
    claimed_at = now(), lease_expires_at = now() + interval '15 seconds'
WHERE f.id = (SELECT id FROM ` + skipSchema + `.files WHERE state = 'pending' AND queue = $1
    ORDER BY priority DESC, id LIMIT 1 FOR UPDATE SKIP LOCKED)
    AND set_config('synchronous_commit', 'off', true) IS NOT NULL
RETURNING f.id, f.source`
)

// PipelineConfig sizes a Pipeline run and names its stores. Input and
// Output are required.
type PipelineConfig struct {
	// Rows, one input object each. Defaults to 2,000.
	Rows int
	// Slots of the worker, and goroutines of the loop without a queue.
	// Defaults to 8.
	Slots int
	// ObjectSize is the size of each input object in bytes. Defaults to
	// 4096.
	ObjectSize int
	// Rounds splits the rows: each round runs its share three ways, the
	// order turning from round to round (direct, queued, bare; queued,
	// bare, direct; ...), so that a load on the machine that drifts during
	// the run weighs on all alike. Defaults to 4.
	Rounds int
	// Exec is the backend command line. Defaults to DefaultPipelineExec.
	Exec string
	// Input receives the benchmark's input objects (under a prefix of the
	// run's own, deleted at the end); Output the backend's outputs (deleted
	// too). The caller opens and closes them.
	Input, Output blob.Store
}

// PipelineResult is what Pipeline measured.
type PipelineResult struct {
	Setup
	Rows        int    `json:"rows"`
	Slots       int    `json:"slots"`
	ObjectBytes int    `json:"object_bytes"`
	Rounds      int    `json:"rounds"`
	Exec        string `json:"exec"`
	InputStore  string `json:"input_store"`
	OutputStore string `json:"output_store"`
	// Queued is the pipeline run by the worker runtime on queued rows: from
	// resuming the queue to the last outcome recorded, summed over the
	// rounds. Direct is the same pipeline.Handler called in a loop on
	// synthetic jobs by as many goroutines as slots, with no database at all.
	// Bare is the handler called by as many goroutines as slots, each on a
	// connection of its own claiming one row at a time from a bare table and
	// completing it (sqlPipeBareClaim): no queue software, but the claim and
	// the completion any queue makes.
	Queued Rate `json:"queued"`
	Direct Rate `json:"direct"`
	Bare   Rate `json:"bare"`
	// OverheadRatio is Direct's rate over Queued's; OverheadPct is the time
	// the queue adds, in percent of Direct's: (ratio - 1) × 100.
	// BareOverheadPct is the same for Bare.
	OverheadRatio   float64 `json:"overhead_ratio"`
	OverheadPct     float64 `json:"overhead_pct"`
	BareOverheadPct float64 `json:"bare_overhead_pct"`
	// RoundMS are each round's times, in the order of the rounds.
	RoundMS PipelineRounds `json:"round_ms"`
	// CPU is each way's CPU time a row, by process, and the machine's.
	CPU PipelineCPUs `json:"cpu_ms_per_row"`
}

// PipelineCPUs are the CPU times a row of a Pipeline run's three ways.
type PipelineCPUs struct {
	Direct PipelineCPU `json:"direct"`
	Queued PipelineCPU `json:"queued"`
	Bare   PipelineCPU `json:"bare"`
}

// PipelineCPU is the CPU time of one way of a Pipeline run, in milliseconds
// a row, summed over the timed parts of its rounds (the rows' load and the
// checks after are left out). Where the handlers, the object store and the
// database share the machine's cores, what one way adds to the CPU a row is
// time its handlers wait for. The worker's slots wait on the paused queue
// in the other ways, and what that costs counts in theirs.
type PipelineCPU struct {
	// Server is the PostgreSQL server's processes; missing when the server
	// is not on this machine or could not be read in every round.
	Server *float64 `json:"server,omitempty"`
	// Process is the benchmark's own process: the handlers' downloads and
	// uploads, and in the queued way the worker runtime beside them.
	Process float64 `json:"process"`
	// Program is the backend program's processes that ended and were
	// waited for (a process a program leaves behind is not counted).
	Program float64 `json:"program"`
	// Machine is all of the machine's CPUs busy (user, system and
	// interrupts; not the time a hypervisor gave to others), whatever ran on
	// them, the object store and the kernel's threads included; Idle is
	// their time idle. Both are missing where /proc/stat could not be read
	// in every round.
	Machine *float64 `json:"machine,omitempty"`
	Idle    *float64 `json:"idle,omitempty"`
}

// PipelineRounds are the times of a Pipeline run's rounds, three ways.
type PipelineRounds struct {
	Direct []float64 `json:"direct"`
	Queued []float64 `json:"queued"`
	Bare   []float64 `json:"bare"`
}

// Rate is the time of a burn-down and its rows per second.
type Rate struct {
	ElapsedMS  float64 `json:"elapsed_ms"`
	RowsPerSec float64 `json:"rows_per_sec"`
}

// Pipeline uploads cfg.Rows objects of cfg.ObjectSize bytes to cfg.Input
// (not timed) and runs the download-exec-upload pipeline on them three times
// with cfg.Slots at once: as a plain loop that calls pipeline.Handler on
// synthetic jobs, through the queue and the worker runtime, and through the
// bare queue of sqlPipeBareClaim, in cfg.Rounds rounds that take turns. A
// warm-up loop on a few objects comes first.
func (b *Bench) Pipeline(ctx context.Context, cfg *PipelineConfig) (*PipelineResult, error) {
	if cfg == nil || cfg.Input == nil || cfg.Output == nil {
		return nil, errors.New("bench: PipelineConfig.Input and Output are required")
	}
	c := pipelineDefaults(cfg)
	runner, err := backend.New(&backend.Config{Command: c.Exec, Logger: b.logger})
	if err != nil {
		return nil, fmt.Errorf("bench: backend: %w", err)
	}
	res := &PipelineResult{
		Rows: c.Rows, Slots: c.Slots, ObjectBytes: c.ObjectSize, Rounds: c.Rounds, Exec: c.Exec,
		InputStore: c.Input.Location().String(), OutputStore: c.Output.Location().String(),
	}
	err = b.run(ctx, "pipeline", func(ctx context.Context) (err error) {
		res.Setup = b.setup("pipeline")
		workDir, err := os.MkdirTemp("", "pgworker-bench-")
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		defer os.RemoveAll(workDir)
		ph, err := pipeline.New(&pipeline.Config{
			Resolver: blob.NewResolver(c.Input), Output: c.Output, Runner: runner, WorkDir: workDir, Logger: b.logger,
		})
		if err != nil {
			return fmt.Errorf("bench: %w", err)
		}
		h := &keepOutputs{h: ph}
		keys := inputKeys(c.Rows)
		defer b.deleteObjects(ctx, c, keys, h)
		if err := b.prepareInputs(ctx, c, h, keys); err != nil {
			return err
		}
		drop, err := b.bareTable(ctx, false)
		defer func() { err = errors.Join(err, drop()) }()
		if err != nil {
			return err
		}
		conns, err := b.clients(ctx, c.Slots)
		defer closeAll(ctx, conns)
		if err != nil {
			return err
		}
		outcomes, stop, err := b.startPipelineWorker(ctx, c, h)
		if err != nil {
			return err
		}
		defer stop()
		cpu := &pipelineCPU{}
		cpu.server, _ = b.localServer(ctx)
		if cpu.server == nil {
			cpu.direct.serverLost, cpu.queued.serverLost, cpu.bare.serverLost = true, true, true
		}
		if err := b.pipelineRounds(ctx, c, h, outcomes, conns, keys, &res.RoundMS, cpu); err != nil {
			return err
		}
		if err := b.outcomes(ctx, c.Rows); err != nil {
			return err
		}
		res.compare()
		res.CPU = PipelineCPUs{Direct: cpu.direct.perRow(c.Rows), Queued: cpu.queued.perRow(c.Rows), Bare: cpu.bare.perRow(c.Rows)}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

func pipelineDefaults(cfg *PipelineConfig) PipelineConfig {
	c := *cfg
	c.Rows = orDefault(c.Rows, 2000)
	c.Slots = orDefault(c.Slots, 8)
	c.ObjectSize = orDefault(c.ObjectSize, 4096)
	c.Rounds = min(orDefault(c.Rounds, 4), c.Rows)
	if c.Exec == "" {
		c.Exec = DefaultPipelineExec
	}
	return c
}

// inputKeys names n input objects under a prefix of the run's own.
func inputKeys(n int) []string {
	prefix := "pgworker-bench-" + randomHex(4) + "/"
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + fmt.Sprintf("%07d.bin", i)
	}
	return keys
}

// prepareInputs uploads the input objects and warms up on a few of them: the
// connections to the stores, the page cache, the program.
func (b *Bench) prepareInputs(ctx context.Context, c PipelineConfig, h worker.Handler, keys []string) error {
	b.logger.Info("bench: uploading the inputs", "objects", c.Rows, "bytes", c.ObjectSize, "store", c.Input.Location().String())
	if err := upload(ctx, c.Input, keys, c.ObjectSize, c.Slots); err != nil {
		return err
	}
	warm := min(c.Rows, 2*c.Slots)
	_, err := direct(ctx, h, keys[:warm], c.Slots, 1<<40, nil)
	return err
}

// deleteObjects removes the inputs and the outputs of the run, even when
// ctx was cancelled.
func (b *Bench) deleteObjects(ctx context.Context, c PipelineConfig, keys []string, h *keepOutputs) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	deleteAll(dctx, c.Input, keys, c.Slots, b.logger)
	deleteAll(dctx, c.Output, h.keys(), c.Slots, b.logger)
}

// startPipelineWorker pauses Queue and starts a worker of c.Slots slots on
// it, which waits on the paused queue while the loop without a queue runs.
// stop stops the worker and closes its pool.
func (b *Bench) startPipelineWorker(ctx context.Context, c PipelineConfig, h worker.Handler) (outcomes *outcomeCount, stop func(), err error) {
	if _, err := b.pool.Exec(ctx, sqlPause, Queue); err != nil {
		return nil, nil, fmt.Errorf("bench: pause queue %s: %w", Queue, explain(err))
	}
	pool, err := b.workerPool(ctx, 6, nil)
	if err != nil {
		return nil, nil, err
	}
	outcomes = &outcomeCount{}
	w, err := b.startWorker(ctx, pool, "pipeline", worker.Config{Handler: h, Slots: c.Slots, Observer: outcomes})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return outcomes, func() {
		stopWorker(w)
		pool.Close()
	}, nil
}

// pipelineRounds runs each round's share of keys three ways, the order
// turning from round to round, and records each way's time in rounds and
// its CPU time in cpu.
func (b *Bench) pipelineRounds(ctx context.Context, c PipelineConfig, h worker.Handler, outcomes *outcomeCount,
	conns []*pgx.Conn, keys []string, rounds *PipelineRounds, cpu *pipelineCPU) error {
	for r := range c.Rounds {
		part := keys[r*c.Rows/c.Rounds : (r+1)*c.Rows/c.Rounds]
		for i := range 3 {
			var (
				t   time.Duration
				err error
			)
			switch (i + r) % 3 {
			case 0:
				b.logger.Info("bench: pipeline without a queue", "round", r+1, "rows", len(part), "slots", c.Slots)
				t, err = direct(ctx, h, part, c.Slots, int64(2+r)<<40, cpu.meter(&cpu.direct))
				rounds.Direct = append(rounds.Direct, ms(t))
			case 1:
				b.logger.Info("bench: pipeline through the queue", "round", r+1, "rows", len(part), "slots", c.Slots)
				t, err = b.queued(ctx, outcomes, part, cpu.meter(&cpu.queued))
				rounds.Queued = append(rounds.Queued, ms(t))
			case 2:
				b.logger.Info("bench: pipeline through a bare queue", "round", r+1, "rows", len(part), "slots", c.Slots)
				t, err = b.bare(ctx, h, conns, part, int64(2+r)<<44, cpu.meter(&cpu.bare))
				rounds.Bare = append(rounds.Bare, ms(t))
			}
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// pipelineCPU sums the CPU times of a Pipeline run's three ways.
type pipelineCPU struct {
	server               *serverCPU // nil when the server is not on this machine
	direct, queued, bare cpuTimes
}

// cpuTimes are CPU times as PipelineCPU names them. In a sum, serverLost and
// machineLost say that a reading of the server or of /proc/stat failed in a
// round, which leaves those times unknown.
type cpuTimes struct {
	server, process, program, machine, idle time.Duration
	serverLost, machineLost                 bool
}

// read takes the CPU times so far.
func (p *pipelineCPU) read() cpuTimes {
	t := cpuTimes{process: selfCPU(), program: childrenCPU(), serverLost: true}
	if p.server != nil {
		if s, err := p.server.total(); err == nil {
			t.server, t.serverLost = s, false
		}
	}
	var ok bool
	t.machine, t.idle, ok = machineCPU()
	t.machineLost = !ok
	return t
}

// meter returns a cpuMeter that adds to sum.
func (p *pipelineCPU) meter(sum *cpuTimes) *cpuMeter { return &cpuMeter{p: p, sum: sum} }

// cpuMeter adds the CPU times of a way's timed parts to a sum. A nil
// cpuMeter measures nothing (the warm-up's).
type cpuMeter struct {
	p   *pipelineCPU
	sum *cpuTimes
}

func (m *cpuMeter) start() cpuTimes {
	if m == nil {
		return cpuTimes{}
	}
	return m.p.read()
}

func (m *cpuMeter) stop(before cpuTimes) {
	if m != nil {
		m.sum.add(before, m.p.read())
	}
}

// add adds the times from before to after; a time that either reading
// could not read makes the sum's unknown.
func (t *cpuTimes) add(before, after cpuTimes) {
	t.serverLost = t.serverLost || before.serverLost || after.serverLost
	t.machineLost = t.machineLost || before.machineLost || after.machineLost
	t.server += after.server - before.server
	t.process += after.process - before.process
	t.program += after.program - before.program
	t.machine += after.machine - before.machine
	t.idle += after.idle - before.idle
}

// perRow divides the sum by the rows, each way having run every row once.
func (t cpuTimes) perRow(rows int) PipelineCPU {
	n := float64(max(rows, 1))
	f := func(d time.Duration) float64 { return round(ms(d)/n, 4) }
	c := PipelineCPU{Process: f(t.process), Program: f(t.program)}
	if !t.serverLost {
		c.Server = new(f(t.server))
	}
	if !t.machineLost {
		c.Machine, c.Idle = new(f(t.machine)), new(f(t.idle))
	}
	return c
}

// compare records the rates of the rows without a queue, through it and
// through the bare queue, and the overheads of the two queues.
func (res *PipelineResult) compare() {
	d, q, bare := sum(res.RoundMS.Direct), sum(res.RoundMS.Queued), sum(res.RoundMS.Bare)
	res.Direct, res.Queued, res.Bare = rate(res.Rows, d), rate(res.Rows, q), rate(res.Rows, bare)
	res.OverheadRatio = round(res.Direct.RowsPerSec/res.Queued.RowsPerSec, 3)
	res.OverheadPct = round((q/d-1)*100, 1)
	res.BareOverheadPct = round((bare/d-1)*100, 1)
}

func sum(xs []float64) float64 {
	var s float64
	for _, x := range xs {
		s += x
	}
	return s
}

func rate(rows int, elapsedMS float64) Rate {
	return Rate{ElapsedMS: round(elapsedMS, 3), RowsPerSec: round(float64(rows)/elapsedMS*1000, 1)}
}

// queued loads a row for each key into the paused queue, resumes it, waits
// until the worker has recorded their outcomes, and pauses the queue again.
// It times the run from the resume to the last outcome.
func (b *Bench) queued(ctx context.Context, outcomes *outcomeCount, keys []string, cpu *cpuMeter) (time.Duration, error) {
	if err := b.copyRows(ctx, func(i int) string { return keys[i] }, len(keys)); err != nil {
		return 0, err
	}
	want := outcomes.count() + uint64(len(keys))
	before := cpu.start()
	t0 := time.Now()
	if _, err := b.pool.Exec(ctx, sqlResume, Queue); err != nil {
		return 0, fmt.Errorf("bench: resume queue %s: %w", Queue, err)
	}
	err := outcomes.wait(ctx, want)
	elapsed := time.Since(t0)
	cpu.stop(before)
	if err != nil {
		return 0, err
	}
	if _, err := b.pool.Exec(ctx, sqlPause, Queue); err != nil {
		return 0, fmt.Errorf("bench: pause queue %s: %w", Queue, err)
	}
	return elapsed, nil
}

// bare loads a row for each key into the bare table and runs h on them
// through it: each connection claims one row (sqlPipeBareClaim), calls h on
// a synthetic job for it, and completes it (sqlSkipComplete), until a claim
// finds nothing. It times the run from the first claim to the last
// completion. Job ids are the table's ids plus base, clear of the others'.
func (b *Bench) bare(ctx context.Context, h worker.Handler, conns []*pgx.Conn, keys []string, base int64, cpu *cpuMeter) (time.Duration, error) {
	if _, err := b.pool.Exec(ctx, sqlPipeBareLoad, Queue, keys); err != nil {
		return 0, fmt.Errorf("bench: load the bare queue: %w", err)
	}
	pid := strconv.Itoa(os.Getpid())
	before := cpu.start()
	elapsed, err := burnDown(conns, func(i int, conn *pgx.Conn) error {
		workerID := workerPrefix + pid + ":bare:" + strconv.Itoa(i)
		for {
			var (
				id     int64
				source string
			)
			err := conn.QueryRow(ctx, sqlPipeBareClaim, Queue, workerID).Scan(&id, &source)
			if errors.Is(err, pgx.ErrNoRows) {
				return nil
			}
			if err != nil {
				return fmt.Errorf("bench: bare claim: %w", err)
			}
			if err := handleSynthetic(ctx, h, base+id, source, workerID, time.Now()); err != nil {
				return err
			}
			if _, err := conn.Exec(ctx, sqlSkipComplete, []int64{id}); err != nil {
				return fmt.Errorf("bench: bare completion: %w", err)
			}
		}
	})
	cpu.stop(before)
	if err != nil {
		return 0, err
	}
	return elapsed, b.bareDone(ctx)
}

// handleSynthetic calls h on a job made up for source, as a claim would
// have handed it to a slot.
func handleSynthetic(ctx context.Context, h worker.Handler, id int64, source, workerID string, created time.Time) error {
	job := &worker.Job{
		ID: id, Queue: Queue, Source: source, Payload: []byte("{}"),
		Attempt: 1, MaxAttempts: 1, WorkerID: workerID, CreatedAt: created, ClaimedAt: time.Now(),
	}
	if _, err := h.Handle(ctx, job); err != nil {
		return fmt.Errorf("bench: pipeline on %s: %w", source, err)
	}
	return nil
}

// direct calls h on a synthetic job per key, slots at a time, with no queue.
// Job ids start at firstID, clear of the table's.
func direct(ctx context.Context, h worker.Handler, keys []string, slots int, firstID int64, cpu *cpuMeter) (time.Duration, error) {
	jobs := make(chan int)
	errs := make(chan error, slots)
	var wg sync.WaitGroup
	pid := strconv.Itoa(os.Getpid())
	before := cpu.start()
	t0 := time.Now()
	for s := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			workerID := workerPrefix + pid + ":direct:" + strconv.Itoa(s)
			for i := range jobs {
				if err := handleSynthetic(ctx, h, firstID+int64(i), keys[i], workerID, t0); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
feed:
	for i := range keys {
		select {
		case jobs <- i:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	elapsed := time.Since(t0)
	cpu.stop(before)
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	return elapsed, err
}

// keepOutputs remembers the output keys of the manifests its handler
// returns, so that they can be deleted afterwards.
type keepOutputs struct {
	h  worker.Handler
	mu sync.Mutex
	k  []string
}

func (k *keepOutputs) Handle(ctx context.Context, job *worker.Job) (*worker.Result, error) {
	res, err := k.h.Handle(ctx, job)
	if res != nil {
		if m, ok := res.Output.(*pipeline.Manifest); ok {
			k.mu.Lock()
			for _, o := range m.Outputs {
				k.k = append(k.k, o.Key)
			}
			k.mu.Unlock()
		}
	}
	return res, err
}

func (k *keepOutputs) keys() []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), k.k...)
}

// upload puts an object of size bytes at each key, slots at a time. The
// objects differ in their first bytes.
func upload(ctx context.Context, st blob.Store, keys []string, size, slots int) error {
	body := make([]byte, size)
	_, _ = rand.Read(body)
	return forEach(ctx, keys, slots, func(ctx context.Context, i int, key string) error {
		b := bytes.Clone(body)
		if len(b) >= 8 {
			binary.BigEndian.PutUint64(b, uint64(i))
		}
		if _, err := st.Put(ctx, key, bytes.NewReader(b), int64(len(b))); err != nil {
			return fmt.Errorf("bench: upload input %s: %w", key, err)
		}
		return nil
	})
}

// deleteAll removes the objects, logging what it could not.
func deleteAll(ctx context.Context, st blob.Store, keys []string, slots int, logger *slog.Logger) {
	err := forEach(ctx, keys, slots, func(ctx context.Context, _ int, key string) error {
		return st.Delete(ctx, key)
	})
	if err != nil {
		logger.Warn("bench: could not delete all the benchmark's objects", "store", st.Location().String(), "error", err)
	}
}

// forEach calls f on each key, n at a time, and returns the first error.
func forEach(ctx context.Context, keys []string, n int, f func(ctx context.Context, i int, key string) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
		next  = make(chan int)
	)
	for range max(n, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := f(ctx, i, keys[i]); err != nil {
					once.Do(func() { first = err; cancel() })
				}
			}
		}()
	}
	for i := range keys {
		select {
		case next <- i:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(next)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = context.Cause(ctx)
	}
	return first
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
