#!/bin/sh
# Runs every pgworker bench mode and the River peer benchmark (bench/peers),
# one after the other, and writes BENCHMARKS.md. `make bench` runs it through
# internal/cmd/withservices, which starts a throwaway PostgreSQL (TEST_DATABASE_URL)
# and MinIO (PGWORKER_S3_ENDPOINT, AWS_*) with a bucket pgworker-bench; the
# cluster runs with fsync on and pg_stat_statements loaded (BENCH_SETTINGS in
# the Makefile), and this script creates the extension in its database.
#
# The sizes below finish in about an hour on two cores:
# the long transaction's phases take thirteen minutes, the soak BENCH_SOAK
# (default 10m; BENCH_SOAK=30m for the soak of the report), building the
# ten-million-row tables of views (about ten minutes) and of claim-depth a
# few more, which BENCH_DEPTHS can shorten (BENCH_DEPTHS=10000,1000000). BENCH_OUT names the report (default
# BENCHMARKS.md); the soak's chart goes to docs/bench-soak.png beside it.
set -eu
cd "$(dirname "$0")/.."
: "${TEST_DATABASE_URL:?run this through make bench, which starts PostgreSQL}"
: "${PGWORKER_S3_ENDPOINT:?run this through make bench, which starts MinIO}"
depths=${BENCH_DEPTHS:-10000,1000000,10000000}
soak=${BENCH_SOAK:-10m}
report=${BENCH_OUT:-BENCHMARKS.md}
psql=psql
if [ -n "${PG_BINDIR:-}" ] && [ -x "$PG_BINDIR/psql" ]; then
	psql=$PG_BINDIR/psql
fi

