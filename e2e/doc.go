// Package e2e holds the end-to-end tests of the pgworker command: they build
// the binary once, with the race detector when the tests have it, and drive
// it as an operator would, as real processes against a real PostgreSQL
// (TEST_DATABASE_URL, one fresh database per test) and a real MinIO (one
// bucket per test), with small shell scripts as backends. Nothing is mocked.
//
//	TEST_DATABASE_URL=postgres://... go test -race ./e2e/...
//
// The tests wait for events (a row state in the database, a backend's pid
// file, a process exit), never for fixed delays, and kill every process they
// start. Processes, stores, counts and waits come from internal/harness,
// which the fault suite shares.
package e2e
