#!/bin/bash
# [ROUNDS=3] [WORKLOAD=W3] [PRECISION=bf16] [THREADS=1] [STEPS=3] step_ab.sh OLD_TESSEL NEW_TESSEL [OP...]
# Two builds' training steps side by side (docs/benchmarks.md): ROUNDS times, OLD then NEW,
# `tessel bench --workload WORKLOAD --precision PRECISION --steps STEPS --warmup 1 --threads
# THREADS --profile`; prints per run the median step and the ms a step of each OP named
# (default: matmul matmul_epi layer_norm_bwd sum gelu) with the load average, then per binary
# the medians over the rounds and the median of the rounds' NEW / OLD step ratios. Alternating
# spreads a drifting load over both builds; compare the columns of one run of this script.
set -eu
OLD=$(realpath "$1")
NEW=$(realpath "$2")
shift 2
OPS=${*:-matmul matmul_epi layer_norm_bwd sum gelu}
ROUNDS=${ROUNDS:-3}
out=$(mktemp /tmp/tessel-step-ab-XXXXXX)
trap 'rm -f "$out"' EXIT
for r in $(seq "$ROUNDS"); do
    for which in old new; do
        bin=$OLD
        [ "$which" = new ] && bin=$NEW
        "$bin" bench --workload "${WORKLOAD:-W3}" --precision "${PRECISION:-bf16}" \
            --steps "${STEPS:-3}" --warmup 1 --threads "${THREADS:-1}" --profile >"$out.run" 2>&1
        line=$(awk -v ops=" $OPS " -v w="$which" -v r="$r" '
            /median step/ { for (i = 1; i < NF; i++) if ($i == "step") step = $(i + 1) }
            index(ops, " " $1 " ") && $2 ~ /^[0-9.]+$/ { t[$1] = $2 }
            END {
                n = split(ops, o, " ")
                printf "%s %s step %s", r, w, step
                for (i = 1; i <= n; i++) printf " %s %s", o[i], (o[i] in t) ? t[o[i]] : "-"
            }' "$out.run")
        echo "$line load $(cut -d' ' -f1 /proc/loadavg)" | tee -a "$out"
    done
done
rm -f "$out.run"
python3 - "$out" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
for w in ("old", "new"):
    rs = [r for r in rows if r[1] == w]
    cols = {rs[0][i]: statistics.median(float(r[i + 1]) for r in rs if r[i + 1] != "-")
            for i in range(2, len(rs[0]) - 2, 2) if any(r[i + 1] != "-" for r in rs)}
    print(w, "medians:", "  ".join(f"{k} {v:.1f}" for k, v in cols.items()))
ratio = [float(n[3]) / float(o[3]) for o, n in zip([r for r in rows if r[1] == "old"],
                                                    [r for r in rows if r[1] == "new"])]
print("new / old step, per round:", " ".join(f"{x:.3f}" for x in ratio),
      f"(median {statistics.median(ratio):.3f})")
PY
