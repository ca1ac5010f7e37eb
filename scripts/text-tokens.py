#!/usr/bin/env python3
"""Byte-level tokens of real text, for convergence checks on a gpt model.

Concatenates the Python standard library's sources (Debian's python3.11,
always installed with python3) and writes the first N bytes as one
little-endian uint16 token per byte, the `data.source: tokens` format
(docs/config.md): ids 0-255, so any model.vocab >= 256 reads them.

    scripts/text-tokens.py /tmp/py.tok            # 3 000 000 tokens
    tessel train examples/w3.yaml --set data.source=tokens --set data.path=/tmp/py.tok ...
"""
import array
import glob
import sys


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: text-tokens.py OUT [N_TOKENS]")
    out = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) == 3 else 3_000_000
    files = sorted(glob.glob("/usr/lib/python3.11/*.py"))
    if not files:
        sys.exit("text-tokens.py: no sources under /usr/lib/python3.11 (apt-get install python3)")
    data = b"".join(open(f, "rb").read() for f in files)[:n]
    if len(data) < n:
        sys.exit(f"text-tokens.py: only {len(data)} bytes of text, {n} asked")
    tokens = array.array("H", list(data))
    if sys.byteorder != "little":
        tokens.byteswap()
    with open(out, "wb") as f:
        f.write(tokens.tobytes())
    print(f"{out}: {len(tokens)} tokens from {len(files)} files")


if __name__ == "__main__":
    main()
