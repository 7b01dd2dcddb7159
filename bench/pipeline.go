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

	"github.com/pgworker/pgworker/backend"
	"github.com/pgworker/pgworker/blob"
	"github.com/pgworker/pgworker/pipeline"
	"github.com/pgworker/pgworker/worker"
)

// DefaultPipelineExec is PipelineConfig.Exec's default: the smallest backend
// that reads its input and writes an output, with no shell in between.
const DefaultPipelineExec = "cp {input} {output_dir}/out"

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
	// Rounds splits the rows: each round runs its share both ways, the
	// order alternating (direct then queued, queued then direct, ...), so
	// that a load on the machine that drifts during the run weighs on both
	// alike. Defaults to 4.
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
	Queued Rate `json:"queued"`
	Direct Rate `json:"direct"`
	// OverheadRatio is Direct's rate over Queued's; OverheadPct is the time
	// the queue adds, in percent of Direct's: (ratio - 1) × 100.
	OverheadRatio float64 `json:"overhead_ratio"`
	OverheadPct   float64 `json:"overhead_pct"`
}

// Rate is the time of a burn-down and its rows per second.
type Rate struct {
	ElapsedMS  float64 `json:"elapsed_ms"`
	RowsPerSec float64 `json:"rows_per_sec"`
}

// Pipeline uploads cfg.Rows objects of cfg.ObjectSize bytes to cfg.Input
// (not timed) and runs the download-exec-upload pipeline on them twice with
// cfg.Slots at once: as a plain loop that calls pipeline.Handler on
// synthetic jobs, and through the queue and the worker runtime, in
// cfg.Rounds alternating rounds. A warm-up loop on a few objects comes
// first.
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
	err = b.run(ctx, "pipeline", func(ctx context.Context) error {
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
		outcomes, stop, err := b.startPipelineWorker(ctx, c, h)
		if err != nil {
			return err
		}
		defer stop()
		d, q, err := b.pipelineRounds(ctx, c, h, outcomes, keys)
		if err != nil {
			return err
		}
		if err := b.outcomes(ctx, c.Rows); err != nil {
			return err
		}
		res.compare(d, q)
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
	_, err := direct(ctx, h, keys[:warm], c.Slots, 1<<40)
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

// pipelineRounds runs each round's share of keys both ways, the order
// alternating from round to round, and returns the time spent without a
// queue (d) and through it (q).
func (b *Bench) pipelineRounds(ctx context.Context, c PipelineConfig, h worker.Handler, outcomes *outcomeCount, keys []string) (d, q time.Duration, err error) {
	for r := range c.Rounds {
		part := keys[r*c.Rows/c.Rounds : (r+1)*c.Rows/c.Rounds]
		for i := range 2 {
			if (i+r)%2 == 0 {
				b.logger.Info("bench: pipeline without a queue", "round", r+1, "rows", len(part), "slots", c.Slots)
				t, err := direct(ctx, h, part, c.Slots, int64(2+r)<<40)
				if err != nil {
					return 0, 0, err
				}
				d += t
			} else {
				b.logger.Info("bench: pipeline through the queue", "round", r+1, "rows", len(part), "slots", c.Slots)
				t, err := b.queued(ctx, outcomes, part)
				if err != nil {
					return 0, 0, err
				}
				q += t
			}
		}
	}
	return d, q, nil
}

// compare records the rates of the rows without a queue (d) and through it
// (q), and the overhead of the queue.
func (res *PipelineResult) compare(d, q time.Duration) {
	res.Direct, res.Queued = rate(res.Rows, d), rate(res.Rows, q)
	res.OverheadRatio = round(res.Direct.RowsPerSec/res.Queued.RowsPerSec, 3)
	res.OverheadPct = round((q.Seconds()/d.Seconds()-1)*100, 1)
}

func rate(rows int, d time.Duration) Rate {
	return Rate{ElapsedMS: ms(d), RowsPerSec: round(float64(rows)/d.Seconds(), 1)}
}

// queued loads a row for each key into the paused queue, resumes it, waits
// until the worker has recorded their outcomes, and pauses the queue again.
// It times the run from the resume to the last outcome.
func (b *Bench) queued(ctx context.Context, outcomes *outcomeCount, keys []string) (time.Duration, error) {
	if err := b.copyRows(ctx, func(i int) string { return keys[i] }, len(keys)); err != nil {
		return 0, err
	}
	want := outcomes.count() + uint64(len(keys))
	t0 := time.Now()
	if _, err := b.pool.Exec(ctx, sqlResume, Queue); err != nil {
		return 0, fmt.Errorf("bench: resume queue %s: %w", Queue, err)
	}
	err := outcomes.wait(ctx, want)
	elapsed := time.Since(t0)
	if err != nil {
		return 0, err
	}
	if _, err := b.pool.Exec(ctx, sqlPause, Queue); err != nil {
		return 0, fmt.Errorf("bench: pause queue %s: %w", Queue, err)
	}
	return elapsed, nil
}

// direct calls h on a synthetic job per key, slots at a time, with no queue.
// Job ids start at firstID, clear of the table's.
func direct(ctx context.Context, h worker.Handler, keys []string, slots int, firstID int64) (time.Duration, error) {
	jobs := make(chan int)
	errs := make(chan error, slots)
	var wg sync.WaitGroup
	pid := strconv.Itoa(os.Getpid())
	t0 := time.Now()
	for s := range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				job := &worker.Job{
					ID: firstID + int64(i), Queue: Queue, Source: keys[i], Payload: []byte("{}"),
					Attempt: 1, MaxAttempts: 1, WorkerID: workerPrefix + pid + ":direct:" + strconv.Itoa(s),
					CreatedAt: t0, ClaimedAt: time.Now(),
				}
				if _, err := h.Handle(ctx, job); err != nil {
					errs <- fmt.Errorf("bench: pipeline on %s: %w", keys[i], err)
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
