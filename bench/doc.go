// Package bench measures pgworker on a real database: the figures that
// `pgworker bench` prints and BENCHMARKS.md records.
//
// Each mode runs the real code (the worker runtime, the SQL API, the enqueue
// COPY, the download-exec-upload pipeline) on scratch rows of its own queue,
// Queue, and reports its figures with its setup as a JSON-ready struct:
//
//   - Throughput: pre-inserted rows burnt down by a no-op handler.
//   - Latency: rows inserted one at a time while every slot is idle; time
//     from the insert's commit to the handler's start, and its steps
//     (notification, claim sent, claim answered) traced by the bench alone.
//   - ClaimDepth: the time of one claim with millions of finished rows in
//     the table.
//   - SkipLocked: the bare FOR UPDATE SKIP LOCKED loop on a table shaped
//     like files.files, with no queue code: the ceiling to compare with.
//   - CPU: the database server's CPU time (from /proc), the worker's, the
//     WAL and the transactions per row, at a fixed rate or at peak.
//   - Herd: claim queries per row with many idle processes listening, their
//     pools optionally through a PgBouncer, and what the idle fleet costs.
//   - Enqueue: rows per second through `pgworker enqueue`'s COPY path.
//   - Pipeline: rows per second of the download-exec-upload pipeline
//     through the queue, beside the same pipeline with no queue at all and
//     through a bare SKIP LOCKED queue with no queue software, and each
//     way's CPU time a row by process.
//   - LongTx: a producer and a worker through phases clean, idle-in-tx (a
//     held REPEATABLE READ snapshot) and recovery.
//   - Soak: a fixed rate for a long time, sampled over time.
//
// A Bench refuses a database that holds rows of other queues, or live
// worker slots, unless Config.Force is set: a benchmark belongs on a scratch
// database, and the figures of a shared one mean little. It never deletes
// rows outside Queue, and it removes its own rows when a mode ends.
//
//	b, err := bench.New(pool, &bench.Config{Logger: logger})
//	if err != nil {
//		return err
//	}
//	res, err := b.Throughput(ctx, &bench.ThroughputConfig{Rows: 20000, Slots: 100})
//	if err != nil {
//		return err
//	}
//	fmt.Printf("%.0f rows/s\n", res.RowsPerSec)
//
// Beside the package, the folder holds what turns its figures into
// BENCHMARKS.md: run.sh (what `make bench` runs: every mode, and River
// alternating with pgworker), cmd/benchreport (renders the report from the
// modes' JSON lines), chart/ (draws the samples of a soak as a PNG, a Go
// module of its own), peers/ (River on the same workloads, a Go module of
// its own) and other-measurements.md (figures measured by other means,
// appended to the report).
package bench
