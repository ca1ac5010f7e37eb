#!/bin/bash
# [RATE=1gbit] [ROUNDS=3] [STEPS=8] [BATCH=2] [CTX=8] [EXTRA=...] compress_netns.sh [TESSEL] — gradient
# compression over a slow link (docs/distributed.md, "Gradient compression", "Measured").
#
# Two "hosts" as in examples/cluster/netns.sh (network namespaces joined by a veth
# pair), ONE MPI rank each, and a token-bucket limit on both ends of the pair:
#     tc qdisc add dev veth0 root tbf rate $RATE burst 1mbit latency 100ms
# Then, ROUNDS times, alternating: `tessel train examples/w3.yaml` (model.batch BATCH,
# model.ctx CTX, one thread, EXTRA added) with dist.compress none and
# with topk (ratio 0.001, E4M3 values) under mpirun -np 2; prints each run's median
# step time (steps 2 to STEPS; from metrics.jsonl's samples_per_s: BATCH over it) and,
# at the end, the median over the rounds of each and of their ratio. This is W3's
# model (23.2 M parameters, so the same 93 MB of gradients per step) on far fewer
# tokens than W3's batch (8 x 256), so that the exchange and not the compute of two
# loaded cores dominates the dense step.
#
# Needs root, iproute2 (ip, tc) and mpirun; otherwise it says why and exits 77
# (skipped). Removes the namespaces on every exit.
set -eu
T=$(realpath "${1:-build/tessel}")
RATE=${RATE:-1gbit}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-8}
BATCH=${BATCH:-2}
CTX=${CTX:-8}
CFG="examples/w3.yaml --set model.batch=$BATCH --set model.ctx=$CTX --set train.threads=1 --set dist.algo=native ${EXTRA:-}"
for tool in ip tc mpirun; do
    command -v $tool >/dev/null 2>&1 || {
        echo "compress_netns: skipped: $tool not found"
        exit 77
    }
done
if [ "$(id -u)" != 0 ]; then
    echo "compress_netns: skipped: needs root (network namespaces, tc)"
    exit 77
fi
. "$(dirname "$0")/../scripts/netns-hosts.sh"
netns_hosts_up tessel-cz 10.78.0 1 "$RATE"
dir=$NETNS_DIR
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
echo "compress_netns: $(lscpu | sed -n 's/^Model name: *//p'); link tbf $RATE; $CFG --steps $STEPS; load $(cut -d' ' -f1-3 /proc/loadavg)"
: >"$dir/none" ; : >"$dir/topk" ; : >"$dir/ratio"
for r in $(seq "$ROUNDS"); do
    for v in none topk; do
        rm -rf "$dir/run"
        # shellcheck disable=SC2086
        netns_mpirun -np 2 "$T" train $CFG --steps "$STEPS" --set dist.compress=$v --out "$dir/run" \
            >"$dir/log" 2>&1 || {
            cat "$dir/log"
            exit 1
        }
        # the step times of steps 2.. (the first one pays for the first touches)
        sed -n 's/.*"type":"train","step":\([0-9]*\),.*"samples_per_s":\([0-9.e+-]*\).*/\1 \2/p' \
            "$dir/run/metrics.jsonl" | awk -v b="$BATCH" '$1 >= 2 && $2 > 0 {printf "%.1f\n", 1000 * b / $2}' \
            >"$dir/steps"
        [ -s "$dir/steps" ] || {
            echo "compress_netns: no step times in $dir/run/metrics.jsonl:"
            cat "$dir/log"
            exit 1
        }
        median <"$dir/steps" >>"$dir/$v"
    done
    n=$(tail -1 "$dir/none") t=$(tail -1 "$dir/topk")
    awk "BEGIN{printf \"%.3f\n\", $n / $t}" >>"$dir/ratio"
    echo "round $r: step none $n ms, topk $t ms, topk faster by $(tail -1 "$dir/ratio")x (load $(cut -d' ' -f1 /proc/loadavg))"
done
echo "medians over $ROUNDS rounds: none $(median <"$dir/none") ms, topk $(median <"$dir/topk") ms, topk faster by $(median <"$dir/ratio")x"
