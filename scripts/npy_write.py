"""write_npy: a 1-D or 2-D array as a .npy file (format 1.0, C order), for the
fixture scripts of this folder (standard library only, no numpy needed)."""
import struct


def write_npy(path, descr, shape, values, fmt):
    """values: the elements in C order; descr: the .npy dtype ('<f4', '<i8',
    '|u1'); fmt: its struct code ('f', 'q', 'B')."""
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (
        descr, "(%d,)" % shape[0] if len(shape) == 1 else "(%d, %d)" % shape)
    pad = 64 - (10 + len(header) + 1) % 64
    header += " " * pad + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(struct.pack("<%d%s" % (len(values), fmt), *values))
