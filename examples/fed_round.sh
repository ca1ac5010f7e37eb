#!/bin/sh
# The whole federated round, local training included (docs/federated.md, "A
# whole round for 1 M parameters"): an aggregator, a key holder and three
# sites, each a `tessel fed` process on loopback over TLS, train a
# 784-HIDDEN-10 MLP (HIDDEN=1260: 1 001 710 parameters) on Fashion-MNIST
# shards of 2 000, 3 000 and 4 000 images, plain FedAvg (fed.secure: none)
# and Paillier alternating, ALTS times each, ROUNDS rounds per run. Prints
# per round and mode the medians of: local training, encryption and upload
# (the slowest site), the aggregator's broadcast, its wait for the updates,
# its aggregation, the key holder's turn and its decryption, the round; and
# the CPU seconds of each role per round (user + system of the whole
# process, startup included, divided by ROUNDS), since on a shared machine
# wall time says more about the load than about the code.
#
#     examples/fed_round.sh [WORKDIR]
#
# With SUMMARY=1 it runs nothing and prints the figures of the runs already
# in WORKDIR (ALTS of them per mode), e.g. of a run cut short.
#
# Environment (defaults): TESSEL (build/tessel), ALTS (3), ROUNDS (2),
# STEPS (60: one epoch of the 3 000-image shard at batch 50), HIDDEN (1260),
# BITS (2048), POOL (11236: the r^n of one round of 1 M parameters),
# THREADS (1: each site's training threads), MODES ("none paillier").
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
TESSEL=${TESSEL:-$ROOT/build/tessel}
W=${1:-/tmp/tessel-fed-round}
ALTS=${ALTS:-3} ROUNDS=${ROUNDS:-2} STEPS=${STEPS:-60} HIDDEN=${HIDDEN:-1260}
BITS=${BITS:-2048} POOL=${POOL:-11236} THREADS=${THREADS:-1} MODES=${MODES:-none paillier}
[ -x "$TESSEL" ] || { echo "fed_round: no $TESSEL (make first)" >&2; exit 1; }
mkdir -p "$W"
[ -f "$W/sh/shard3-labels.idx" ] || "$ROOT/scripts/fed-idx-shards.sh" "$W/sh" 2000 3000 4000
[ -f "$W/ca/site3.key" ] || "$ROOT/scripts/fed-test-ca.sh" "$W/ca" aggregator keyholder site1 site2 site3 >/dev/null
[ -f "$W/sign.key" ] || "$TESSEL" keygen --out "$W/sign" >/dev/null

port=$((20000 + $$ % 20000))
run() { # MODE DIR: one run of the five roles
    mode=$1 d=$2
    rm -rf "$d" && mkdir -p "$d"
    port=$((port + 1))
    cat >"$d/fed.yaml" <<EOF
model: {name: mlp, window: 0, in_dim: 784, hidden: $HIDDEN, n_hidden: 1, layer_norm: false, classes: 10, batch: 50}
data: {source: idx, train_images: $W/sh/shard1-images.idx, train_labels: $W/sh/shard1-labels.idx, val_fraction: 0}
train: {optimizer: adamw, lr: 1.0e-3, steps: $STEPS, seed: 0, threads: $THREADS}
ckpt: {sign_key: $W/sign.key}
fed:
  secure: $mode
  rounds: $ROUNDS
  local_steps: $STEPS
  min_clients: 3
  max_clients: 3
  key_bits: $BITS
  pool: $POOL
  timeout_s: 3600
  join_s: 600
  port: $port
  key: $W/paillier-$BITS.key
  tls: {ca: $W/ca/ca.pem}
EOF
    cd "$d"
    for role in aggregator keyholder site1 site2 site3; do
        case $role in
            aggregator) verb=serve out=agg extra= ;;
            keyholder) verb=keyholder out=kh extra= ;;
            *) verb=join out=$role n=${role#site}
               extra="--set data.train_images=$W/sh/shard$n-images.idx --set data.train_labels=$W/sh/shard$n-labels.idx" ;;
        esac
        # shellcheck disable=SC2086
        /usr/bin/time -f '%U %S %e' -o "$role.time" "$TESSEL" fed $verb fed.yaml \
            --set fed.tls.cert="$W/ca/$role.pem" --set fed.tls.key="$W/ca/$role.key" $extra \
            --out "$out" >"$role.log" 2>&1 &
        if [ $role = aggregator ]; then
            i=0
            until grep -qs 'listening on' aggregator.log || [ $i -ge 600 ]; do sleep 0.1; i=$((i + 1)); done
        fi
    done
    fail=0
    wait || fail=1
    cd - >/dev/null
    for role in aggregator keyholder site1 site2 site3; do
        if grep -qs 'exited with non-zero status\|Command terminated' "$d/$role.time"; then fail=1; fi
    done
    [ $fail = 0 ] || { echo "fed_round: a role failed in $d (logs there)" >&2; exit 1; }
}

