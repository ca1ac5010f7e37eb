#!/usr/bin/env bash
# gpu-check.sh — every GPU figure of the CUDA backend (issue #17, docs/cuda.md)
# from one run on a machine with an NVIDIA GPU (written for an H200: about
# 5 minutes with 16 cores; nothing here has run on a GPU yet):
#
#   1. configure build-gpu/ with the CUDA plugin (TESSEL_CUDA_ARCHS, default 90)
#      and build tessel, the plugin and the CUDA tests;
#   2. the CUDA tests: every kernel against the CPU reference, W1 and W3 steps
#      against the CPU, determinism with and without the CUDA graph;
#   3. `tessel bench --backend cuda` on W1 and W3 (fp32, 100 steps per mode)
#      and GPT-2 124M (B 16, T 1024, bf16, GPT2_STEPS steps per mode): step
#      time, throughput, kernels per step, launch cost and jitter with and
#      without the graph; every figure also appended to build-gpu/gpu-check.jsonl.
#
#   scripts/gpu-check.sh [--skip-build]        (run from the repository root)
set -u
cd "$(dirname "$0")/.." || exit 2
BUILD=${BUILD:-build-gpu}
ARCHS=${TESSEL_CUDA_ARCHS:-90}
GPT2_STEPS=${GPT2_STEPS:-30}
JOBS=${JOBS:-$(nproc)}
export PATH=/usr/local/cuda/bin:$PATH
t0=$(date +%s)
section() { printf '\n==== %s (%ds)\n' "$1" $(($(date +%s) - t0)); }
fails=0

section "GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader ||
    { echo "gpu-check: no GPU visible (nvidia-smi failed)"; exit 2; }
nvcc --version | tail -1

if [ "${1:-}" != "--skip-build" ]; then
    section "build ($BUILD, sm_$ARCHS)"
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DTESSEL_CUDA=ON \
        -DTESSEL_CUDA_ARCHS="$ARCHS" >/dev/null || exit 2
    cmake --build "$BUILD" -j "$JOBS" --target tessel tessel_cuda test_unit_cuda_backend \
        test_unit_cuda_ops test_unit_cuda_steps test_e2e_cuda_cli 2>&1 | tail -3
    [ "${PIPESTATUS[0]}" -eq 0 ] || { echo "gpu-check: the build failed"; exit 2; }
fi

section "CUDA tests"
(cd "$BUILD" && OMP_NUM_THREADS=$JOBS ctest -R 'cuda' --output-on-failure --timeout 300) ||
    fails=$((fails + 1))

JSON=$BUILD/gpu-check.jsonl
rm -f "$JSON"
bench() {
    section "bench $*"
    "$BUILD/tessel" bench --backend cuda --json "$JSON" "$@" || fails=$((fails + 1))
}
bench --workload W1 --steps 100 --warmup 5
bench --workload W3 --steps 100 --warmup 5
bench --workload gpt2-124m --precision bf16 --steps "$GPT2_STEPS" --warmup 3

section "figures ($JSON)"
cat "$JSON" 2>/dev/null
section "done: $fails part(s) failed"
[ "$fails" -eq 0 ]
