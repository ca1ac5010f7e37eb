#!/bin/bash
# [WORKLOADS="w1 w3"] [EXTRA="--set dist.zero=1"] [OLD=other/tessel] [STEPS=N] repro_cost.sh [TESSEL] [ROUNDS]
# — the cost of dist.reproducible at 2 processes (docs/reproducibility.md, "Cost"). For W1 and
# W3 it alternates, ROUNDS times, three trainings on 2 processes: without the key, with it
# (dist.microbatch default: batch / 4, so 2 rounds per process and step) and with
# dist.microbatch = batch / 2 (one round: the plain step's rows), and prints each one's median
# samples/s (the median over its steps that `tessel train` reports) and the CPU seconds the run
# used (user + system, every process, start-up included: less disturbed by other jobs on a
# shared machine than the wall clock), with the ratios to the plain run, round by round, and
# the load average before each round. EXTRA: settings added to all three (ZeRO-1: the
# reproducible runs then update their shards from the tree's sums). OLD: a second build (e.g.
# before a change), whose three runs alternate with TESSEL's in every round (old first). STEPS:
# steps per run instead of 30 (W1) and 8 (W3); longer runs weigh the start-up less. Under each
# round's line, the reproducible run's waits at its meetings, per rank, where the build prints them.
set -eu
T=${1:-build/tessel}
R=${2:-3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
rate() { sed -n 's/.*median \([0-9.]*\) .*/\1/p' "$1" | tail -1; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
ratio() { awk "BEGIN{printf \"%.3f\", $1/$2}"; }
builds="new"
[ -n "${OLD:-}" ] && builds="old new"
bin() { if [ "$1" = old ]; then echo "$OLD"; else echo "$T"; fi; }
for w in ${WORKLOADS:-w1 w3}; do
    case $w in
    w1) cfg="examples/w1.yaml --steps ${STEPS:-30}" half=128 ;;
    w3) cfg="examples/w3.yaml --steps ${STEPS:-8}" half=4 ;;
    esac
    for b in $builds; do
        for v in plain repro half; do : >"$out/$w.$b.$v" && : >"$out/$w.$b.$v.cpu"; done
    done
    for r in $(seq "$R"); do
        echo "$w round $r: load $(cut -d' ' -f1-3 /proc/loadavg)"
        for b in $builds; do
            for v in plain repro half; do
                case $v in
                plain) sets="" ;;
                repro) sets="--set dist.reproducible=true" ;;
                half) sets="--set dist.reproducible=true --set dist.microbatch=$half" ;;
                esac
                rm -rf "$out/run"
                # shellcheck disable=SC2086
                /usr/bin/time -f "cpu %U %S" -o "$out/time" "$(bin $b)" train $cfg --procs 2 $sets ${EXTRA:-} --out "$out/run" >"$out/log" 2>&1 || {
                    cat "$out/log"
                    exit 1
                }
                rate "$out/log" >>"$out/$w.$b.$v"
                # the split finish's waits per rank (builds that print them): who holds up whom
                if [ "$v" = repro ]; then grep '^dist.reproducible: .*meetings' "$out/log" >"$out/$w.$b.waits" || :; fi
                awk '/^cpu/ {print $2 + $3}' "$out/time" >>"$out/$w.$b.$v.cpu"
            done
        done
        for b in $builds; do
            f="$out/$w.$b"
            p=$(tail -1 "$f.plain") a=$(tail -1 "$f.repro") h=$(tail -1 "$f.half")
            pc=$(tail -1 "$f.plain.cpu") ac=$(tail -1 "$f.repro.cpu") hc=$(tail -1 "$f.half.cpu")
            echo "$w round $r ($b): rate plain $p, reproducible $a ($(ratio "$a" "$p")), batch/2 $h ($(ratio "$h" "$p")); cpu s plain $pc, reproducible $ac ($(ratio "$ac" "$pc")), batch/2 $hc ($(ratio "$hc" "$pc"))"
            if [ -s "$f.waits" ]; then echo "  reproducible ($b): $(cat "$f.waits")"; fi
        done
    done
    for b in $builds; do
        f="$out/$w.$b"
        p=$(median <"$f.plain") a=$(median <"$f.repro") h=$(median <"$f.half")
        pc=$(median <"$f.plain.cpu") ac=$(median <"$f.repro.cpu") hc=$(median <"$f.half.cpu")
        echo "$w medians ($b): rate plain $p, reproducible $a (cost $(awk "BEGIN{printf \"%.1f\", 100*(1-$a/$p)}") %), batch/2 $h (cost $(awk "BEGIN{printf \"%.1f\", 100*(1-$h/$p)}") %); cpu s plain $pc, reproducible $ac (+$(awk "BEGIN{printf \"%.1f\", 100*($ac/$pc-1)}") %), batch/2 $hc (+$(awk "BEGIN{printf \"%.1f\", 100*($hc/$pc-1)}") %)"
    done
done
