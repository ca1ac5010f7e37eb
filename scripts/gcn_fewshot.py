#!/usr/bin/env python3
"""Writes examples/data/gcn_fewshot: the graph of examples/gcn_lora.yaml, a
GCN pretrained on one set of node features and fine-tuned few-shot on
another. Deterministic (seed 19), standard library only.

300 nodes in 3 communities (node i in community i % 3, its label); each
pair is joined with probability 0.05 inside a community and 0.004 across.
Two feature sets of 8 columns, N(0, 1) noise plus 1.0 at one column of the
label: x_pretrain.npy marks column label, x_finetune.npy column 3 + label
(the same patients, measured with other markers). The base trains on
x_pretrain with most labels (split_pretrain.npy: 200 train, 50 val, 50
test); the fine-tuning run sees x_finetune and ten labelled nodes
(split_finetune.npy: 10 train, 90 val, 200 test), so the frozen base, whose
first layer reads the old columns, has to be adapted.

    python3 scripts/gcn_fewshot.py [OUTDIR]
"""
import os
import random
import sys

from npy_write import write_npy

NODES, FEATURES, CLASSES = 300, 8, 3


def features(rng, label, first):
    x = []
    for i in range(NODES):
        for f in range(FEATURES):
            x.append(rng.gauss(0.0, 1.0) + (1.0 if f == first + label[i] else 0.0))
    return x


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "examples/data/gcn_fewshot"
    os.makedirs(out, exist_ok=True)
    rng = random.Random(19)
    label = [i % CLASSES for i in range(NODES)]
    edges = []
    for a in range(NODES):
        for b in range(a + 1, NODES):
            p = 0.05 if label[a] == label[b] else 0.004
            if rng.random() < p:
                edges.append((a, b))
    x_pre, x_ft = features(rng, label, 0), features(rng, label, 3)
    order = list(range(NODES))
    rng.shuffle(order)
    pre, ft = [0] * NODES, [2] * NODES
    for k, i in enumerate(order):
        pre[i] = 0 if k < 200 else (1 if k < 250 else 2)
    # ten labelled nodes, at least three of each class; 90 val, 200 test
    shots = [i for i in order if label[i] == 0][:4] + [i for i in order if label[i] == 1][:3] + \
        [i for i in order if label[i] == 2][:3]
    rest = [i for i in order if i not in shots]
    for i in shots:
        ft[i] = 0
    for i in rest[:90]:
        ft[i] = 1
    with open(os.path.join(out, "edges.csv"), "w") as f:
        f.write("# %d nodes in %d communities; scripts/gcn_fewshot.py\nsrc,dst\n" % (NODES, CLASSES))
        for a, b in edges:
            f.write("%d,%d\n" % (a, b))
    write_npy(os.path.join(out, "x_pretrain.npy"), "<f4", (NODES, FEATURES), x_pre, "f")
    write_npy(os.path.join(out, "x_finetune.npy"), "<f4", (NODES, FEATURES), x_ft, "f")
    write_npy(os.path.join(out, "y.npy"), "<i8", (NODES,), label, "q")
    write_npy(os.path.join(out, "split_pretrain.npy"), "<i8", (NODES,), pre, "q")
    write_npy(os.path.join(out, "split_finetune.npy"), "<i8", (NODES,), ft, "q")


if __name__ == "__main__":
    main()
