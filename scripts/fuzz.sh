#!/bin/sh
# Builds the libFuzzer harnesses (tests/fuzz) with clang, ASan and UBSan in
# build-fuzz/ and runs each for FUZZ_SECONDS (default 30) from its seed corpus
# tests/fuzz/corpus/<target>/. New inputs go to build-fuzz/corpus/<target>
# (the committed seeds are not touched); a crash is saved as
# build-fuzz/crashes/<target>/crash-* (replaced by the target's next run) and
# makes the script exit 1 after all targets ran. Usage: scripts/fuzz.sh [target ...]   (default: all)
#   FUZZ_SECONDS=300 scripts/fuzz.sh npy csv
set -u
cd "$(dirname "$0")/.."
SECONDS_EACH=${FUZZ_SECONDS:-30}
BUILD=${FUZZ_BUILD:-build-fuzz}
JOBS=${JOBS:-$(nproc)}
ALL="audit config csv graph idx manifest npy safetensors tokens"
TARGETS=${*:-$ALL}

cmake -S . -B "$BUILD" -DCMAKE_C_COMPILER=clang -DCMAKE_BUILD_TYPE=Debug -DTESSEL_FUZZ=ON \
    >/dev/null || exit 2
if ! cmake --build "$BUILD" -j "$JOBS" --target $(for t in $TARGETS; do printf 'fuzz_%s ' "$t"; done) \
    >"$BUILD/fuzz-build.log" 2>&1; then
    tail -30 "$BUILD/fuzz-build.log" >&2
    exit 2
fi

failed=""
for t in $TARGETS; do
    work="$BUILD/corpus/$t" crashes="$BUILD/crashes/$t" log="$BUILD/fuzz-$t.log"
    # A target's findings are those of its latest run: move earlier ones
    # into the corpus (fixed) or keep them elsewhere before running again.
    rm -rf "$crashes"
    mkdir -p "$work" "$crashes"
    # -timeout: an input taking longer than 10 s is reported as a hang;
    # -rss_limit_mb: a reader that allocates what the input claims is a finding.
    ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 \
    "$BUILD/fuzz_$t" -max_total_time="$SECONDS_EACH" -timeout=10 -rss_limit_mb=2048 \
        -max_len=65536 -artifact_prefix="$crashes/" -print_final_stats=1 \
        "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    found=$(ls "$crashes" | wc -l)
    printf '%-12s %10s runs  %-10s findings %s%s\n' "$t" "${execs:-?}" "${cov:-}" "$found" \
        "$([ $rc -ne 0 ] && echo "  (exit $rc, see $log)")"
    [ $rc -ne 0 ] || [ "$found" -ne 0 ] && failed="$failed $t"
done
if [ -n "$failed" ]; then
    echo "fuzz: findings in:$failed (inputs in $BUILD/crashes/)" >&2
    exit 1
fi
