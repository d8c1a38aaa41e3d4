"""Writers of the public data sets' real formats, byte for byte, for tests to make small files with.

* IDX (LeCun, Cortes, Burges: the MNIST database's format): a big-endian magic number 0x00000803 (images) or
  0x00000801 (labels), then each dimension's size as a big-endian 4-byte integer, then the uint8 values in C order;
  gzipped as published, or not.
* CIFAR-10's python batches: what Python 2's cPickle wrote (protocol 2, Python 2 strings as SHORT_BINSTRING /
  BINSTRING, numpy's array as ``numpy.core.multiarray._reconstruct`` + ``ndarray.__setstate__``), assembled opcode by
  opcode here, since Python 3's pickle writes bytes differently.
* LEAF's JSON: {"users": [...], "num_samples": [...], "user_data": {user: {"x": [...], "y": [...]}}} in train/ and
  test/ (or all_data/), with json.dump's separators, as LEAF's scripts write them.
"""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import numpy as np

IDX_NAMES = {("train", "images"): "train-images-idx3-ubyte", ("train", "labels"): "train-labels-idx1-ubyte",
             ("test", "images"): "t10k-images-idx3-ubyte", ("test", "labels"): "t10k-labels-idx1-ubyte"}
EMNIST_NAMES = {(split, kind): f"emnist-balanced-{split}-{kind}-idx{3 if kind == 'images' else 1}-ubyte"
                for split in ("train", "test") for kind in ("images", "labels")}


