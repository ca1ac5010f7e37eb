#!/bin/sh
# [STEPS=2000] [CONFIG=examples/w3_bf16.yaml] [CORPUS=/usr/lib/python3.11] [RUNS="..."]
# compress_converge.sh [TESSEL] [OUT_DIR] — W3 trained on text with and without gradient
# compression, 2 processes, 1 thread each, and the final training losses side by side.
#
# W3's synthetic tokens are uniform, so every run ends at ln(8192) and a convergence
# comparison on them says nothing. This script writes a byte-level token file of real text
# instead: the .py files under CORPUS (sorted by path, one uint16 token per byte; Debian's
# Python standard library by default, 11.3 M tokens, more than 2 000 steps of 8 x 256 read).
# Then, one after the other, the runs of RUNS (each "NAME|--set ... --set ..."), STEPS steps
# each, the same seed and data; at the end a table of the loss at steps 100, 500, 1 000 and the
# mean of the last 100 steps, each compressed run against the uncompressed run of its optimizer.
# The runs are deterministic: a rerun gives the same losses, whatever the load.
# Curves: `tessel plot OUT_DIR/NAME`.
set -eu
T=${1:-build/tessel}
OUT=${2:-/tmp/tessel-converge}
STEPS=${STEPS:-2000}
CONFIG=${CONFIG:-examples/w3_bf16.yaml}
CORPUS=${CORPUS:-/usr/lib/python3.11}
SGD="--set train.optimizer=sgd --set train.lr=0.1 --set train.momentum=0.9 --set train.weight_decay=0 --set train.clip_grad_norm=1"
RUNS=${RUNS:-"sgd_none|$SGD
sgd_topk_mc|$SGD --set dist.compress=topk --set dist.compress_momentum=true --set dist.compress_dense_steps=200
sgd_powersgd4|$SGD --set dist.compress=powersgd --set dist.compress_rank=4 --set dist.compress_dense_steps=200"}

mkdir -p "$OUT"
if [ ! -s "$OUT/corpus.u16" ]; then
    python3 - "$CORPUS" "$OUT/corpus.u16" <<'EOF'
import array, pathlib, sys
files = sorted(p for p in pathlib.Path(sys.argv[1]).rglob("*.py") if p.is_file())
tokens = array.array("H")
for p in files:
    tokens.extend(p.read_bytes())
if tokens.itemsize != 2 or sys.byteorder != "little":
    sys.exit("compress_converge: needs 16-bit little-endian arrays")
pathlib.Path(sys.argv[2]).write_bytes(tokens.tobytes())
print(f"compress_converge: {len(files)} files under {sys.argv[1]}, {len(tokens)} tokens")
EOF
fi
# alerts.defaults=false: the default rules pause a run at a gradient-norm spike until `tessel ctl
# resume` (or 600 s), which an unattended comparison should not wait for; the spikes are in the curves.
DATA="--set alerts.defaults=false --set data.source=tokens --set data.path=$OUT/corpus.u16 --set data.bits=16 --set data.drop_last=true --set data.val_fraction=0"
echo "compress_converge: $(lscpu | sed -n 's/^Model name: *//p'); $CONFIG, $STEPS steps, 2 processes; load $(cut -d' ' -f1-3 /proc/loadavg)"

echo "$RUNS" | while IFS='|' read -r name sets; do
    [ -n "$name" ] || continue
    if [ -s "$OUT/$name/metrics.jsonl" ] && [ "$(grep -c '"type":"train"' "$OUT/$name/metrics.jsonl")" -ge "$STEPS" ]; then
        echo "compress_converge: $name: done before, kept"
        continue
    fi
    rm -rf "$OUT/$name"
    start=$(date +%s)
    # shellcheck disable=SC2086 # the sets are words
    "$T" train "$CONFIG" --procs 2 --steps "$STEPS" --set train.threads=1 $DATA $sets \
        --out "$OUT/$name" >"$OUT/$name.log" 2>&1 || {
        echo "compress_converge: $name failed:" >&2
        tail -5 "$OUT/$name.log" >&2
        exit 1
    }
    echo "compress_converge: $name: $(($(date +%s) - start)) s, $(tail -2 "$OUT/$name.log" | head -1)"
done

python3 - "$OUT" "$RUNS" <<'EOF'
import json, sys
out, runs = sys.argv[1], [r.split("|")[0] for r in sys.argv[2].splitlines() if r.strip()]
def losses(name):
    with open(f"{out}/{name}/metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    return [r["loss"] for r in rows if r.get("type") == "train"]
print("| run | step 100 | step 500 | step 1 000 | last 100 steps | vs. uncompressed |")
print("|---|---|---|---|---|---|")
ref = {}
for name in runs:
    l = losses(name)
    last = sum(l[-100:]) / len(l[-100:])
    opt = name.split("_")[0]
    ref.setdefault(opt, last)
    at = lambda s: f"{l[s - 1]:.4f}" if len(l) >= s else "-"
    rel = "" if ref[opt] == last and name.endswith("_none") else f"{100 * (last / ref[opt] - 1):+.2f} %"
    print(f"| {name} | {at(100)} | {at(500)} | {at(1000)} | {last:.5f} | {rel} |")
EOF
