#!/usr/bin/env python3
"""Writes examples/data/fusion_sensors: 256 examples for the fusion model of
examples/fusion_valid.yaml whose sensors fail now and then, and the file
that says which did (data.valid). Deterministic (seed 7), standard library
only.

Each example has a hidden value z ~ N(0, 1), the target. Three sources see
it through noise, in the model's layout of 112 values (model.in_dim):
a 1 x 8 x 8 camera (64 values: z times a fixed pattern, plus noise), a
sequence of 8 steps of 4 features (32 values: z plus noise) and 16 tabular
values (z times fixed weights, plus noise). Each source of each example
fails with probability 0.3 (at least one works): a failed sensor reports a
stuck reading, 4.0 in every value, and valid.npy marks it 0.

    python3 scripts/fusion_sensors.py [OUTDIR]
"""
import os
import random
import sys

from npy_write import write_npy

N, CAM, SEQ, TAB = 256, 64, 32, 16
P_FAIL, STUCK = 0.3, 4.0


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "examples/data/fusion_sensors"
    os.makedirs(out, exist_ok=True)
    rng = random.Random(7)
    pattern = [rng.uniform(-1, 1) for _ in range(CAM)]
    weights = [rng.uniform(-1, 1) for _ in range(TAB)]
    x, y, valid = [], [], []
    for _ in range(N):
        z = rng.gauss(0, 1)
        ok = [rng.random() >= P_FAIL for _ in range(3)]
        if not any(ok):
            ok[rng.randrange(3)] = True
        cam = [z * p + rng.gauss(0, 0.5) for p in pattern]
        seq = [z + rng.gauss(0, 1) for _ in range(SEQ)]
        tab = [z * w + rng.gauss(0, 0.5) for w in weights]
        for k, part in enumerate((cam, seq, tab)):
            x += part if ok[k] else [STUCK] * len(part)
        y.append(z)
        valid += [int(v) for v in ok]
    write_npy(os.path.join(out, "x.npy"), "<f4", (N, CAM + SEQ + TAB), x, "f")
    write_npy(os.path.join(out, "y.npy"), "<f4", (N, 1), y, "f")
    write_npy(os.path.join(out, "valid.npy"), "|u1", (N, 3), valid, "B")


if __name__ == "__main__":
    main()
