"""Writes a small MNIST-like data set in the IDX format of the real one, for train_mlp --mnist.

Usage: make_mnist_like.py DIR

DIR gets train-images-idx3-ubyte / train-labels-idx1-ubyte (2048 images) and
t10k-images-idx3-ubyte / t10k-labels-idx1-ubyte (512): 28 x 28 bytes per image, showing its
digit's class (0-9) as a bright bar whose row and column depend on the class, over noise.
Deterministic (fixed seed); the standard library only.
"""

import os
import random
import struct
import sys

SIDE = 28


def image(label, rng):
    pixels = bytearray(rng.randrange(0, 64) for _ in range(SIDE * SIDE))
    row = 2 + 2 * label
    for c in range(4 + label, 14 + label):
        for r in (row, row + 1):
            pixels[r * SIDE + c] = rng.randrange(160, 256)
    return bytes(pixels)


def write(directory, prefix, count, rng):
    labels = [rng.randrange(10) for _ in range(count)]
    with open(os.path.join(directory, f"{prefix}-images-idx3-ubyte"), "wb") as f:
        f.write(struct.pack(">IIII", 0x00000803, count, SIDE, SIDE))
        for label in labels:
            f.write(image(label, rng))
    with open(os.path.join(directory, f"{prefix}-labels-idx1-ubyte"), "wb") as f:
        f.write(struct.pack(">II", 0x00000801, count))
        f.write(bytes(labels))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    os.makedirs(sys.argv[1], exist_ok=True)
    rng = random.Random(2024)
    write(sys.argv[1], "train", 2048, rng)
    write(sys.argv[1], "t10k", 512, rng)


if __name__ == "__main__":
    main()
