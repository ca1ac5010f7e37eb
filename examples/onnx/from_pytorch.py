#!/usr/bin/python3
"""Step 1 of examples/onnx/README.md: a PyTorch model exported to ONNX for
tessel to train.

    /usr/bin/python3 examples/onnx/from_pytorch.py --out DIR

Writes DIR/model.onnx (a small classifier, exported in training mode
without constant folding so the parameters keep their state-dict names),
DIR/x.npy and DIR/y.npy (512 examples, 3 classes) and DIR/train.yaml, the
tessel config that trains it. Needs Debian's python3-torch and python3-onnx."""
import argparse
import os

import numpy
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 32)
        self.norm = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(F.gelu(self.norm(self.fc1(x))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(0)
    model = Classifier()
    path = os.path.join(a.out, "model.onnx")
    torch.onnx.export(model, (torch.zeros(16, 12),), path, opset_version=17,
                      input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    onnx.checker.check_model(onnx.load(path))
    g = torch.Generator().manual_seed(7)
    x = torch.randn(512, 12, generator=g)
    s = x[:, :6].sum(dim=1)
    y = (s > -1).long() + (s > 1).long()
    numpy.save(os.path.join(a.out, "x.npy"), x.numpy().astype("<f4"))
    numpy.save(os.path.join(a.out, "y.npy"), y.numpy().astype("<i8"))
    with open(os.path.join(a.out, "train.yaml"), "w") as f:
        f.write("model: {name: onnx, onnx: model.onnx, batch: 16, loss: cross_entropy}\n"
                f"data: {{source: npy, x: {a.out}/x.npy, y: {a.out}/y.npy, val_fraction: 0.25}}\n"
                "train: {steps: 300, optimizer: adamw, lr: 0.01, seed: 1}\n"
                "ckpt: {every: 300}\n")
    print(f"wrote {path}, x.npy [512, 12], y.npy [512] and train.yaml in {a.out}")


if __name__ == "__main__":
    main()
