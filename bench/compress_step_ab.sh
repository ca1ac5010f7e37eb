#!/bin/bash
# [ROUNDS=3] [STEPS=8] [EXTRA=...] compress_step_ab.sh OLD_TESSEL NEW_TESSEL — the top-k
# step's own work on W3's model, two builds side by side (docs/distributed.md,
# "Gradient compression", "Measured").
#
# ROUNDS times, alternating OLD and NEW: `tessel train examples/w3.yaml --procs 2`
# (shm transport on this host; W3's 23.2 M parameters on 2 sequences of 8 tokens,
# one thread, as bench/compress_netns.sh) with dist.compress topk and --trace; prints
# per run the median step time (steps 2 to STEPS, metrics.jsonl) and rank 0's mean
# time per step in compress_start, compress_wait and adam_update (steps 2 on, from the
# Chrome trace), then the medians over the rounds. The load average is printed with
# each round: compare the two columns of one run of this script, not runs apart.
set -eu
OLD=$(realpath "$1")
NEW=$(realpath "$2")
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-8}
CFG="examples/w3.yaml --set model.batch=2 --set model.ctx=8 --set train.threads=1 --set dist.compress=topk ${EXTRA:-}"
dir=$(mktemp -d /tmp/tessel-compress-ab-XXXXXX)
trap 'rm -rf "$dir"' EXIT
summary() { # RUN_DIR TRACE -> "step_ms start_ms wait_ms adam_ms"
    python3 - "$1/metrics.jsonl" "$2" <<'PY'
import json, sys, statistics
steps = [json.loads(l) for l in open(sys.argv[1])]
ms = [2 * 1000.0 / s["samples_per_s"] for s in steps
      if s.get("type") == "train" and s["step"] >= 2 and s.get("samples_per_s", 0) > 0]
ev = [e for e in json.load(open(sys.argv[2]))["traceEvents"] if e.get("ph") == "X" and e.get("pid") == 0]
firsts = sorted(e["ts"] for e in ev if e["name"] == "gather" and "wte" in e["args"].get("label", ""))
tot = {"compress_start": 0.0, "compress_wait": 0.0, "adam_update": 0.0}
for e in ev:
    if e["ts"] >= firsts[1] and e["name"] in tot:
        tot[e["name"]] += e["dur"] / 1000.0
n = len(firsts) - 1
print("%.1f %.1f %.1f %.1f" % (statistics.median(ms), tot["compress_start"] / n,
                               tot["compress_wait"] / n, tot["adam_update"] / n))
PY
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
echo "compress_step_ab: $(lscpu | sed -n 's/^Model name: *//p'); $CFG --steps $STEPS --procs 2"
echo "columns: step, compress_start, compress_wait, adam_update (ms, per step)"
for r in $(seq "$ROUNDS"); do
    for v in old new; do
        T=$OLD
        [ $v = new ] && T=$NEW
        rm -rf "$dir/run"
        # shellcheck disable=SC2086
        "$T" train $CFG --steps "$STEPS" --procs 2 --out "$dir/run" --trace "$dir/trace.json" \
            >"$dir/log" 2>&1 || {
            cat "$dir/log"
            exit 1
        }
        summary "$dir/run" "$dir/trace.json" | tee -a "$dir/$v" | sed "s/^/round $r $v: /;s/\$/ (load $(cut -d' ' -f1 /proc/loadavg))/"
    done
done
for v in old new; do
    echo "median $v: step $(cut -d' ' -f1 "$dir/$v" | median), compress_start $(cut -d' ' -f2 "$dir/$v" | median), compress_wait $(cut -d' ' -f3 "$dir/$v" | median), adam_update $(cut -d' ' -f4 "$dir/$v" | median)"
done
