// Package riverbench measures River (riverqueue/river) on the same two
// workloads as `pgworker bench`, so that the two can be read side by side.
//
// Throughput burns down pre-inserted jobs with a no-op worker; Latency inserts
// jobs one at a time at a steady rate while every worker is idle and measures
// how long each waits before its worker starts. Both run on a pool whose
// database holds River's schema (see Migrate) and nothing else that matters:
// the jobs they insert are left behind, completed.
//
//	pool, _ := pgxpool.New(ctx, url)
//	if err := riverbench.Migrate(ctx, pool, nil); err != nil { ... }
//	res, err := riverbench.Throughput(ctx, pool, &riverbench.Config{Rows: 20000, Slots: 100})
//	fmt.Println(res.RowsPerSec)
//
// The command riverbench wraps this package and, by default, runs it in a
// throwaway database that it creates and drops (see CreateDatabase).
package riverbench
