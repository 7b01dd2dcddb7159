package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pgworker/pgworker/queue"
)

// The statements of the batches mode: scratch rows of Queue in batches
// named batchPrefix-N, inserted by the server, half of them already ended
// (so that the counts the SQL API keeps have work in them).
const (
	batchPrefix = "pgworker-bench-"

	sqlInsertBatchRows = `
INSERT INTO files.files (queue, source, batch, state, finished_at, result)
SELECT $1, 'bench/' || $2::text || '/' || i, $2,
       CASE WHEN i % 2 = 0 THEN 'done' ELSE 'pending' END,
       CASE WHEN i % 2 = 0 THEN now() END,
       CASE WHEN i % 2 = 0 THEN jsonb_build_object('outputs', jsonb_build_array(jsonb_build_object(
           'key', 'out/' || i || '.txt', 'size', 1000 + i % 1000,
           'sha256', '9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08'))) END
FROM generate_series($3::bigint, $4::bigint) i`
	sqlAllProgress     = `SELECT count(*) FROM (SELECT * FROM files.batch_progress) p`
	sqlOneProgress     = `SELECT total FROM files.batch_progress WHERE batch = $1`
	sqlDeleteBatches   = `DELETE FROM files.batches WHERE batch LIKE 'pgworker-bench-%'`
	sqlProgressBatches = `SELECT count(*) FROM files.batch_progress WHERE batch LIKE 'pgworker-bench-%' AND total > 0`
)

// BatchesConfig sizes a Batches run.
type BatchesConfig struct {
	// Rows in the table, spread over Batches batches. Defaults to
	// 10,000,000.
	Rows int
	// Batches the rows are spread over. Defaults to 10.
	Batches int
	// Queries is how many times each read is timed. Defaults to 50.
	Queries int
	// ExportRows is the size of the batch that Results reads whole.
	// Defaults to 1,000,000 (at most Rows).
	ExportRows int
}

// BatchesResult is what Batches measured.
type BatchesResult struct {
	Setup
	Rows    int `json:"rows"`
	Batches int `json:"batches"`
	// AllBatches times a read of files.batch_progress whole, OneBatch a
	// read of one line of it.
	AllBatches Percentiles `json:"all_batches"`
	OneBatch   Percentiles `json:"one_batch"`
	// The export of one batch by queue.Results, as pgworker results runs it.
	ExportRows       int     `json:"export_rows"`
	ExportMS         float64 `json:"export_ms"`
	ExportRowsPerSec float64 `json:"export_rows_per_sec"`
	// PeakRSSMiB is the process's peak resident memory (VmHWM) after the
	// export: the bound of what the export held at once.
	PeakRSSMiB float64 `json:"peak_rss_mib"`
}

// Batches builds a table of cfg.Rows rows in cfg.Batches batches, then
// times files.batch_progress and the export of one batch's rows.
func (b *Bench) Batches(ctx context.Context, cfg *BatchesConfig) (*BatchesResult, error) {
	c := BatchesConfig{}
	if cfg != nil {
		c = *cfg
	}
	c.Rows = orDefault(c.Rows, 10_000_000)
	c.Batches = orDefault(c.Batches, 10)
	c.Queries = orDefault(c.Queries, 50)
	c.ExportRows = min(orDefault(c.ExportRows, 1_000_000), c.Rows)
	res := &BatchesResult{Rows: c.Rows, Batches: c.Batches, ExportRows: c.ExportRows}
	err := b.run(ctx, "batches", func(ctx context.Context) error {
		defer b.pool.Exec(context.WithoutCancel(ctx), sqlDeleteBatches) //nolint:errcheck // scratch batches, best effort
		res.Setup = b.setup("batches")
		if err := b.fillBatches(ctx, &c); err != nil {
			return err
		}
		var err error
		if res.AllBatches, err = b.timeQuery(ctx, c.Queries, sqlAllProgress); err != nil {
			return err
		}
		if res.OneBatch, err = b.timeQuery(ctx, c.Queries, sqlOneProgress, batchPrefix+"1"); err != nil {
			return err
		}
		return b.export(ctx, res)
	})
	if err != nil {
		return nil, err
	}
	return res, nil
}

// fillBatches inserts the rows: the export's batch first, the rest spread
// over the other batches, a million rows per statement.
func (b *Bench) fillBatches(ctx context.Context, c *BatchesConfig) error {
	sizes := make([]int, c.Batches)
	sizes[0] = c.ExportRows
	for i := 1; i < c.Batches; i++ {
		sizes[i] = (c.Rows - c.ExportRows) / (c.Batches - 1)
	}
	if c.Batches == 1 {
		sizes[0] = c.Rows
	}
	next := int64(1)
	for i, n := range sizes {
		name := batchPrefix + strconv.Itoa(i)
		b.logger.Info("bench: filling a batch", "batch", name, "rows", n)
		for left := int64(n); left > 0; {
			step := min(left, 1_000_000)
			if _, err := b.pool.Exec(ctx, sqlInsertBatchRows, Queue, name, next, next+step-1); err != nil {
				return fmt.Errorf("bench: fill %s: %w", name, err)
			}
			next, left = next+step, left-step
		}
	}
	if _, err := b.pool.Exec(ctx, sqlVacuum); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	var batches int
	if err := b.pool.QueryRow(ctx, sqlProgressBatches).Scan(&batches); err != nil {
		return fmt.Errorf("bench: %w", err)
	}
	if batches != c.Batches {
		return fmt.Errorf("bench: files.batch_progress shows %d batches, want %d", batches, c.Batches)
	}
	return nil
}

func (b *Bench) timeQuery(ctx context.Context, n int, sql string, args ...any) (Percentiles, error) {
	ds := make([]time.Duration, 0, n)
	for range n {
		t := time.Now()
		var v int64
		if err := b.pool.QueryRow(ctx, sql, args...).Scan(&v); err != nil {
			return Percentiles{}, fmt.Errorf("bench: %s: %w", strings.Fields(sql)[0], err)
		}
		ds = append(ds, time.Since(t))
	}
	return percentiles(ds), nil
}

// export reads batch 0 whole through queue.Results, as pgworker results
// does, discarding the rows.
func (b *Bench) export(ctx context.Context, res *BatchesResult) error {
	q := queue.New(b.pool, nil)
	rows := 0
	t := time.Now()
	err := q.Results(ctx, batchPrefix+"0", nil, func(r *queue.ResultRow) error {
		rows++
		return nil
	})
	elapsed := time.Since(t)
	if err != nil {
		return fmt.Errorf("bench: export: %w", err)
	}
	if rows != res.ExportRows {
		return fmt.Errorf("bench: export read %d rows, want %d", rows, res.ExportRows)
	}
	res.ExportMS = ms(elapsed)
	res.ExportRowsPerSec = round(float64(rows)/elapsed.Seconds(), 1)
	res.PeakRSSMiB = peakRSSMiB()
	return nil
}

// peakRSSMiB reads VmHWM of this process; 0 where /proc has none.
func peakRSSMiB() float64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmHWM:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			if err != nil {
				return 0
			}
			return round(kb/1024, 1)
		}
	}
	return 0
}
