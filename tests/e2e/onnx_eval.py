#!/usr/bin/python3
"""Evaluates an ONNX file with NumPy, op by op from the ONNX specification,
and compares its output with tessel's: an independent check of what
`tessel export --onnx` writes (tests/e2e/onnx_export.c runs it; Debian's
onnx 1.12 has no reference evaluator, and ONNX Runtime is not packaged).

    onnx_eval.py MODEL.onnx X.npy WANT.npy

Covers the ops the exporter writes (2-D convolution and pooling; not the
U-Net's 3-D ones); an int64 X feeds token ids. Exits 1 with the largest
difference when the output is not within fp32 tolerance, 2 on an op it
does not know."""
import math
import sys

import numpy as np
import onnx
from onnx import numpy_helper


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def windows(x, kernel, strides, pads, fill):
    """The kernel offsets' strided views of x [N, C, H, W] padded with fill."""
    (kh, kw), (sh, sw) = kernel, strides
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])),
                constant_values=fill)
    oh = (xp.shape[2] - kh) // sh + 1
    ow = (xp.shape[3] - kw) // sw + 1
    for i in range(kh):
        for j in range(kw):
            yield i, j, xp[:, :, i:i + sh * oh:sh, j:j + sw * ow:sw]


def run(node, v):
    a = attrs(node)
    x = [v[n] if n else None for n in node.input]
    op = node.op_type
    unary = {"Relu": lambda t: np.maximum(t, 0), "Sigmoid": lambda t: 1 / (1 + np.exp(-t)),
             "Tanh": np.tanh, "Neg": np.negative, "Exp": np.exp, "Log": np.log,
             "Sqrt": np.sqrt, "Abs": np.abs, "Identity": lambda t: t}
    binary = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}
    if op == "Constant":
        c = numpy_helper.to_array(a["value"])
        return c.astype(np.float64) if c.dtype == np.float32 else c
    if op == "Erf":
        return np.vectorize(math.erf)(x[0])
    if op == "Pow":
        return np.power(x[0], x[1])
    if op in ("Max", "Min"):
        return (np.maximum if op == "Max" else np.minimum)(x[0], x[1])
    if op == "Where":
        return np.where(x[0].astype(bool), x[1], x[2])
    if op == "Cast":
        to = {1: np.float64, 7: np.int64, 6: np.int32, 9: bool, 2: np.uint8}[a["to"]]
        return x[0].astype(to)
    if op in ("ReduceSum", "ReduceMax"):
        axes = tuple(int(k) for k in (x[1] if len(x) > 1 else a["axes"]))
        f = np.sum if op == "ReduceSum" else np.max
        return f(x[0], axis=axes, keepdims=bool(a.get("keepdims", 1)))
    if op == "Expand":
        return x[0] * np.ones(tuple(int(d) for d in x[1]), x[0].dtype)
    if op == "Concat":
        return np.concatenate(x, axis=a["axis"])
    if op == "Slice":
        idx = [slice(None)] * x[0].ndim
        axes = x[3] if len(x) > 3 else range(len(x[1]))
        for k, ax in enumerate(axes):
            idx[int(ax)] = slice(int(x[1][k]), int(x[2][k]))
        return x[0][tuple(idx)]
    if op == "Gather":
        return np.take(x[0], x[1].astype(np.int64), axis=a.get("axis", 0))
    if op == "Shape":
        return np.array(x[0].shape, np.int64)
    if op == "ConstantOfShape":
        fill = numpy_helper.to_array(a["value"]) if "value" in a else np.zeros(1, np.float32)
        return np.full(tuple(int(d) for d in x[0]), fill.reshape(-1)[0], np.float64)
    if op in unary:
        return unary[op](x[0])
    if op in binary:
        return binary[op](x[0], x[1])
    if op == "LeakyRelu":
        return np.where(x[0] >= 0, x[0], a.get("alpha", 0.01) * x[0])
    if op == "Reshape":
        shape = [x[0].shape[k] if d == 0 else int(d) for k, d in enumerate(x[1])]
        return x[0].reshape(shape)
    if op == "Transpose":
        return np.transpose(x[0], a["perm"])
    if op == "Gemm":
        p = x[0].T if a.get("transA") else x[0]
        q = x[1].T if a.get("transB") else x[1]
        y = a.get("alpha", 1.0) * (p @ q)
        return y + a.get("beta", 1.0) * x[2] if len(x) > 2 and x[2] is not None else y
    if op == "MatMul":
        return x[0] @ x[1]
    if op in ("Softmax", "LogSoftmax"):
        t = x[0] - x[0].max(axis=a.get("axis", -1), keepdims=True)
        s = np.log(np.exp(t).sum(axis=a.get("axis", -1), keepdims=True))
        return t - s if op == "LogSoftmax" else np.exp(t - s)
    if op == "LayerNormalization":
        m = x[0].mean(axis=-1, keepdims=True)
        var = ((x[0] - m) ** 2).mean(axis=-1, keepdims=True)
        y = (x[0] - m) / np.sqrt(var + a.get("epsilon", 1e-5)) * x[1]
        return y + x[2] if len(x) > 2 and x[2] is not None else y
    if op == "BatchNormalization":
        c = (1, -1) + (1,) * (x[0].ndim - 2)
        scale, bias, mean, var = (t.reshape(c) for t in x[1:5])
        return (x[0] - mean) / np.sqrt(var + a.get("epsilon", 1e-5)) * scale + bias
    if op == "GlobalAveragePool":
        return x[0].mean(axis=tuple(range(2, x[0].ndim)), keepdims=True)
    if op in ("Conv", "MaxPool", "AveragePool") and x[0].ndim == 4:
        k = a["kernel_shape"]
        s = a.get("strides", [1, 1])
        p = a.get("pads", [0, 0, 0, 0])
        if op == "MaxPool":
            return np.max([w for _, _, w in windows(x[0], k, s, p, -np.inf)], axis=0)
        if op == "AveragePool":
            total = np.sum([w for _, _, w in windows(x[0], k, s, p, 0)], axis=0)
            if a.get("count_include_pad", 0):
                return total / (k[0] * k[1])
            ones = np.ones((1, 1) + x[0].shape[2:], x[0].dtype)
            return total / np.sum([w for _, _, w in windows(ones, k, s, p, 0)], axis=0)
        if a.get("group", 1) != 1 or any(d != 1 for d in a.get("dilations", [1, 1])):
            raise NotImplementedError("Conv with groups or dilations")
        y = sum(np.einsum("nchw,oc->nohw", w, x[1][:, :, i, j])
                for i, j, w in windows(x[0], k, s, p, 0))
        return y + x[2].reshape(1, -1, 1, 1) if len(x) > 2 and x[2] is not None else y
    raise NotImplementedError(op)


def main():
    model = onnx.load(sys.argv[1])
    x, want = np.load(sys.argv[2]), np.load(sys.argv[3])
    g = model.graph
    v = {t.name: numpy_helper.to_array(t).astype(np.float64) for t in g.initializer}
    v[g.input[0].name] = x if x.dtype == np.int64 else x.astype(np.float64)
    try:
        for node in g.node:
            v[node.output[0]] = np.asarray(run(node, v))
    except NotImplementedError as e:
        print(f"onnx_eval: {sys.argv[1]}: op {e} is not evaluated here")
        return 2
    got = v[g.output[0].name]
    if got.size == want.size:  # WANT holds the rows flattened ([batch, ...] as [batch, n])
        got = got.reshape(want.shape)
    diff = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
    scale = max(1.0, float(np.abs(want).max()))
    print(f"onnx_eval: {sys.argv[1]}: NumPy evaluation vs tessel's forward: "
          f"max |diff| {diff:.3g} over {want.size} outputs")
    return 0 if diff <= 1e-5 * scale else 1


if __name__ == "__main__":
    sys.exit(main())
