#!/usr/bin/python3
"""Generate the ONNX import fixtures of tessel (tests/parity/fixtures/onnx/).

Small PyTorch models are exported with torch.onnx.export (opset 17, the
newest torch 1.13 writes; dynamic batch dimension "batch"), and beside each
a safetensors file in the layout of the other parity fixtures (README.md
beside this script): param.NAME (the initialisers, as the ONNX file holds
them), input.x, target.y, output.logits (the forward), loss, grad.NAME
(first step), step2.NAME (after two SGD(lr=0.1) steps on the same batch),
buffer.NAME (BatchNorm running statistics after the two steps) and, for a
model with BatchNorm, eval.logits (the eval-mode forward before training):

  mlp, cnn     an MLP and a CNN, F.cross_entropy over the logits
  gpt          the W3 GPT of shared/reference/torch_bench.py at vocab 64,
               context 16, 2 layers, 2 heads, d 32 (token ids in, logits
               [B, T, vocab] out, cross-entropy over every position);
               gpt_seq.onnx the same with a dynamic sequence axis "seq"
  cnn_bn       gen_fixtures.SmallCNN (Conv, BatchNorm, ReLU, MaxPool, Linear),
               its running statistics moved off 0 / 1 by one forward first
  ops          OpsNet below: the other ops of a torch export
  bigru.onnx, strided.onnx  models the importer refuses (a bidirectional
               GRU, a Slice with step 2), for tests/unit/onnx_import.c
  gru, lstm    gen_fixtures' W2 GRUClassifier and LSTMClassifier (features 3,
               hidden 6, 2 layers, sequence 5), BCE with logits on [B, 1]

gpt, cnn_bn, gru and lstm are exported in training mode without constant
folding, as one exports a model to train it elsewhere: parameters keep their
state-dict names (an eval export folds the transposes of the GPT's Linear
weights and the GRU's gate reordering into new, renamed initialisers) and
BatchNormalization carries training_mode=1. torch 1.13 has no ONNX form of
logical_not (the GPT's mask); the script registers Not for it.

It also writes the bad-input models of the tests with onnx.helper:
unsupported_op.onnx (a Hardmax node), lone_erf.onnx (an Erf outside the GELU
pattern), auto_pad.onnx, asym_pads.onnx and
unknown_attr.onnx (Conv attributes tessel refuses), opset12.onnx (opset out of range),
missing_external.onnx (external data that does not exist), escape.onnx
(external data outside the model's directory) and mlp_ext.onnx + mlp_ext.data
(the MLP with its weights in an external data file).

With --example it also writes examples/onnx/: the MLP (mlp.onnx) and 256
examples to train it on (x.npy [256, 12] float32, y.npy [256] int64: 3
classes from the sum of the first 6 features), for docs/onnx.md.

Usage (from the repository root), Debian's python3-torch and python3-onnx:
  /usr/bin/python3 tests/parity/gen_onnx_fixtures.py [--out DIR]
"""
import argparse
import os
import shutil
import sys

import numpy
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gen_fixtures import LSTMClassifier, SmallCNN, load_reference, save_safetensors  # noqa: E402

OPSET = 17
LR = 0.1


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(12, 16)
        self.fc2 = nn.Linear(16, 8)
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.fc2(F.relu(self.fc1(x)))))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(2)
        self.flat = nn.Flatten()
        self.head = nn.Linear(24, 3)

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.avg(torch.sigmoid(self.conv2(x)))
        return self.head(self.flat(x))


def export(model, x, path, train=False):
    kw = dict(do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING) if train else {}
    torch.onnx.export(model, (x,), path, opset_version=OPSET, input_names=["x"],
                      output_names=["logits"],
                      dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}}, **kw)
    onnx.checker.check_model(onnx.load(path))


