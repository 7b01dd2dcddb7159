#!/bin/sh
# Runs River through the standard benchmark set and prints one JSON object per
# line: throughput at 100 and 2,000 slots, pickup latency at 50/s with River's
# defaults and with --tuned. Extra arguments go to every run, for example
# --database-url URL or --dedicated; otherwise the URL comes from
# RIVERBENCH_DATABASE_URL, PGWORKER_DATABASE_URL or DATABASE_URL.
set -eu
cd "$(dirname "$0")"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
go build -o "$dir/riverbench" ./cmd/riverbench
"$dir/riverbench" throughput --rows 20000 --slots 100 --json "$@"
"$dir/riverbench" throughput --rows 50000 --slots 2000 --json "$@"
"$dir/riverbench" latency --rows 500 --rate 50 --slots 100 --json "$@"
"$dir/riverbench" latency --rows 500 --rate 50 --slots 100 --tuned --json "$@"
