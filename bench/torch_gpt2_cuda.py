#!/usr/bin/env python3
"""GPT-2 124M training steps in PyTorch on a CUDA GPU: the reference that
`tessel bench --workload gpt2-124m --backend cuda` is compared with
(issue #17, docs/cuda.md). The model is tessel's gpt2-124m (vocabulary
50257, context 1024, 12 layers of 12 heads, d 768, learned positions, tied
embedding, LayerNorm eps 1e-5, GELU tanh, no dropout), AdamW (lr 3e-4,
betas 0.9/0.999, eps 1e-8, weight decay 0.1), synthetic tokens.

    python3 bench/torch_gpt2_cuda.py --mode compile --batch 16 --steps 30

Modes: eager (fp32), bf16 (autocast), compile (bf16 autocast + torch.compile).
Prints one JSON line: median step time (ms, wall clock around a whole step
with a device synchronise), tokens/s, the torch version and the GPU."""
import argparse
import json
import math
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d, eps=1e-5)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):  # x: [B, T, d]
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab=50257, ctx=1024, d=768, layers=12, heads=12):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d, eps=1e-5)
        for n, p in self.named_parameters():
            if n.endswith("bias"):
                nn.init.zeros_(p)
            elif p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if n.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):  # idx, targets: [B, T] int64
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head, [B, T, vocab]
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="compile", choices=["eager", "bf16", "compile"])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", default=None, help="append the JSON line to this file too")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("torch_gpt2_cuda.py: no CUDA device visible to torch")
    torch.manual_seed(1234)
    dev = torch.device("cuda")
    model = GPT(ctx=a.ctx).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if a.mode == "compile" else model
    batches = [(torch.randint(0, 50257, (a.batch, a.ctx), device=dev),
                torch.randint(0, 50257, (a.batch, a.ctx), device=dev)) for _ in range(4)]

    def step(k):
        x, y = batches[k % 4]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.mode != "eager"):
            loss = fwd(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    times, first = [], None
    for k in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step(k)
        lv = loss.item()  # waits for the step, as a training loop reading its loss does
        if k == 0:
            first = lv
        if k >= a.warmup:
            times.append(time.perf_counter() - t0)
    ms = 1e3 * statistics.median(times)
    r = {"workload": "gpt2-124m", "framework": "torch", "torch": torch.__version__,
         "gpu": torch.cuda.get_device_name(0), "mode": a.mode, "batch": a.batch, "ctx": a.ctx,
         "steps": a.steps, "step_ms": round(ms, 3), "tokens_per_s": round(a.batch * a.ctx / ms * 1e3),
         "loss_first": round(first, 4), "loss_last": round(lv, 4),
         "max_mem_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1)}
    line = json.dumps(r)
    print(line, flush=True)
    if a.json:
        with open(a.json, "a") as f:
            f.write(line + "\n")


if __name__ == "__main__":
    main()