# -- IDX -----------------------------------------------------------------------------------------------------------
def idx_bytes(array: np.ndarray) -> bytes:
    array = np.asarray(array, dtype=np.uint8)
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> Path:
    data = idx_bytes(array)
    path = path.with_name(path.name + ".gz") if gz else path
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def mnist_records(n_train: int = 40, n_test: int = 10, side: int = 28, seed: int = 0) -> dict:
    """Images whose first pixel is the record's index within its split (so a record can be found again) and whose
    second is its label; labels cycle 0..9."""
    rng = np.random.default_rng(seed)
    records = {}
    for split, n in (("train", n_train), ("test", n_test)):
        images = rng.integers(0, 256, (n, side, side), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        images[:, 0, 0], images[:, 0, 1] = np.arange(n) % 256, labels
        records[split] = (images, labels)
    return records


def write_mnist(folder: Path, records: dict | None = None, gz: bool = False, emnist: bool = False) -> dict:
    """MNIST's four files (or EMNIST-balanced's, whose images NIST stores transposed: column by column)."""
    folder.mkdir(parents=True, exist_ok=True)
    records = records or mnist_records()
    names = EMNIST_NAMES if emnist else IDX_NAMES
    for split, (images, labels) in records.items():
        write_idx(folder / names[(split, "images")], images.transpose(0, 2, 1) if emnist else images, gz)
        write_idx(folder / names[(split, "labels")], labels, gz)
    return records


# -- CIFAR-10 (Python 2's cPickle, protocol 2) ----------------------------------------------------------------------
def _py2_str(value: bytes) -> bytes:
    if len(value) < 256:
        return b"U" + bytes([len(value)]) + value  # SHORT_BINSTRING
    return b"T" + struct.pack("<i", len(value)) + value  # BINSTRING


def _py2_int(value: int) -> bytes:
    if 0 <= value < 256:
        return b"K" + bytes([value])  # BININT1
    if 0 <= value < 65536:
        return b"M" + struct.pack("<H", value)  # BININT2
    return b"J" + struct.pack("<i", value)  # BININT


def _py2_array(array: np.ndarray) -> bytes:
    """numpy 1's ndarray.__reduce__ as Python 2 pickled it: _reconstruct(ndarray, (0,), 'b'), then __setstate__ with
    (1, shape, dtype('u1') with its state (3, '|', None, None, None, -1, -1, 0), False, the raw bytes)."""
    assert array.dtype == np.uint8
    shape = b"".join(_py2_int(n) for n in array.shape)
    dtype = (b"cnumpy\ndtype\n" + _py2_str(b"u1") + _py2_int(0) + _py2_int(1) + b"\x87R"
             + b"(" + _py2_int(3) + _py2_str(b"|") + b"NNN" + _py2_int(-1) + _py2_int(-1) + _py2_int(0) + b"tb")
    return (b"cnumpy.core.multiarray\n_reconstruct\n" + b"cnumpy\nndarray\n" + _py2_int(0) + b"\x85" + _py2_str(b"b")
            + b"\x87R" + b"(" + _py2_int(1) + b"(" + shape + b"t" + dtype + b"\x89" + _py2_str(array.tobytes())
            + b"tb")


def py2_pickle(batch: dict) -> bytes:
    """A dict of bytes keys -> uint8 array, list of ints, list of bytes or bytes, as Python 2's cPickle wrote it."""
    out = b"\x80\x02}("
    for key, value in batch.items():
        out += _py2_str(key)
        if isinstance(value, np.ndarray):
            out += _py2_array(value)
        elif isinstance(value, bytes):
            out += _py2_str(value)
        else:
            out += b"](" + b"".join(_py2_int(v) if isinstance(v, int) else _py2_str(v) for v in value) + b"e"
    return out + b"u."


def cifar_batch(n: int, start: int, seed: int) -> dict:
    """A batch of n images whose first red pixel is (start + index) mod 256 and whose labels cycle 0..9."""
    data = np.random.default_rng(seed).integers(0, 256, (n, 3072), dtype=np.uint8)
    data[:, 0] = (start + np.arange(n)) % 256
    labels = [int(v) for v in (start + np.arange(n)) % 10]
    return {b"batch_label": b"training batch 1 of 5", b"labels": labels, b"data": data,
            b"filenames": [b"img_%d.png" % (start + i) for i in range(n)]}


def write_cifar(folder: Path, per_batch: int = 6, test: int = 10) -> dict[str, dict]:
    folder.mkdir(parents=True, exist_ok=True)
    batches = {f"data_batch_{i}": cifar_batch(per_batch, (i - 1) * per_batch, i) for i in range(1, 6)}
    batches["test_batch"] = cifar_batch(test, 5 * per_batch, 9)
    for name, batch in batches.items():
        (folder / name).write_bytes(py2_pickle(batch))
    return batches


# -- LEAF JSON -----------------------------------------------------------------------------------------------------
def write_leaf(folder: Path, name: str, users: dict[str, tuple[list, list]], hierarchies: list | None = None) -> Path:
    """One LEAF JSON file ``folder/name`` of ``users`` (user -> (x, y)), keys in LEAF's order."""
    folder.mkdir(parents=True, exist_ok=True)
    document = {"users": list(users)}
    if hierarchies is not None:
        document["hierarchies"] = hierarchies
    document["num_samples"] = [len(y) for _, y in users.values()]
    document["user_data"] = {user: {"x": x, "y": y} for user, (x, y) in users.items()}
    path = folder / name
    with open(path, "w") as handle:
        json.dump(document, handle)
    return path


def femnist_writer(index: int, records: int, seed: int = 0) -> tuple[list, list]:
    """A writer's records: 784 pixel values k / 255 (as LEAF writes them), the first being index / 255, classes
    cycling from ``index`` over 0..61."""
    rng = np.random.default_rng(seed + index)
    pixels = rng.integers(0, 256, (records, 784))
    pixels[:, 0] = (index * 16 + np.arange(records)) % 256
    x = (pixels / 255).tolist()
    y = [(index + j) % 62 for j in range(records)]
    return x, y


def shakespeare_role(text: str, length: int = 80) -> tuple[list, list]:
    """LEAF's next-character records of one speaking role's ``text``: each window of ``length`` characters of the
    text prefixed with ``length`` spaces, and the character after it."""
    padded = " " * length + text
    return ([padded[i:i + length] for i in range(len(padded) - length)],
            [padded[i + length] for i in range(len(padded) - length)])
