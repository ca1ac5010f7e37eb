#!/usr/bin/env python3
"""Writes examples/data/tiny_graph: a 90-node, 3-community graph for the gcn
example (examples/w5.yaml). Deterministic (seed 5), standard library only.

Nodes 0..89 belong to community i % 3 (their label). Each pair of nodes is
joined with probability 0.12 inside a community and 0.01 across. The 8 node
features are N(0, 1) noise plus 0.6 at position label (a weak signal a
single node cannot be classified by, which averaging over neighbours
sharpens: what a GCN is for).

    python3 scripts/tiny_graph.py [OUTDIR]
"""
import os
import random
import sys

from npy_write import write_npy

NODES, FEATURES, CLASSES = 90, 8, 3


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "examples/data/tiny_graph"
    os.makedirs(out, exist_ok=True)
    rng = random.Random(5)
    label = [i % CLASSES for i in range(NODES)]
    edges = []
    for a in range(NODES):
        for b in range(a + 1, NODES):
            p = 0.12 if label[a] == label[b] else 0.01
            if rng.random() < p:
                edges.append((a, b))
    x = []
    for i in range(NODES):
        for f in range(FEATURES):
            x.append(rng.gauss(0.0, 1.0) + (0.6 if f == label[i] else 0.0))
    with open(os.path.join(out, "edges.csv"), "w") as f:
        f.write("# %d nodes in %d communities; scripts/tiny_graph.py\nsrc,dst\n" % (NODES, CLASSES))
        for a, b in edges:
            f.write("%d,%d\n" % (a, b))
    write_npy(os.path.join(out, "x.npy"), "<f4", (NODES, FEATURES), x, "f")
    write_npy(os.path.join(out, "y.npy"), "<i8", (NODES,), label, "q")


if __name__ == "__main__":
    main()