def fixture(name, model, x, y, out, loss_fn=F.cross_entropy, train=False):
    path = os.path.join(out, name + ".onnx")
    export(model, x, path, train)
    inits = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy())
             for t in onnx.load(path).graph.initializer}
    params = dict(model.named_parameters())
    buffers = {n: b for n, b in model.named_buffers() if b.is_floating_point()}
    missing = set(inits) - set(params) - set(n for n, _ in model.named_buffers())
    if missing:
        raise SystemExit(f"{path}: initialisers {sorted(missing)} are not parameters by name")
    trained = sorted(n for n in inits if n in params)
    # int64 tensors first: every tensor starts aligned to its element size.
    tensors = [("target.y", y), ("input.x", x)] if y.dtype == torch.int64 else \
        [("input.x", x), ("target.y", y)]
    if x.dtype == torch.int64 and y.dtype != torch.int64:
        raise SystemExit("int64 input with float targets: reorder for alignment")
    tensors += [("param." + n, inits[n].float().contiguous()) for n in trained]
    if buffers:  # an inference plan's forward: torch's eval mode (running statistics)
        model.eval()
        tensors += [("eval.logits", model(x).detach().contiguous())]
        model.train()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    logits = model(x)
    loss = loss_fn(logits, y)
    opt.zero_grad()
    loss.backward()
    tensors += [("output.logits", logits.detach().contiguous()), ("loss", loss.detach().reshape(1))]
    tensors += [("grad." + n, params[n].grad.detach().clone()) for n in trained]
    opt.step()
    opt.zero_grad()
    loss_fn(model(x), y).backward()
    opt.step()
    tensors += [("step2." + n, params[n].detach().clone()) for n in trained]
    tensors += [("buffer." + n, buffers[n].detach().clone()) for n in sorted(inits)
                if n in buffers]
    st = os.path.join(out, name + ".safetensors")
    save_safetensors(st, tensors, {"generator": "tests/parity/gen_onnx_fixtures.py",
                                   "torch": torch.__version__, "opset": str(OPSET)})
    print(f"{path}: {os.path.getsize(path)} bytes; {st}: {os.path.getsize(st)} bytes")
    return path


def small_graph(path, op, opset, external=None):
    """x [2, 4] -> Gemm(W) -> op -> y, for the bad-input tests."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], [0.5] * 12)
    if external:
        w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[3, 4])
        w.data_location = TensorProto.EXTERNAL
        for k, v in (("location", external), ("offset", "0"), ("length", "48")):
            e = w.external_data.add()
            e.key, e.value = k, v
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"], name="fc", transB=1),
             helper.make_node(op, ["h"], ["y"], name="act")]
    g = helper.make_graph(nodes, "bad", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


def conv_graph(path, **attrs):
    """x [1, 1, 4, 4] -> Conv(w [2, 1, 3, 3], attrs) -> y, for the refused-attribute tests."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [2, 1, 3, 3], [0.1] * 18)
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", **attrs)]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)])
    m.ir_version = 8
    with open(path, "wb") as f:
        f.write(m.SerializeToString())


class OpsNet(nn.Module):
    """The ops a torch export emits that the other fixtures do not: GELU's
    erf pattern, ConvTranspose, Concat, Slice, ReduceMean / ReduceMax /
    ReduceSum, Abs, Neg, Exp, Log, Pow, Sqrt, Unsqueeze / Expand / Squeeze
    and Where with a constant condition."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 3, 3, padding=1)
        self.up = nn.ConvTranspose2d(3, 2, 2, stride=2)
        self.fc = nn.Linear(8, 3)
        self.register_buffer("keep", torch.tensor([True, False, True, True]))

    def forward(self, x):  # x [B, 1, 4, 4]
        u = self.up(F.gelu(self.conv(x)))  # [B, 2, 8, 8]
        s = torch.cat([u, u * 0.5], dim=1)[:, :, 1:7, 2:8]  # [B, 4, 6, 6]
        m = s.mean(dim=(2, 3))
        mx = s.amax(dim=3).sum(dim=2)
        e = torch.exp(-m.abs()) + torch.log(1 + mx.pow(2)) + torch.sqrt(m * m + 1)
        e = torch.where(self.keep, e, -e)
        z = e.unsqueeze(1).expand(-1, 2, -1).unsqueeze(3).squeeze(3)  # [B, 2, 4]
        return self.fc(z.flatten(1))


class BiGRU(nn.Module):
    """A bidirectional GRU: refused (tessel's GRU import is forward only)."""

    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(3, 4, batch_first=True, bidirectional=True)

    def forward(self, x):
        return self.gru(x)[0][:, -1]


class Strided(nn.Module):
    """x[:, ::2] of a graph value: refused (Slice steps other than 1)."""

    def forward(self, x):
        return torch.relu(x)[:, ::2]


def refusal(model, x, path):
    torch.onnx.export(model, (x,), path, opset_version=OPSET, input_names=["x"],
                      output_names=["y"], do_constant_folding=False,
                      training=torch.onnx.TrainingMode.TRAINING)


def lm_loss(logits, y):
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))


