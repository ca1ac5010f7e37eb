#!/usr/bin/env bash
# gpu-check.sh — every GPU figure of the CUDA backend (issue #17, docs/cuda.md)
# from one run on a machine with an NVIDIA GPU (written for an H200: about
# 5 minutes with 16 cores; nothing here has run on a GPU yet):
#
#   1. configure build-gpu/ with the CUDA plugin (TESSEL_CUDA_ARCHS, default 90)
#      and build tessel, the plugin and the CUDA tests;
#   2. the CUDA tests: every kernel against the CPU reference, W1 and W3 steps
#      against the CPU, determinism with and without the CUDA graph;
#   3. `tessel bench --backend cuda` on W1 and W3 (fp32, W_STEPS steps per
#      mode) and GPT-2 124M (B 16, T 1024, bf16, GPT2_STEPS steps per mode):
#      step time, throughput, kernels per step, launch cost and jitter with
#      and without the graph;
#   4. PyTorch (bench/torch_gpt2_cuda.py: torch.compile, and bf16 eager) on
#      GPT-2 124M, where python3 has torch with CUDA.
#   Every figure is also appended to $BUILD/gpu-check.jsonl.
#
#   scripts/gpu-check.sh [--skip-build]        (run from the repository root)
#   BUILD=DIR scripts/gpu-check.sh --skip-build   (tessel, libtessel_cuda.so and
#                                  the test programs already built in DIR)
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
# The test programs run straight from $BUILD (a build made elsewhere works
# too), from the repository root, as ctest would run them.
for t in unit_cuda_backend unit_cuda_ops unit_cuda_steps e2e_cuda_cli; do
    printf -- '-- %s\n' "$t"
    TESSEL_BIN="$BUILD/tessel" TESSEL_CUDA_BUILT=1 OMP_NUM_THREADS=$JOBS \
        timeout "${TEST_TIMEOUT:-300}" "$BUILD/test_$t"
    rc=$?
    [ "$rc" -eq 0 ] || { echo "gpu-check: test_$t exit $rc"; fails=$((fails + 1)); }
done

JSON=$BUILD/gpu-check.jsonl
rm -f "$JSON"
bench() {
    section "bench $*"
    timeout "${BENCH_TIMEOUT:-300}" "$BUILD/tessel" bench --backend cuda --json "$JSON" "$@" ||
        fails=$((fails + 1))
}
bench --workload W1 --steps "${W_STEPS:-100}" --warmup 5
bench --workload W3 --steps "${W_STEPS:-100}" --warmup 5
bench --workload gpt2-124m --precision bf16 --steps "$GPT2_STEPS" --warmup 3

# PyTorch on the same GPU, same model and batch (bench/torch_gpt2_cuda.py),
# where the python3 on the PATH has torch with CUDA.
if python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>/dev/null; then
    for mode in ${TORCH_MODES:-compile bf16}; do
        section "torch $mode gpt2-124m"
        timeout "${TORCH_TIMEOUT:-300}" python3 bench/torch_gpt2_cuda.py --mode $mode \
            --steps "$GPT2_STEPS" --json "$JSON" || fails=$((fails + 1))
    done
else
    section "torch: no python3 with CUDA torch here, the reference is skipped"
fi

section "figures ($JSON)"
cat "$JSON" 2>/dev/null
section "done: $fails part(s) failed"
[ "$fails" -eq 0 ]
