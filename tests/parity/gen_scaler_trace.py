#!/usr/bin/env python3
"""Trace of torch's GradScaler (dynamic loss scaling) for tests/unit/scaler.c.

A deliberately huge initial scale (2**127) makes the first steps overflow
in f32: the scaler backs off step by step until the gradients are finite,
grows again after `growth_interval` clean steps, overflows again, and so
on. The model is one nn.Linear(4, 3) with an MSE loss on a fixed batch,
trained with SGD(lr=0.05) through scaler.scale(loss).backward(),
scaler.step(opt), scaler.update(). Every number is written exactly
(float.hex), so the test compares scale, found_inf and the growth tracker
bit for bit, and the loss and weights with a tolerance.

Needs torch >= 2.3 (torch.amp.GradScaler("cpu"): torch._amp_update_scale_
has a CPU kernel). Debian's python3-torch 1.13 has none, so the committed
file was made with PyPI's torch 2.15.0 (CPU) in a venv:

    python3 -m venv /tmp/torch && /tmp/torch/bin/pip install torch
    /tmp/torch/bin/python tests/parity/gen_scaler_trace.py

Output: tests/parity/fixtures/scaler_trace.txt (or --out PATH).
"""
import argparse

import torch

STEPS = 24
INIT_SCALE = 2.0**127
GROWTH, BACKOFF, INTERVAL = 2.0, 0.5, 3
LR = 0.002


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/parity/fixtures/scaler_trace.txt")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Linear(4, 3)
    x = torch.linspace(-2.0, 3.0, 8 * 4).reshape(8, 4) * 8
    t = torch.linspace(1.5, -1.0, 8 * 3).reshape(8, 3) * 64
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    scaler = torch.amp.GradScaler(
        "cpu", init_scale=INIT_SCALE, growth_factor=GROWTH, backoff_factor=BACKOFF,
        growth_interval=INTERVAL)
    lines = [
        f"# torch {torch.__version__}: GradScaler('cpu', init_scale=2**127, growth_factor={GROWTH}, "
        f"backoff_factor={BACKOFF}, growth_interval={INTERVAL}); nn.Linear(4, 3), MSE, SGD lr {LR}",
        f"config {float(INIT_SCALE).hex()} {GROWTH.hex()} {BACKOFF.hex()} {INTERVAL} {LR.hex()} {STEPS}",
        "x " + " ".join(float(v).hex() for v in x.flatten().tolist()),
        "t " + " ".join(float(v).hex() for v in t.flatten().tolist()),
        "w0 " + " ".join(float(v).hex() for v in model.weight.detach().flatten().tolist()),
        "b0 " + " ".join(float(v).hex() for v in model.bias.detach().flatten().tolist()),
        "# step scale_used loss found_inf scale_after growth_tracker_after",
    ]
    for step in range(1, STEPS + 1):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), t)
        used = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        found = sum(v.item() for v in scaler._found_inf_per_device(opt).values())
        scaler.update()
        tracker = scaler._growth_tracker.item()
        lines.append(f"step {step} {float(used).hex()} {float(loss.item()).hex()} {int(found > 0)} "
                     f"{float(scaler.get_scale()).hex()} {tracker}")
    lines.append("w " + " ".join(float(v).hex() for v in model.weight.detach().flatten().tolist()))
    lines.append("b " + " ".join(float(v).hex() for v in model.bias.detach().flatten().tolist()))
    text = "\n".join(lines) + "\n"
    with open(args.out, "w") as f:
        f.write(text)
    print(f"{args.out}: {len(text)} bytes")


if __name__ == "__main__":
    main()
