#!/usr/bin/env python3
"""Paillier interop fixtures between python-paillier (`phe`) and tessel.

Run once, in a venv with phe (never a test-time dependency):

    python3 -m venv /work/venvs/phe && /work/venvs/phe/bin/pip install phe
    /work/venvs/phe/bin/python tests/parity/gen_phe_fixture.py write
        -> tests/parity/fixtures/phe_paillier.txt: a 1024-bit phe key (n, p, q) and
           phe ciphertexts of known integers (tests/unit/fed_paillier.c
           decrypts them with tessel)
    FED_TESSEL_CT_OUT=tests/parity/fixtures/tessel_paillier.txt build/test_unit_fed_paillier
        -> tessel ciphertexts of known integers under the same key
    /work/venvs/phe/bin/python tests/parity/gen_phe_fixture.py check
        -> phe decrypts tessel's ciphertexts (and their homomorphic sum)

Both files are text, one "name value" pair per line, integers in hex
(ciphertexts) or decimal (plaintexts, signed the phe way: -v is n - v).
"""
import os
import sys

import phe
from phe import paillier

HERE = os.path.dirname(os.path.abspath(__file__))
PHE_FILE = os.path.join(HERE, "fixtures", "phe_paillier.txt")
TESSEL_FILE = os.path.join(HERE, "fixtures", "tessel_paillier.txt")
# Known plaintexts: small, zero, negative, large (near int64).
VALUES = [0, 1, 42, -7, 123456789012345, -(2**62), 2**63 - 1]


def write():
    pub, priv = paillier.generate_paillier_keypair(n_length=1024)
    lines = ["# phe %s paillier fixture: key and ciphertexts of known integers" % phe.__version__,
             "n %x" % pub.n, "p %x" % priv.p, "q %x" % priv.q]
    for i, v in enumerate(VALUES):
        c = pub.encrypt(v).ciphertext(be_secure=True)
        lines.append("m%d %d" % (i, v))
        lines.append("c%d %x" % (i, c))
    os.makedirs(os.path.dirname(PHE_FILE), exist_ok=True)
    with open(PHE_FILE, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("wrote", PHE_FILE)


def read_pairs(path):
    out = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            k, v = line.split()
            out[k] = v
    return out


def check():
    key = read_pairs(PHE_FILE)
    n, p, q = (int(key[k], 16) for k in ("n", "p", "q"))
    pub = paillier.PaillierPublicKey(n)
    priv = paillier.PaillierPrivateKey(pub, p, q)
    t = read_pairs(TESSEL_FILE)
    if int(t["n"], 16) != n:
        sys.exit("tessel fixture was made under another key")
    count, total = 0, 0
    while "c%d" % count in t:
        m = int(t["m%d" % count])
        c = int(t["c%d" % count], 16)
        got = priv.decrypt(paillier.EncryptedNumber(pub, c, 0))
        if got != m:
            sys.exit("c%d: phe decrypts %d, tessel encrypted %d" % (count, got, m))
        total += m
        count += 1
    if count == 0:
        sys.exit("no tessel ciphertexts in " + TESSEL_FILE)
    # tessel's homomorphic sum of all of them, decrypted by phe
    s = priv.decrypt(paillier.EncryptedNumber(pub, int(t["sum"], 16), 0))
    if s != total:
        sys.exit("sum: phe decrypts %d, expected %d" % (s, total))
    print("phe decrypted %d tessel ciphertexts and their sum" % count)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("write", "check"):
        sys.exit("usage: gen_phe_fixture.py write|check")
    write() if sys.argv[1] == "write" else check()
