#!/bin/bash
# fed-idx-shards.sh OUT_DIR N1 [N2 ...] — cuts an IDX image/label pair into
# disjoint shards of N1, N2, ... consecutive examples (shard 1 the first N1,
# shard 2 the next N2, ...), one per federated client (docs/federated.md):
# OUT_DIR/shardK-images.idx and OUT_DIR/shardK-labels.idx, uncompressed IDX
# files (a header with the shard's count, then its bytes) that data.source:
# idx reads like the originals. The pair is $IMAGES and $LABELS, by default
# the Fashion-MNIST training set of the Debian package dataset-fashion-mnist.
#
#     scripts/fed-idx-shards.sh /tmp/fmnist 2000 3000 4000
set -eu
if [ $# -lt 2 ]; then
    echo "usage: $0 OUT_DIR N1 [N2 ...]" >&2
    exit 2
fi
out=$1
shift
images=${IMAGES:-/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz}
labels=${LABELS:-/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz}
sizes="$*"
need=0
for n in $sizes; do
    case "$n" in '' | *[!0-9]*) echo "fed-idx-shards: shard size '$n' is not a number" >&2; exit 2 ;; esac
    [ "$n" -ge 1 ] || { echo "fed-idx-shards: shard sizes must be at least 1" >&2; exit 2; }
    need=$((need + n))
done
for f in "$images" "$labels"; do
    [ -r "$f" ] || { echo "fed-idx-shards: cannot read $f" >&2; exit 2; }
done
mkdir -p "$out"

be32() { # a number as 4 big-endian bytes
    printf "\\$(printf %03o $(($1 >> 24 & 255)))\\$(printf %03o $(($1 >> 16 & 255)))"
    printf "\\$(printf %03o $(($1 >> 8 & 255)))\\$(printf %03o $(($1 & 255)))"
}
# header fields: magic (0 0 8 rank), then one big-endian u32 per dimension
lhead=$(zcat -f "$labels" | head -c 8 | od -An -tu1 | tr -s ' \n' ' ')
ihead=$(zcat -f "$images" | head -c 16 | od -An -tu1 | tr -s ' \n' ' ')
set -- $lhead
[ "$1 $2 $3 $4" = "0 0 8 1" ] || { echo "fed-idx-shards: $labels is not an IDX file of u8 labels" >&2; exit 2; }
total=$(($5 * 16777216 + $6 * 65536 + $7 * 256 + $8))
set -- $ihead
[ "$1 $2 $3 $4" = "0 0 8 3" ] || { echo "fed-idx-shards: $images is not an IDX file of u8 images" >&2; exit 2; }
[ $(($5 * 16777216 + $6 * 65536 + $7 * 256 + $8)) = "$total" ] ||
    { echo "fed-idx-shards: $images and $labels differ in their counts" >&2; exit 2; }
rows=$(($9 * 16777216 + ${10} * 65536 + ${11} * 256 + ${12}))
cols=$((${13} * 16777216 + ${14} * 65536 + ${15} * 256 + ${16}))
if [ "$need" -gt "$total" ]; then
    echo "fed-idx-shards: the shards need $need examples, $labels has $total" >&2
    exit 2
fi
pixels=$((rows * cols))
k=0 first=0
for per in $sizes; do
    k=$((k + 1))
    { printf '\000\000\010\003'; be32 "$per"; be32 "$rows"; be32 "$cols"
      zcat -f "$images" | tail -c +$((16 + first * pixels + 1)) | head -c $((per * pixels)); } \
        >"$out/shard$k-images.idx"
    { printf '\000\000\010\001'; be32 "$per"
      zcat -f "$labels" | tail -c +$((8 + first + 1)) | head -c "$per"; } >"$out/shard$k-labels.idx"
    first=$((first + per))
done
