#!/usr/bin/python3
"""Generate the PyTorch parity fixtures of tessel (tests/parity/fixtures/).

Each fixture is a safetensors file holding, for a small version of a benchmark
workload: the initial parameters, one input batch and its target, the loss and
gradients of the first forward/backward, and the parameters after two AdamW (W2, W4, W5: Adam)
steps on that same batch. The model classes come from the reference benchmark
script (shared/reference/torch_bench.py) so tessel is checked against exactly
the models it is benchmarked against. See README.md beside this file.

Usage (from the repository root):
  LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp \\
      /usr/bin/python3 tests/parity/gen_fixtures.py [--reference PATH] [--out DIR]

The safetensors files are written by hand (struct + json), so only torch and
numpy are needed. Everything is float32 (int64 for token ids), single-threaded
and seeded, so a rerun on the same torch build reproduces the files bit for bit.
"""
import argparse
import hashlib
import importlib.util
import json
import os
import struct
import sys

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
# tests/parity/ -> repository root -> its parent, where shared/ lives.
DEFAULT_REFERENCE = os.path.normpath(
    os.path.join(HERE, "..", "..", "..", "shared", "reference", "torch_bench.py"))
DEFAULT_OUT = os.path.join(HERE, "fixtures")
COMMAND = ("LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp "
           "/usr/bin/python3 tests/parity/gen_fixtures.py")
MAX_FIXTURE_BYTES = 1 << 20

MODEL_SEED = 0    # torch.manual_seed before the model is built
DATA_SEED = 1234  # generator for the batch, as in torch_bench.py's main()

# AdamW defaults of torch (the workloads only change lr and weight decay).
BETAS = (0.9, 0.999)
EPS = 1e-8

# ----------------------------------------------------------------------------- safetensors

ST_DTYPES = {torch.float32: ("F32", "<f4"), torch.int64: ("I64", "<i8")}


