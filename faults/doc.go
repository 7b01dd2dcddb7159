// Package faults is pgworker's fault suite: each scenario runs real
// `pgworker run` processes (the binary, built once, with -race when the
// tests run with it) against a real PostgreSQL and a real MinIO, injects
// faults while rows are being worked on, and checks at its end that the
// guarantees of the design held:
//
//   - every enqueued row is in exactly one terminal state;
//   - no row has two attempts with outcome done;
//   - each recorded result is the output of the row's single done attempt
//     (its worker id, attempt number and output prefix), so no output of a
//     losing attempt became a result;
//   - each result's objects exist in MinIO with the recorded size and
//     SHA-256 (downloaded and hashed), equal to the input the backend copied.
//
// The processes, the bucket, counts and waits come from internal/harness,
// which the e2e tests share; the rig adds the scenario's inputs, its fault
// trackers and a watcher of slots declared dead.
//
// The backend (internal/slowcopy) sleeps 20-500 ms and copies its input to
// its output directory, so that faults land mid-work.
//
// The scenarios: kill -9 of worker processes, immediate PostgreSQL
// restarts, a network partition longer than the lease timeout, PgBouncer in
// transaction pooling mode and its restart, failover to a synchronous
// standby, a MinIO outage, and a work directory that becomes unusable.
//
// `go test ./faults` runs the short form (a few hundred rows per scenario);
// -faults.full runs the full form, and -faults.report=FILE writes the results
// table (FAULTS.md). `make test-faults` does both. With -short the suite is
// skipped, as are the scenarios whose tools (PostgreSQL server binaries,
// PgBouncer, MinIO) are missing.
package faults
