"""Interoperability of xshard's integrated checkpoints with Python, through numpy alone.

Usage: safetensors_interop.py DATA_DIR

1. Reads DATA_DIR/saved_2x2/model.safetensors (written by xshard on a 2x2 mesh, step 3),
   parsing the safetensors header in a few lines, and checks every tensor's values (the
   formula of tests/io/model.hpp) and its CRC-32 from the header's metadata.
2. Writes DATA_DIR/damaged.safetensors, a copy with one bit flipped in w2's data.
3. Writes DATA_DIR/from_python.safetensors (the model's parameters at step 0, in another
   order than xshard's), which the test program then loads into every layout.
"""

import json
import struct
import sys
import zlib

import numpy as np

DTYPES = {"F64": np.float64, "F32": np.float32, "I32": np.int32, "BF16": np.uint16}


def tensor_id(name):
    return sum(name.encode()) % 89


def expected(name, dtype, shape, step):
    """tests/io/model.hpp's expected_value for every element, as stored (BF16 as its bits)."""
    i = np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
    k = tensor_id(name) + step * 31
    if dtype == "BF16":
        values = ((i * 7 + k * 13) % 61) * 0.5 - 15  # exact in bfloat16: its bits are a float32's top half
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).reshape(shape)
    if dtype == "I32":
        return (((i * 7 + k * 13) % 1001) - 500).astype(np.int32).reshape(shape)
    return (((i * 7 + k * 13) % 1001) * 0.125 - 50).astype(DTYPES[dtype]).reshape(shape)


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    body = data[8 + length :]
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        dtype = np.dtype(DTYPES[entry["dtype"]]).newbyteorder("<")
        tensors[name] = (entry["dtype"], np.frombuffer(body[begin:end], dtype=dtype).reshape(entry["shape"]), body[begin:end])
    return tensors, metadata


def write_safetensors(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, (dtype, array) in tensors.items():
        blob = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def main():
    data_dir = sys.argv[1]
    tensors, metadata = read_safetensors(data_dir + "/saved_2x2/model.safetensors")
    crcs = json.loads(metadata["xshard.crc32"])
    strategy = json.loads(metadata["xshard.strategy"])
    assert metadata["xshard.step"] == "3", metadata["xshard.step"]
    assert strategy["mesh"] == {"axes": ["dp", "mp"], "sizes": [2, 2]}, strategy["mesh"]
    names = {"w1", "w2", "b", "e", "h", "counts", "optimizer.momentum.w1", "optimizer.momentum.w2"}
    assert set(tensors) == names, sorted(tensors)
    for name, (dtype, array, raw) in tensors.items():
        want = expected(name, dtype, array.shape, 3)
        assert np.array_equal(array, want), f"{name}: values differ from the formula"
        assert f"{zlib.crc32(raw):08x}" == crcs[name], f"{name}: CRC-32 differs"
    print(f"read {len(tensors)} tensors written by xshard: values and CRC-32s match")

    # A copy with one flipped bit in w2's data, for `xshard-ckpt verify` to catch.
    with open(data_dir + "/saved_2x2/model.safetensors", "rb") as f:
        damaged = bytearray(f.read())
    (length,) = struct.unpack("<Q", damaged[:8])
    damaged[8 + length + json.loads(damaged[8 : 8 + length])["w2"]["data_offsets"][0] + 5] ^= 0x04
    with open(data_dir + "/damaged.safetensors", "wb") as f:
        f.write(damaged)

    # Per-rank copies a load cannot use although every CRC matches: w1 deleted from one rank
    # file, w1's shape changed in strategy.json. `xshard-ckpt verify` must find both.
    import shutil
    for name in ("missing_block", "changed_shape"):
        shutil.rmtree(f"{data_dir}/{name}", ignore_errors=True)
        shutil.copytree(data_dir + "/saved_2x2/model", f"{data_dir}/{name}")
    path = data_dir + "/missing_block/rank_1.safetensors"
    with open(path, "rb") as f:
        data = f.read()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    del header["w1"]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data[8 + length :])
    path = data_dir + "/changed_shape/strategy.json"
    with open(path) as f:
        strategy = json.load(f)
    next(p for p in strategy["parameters"] if p["name"] == "w1")["shape"] = [12, 8]
    with open(path, "w") as f:
        json.dump(strategy, f)

    # Per-rank copies whose strategy.json lists a tensor that no rank file stores: one of
    # 2^17 x 2^17 float64 (merge must not allocate its 128 GiB), one of 2^62 x 0 (nor loop
    # over its rows). `merge` and `reshard` must refuse them at once, naming the tensor.
    for name, shape in (("unstored", [2**17, 2**17]), ("unstored_empty", [2**62, 0])):
        shutil.rmtree(f"{data_dir}/{name}", ignore_errors=True)
        shutil.copytree(data_dir + "/saved_2x2/model", f"{data_dir}/{name}")
        path = f"{data_dir}/{name}/strategy.json"
        with open(path) as f:
            strategy = json.load(f)
        strategy["parameters"].append({"name": "ghost", "shape": shape, "dtype": "F64",
                                       "layout": "[-, -]", "trainable": True})
        with open(path, "w") as f:
            json.dump(strategy, f)

    # Foreign files `xshard-ckpt info` must print safely or refuse clearly: a tensor name with
    # control characters (an escape sequence), a tensor of 9 dimensions.
    write_safetensors(data_dir + "/control_name.safetensors",
                      {"a\x1b[2J\nb": ("F32", np.zeros((2, 3), dtype=np.float32))})
    write_safetensors(data_dir + "/rank9.safetensors",
                      {"t": ("F32", np.zeros((1,) * 9, dtype=np.float32))})

    shapes = {"w1": ("F64", (12, 10)), "w2": ("F32", (7, 5)), "b": ("F64", (9,)), "e": ("F64", (3, 4, 6)),
              "h": ("BF16", (6, 4)), "counts": ("I32", (10,))}
    out = {name: (dtype, expected(name, dtype, shape, 0)) for name, (dtype, shape) in reversed(shapes.items())}
    write_safetensors(data_dir + "/from_python.safetensors", out)
    print(f"wrote {len(out)} tensors for xshard to load")


if __name__ == "__main__":
    main()