def save_safetensors(path, tensors, metadata):
    """Write `tensors` (list of (name, tensor), laid out in that order) and
    `metadata` (str -> str) as a safetensors file, atomically."""
    header = {"__metadata__": metadata}
    blobs, offset = [], 0
    for name, t in tensors:
        if t.dtype not in ST_DTYPES:
            raise TypeError(f"{path}: tensor {name}: dtype {t.dtype} is not float32/int64")
        tag, np_dtype = ST_DTYPES[t.dtype]
        if offset % t.element_size():
            raise ValueError(f"{path}: tensor {name} would start misaligned at {offset}")
        data = t.detach().cpu().contiguous().numpy().astype(np_dtype, copy=False).tobytes()
        header[name] = {"dtype": tag, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # pad so the data starts 8-aligned
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_safetensors(path):
    """Read a file back (names -> (dtype tag, shape, bytes), metadata): a
    self-check of save_safetensors, independent of the C reader."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    meta = header.pop("__metadata__", {})
    data = raw[8 + n:]
    out = {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
           for k, v in header.items()}
    return out, meta

# ----------------------------------------------------------------------------- workloads


def load_reference(path):
    spec = importlib.util.spec_from_file_location("torch_bench", path)
    if spec is None or not os.path.isfile(path):
        sys.exit(f"gen_fixtures: reference script not found: {path} (use --reference PATH)")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_w1(ref):
    """W1 (finance MLP) at window 8 x features 8, hidden 32, batch 16."""
    window, features, hidden, batch = 8, 8, 32, 16
    torch.manual_seed(MODEL_SEED)
    model = ref.MLP(window * features, hidden, 1)
    g = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(batch, window, features, generator=g)
    # Same target as setup_w1: mean of the last 8 steps of the first 4 features, plus noise.
    y = (x[:, -8:, :4].mean(dim=(1, 2)) + 0.1 * torch.randn(batch, generator=g)).unsqueeze(1)
    hp = dict(workload="W1", model=f"MLP(d_in={window * features}, d_h={hidden}, d_out=1)",
              window=window, features=features, hidden=hidden, batch=batch,
              input_shape=list(x.shape), target_shape=list(y.shape),
              loss="F.mse_loss(model(x), y) (mean)", lr=1e-3, weight_decay=0.01)
    return model, x, y, lambda out, t: F.mse_loss(out, t), hp


def make_w3(ref):
    """W3 (GPT language model) at vocab 64, context 16, 2 layers, 2 heads, d 32, batch 2."""
    vocab, ctx, layers, heads, d, batch = 64, 16, 2, 2, 32, 2
    torch.manual_seed(MODEL_SEED)
    model = ref.GPT(vocab, ctx, layers, heads, d)
    g = torch.Generator().manual_seed(DATA_SEED)
    seq = torch.randint(0, vocab, (batch, ctx + 1), generator=g)
    x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def loss_fn(logits, t):
        return F.cross_entropy(logits.view(-1, logits.size(-1)), t.view(-1))

    hp = dict(workload="W3", model=f"GPT(vocab={vocab}, ctx={ctx}, layers={layers}, "
              f"heads={heads}, d={d})", vocab=vocab, ctx=ctx, layers=layers, heads=heads,
              d_model=d, batch=batch, input_shape=list(x.shape), target_shape=list(y.shape),
              loss="F.cross_entropy(logits.view(-1, vocab), y.view(-1)) (mean); LM head tied "
                   "to wte.weight", lr=3e-4, weight_decay=0.1)
    return model, x, y, loss_fn, hp


def make_w2(ref):
    """W2 (finance GRU) at batch 4, sequence 5, features 3, hidden 6, 2 layers."""
    batch, seq, features, hidden, layers = 4, 5, 3, 6, 2
    torch.manual_seed(MODEL_SEED)
    model = ref.GRUClassifier(features, hidden, layers)
    g = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(batch, seq, features, generator=g)
    # As setup_w2, over the last 2 steps instead of 16.
    y = (x[:, -2:, 0].sum(dim=1) > 0).float().unsqueeze(1)
    hp = dict(workload="W2", model=f"GRUClassifier(f={features}, h={hidden}, layers={layers})",
              seq_len=seq, features=features, hidden=hidden, layers=layers, batch=batch,
              input_shape=list(x.shape), target_shape=list(y.shape),
              loss="F.binary_cross_entropy_with_logits(model(x), y) (mean)", lr=1e-3,
              weight_decay=0.0, optim_class="Adam")
    return model, x, y, lambda out, t: F.binary_cross_entropy_with_logits(out, t), hp


def make_w4(ref):
    """W4 (3D U-Net) at batch 2, 1 x 8^3, channels 2-4-8, 2 classes."""
    batch, size, ch = 2, 8, (2, 4, 8)
    torch.manual_seed(MODEL_SEED)
    model = ref.UNet3D(cin=1, ncls=2, ch=ch)
    g = torch.Generator().manual_seed(DATA_SEED)
    zz, yy, xx = torch.meshgrid(torch.arange(size), torch.arange(size), torch.arange(size),
                                indexing="ij")
    xs, ys = [], []
    for _b in range(batch):  # setup_w4's noisy spheres, scaled to 8^3
        c = torch.randint(2, 6, (3,), generator=g)
        r = 1.5 + 2 * torch.rand(1, generator=g).item()
        m = ((zz - c[0]) ** 2 + (yy - c[1]) ** 2 + (xx - c[2]) ** 2).float() <= r * r
        xs.append((m.float() + 0.5 * torch.randn(size, size, size, generator=g)).unsqueeze(0))
        ys.append(m.long())
    x, y = torch.stack(xs), torch.stack(ys)

    def loss_fn(logits, t):  # setup_w4's loss
        ce = F.cross_entropy(logits, t)
        probs = F.softmax(logits, dim=1)
        onehot = F.one_hot(t, 2).permute(0, 4, 1, 2, 3).to(probs.dtype)
        dims = (0, 2, 3, 4)
        inter = (probs * onehot).sum(dims)
        denom = probs.sum(dims) + onehot.sum(dims)
        dice = 1.0 - ((2.0 * inter + 1e-5) / (denom + 1e-5)).mean()
        return ce + dice

    hp = dict(workload="W4", model=f"UNet3D(cin=1, ncls=2, ch={ch})", size=size,
              channels=list(ch), classes=2, batch=batch, input_shape=list(x.shape),
              target_shape=list(y.shape),
              loss="F.cross_entropy (mean over voxels) + soft Dice, as setup_w4", lr=1e-3,
              weight_decay=0.0, optim_class="Adam", buffers="running_mean/var after 2 steps")
    return model, x, y, loss_fn, hp


def make_w5(ref):
    """W5 (GCN) at 30 nodes, mean degree 4, features 5, hidden 4, 3 classes."""
    nodes, deg, fin, hid, ncls = 30, 4, 5, 4, 3
    # build_graph draws src then dst first: redraw them from the same seed to
    # store the raw edge list (self pairs and duplicates included).
    g = torch.Generator().manual_seed(DATA_SEED)
    adj, _ = ref.build_graph(g, nodes, deg)
    g2 = torch.Generator().manual_seed(DATA_SEED)
    m = nodes * deg // 2
    src = torch.randint(0, nodes, (m,), generator=g2)
    dst = torch.randint(0, nodes, (m,), generator=g2)
    labels = torch.randint(0, ncls, (nodes,), generator=g)
    centroids = torch.randn(ncls, fin, generator=g)
    x = torch.randn(nodes, fin, generator=g) + 0.5 * centroids[labels]
    torch.manual_seed(MODEL_SEED)
    model = ref.GCN(fin, hid, ncls)
    hp = dict(workload="W5", model=f"GCN(fin={fin}, hid={hid}, ncls={ncls})", nodes=nodes,
              avg_degree=deg, edges=m, in_features=fin, hidden=hid, classes=ncls,
              adjacency_nnz=int(adj._nnz()), input_shape=list(x.shape),
              target_shape=list(labels.shape),
              loss="F.cross_entropy over all nodes; adjacency from build_graph(input.src, "
                   "input.dst)", lr=0.01, weight_decay=0.0, optim_class="Adam")
    extra = dict(forward=lambda mod, inp: mod(inp, adj),
                 inputs=[("input.src", src), ("input.dst", dst)])
    return model, x, labels, lambda out, t: F.cross_entropy(out, t), hp, extra


class SmallCNN(torch.nn.Module):
    """tessel's `cnn` model (src/models/cnn.c): not a benchmark workload, so
    defined here: two Conv2d 3x3 (no bias) -> BatchNorm2d -> ReLU -> MaxPool2d 2
    blocks, then Linear over the flattened maps."""

    def __init__(self, cin, c1, c2, h, w, ncls):
        super().__init__()
        nn = torch.nn
        self.features = nn.Sequential(
            nn.Conv2d(cin, c1, 3, padding=1, bias=False), nn.BatchNorm2d(c1), nn.ReLU(),
            nn.MaxPool2d(2), nn.Conv2d(c1, c2, 3, padding=1, bias=False), nn.BatchNorm2d(c2),
            nn.ReLU(), nn.MaxPool2d(2))
        self.classifier = nn.Linear(c2 * (h // 4) * (w // 4), ncls)

    def forward(self, x):
        return self.classifier(self.features(x).flatten(1))


class LSTMClassifier(torch.nn.Module):
    """tessel's `lstm` model (src/models/rnn.c): GRUClassifier with an LSTM."""

    def __init__(self, f, h, layers):
        super().__init__()
        self.lstm = torch.nn.LSTM(input_size=f, hidden_size=h, num_layers=layers,
                                  batch_first=True)
        self.head = torch.nn.Linear(h, 1)

    def forward(self, x):
        out, (h_n, c_n) = self.lstm(x)
        return self.head(h_n[-1])


def make_cnn(ref):
    """cnn at batch 4, 1 x 8 x 8, widths 3 and 4, 3 classes (BatchNorm running stats too)."""
    batch, cin, hw, c1, c2, ncls = 4, 1, 8, 3, 4, 3
    torch.manual_seed(MODEL_SEED)
    model = SmallCNN(cin, c1, c2, hw, hw, ncls)
    g = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(batch, cin, hw, hw, generator=g)
    y = torch.randint(0, ncls, (batch,), generator=g)
    hp = dict(workload="cnn", model=f"SmallCNN(cin={cin}, c1={c1}, c2={c2}, {hw}x{hw}, "
              f"ncls={ncls})", batch=batch, input_shape=list(x.shape),
              target_shape=list(y.shape), loss="F.cross_entropy (mean)", lr=1e-3,
              weight_decay=0.0, optim_class="Adam", buffers="running_mean/var after 2 steps")
    return model, x, y, lambda out, t: F.cross_entropy(out, t), hp


def make_lstm(ref):
    """lstm at batch 4, sequence 5, features 3, hidden 6, 2 layers (as w2_small)."""
    batch, seq, features, hidden, layers = 4, 5, 3, 6, 2
    torch.manual_seed(MODEL_SEED)
    model = LSTMClassifier(features, hidden, layers)
    g = torch.Generator().manual_seed(DATA_SEED)
    x = torch.randn(batch, seq, features, generator=g)
    y = (x[:, -2:, 0].sum(dim=1) > 0).float().unsqueeze(1)
    hp = dict(workload="lstm", model=f"LSTMClassifier(f={features}, h={hidden}, "
              f"layers={layers})", seq_len=seq, features=features, hidden=hidden, layers=layers,
              batch=batch, input_shape=list(x.shape), target_shape=list(y.shape),
              loss="F.binary_cross_entropy_with_logits(model(x), y) (mean)", lr=1e-3,
              weight_decay=0.0, optim_class="Adam")
    return model, x, y, lambda out, t: F.binary_cross_entropy_with_logits(out, t), hp


WORKLOADS = {"w1_small": make_w1, "w3_small": make_w3, "w2_small": make_w2,
             "w4_small": make_w4, "w5_small": make_w5, "cnn_small": make_cnn,
             "lstm_small": make_lstm}

# ----------------------------------------------------------------------------- generation


def run(model, x, y, loss_fn, hp, extra=None):
    """Two AdamW (or Adam, hp["optim_class"]) steps on the same batch; returns
    the fixture tensors, in file order. extra: "forward" (model, x) -> output
    and "inputs" (more input tensors, stored first); W4 also stores the
    BatchNorm running statistics after the steps as buffer.<name>."""
    extra = extra or {}
    forward = extra.get("forward", lambda mod, inp: mod(inp))
    params = list(model.named_parameters())  # parameters only: GPT's "mask" is a buffer
    for name, p in params:
        assert p.dtype == torch.float32, f"parameter {name} is {p.dtype}"
    initial = [(f"param.{n}", p.detach().clone()) for n, p in params]
    opt_class = torch.optim.Adam if hp.get("optim_class") == "Adam" else torch.optim.AdamW
    opt = opt_class(model.parameters(), lr=hp["lr"], betas=BETAS, eps=EPS,
                    weight_decay=hp["weight_decay"])
    model.train()
    losses, grads = [], None
    for _ in range(2):
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(forward(model, x), y)
        loss.backward()
        if grads is None:  # gradients of the first backward, at the initial weights
            grads = [(f"grad.{n}", p.grad.detach().clone()) for n, p in params]
        losses.append(loss.detach().clone())
        opt.step()
    step2 = [(f"step2.{n}", p.detach().clone()) for n, p in params]
    # Inputs first: int64 tensors then sit at 8-aligned offsets (all later tensors are f32).
    tensors = list(extra.get("inputs", []))
    tensors += [("input.x", x), ("target.y", y), ("loss", losses[0].reshape(()))]
    tensors += initial + grads + step2
    tensors += [(f"buffer.{n}", b.detach().clone()) for n, b in model.named_buffers()
                if n.endswith("running_mean") or n.endswith("running_var")]
    for name, t in tensors:
        assert t.dtype in (torch.float32, torch.int64), f"{name} is {t.dtype}"
    return tensors, [float(l) for l in losses], [n for n, _ in params]


def metadata(hp, losses, param_names, reference):
    with open(reference, "rb") as f:
        ref_sha = hashlib.sha256(f.read()).hexdigest()
    meta = {k: json.dumps(v) if not isinstance(v, str) else v for k, v in hp.items()}
    meta.update(
        format="pt",
        optimizer=("torch.optim.Adam (single param group)" if hp.get("optim_class") == "Adam"
                   else "torch.optim.AdamW (single param group, decay on all parameters)"),
        lr=repr(hp["lr"]), betas=json.dumps(list(BETAS)), eps=repr(EPS),
        weight_decay=repr(hp["weight_decay"]),
        steps="2 (zero_grad, forward, backward, step; both on the same batch)",
        seeds=f"torch.manual_seed({MODEL_SEED}) before building the model; "
              f"torch.Generator().manual_seed({DATA_SEED}) for the batch",
        param_names=",".join(param_names),
        losses=json.dumps(["%.9g" % l for l in losses]),  # first and second forward
        torch_version=torch.__version__,
        reference="shared/reference/torch_bench.py", reference_sha256=ref_sha,
        generator=COMMAND)
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", default=DEFAULT_REFERENCE,
                    help="path of torch_bench.py (default: %(default)s)")
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    ap.add_argument("--only", default="",
                    help="comma-separated fixture stems to write (default: all)")
    args = ap.parse_args()

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only allowed before any parallel work; harmless if too late
        pass
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)

    ref = load_reference(args.reference)
    os.makedirs(args.out, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    for stem, make in WORKLOADS.items():
        if only and stem not in only:
            continue
        made = make(ref)
        hp = made[4]
        tensors, losses, names = run(*made)
        path = os.path.join(args.out, stem + ".safetensors")
        save_safetensors(path, tensors, metadata(hp, losses, names, args.reference))

        back, meta = load_safetensors(path)  # self-check of the file just written
        assert list(back) == [n for n, _ in tensors] and meta["workload"] == hp["workload"]
        size = os.path.getsize(path)
        if size >= MAX_FIXTURE_BYTES:
            sys.exit(f"gen_fixtures: {path} is {size} bytes, over the 1 MB budget")
        print(f"{path}: {size} bytes, {len(tensors)} tensors, {len(names)} parameters, "
              f"loss {losses[0]:.6f} -> {losses[1]:.6f}")


if __name__ == "__main__":
    main()