echo "fed_round: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg) at the start"
a=1
[ "${SUMMARY:-0}" = 1 ] && a=$((ALTS + 1))
while [ $a -le "$ALTS" ]; do
    for mode in $MODES; do
        run "$mode" "$W/$mode-$a"
        echo "fed_round: $mode run $a done, load $(cut -d' ' -f1-3 /proc/loadavg)"
    done
    a=$((a + 1))
done

python3 - "$W" "$ALTS" "$ROUNDS" "$MODES" <<'EOF'
import json, statistics, sys
w, alts, rounds, modes = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split()
sites = ["site1", "site2", "site3"]
def lines(path):
    with open(path) as f:
        return [json.loads(l) for l in f if l.strip()]
cols = ["train", "encrypt", "upload", "broadcast", "updates", "aggregate", "keyholder", "decrypt", "round"]
rows, cpu, round_of = {}, {}, {}
for m in modes:
    for a in range(1, alts + 1):
        d = f"{w}/{m}-{a}"
        agg = {r["round"]: r for r in lines(f"{d}/agg/rounds.jsonl")}
        kh = {r["round"]: r for r in lines(f"{d}/kh/rounds.jsonl")}
        st = {s: {r["round"]: r for r in lines(f"{d}/{s}/rounds.jsonl")} for s in sites}
        for r in range(1, rounds + 1):
            v = {c: max(st[s][r].get(c + "_s", 0) for s in sites) for c in ["train", "encrypt", "upload"]}
            for c in ["broadcast", "updates", "aggregate", "keyholder", "round"]:
                v[c] = agg[r][c + "_s"]
            v["decrypt"] = kh[r].get("decrypt_s", 0)
            rows.setdefault((m, r), []).append(v)
            round_of[(m, a, r)] = v["round"]
        for role in ["aggregator", "keyholder"] + sites:
            u, s_, e = open(f"{d}/{role}.time").read().split()[-3:]
            cpu.setdefault((m, role), []).append((float(u) + float(s_)) / rounds)
print(f"\nmedians over {alts} runs, seconds (site columns: the slowest of the three)")
print("mode      round | " + " ".join(f"{c:>9}" for c in cols))
for m in modes:
    for r in range(1, rounds + 1):
        vs = rows[(m, r)]
        print(f"{m:9} {r:5} | " + " ".join(f"{statistics.median(v[c] for v in vs):9.3f}" for c in cols))
print("\nCPU seconds per round and role (user + system / rounds, median over runs)")
print("mode      | " + " ".join(f"{r:>10}" for r in ["aggregator", "keyholder"] + sites))
for m in modes:
    print(f"{m:9} | " + " ".join(f"{statistics.median(cpu[(m, r)]):10.2f}" for r in ["aggregator", "keyholder"] + sites))
if len(modes) == 2:
    for r in range(1, rounds + 1):
        q = [round_of[(modes[1], a, r)] / round_of[(modes[0], a, r)] for a in range(1, alts + 1)]
        print(f"round {r}: {modes[1]} / {modes[0]} wall time per alternation: "
              + ", ".join(f"{x:.1f}" for x in q) + f" (median {statistics.median(q):.1f}x)")
EOF
echo "fed_round: load $(cut -d' ' -f1-3 /proc/loadavg) at the end"
