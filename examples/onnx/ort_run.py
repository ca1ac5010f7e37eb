#!/usr/bin/env python3
"""Runs an ONNX file with ONNX Runtime (step 5 of examples/onnx/README.md).

    ort_run.py MODEL.onnx X.npy [WANT.npy | LABELS.npy]

Feeds X to the model's first input and prints the output's shape; with
WANT (tessel's own forward on X, as tests/e2e/onnx_export*.c write it), the
largest difference, exiting 1 beyond fp32 tolerance (1e-5 of the largest
value, at least 1e-5); with integer LABELS, the accuracy of the output's
argmax. ONNX Runtime is not a Debian package: install it in a
virtual environment (pip install onnxruntime numpy); no tessel test needs it
(they run this only when TESSEL_ORT_PYTHON names such a python)."""
import sys

import numpy as np
import onnxruntime as ort


def main():
    if len(sys.argv) not in (3, 4):
        print(__doc__)
        return 2
    sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
    x = np.load(sys.argv[2])
    inp = sess.get_inputs()[0]
    if x.ndim != len(inp.shape):  # rows flattened: the model's own per-row shape
        x = x.reshape((x.shape[0],) + tuple(int(d) for d in inp.shape[1:]))
    y = sess.run(None, {inp.name: x})[0]
    print(f"ort_run: {sys.argv[1]}: onnxruntime {ort.__version__}, input {inp.name} "
          f"{list(x.shape)} -> output {list(y.shape)}")
    if len(sys.argv) == 3:
        return 0
    want = np.load(sys.argv[3])
    if want.dtype.kind in "iu":
        acc = float((y.reshape(len(want), -1).argmax(axis=1) == want).mean())
        print(f"ort_run: {sys.argv[1]}: accuracy {acc:.4f} over {len(want)} labelled examples")
        return 0
    got = y.reshape(want.shape) if y.size == want.size else y
    diff = float(np.abs(got - want).max()) if got.shape == want.shape else float("inf")
    scale = max(1.0, float(np.abs(want).max()))
    print(f"ort_run: {sys.argv[1]}: ONNX Runtime vs tessel's forward: max |diff| {diff:.3g} "
          f"over {want.size} outputs")
    return 0 if diff <= 1e-5 * scale else 1


if __name__ == "__main__":
    sys.exit(main())
