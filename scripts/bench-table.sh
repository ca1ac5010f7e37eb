#!/bin/sh
# bench-table.sh — measure W1-W5 and gpt2-124m (batch 4, context 64) side by
# side with the PyTorch reference, and W1/W3 in bf16, and write the table
# between the "bench-table" markers of docs/benchmarks.md. Rerun it any time:
#
#     scripts/bench-table.sh                 # or: make bench-table
#     THREADS=1 ROUNDS=3 scripts/bench-table.sh
#
# Every workload runs once per thread count of THREADS ("1 2": the issue's
# 1-thread and 2-thread tables in one sitting); the table has a row per
# workload, precision and thread count.
#
# PyTorch runs every mode its version has (`tessel bench --torch-best`: eager,
# torch.compile, compiled optimizer; bf16 autocast eager and compiled) and
# each ratio is against the fastest mode, named in the table.
# Environment: BUILD (build), REFERENCE (../shared/reference/torch_bench.py),
# TORCH_PYTHON (../shared/reference/torch2-python where it exists, else
# Debian's /usr/bin/python3 with torch 1.13), THREADS ("1 2": the thread
# counts, each a full pass), ROUNDS (2 tessel/PyTorch alternations), BF16 (1:
# also W1 and W3 in bf16), PIN (0; 1: pin the 1-thread runs of both sides to
# CPU 0 with taskset, as the issue's reference figures were), NICE (5), DOC
# (docs/benchmarks.md). It takes tens of minutes (torch.compile compiles
# in every run); run it when the machine is quiet (see uptime).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
REFERENCE=${REFERENCE:-../shared/reference/torch_bench.py}
if [ -z "${TORCH_PYTHON:-}" ]; then
    TORCH_PYTHON=/usr/bin/python3
    [ -x "$(dirname "$REFERENCE")/torch2-python" ] && TORCH_PYTHON=$(dirname "$REFERENCE")/torch2-python
fi
THREADS=${THREADS:-1 2}
PIN=${PIN:-0}
ROUNDS=${ROUNDS:-2}
BF16=${BF16:-1}
NICE=${NICE:-5}
DOC=${DOC:-docs/benchmarks.md}
[ -x "$BUILD/tessel" ] || { echo "bench-table: build first ($BUILD/tessel missing)" >&2; exit 2; }
[ -f "$REFERENCE" ] || { echo "bench-table: no PyTorch reference at $REFERENCE (set REFERENCE)" >&2; exit 2; }
json=$(mktemp)
trap 'rm -f "$json"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
started=$(date -u '+%Y-%m-%d %H:%M UTC')
for t in $THREADS; do
    case $t in
    '' | *[!0-9]* | 0) echo "bench-table: THREADS must be thread counts >= 1, got '$THREADS'" >&2; exit 2 ;;
    esac
done
threads=1
run() {
    pin=
    [ "$PIN" = 1 ] && [ "$threads" = 1 ] && pin="taskset -c 0"
    nice -n "$NICE" $pin "$BUILD/tessel" bench --json "$json" --threads "$threads" "$@"
}
cmp() {
    run --compare-torch --torch-best --torch-python "$TORCH_PYTHON" --rounds "$ROUNDS" \
        --reference "$REFERENCE" "$@"
}
for threads in $THREADS; do
    cmp --workload W1
    cmp --workload W3 --steps 5 --warmup 1
    cmp --workload W2
    cmp --workload W4 --steps 5
    cmp --workload W5
    if [ "$BF16" = 1 ]; then
        cmp --workload W1 --precision bf16
        cmp --workload W3 --precision bf16 --steps 5 --warmup 1
    fi
done
run --workload gpt2-124m --steps 5 --warmup 1 # at the last thread count
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit (with uncommitted changes)"
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n1)
# The flags that decide the kernels: AVX-512, its bf16 dot product, AMX tiles.
flags=$(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo | head -n1 | tr ' ' '\n' |
    grep -E '^(fma|avx2|avx512f|avx512_bf16|avx512_fp16|amx_bf16|amx_tile|amx_fp16)$' | tr '\n' ' ')
python3 scripts/bench_table.py "$json" "$DOC" "$started" "$commit" "$cpu" "$(nproc)" \
    "$load_before" "$load_after" "${flags% }" "$THREADS" "$PIN"