def more_fixtures(ref, out):
    """The W3 GPT, the CNN with BatchNorm, the W2 GRU and an LSTM."""
    torch.onnx.register_custom_op_symbolic("aten::logical_not", lambda g, a: g.op("Not", a), 9)
    gen = torch.Generator().manual_seed(4321)
    torch.manual_seed(0)
    gpt = ref.GPT(64, 16, 2, 2, 32)
    seq = torch.randint(0, 64, (2, 17), generator=gen)
    # The same weights with a dynamic sequence axis too (model.ctx gives it).
    path = os.path.join(out, "gpt_seq.onnx")
    torch.onnx.export(gpt, (seq[:, :-1].contiguous(),), path, opset_version=OPSET,
                      input_names=["x"], output_names=["logits"],
                      dynamic_axes={"x": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}},
                      do_constant_folding=False, training=torch.onnx.TrainingMode.TRAINING)
    onnx.checker.check_model(onnx.load(path))
    fixture("gpt", gpt, seq[:, :-1].contiguous(), seq[:, 1:].contiguous(), out, lm_loss, True)
    torch.manual_seed(0)
    cnn = SmallCNN(1, 3, 4, 8, 8, 3)
    with torch.no_grad():  # running statistics other than 0 / 1 in the file
        cnn(torch.randn(8, 1, 8, 8, generator=gen) * 2 + 1)
    fixture("cnn_bn", cnn, torch.randn(4, 1, 8, 8, generator=gen),
            torch.randint(0, 3, (4,), generator=gen), out, train=True)
    torch.manual_seed(0)
    fixture("ops", OpsNet(), torch.randn(4, 1, 4, 4, generator=gen),
            torch.randint(0, 3, (4,), generator=gen), out, train=True)
    for name, cls in (("gru", ref.GRUClassifier), ("lstm", LSTMClassifier)):
        torch.manual_seed(0)
        model = cls(3, 6, 2)
        x = torch.randn(4, 5, 3, generator=gen)
        y = (x[:, -2:, 0].sum(dim=1) > 0).float().unsqueeze(1)
        fixture(name, model, x, y, out, F.binary_cross_entropy_with_logits, True)
    refusal(BiGRU(), torch.randn(2, 5, 3, generator=gen), os.path.join(out, "bigru.onnx"))
    refusal(Strided(), torch.randn(2, 6, generator=gen), os.path.join(out, "strided.onnx"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(HERE, "fixtures", "onnx"))
    ap.add_argument("--reference", default=os.path.join(HERE, "..", "..", "..", "shared",
                                                        "reference", "torch_bench.py"),
                    help="shared/reference/torch_bench.py (the W2 / W3 models)")
    ap.add_argument("--example", action="store_true", help="also write examples/onnx/")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(1234)
    torch.manual_seed(0)
    mlp = MLP()
    x = torch.randn(4, 12, generator=gen)
    y = torch.randint(0, 3, (4,), generator=gen)
    path = fixture("mlp", mlp, x, y, a.out)
    torch.manual_seed(0)
    cnn = CNN()
    xc = torch.randn(4, 1, 8, 8, generator=gen)
    yc = torch.randint(0, 3, (4,), generator=gen)
    fixture("cnn", cnn, xc, yc, a.out)
    more_fixtures(load_reference(a.reference), a.out)

    m = onnx.load(path)
    ext = os.path.join(a.out, "mlp_ext.data")
    if os.path.exists(ext):
        os.remove(ext)  # onnx appends to an existing data file
    onnx.save_model(m, os.path.join(a.out, "mlp_ext.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="mlp_ext.data", size_threshold=0)
    if a.example:
        ex = os.path.join(HERE, "..", "..", "examples", "onnx")
        os.makedirs(ex, exist_ok=True)
        shutil.copyfile(path, os.path.join(ex, "mlp.onnx"))
        g = torch.Generator().manual_seed(7)
        xs = torch.randn(256, 12, generator=g)
        s6 = xs[:, :6].sum(dim=1)
        ys = (s6 > -1).long() + (s6 > 1).long()
        numpy.save(os.path.join(ex, "x.npy"), xs.numpy().astype("<f4"))
        numpy.save(os.path.join(ex, "y.npy"), ys.numpy().astype("<i8"))
    small_graph(os.path.join(a.out, "unsupported_op.onnx"), "Hardmax", OPSET)
    small_graph(os.path.join(a.out, "lone_erf.onnx"), "Erf", OPSET)
    conv_graph(os.path.join(a.out, "auto_pad.onnx"), auto_pad="SAME_UPPER")
    conv_graph(os.path.join(a.out, "asym_pads.onnx"), pads=[0, 0, 1, 1])
    conv_graph(os.path.join(a.out, "unknown_attr.onnx"), pads=[1, 1, 1, 1], sparsity=2)
    small_graph(os.path.join(a.out, "opset12.onnx"), "Relu", 12)
    small_graph(os.path.join(a.out, "missing_external.onnx"), "Relu", OPSET, "missing.data")
    small_graph(os.path.join(a.out, "escape.onnx"), "Relu", OPSET, "../w1_small.safetensors")


if __name__ == "__main__":
    main()
