#!/bin/bash
# [WORKLOADS="w1 w3"] [EXTRA="--set dist.zero=1"] repro_cost.sh [TESSEL] [ROUNDS] — the cost of
# dist.reproducible at 2 processes
# (docs/reproducibility.md, "Cost"). For W1 and W3 it alternates, ROUNDS times, three
# trainings on 2 processes: without the key, with it (dist.microbatch default: batch / 4,
# so 2 rounds per process and step) and with dist.microbatch = batch / 2 (one round: the
# plain step's rows), and prints each one's median samples/s (the median over its steps
# that `tessel train` reports) and the CPU seconds the run used (user + system, every process,
# start-up included: less disturbed by other jobs on a shared machine than the wall clock),
# with the ratios to the plain run, round by round. EXTRA: settings added to all three (ZeRO-1:
# the reproducible runs then update their shards from the tree's sums).
set -eu
T=${1:-build/tessel}
R=${2:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rate() { sed -n 's/.*median \([0-9.]*\) .*/\1/p' "$1" | tail -1; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for w in ${WORKLOADS:-w1 w3}; do
    case $w in
    w1) cfg="examples/w1.yaml --steps 30" half=128 ;;
    w3) cfg="examples/w3.yaml --steps 8" half=4 ;;
    esac
    : >"$out/$w.plain"; : >"$out/$w.repro"; : >"$out/$w.half"
    : >"$out/$w.plain.cpu"; : >"$out/$w.repro.cpu"; : >"$out/$w.half.cpu"
    for r in $(seq "$R"); do
        for v in plain repro half; do
            case $v in
            plain) sets="" ;;
            repro) sets="--set dist.reproducible=true" ;;
            half) sets="--set dist.reproducible=true --set dist.microbatch=$half" ;;
            esac
            rm -rf "$out/run"
            # shellcheck disable=SC2086
            /usr/bin/time -f "cpu %U %S" -o "$out/time" "$T" train $cfg --procs 2 $sets ${EXTRA:-} --out "$out/run" >"$out/log" 2>&1 || {
                cat "$out/log"
                exit 1
            }
            rate "$out/log" >>"$out/$w.$v"
            awk '/^cpu/ {print $2 + $3}' "$out/time" >>"$out/$w.$v.cpu"
        done
        p=$(tail -1 "$out/$w.plain") a=$(tail -1 "$out/$w.repro") b=$(tail -1 "$out/$w.half")
        pc=$(tail -1 "$out/$w.plain.cpu") ac=$(tail -1 "$out/$w.repro.cpu") bc=$(tail -1 "$out/$w.half.cpu")
        echo "$w round $r: rate plain $p, reproducible $a ($(awk "BEGIN{printf \"%.3f\", $a/$p}")), batch/2 $b ($(awk "BEGIN{printf \"%.3f\", $b/$p}")); cpu s plain $pc, reproducible $ac ($(awk "BEGIN{printf \"%.3f\", $ac/$pc}")), batch/2 $bc ($(awk "BEGIN{printf \"%.3f\", $bc/$pc}"))"
    done
    p=$(median <"$out/$w.plain") a=$(median <"$out/$w.repro") b=$(median <"$out/$w.half")
    pc=$(median <"$out/$w.plain.cpu") ac=$(median <"$out/$w.repro.cpu") bc=$(median <"$out/$w.half.cpu")
    echo "$w medians: rate plain $p, reproducible $a (cost $(awk "BEGIN{printf \"%.1f\", 100*(1-$a/$p)}") %), batch/2 $b (cost $(awk "BEGIN{printf \"%.1f\", 100*(1-$b/$p)}") %); cpu s plain $pc, reproducible $ac (+$(awk "BEGIN{printf \"%.1f\", 100*($ac/$pc-1)}") %), batch/2 $bc (+$(awk "BEGIN{printf \"%.1f\", 100*($bc/$pc-1)}") %)"
done
