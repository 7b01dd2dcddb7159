package migrations_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgworker/pgworker/internal/pgtest"
)

// BenchmarkCompleteMany measures claim_batch and complete_many together, per
// row, at two batch sizes and under custom and generic plans: the cost per
// row should not grow with the batch (it did, quadratically, when a generic
// plan rescanned the arrays for each row).
func BenchmarkCompleteMany(b *testing.B) {
	for _, mode := range []string{"auto", "force_generic_plan"} {
		for _, size := range []int{100, 1000} {
			b.Run(fmt.Sprintf("plan=%s/batch=%d", mode, size), func(b *testing.B) {
				pool := pgtest.Pool(b)
				ctx := context.Background()
				conn, err := pool.Acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				defer conn.Release()
				mustExec(b, conn, "SET plan_cache_mode = "+mode)
				mustExec(b, conn, "INSERT INTO files.files (source) SELECT 'x' || g FROM generate_series(1, $1::int) g", b.N*size)
				mustExec(b, conn, "VACUUM ANALYZE files.files")
				workers := make([]string, size)
				for i := range workers {
					workers[i] = fmt.Sprintf("bench:%d", i)
				}
				b.ResetTimer()
				for range b.N {
					ids, held, attempts, tokens := claimBatch(b, conn, workers)
					if _, err := conn.Exec(ctx, "SELECT count(*) FROM files.complete_many($1, $2, $3, $4)", ids, held, attempts, tokens); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*size), "µs/row")
			})
		}
	}
}

// BenchmarkBatchEnds measures the outcomes of a fleet: procs sessions, as
// many worker processes, each claiming for its slots and recording their
// outcomes in one statement, on rows without a batch and on rows of one
// batch, whose ends look in turn whether the batch has finished
// (files.batch_end_locks). Compare the two rows/s in one run.
func BenchmarkBatchEnds(b *testing.B) {
	const procs, slots = 8, 25
	for _, batch := range []string{"none", "one"} {
		b.Run("batch="+batch, func(b *testing.B) {
			pool := pgtest.PoolFor(b, pgtest.URL(b), func(c *pgxpool.Config) { c.MaxConns = procs })
			ctx := context.Background()
			name := map[string]any{"none": nil, "one": "ends"}[batch]
			mustExec(b, pool, "INSERT INTO files.files (source, batch) SELECT 'x' || g, $2 FROM generate_series(1, $1::int) g",
				b.N*procs*slots, name)
			mustExec(b, pool, "VACUUM ANALYZE files.files")
			b.ResetTimer()
			var wg sync.WaitGroup
			for p := range procs {
				wg.Go(func() {
					conn, err := pool.Acquire(ctx)
					if err != nil {
						b.Error(err)
						return
					}
					defer conn.Release()
					workers := make([]string, slots)
					for i := range workers {
						workers[i] = fmt.Sprintf("bench:%d:%d", p, i)
					}
					for range b.N {
						ids, held, attempts, tokens := claimBatch(b, conn, workers)
						if _, err := conn.Exec(ctx, "SELECT count(*) FROM files.complete_many($1, $2, $3, $4)", ids, held, attempts, tokens); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.ReportMetric(float64(b.N*procs*slots)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
