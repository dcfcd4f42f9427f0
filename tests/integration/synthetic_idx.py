"""Writes a small labelled image set in Fashion-MNIST's file format (gzip'd
IDX: train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz and the t10k
pair) into DIR, for the example runs on a machine without Debian's
dataset-fashion-mnist. Each of the 10 classes is a fixed random 28x28
pattern plus noise, so a classifier can learn it and a test can tell that
it did; nothing of the real data is imitated beyond the format.

Usage: synthetic_idx.py DIR [TRAIN [TEST]] (6000 and 1000 images)
"""
import gzip
import os
import random
import struct
import sys


def write(path, magic, dims, payload):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims))
        f.write(payload)


def images(rng, protos, n, prefix, out):
    labels = bytes(rng.randrange(10) for _ in range(n))
    pix = bytearray()
    for y in labels:
        p = protos[y]
        pix += bytes(max(0, min(255, v + rng.randrange(-60, 61))) for v in p)
    # IDX magic: 0x00000803 for unsigned-byte 3-d data, 0x00000801 for 1-d.
    write(os.path.join(out, prefix + "-images-idx3-ubyte.gz"), 0x803, (n, 28, 28), bytes(pix))
    write(os.path.join(out, prefix + "-labels-idx1-ubyte.gz"), 0x801, (n,), labels)


def main():
    out = sys.argv[1]
    n_train = int(sys.argv[2]) if len(sys.argv) > 2 else 6000
    n_test = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    os.makedirs(out, exist_ok=True)
    rng = random.Random(7)
    protos = [[rng.choice((0, 0, 40, 200, 255)) for _ in range(784)] for _ in range(10)]
    images(rng, protos, n_train, "train", out)
    images(rng, protos, n_test, "t10k", out)


main()
