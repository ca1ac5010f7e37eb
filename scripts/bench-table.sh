#!/bin/sh
# bench-table.sh — measure W1-W5 and gpt2-124m (batch 4, context 64) side by
# side with the PyTorch reference and write the table between the
# "bench-table" markers of docs/benchmarks.md. Rerun it any time:
#
#     scripts/bench-table.sh                 # or: make bench-table
#     REFERENCE=/path/to/torch_bench.py ROUNDS=3 scripts/bench-table.sh
#
# Environment: BUILD (build), REFERENCE (../shared/reference/torch_bench.py),
# ROUNDS (2 tessel/PyTorch alternations), NICE (5), DOC (docs/benchmarks.md).
# It takes several minutes; run it when the machine is quiet (see uptime).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
REFERENCE=${REFERENCE:-../shared/reference/torch_bench.py}
ROUNDS=${ROUNDS:-2}
NICE=${NICE:-5}
DOC=${DOC:-docs/benchmarks.md}
[ -x "$BUILD/tessel" ] || { echo "bench-table: build first ($BUILD/tessel missing)" >&2; exit 2; }
[ -f "$REFERENCE" ] || { echo "bench-table: no PyTorch reference at $REFERENCE (set REFERENCE)" >&2; exit 2; }
json=$(mktemp)
trap 'rm -f "$json"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
run() { nice -n "$NICE" "$BUILD/tessel" bench --json "$json" "$@"; }
run --workload W1 --compare-torch --rounds "$ROUNDS" --reference "$REFERENCE"
run --workload W3 --steps 5 --warmup 1 --compare-torch --rounds "$ROUNDS" --reference "$REFERENCE"
run --workload W2 --compare-torch --rounds "$ROUNDS" --reference "$REFERENCE"
run --workload W4 --steps 5 --compare-torch --rounds "$ROUNDS" --reference "$REFERENCE"
run --workload W5 --compare-torch --rounds "$ROUNDS" --reference "$REFERENCE"
run --workload gpt2-124m --steps 5 --warmup 1
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit (with uncommitted changes)"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
python3 scripts/bench_table.py "$json" "$DOC" "$started" "$commit" "$cpu" "$(nproc)" "$load_before" "$load_after"
