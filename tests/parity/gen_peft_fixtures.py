#!/usr/bin/env python3
"""Generate the Hugging Face peft parity fixtures of tessel
(tests/parity/fixtures/peft/, read by tests/parity/peft.c).

For a small MLP and a small GPT (the model classes of the reference benchmark,
shared/reference/torch_bench.py, whose parameter names tessel's models share)
this script asks Hugging Face peft itself for what tessel's LoRA must match:

- LoraConfig(r=4, lora_alpha=8, lora_dropout=0, target_modules=...) applied
  with get_peft_model after torch.manual_seed(42) (peft's own init: A
  Kaiming-uniform with a = sqrt(5), B zero);
- `loss_init`: the loss with that init (B = 0: the base model's loss);
- B then set to N(0, 0.1) draws (so A gets a gradient), and one forward and
  backward on one batch: `loss`, `grad.<W>.lora_A`, `grad.<W>.lora_B`;
- `merged.<name>`: every parameter of merge_and_unload() of that model;
- the adapter directory peft's save_pretrained writes (adapter_config.json,
  adapter_model.safetensors) as `<model>/`, unchanged.

`<model>.safetensors` holds the base parameters `param.<name>`, `input.x`,
`target.y`, the LoRA tensors `param.<W>.lora_A` [r, in] / `.lora_B` [out, r]
under tessel's names, and the results above. Everything is float32 (int64
token ids), single-threaded and seeded.

Needs torch and peft (PyPI), used only to make these files; the C test reads
only the committed files. See README.md beside this file:

    python3 -m venv --system-site-packages /work/venvs/peft
    /work/venvs/peft/bin/pip install peft    # and torch (torch2-install.sh)
    /work/venvs/peft/bin/python tests/parity/gen_peft_fixtures.py
"""
import argparse
import importlib.util
import json
import os
import shutil
import struct
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_REFERENCE = os.path.normpath(
    os.path.join(HERE, "..", "..", "..", "shared", "reference", "torch_bench.py"))
DEFAULT_OUT = os.path.join(HERE, "fixtures", "peft")
MAX_TOTAL_BYTES = 200 * 1024
R, ALPHA = 4, 8


def save_safetensors(path, tensors, metadata):
    """`tensors`: list of (name, tensor), float32 or int64, laid out in order."""
    tags = {torch.float32: ("F32", "<f4"), torch.int64: ("I64", "<i8")}
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, t in tensors:
        tag, np_dtype = tags[t.dtype]
        data = t.detach().cpu().contiguous().numpy().astype(np_dtype, copy=False).tobytes()
        header[name] = {"dtype": tag, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def load_reference(path):
    spec = importlib.util.spec_from_file_location("torch_bench", path)
    if spec is None or not os.path.isfile(path):
        sys.exit(f"gen_peft_fixtures: reference script not found: {path} (use --reference PATH)")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_mlp(ref):
    """MLP(d_in=64, d_h=16, d_out=1) on x [8, 8, 8], MSE; LoRA on the three Linear layers."""
    torch.manual_seed(0)
    model = ref.MLP(64, 16, 1)
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(8, 8, 8, generator=g)
    y = (x[:, -8:, :4].mean(dim=(1, 2)) + 0.1 * torch.randn(8, generator=g)).unsqueeze(1)
    return model, x, y, lambda out, t: F.mse_loss(out, t), ["net.0", "net.3", "net.6"]


def make_gpt(ref):
    """GPT(vocab=32, ctx=8, layers=1, heads=2, d=16), batch 2, cross-entropy;
    LoRA on attention (c_attn, attn.c_proj) and MLP (fc, c_proj)."""
    torch.manual_seed(0)
    model = ref.GPT(32, 8, 1, 2, 16)
    g = torch.Generator().manual_seed(1234)
    seq = torch.randint(0, 32, (2, 9), generator=g)
    x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def loss_fn(logits, t):
        return F.cross_entropy(logits.view(-1, logits.size(-1)), t.view(-1))

    return model, x, y, loss_fn, ["c_attn", "c_proj", "fc"]


def tessel_name(peft_name):
    """base_model.model.M.lora_A.default.weight -> M.weight.lora_A"""
    m = peft_name[len("base_model.model."):]
    for ab in ("lora_A", "lora_B"):
        tail = "." + ab + ".default.weight"
        if m.endswith(tail):
            return m[:-len(tail)] + ".weight." + ab
    return None


def make_fixture(name, builder, ref, out):
    import peft
    model, x, y, loss_fn, targets = builder(ref)
    model.eval()  # no dropout anywhere
    base = [(k, v.detach().clone()) for k, v in model.named_parameters()]
    cfg = peft.LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=targets)
    torch.manual_seed(42)
    pm = peft.get_peft_model(model, cfg)
    with torch.no_grad():
        loss_init = loss_fn(pm(x), y).detach()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for k, p in pm.named_parameters():
            if ".lora_B." in k:
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    lora = [(tessel_name(k), p) for k, p in pm.named_parameters() if ".lora_" in k]
    assert all(n for n, _ in lora), lora
    pm.zero_grad()
    loss = loss_fn(pm(x), y)
    loss.backward()
    tensors = [("param." + k, v) for k, v in base]
    tensors += [("param." + n, p.detach().clone()) for n, p in lora]
    tensors += [("input.x", x), ("target.y", y), ("loss_init", loss_init.reshape(1)),
                ("loss", loss.detach().reshape(1))]
    tensors += [("grad." + n, p.grad.detach().clone()) for n, p in lora]
    adir = os.path.join(out, name)
    if os.path.isdir(adir):
        shutil.rmtree(adir)
    pm.save_pretrained(adir)
    card = os.path.join(adir, "README.md")  # a model card template, not part of the format
    if os.path.exists(card):
        os.remove(card)
    merged = pm.merge_and_unload()
    tensors += [("merged." + k, v.detach().clone()) for k, v in merged.named_parameters()]
    meta = {"peft_version": peft.__version__, "torch_version": torch.__version__,
            "r": str(R), "lora_alpha": str(ALPHA), "target_modules": ",".join(targets),
            "made_by": "tests/parity/gen_peft_fixtures.py"}
    path = os.path.join(out, name + ".safetensors")
    save_safetensors(path, tensors, meta)
    return path, adir


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reference", default=DEFAULT_REFERENCE)
    ap.add_argument("--out", default=DEFAULT_OUT)
    a = ap.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    ref = load_reference(a.reference)
    os.makedirs(a.out, exist_ok=True)
    total = 0
    for name, builder in (("mlp", make_mlp), ("gpt", make_gpt)):
        path, adir = make_fixture(name, builder, ref, a.out)
        files = [path] + [os.path.join(adir, f) for f in sorted(os.listdir(adir))]
        for f in files:
            n = os.path.getsize(f)
            total += n
            print(f"{os.path.relpath(f)}: {n} bytes")
    print(f"total {total} bytes")
    if total > MAX_TOTAL_BYTES:
        sys.exit(f"gen_peft_fixtures: {total} bytes is over the {MAX_TOTAL_BYTES} limit")


if __name__ == "__main__":
    main()