# A database of the run's own, beside TEST_DATABASE_URL's, dropped at the end.
db=pgworker_bench_$$
PGWORKER_DATABASE_URL=$(printf '%s' "$TEST_DATABASE_URL" | sed -E "s#^([a-z]+://[^/]*)/[^?]*#\1/$db#")
export PGWORKER_DATABASE_URL PGWORKER_LOG_FORMAT=text
out=$(mktemp -d)
cleanup() {
	"$psql" "$TEST_DATABASE_URL" -qc "DROP DATABASE IF EXISTS $db WITH (FORCE)" || true
	rm -rf "$out"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
"$psql" "$TEST_DATABASE_URL" -qc "CREATE DATABASE $db"
go build -o "$out/pgworker" ./cmd/pgworker
"$out/pgworker" migrate up --log-level warn >/dev/null
# The statements' breakdown of bench cpu, when the server has the library.
if [ "$("$psql" "$PGWORKER_DATABASE_URL" -Atc "SELECT current_setting('shared_preload_libraries') ~ 'pg_stat_statements'")" = t ]; then
	"$psql" "$PGWORKER_DATABASE_URL" -qc "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"
fi

# A failed run is reported and left out; the others still make the report.
failed=
# pgworker runs one mode, recording its command line and its JSON.
pgworker() {
	echo "pgworker $*" >>"$out/commands"
	echo "== pgworker $*" >&2
	"$out/pgworker" "$@" >>"$out/pgworker.jsonl" || { echo "FAILED: pgworker $*" >&2; failed=1; }
}

# The River peer benchmark: the same workloads on River, in a throwaway
# database of its own beside ours (it reads PGWORKER_DATABASE_URL).
river() {
	echo "cd bench/peers && go run ./cmd/riverbench $*" >>"$out/commands"
	echo "== riverbench $*" >&2
	(cd bench/peers && go run ./cmd/riverbench "$@") >>"$out/river.jsonl" || { echo "FAILED: riverbench $*" >&2; failed=1; }
}
peers=
if [ -d bench/peers/cmd/riverbench ]; then
	peers=1
else
	echo "bench/peers is missing: the River figures are left out of $report" >&2
fi

# Burn-downs side by side: pgworker and River alternate, three rounds, so
# that the machine's drifting load falls on both alike; the report compares
# the medians.
# The bare SKIP LOCKED loop runs in the same rounds, as the ceiling the
# 2,000-slot figure is compared with, the same loop with the rows that the
# guarantees write, and the same loop through the SQL API: what the rows and
# then the functions that write them cost. pgworker's 2,000 slots and the
# bare loop take seven rounds: their ratio sits within a few points of its
# goal, and each one's runs spread by more.
for round in 1 2 3 4 5 6 7; do
	pgworker bench throughput --rows 50000 --slots 2000 --json
	pgworker bench skiplocked --rows 50000 --clients 8 --batch 100 --json
	[ "$round" -le 3 ] || continue
	[ -z "$peers" ] || river throughput --rows 50000 --slots 2000 --json
	pgworker bench throughput --rows 20000 --slots 100 --json
	[ -z "$peers" ] || river throughput --rows 20000 --slots 100 --json
	pgworker bench skiplocked --rows 50000 --clients 8 --batch 100 --bookkeeping --json
	pgworker bench skiplocked --rows 50000 --clients 8 --batch 100 --api --json
done
# Pickup and database CPU per row, alternating with River's in three rounds;
# pgworker also at River's trade, its claims held back for as long as River's
# default fetch cooldown (100 ms). The bare LISTEN/NOTIFY queue runs in the
# same rounds at the same rates: what the database itself costs a pickup and
# a row. The pickup and River tuned's run in seven rounds: each one's runs
# spread by more than the two differ, and the medians of three rounds can fall
# either way (bench/other-measurements.md, seventeenth study). So do the
# CPU per row at 200 rows/s at River's trade and River's, for the same reason
# (the sixteenth study).
for round in 1 2 3 4 5 6 7; do
	pgworker bench notify --rate 50 --duration 10s --json
	pgworker bench latency --rows 500 --rate 50 --slots 100 --json
	[ -z "$peers" ] || river latency --rows 500 --rate 50 --slots 100 --tuned --json
	if [ "$round" -gt 3 ]; then
		pgworker bench cpu --rate 200 --duration 10s --slots 100 --claim-cooldown 100ms --json
		[ -z "$peers" ] || river cpu --rate 200 --duration 10s --slots 100 --json
		continue
	fi
	pgworker bench latency --rows 500 --rate 50 --slots 100 --claim-cooldown 100ms --json
	[ -z "$peers" ] || river latency --rows 500 --rate 50 --slots 100 --json
	for rate in 200 1000; do
		pgworker bench notify --rate "$rate" --duration 10s --json
		pgworker bench cpu --rate "$rate" --duration 10s --slots 100 --json
		pgworker bench cpu --rate "$rate" --duration 10s --slots 100 --claim-cooldown 100ms --json
		if [ -n "$peers" ]; then
			river cpu --rate "$rate" --duration 10s --slots 100 --json
			river cpu --rate "$rate" --duration 10s --slots 100 --tuned --json
		fi
	done
	pgworker bench cpu --rate 0 --rows 50000 --slots 2000 --json
	[ -z "$peers" ] || river cpu --rate 0 --rows 50000 --slots 2000 --json
done
pgworker bench claim-depth --depths "$depths" --claims 200 --json
pgworker bench herd --processes 20 --slots 50 --rows 100 --json
# Three enqueues: the goal is judged on their median.
for _ in 1 2 3; do
	pgworker bench enqueue --rows 1000000 --json
done
pgworker bench views --rows 10000000 --attempts 10000000 --slots 2000 --json
pgworker bench pipeline --rows 4000 --rounds 8 --slots 8 --input-store s3://pgworker-bench/in --output-store s3://pgworker-bench/out --json

# A snapshot held open beside the queue, at a fixed rate and at peak; then the
# soak, with retention's pruner when the schema has one.
pgworker bench long-tx --rate 1000 --slots 16 --phase 90s --json
pgworker bench long-tx --rate 1000 --processes 4 --slots 4 --phase 90s --json
pgworker bench long-tx --depth 2000 --slots 16 --phase 60s --json
prune=
if [ "$("$psql" "$PGWORKER_DATABASE_URL" -Atc "SELECT to_regproc('files.prune') IS NOT NULL")" = t ]; then
	prune="--prune-every 1m"
fi
# shellcheck disable=SC2086 # $prune is empty or two words
pgworker bench soak --duration "$soak" --rate 500 --slots 16 $prune --json
chart=docs/bench-soak.png
grep '"mode":"soak"' "$out/pgworker.jsonl" >"$out/soak.jsonl" || true
if [ -s "$out/soak.jsonl" ] && (cd bench/chart && go run . -mode soak -o "../../$chart" "$out/soak.jsonl"); then
	chartflag="-soak-chart $chart"
else
	echo "no soak chart" >&2
	chartflag=
fi

# shellcheck disable=SC2086 # $chartflag is empty or two words
go run ./bench/cmd/benchreport -commands "$out/commands" -append bench/other-measurements.md $chartflag -o "$report" "$out/pgworker.jsonl" "$out/river.jsonl"
echo "wrote $report" >&2
if [ -n "$failed" ]; then
	echo "some runs failed (see FAILED above); their figures are missing from $report" >&2
	exit 1
fi
