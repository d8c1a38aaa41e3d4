"""MNIST, Fashion-MNIST and EMNIST-balanced from their IDX files, gzipped (as published) or not.

Format (LeCun, Cortes, Burges, "The MNIST database of handwritten digits", which defines IDX): a 4-byte magic number,
big-endian, whose first two bytes are 0, third byte the value type (0x08: unsigned byte) and fourth byte the number of
dimensions; then each dimension's size as a 4-byte big-endian unsigned integer; then the values in C order (the last
dimension fastest). Images: magic 0x00000803 (unsigned bytes, 3 dimensions), sizes N, rows, columns, pixels 0..255
(0 = background); labels: magic 0x00000801 (unsigned bytes, 1 dimension), size N, class numbers.

Files, in the data set's folder (``library.folder_of``), each as named or with ``.gz`` (the uncompressed one is read
when both are there; ``LAYOUTS``):

    MNIST, Fashion-MNIST:  train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
                           t10k-labels-idx1-ubyte
    EMNIST-balanced:       emnist-balanced-train-images-idx3-ubyte, emnist-balanced-train-labels-idx1-ubyte,
                           emnist-balanced-test-images-idx3-ubyte, emnist-balanced-test-labels-idx1-ubyte

MNIST is published by Y. LeCun, C. Cortes and C. Burges; Fashion-MNIST (Xiao, Rasul, Vollgraf 2017) by Zalando
Research, with the same file names and format; EMNIST (Cohen, Afshar, Tapson, van Schaik 2017) by NIST, whose files
store each image transposed (column by column), turned here to MNIST's row-by-row orientation. Records: images
[N, 1, rows, columns] of uint8 pixels (scaled to [0, 1] by the public constant 1/255 when federated), the official
split kept (MNIST: 60,000 train, 10,000 t10k test; EMNIST-balanced: 112,800 and 18,800, 47 classes).
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dpfl.data.library import PublicSet, Records, Shape, corrupt, missing, read_file

IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801
GZIP_MAGIC = b"\x1f\x8b"
PIXEL_SCALE = 1 / 255


@dataclass(frozen=True)
class Layout:
    """A data set's IDX files: the name prefixes of its training and test splits, and whether its images are stored
    transposed."""

    train: str
    test: str
    transposed: bool = False

    def splits(self) -> tuple[tuple[str, bool], ...]:
        """(file name prefix, whether its records are the test split), in the order they are pooled."""
        return (self.train, False), (self.test, True)

    def files(self) -> tuple[str, ...]:
        return tuple(f"{prefix}-{kind}" for prefix, _ in self.splits()
                     for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"))


#: data.name -> its layout
LAYOUTS = {"mnist": Layout("train", "t10k"), "fashion_mnist": Layout("train", "t10k"),
           "emnist_balanced": Layout("emnist-balanced-train", "emnist-balanced-test", transposed=True)}


def _kind(magic: int) -> str:
    return "images" if magic == IMAGES_MAGIC else "labels"


def locate(spec: PublicSet, folder: Path, why: str) -> dict[str, Path]:
    """name -> the file to read (plain preferred to .gz) for each of the data set's files (``LAYOUTS``); refused
    naming what is missing."""
    found, absent = {}, []
    files = LAYOUTS[spec.name].files()
    for name in files:
        candidates = [folder / name, folder / f"{name}.gz"]
        present = [path for path in candidates if path.is_file()]
        if present:
            found[name] = present[0]
        else:
            absent.append(f"{name}[.gz]")
    if absent:
        raise missing(spec, folder, why, ", ".join(f"{name}[.gz]" for name in files), absent)
    return found


def _decompressed(path: Path, raw: bytes) -> bytes:
    if raw[:2] != GZIP_MAGIC:
        return raw
    try:
        return gzip.decompress(raw)
    except (OSError, EOFError, zlib.error) as err:
        raise corrupt(path, "a readable gzip file", f"{err}") from None


def _header(path: Path, data: bytes, magic: int) -> tuple[tuple[int, ...], int]:
    """The dimensions an IDX file's header announces, and where its values start; refused unless its magic number
    is ``magic``."""
    expected = f"an IDX {_kind(magic)} file, magic number 0x{magic:08X}"
    if len(data) < 4:
        raise corrupt(path, expected, f"{len(data)} bytes in all")
    found = int.from_bytes(data[:4], "big")
    if found != magic:
        hint = ""
        if found == (LABELS_MAGIC if magic == IMAGES_MAGIC else IMAGES_MAGIC):
            hint = f", the magic number of {_kind(found)}: are the files' names swapped?"
        elif data[:2] != b"\0\0":
            hint = ", whose first two bytes are not 0: not an IDX file"
        raise corrupt(path, expected, f"0x{found:08X}{hint}")
    ndim = magic & 0xFF
    start = 4 + 4 * ndim
    if len(data) < start:
        raise corrupt(path, f"{expected} and {ndim} dimension sizes", f"a header cut off after {len(data)} bytes")
    return struct.unpack(f">{ndim}I", data[4:start]), start


def read_idx(path: Path, magic: int) -> tuple[np.ndarray, str]:
    """The uint8 array an IDX file holds (gzipped or not), and the sha256 of the file as stored."""
    raw, digest = read_file(path)
    data = _decompressed(path, raw)
    shape, start = _header(path, data, magic)
    count = int(np.prod(shape))
    body = len(data) - start
    if body != count:
        dims = " x ".join(f"{n:,}" for n in shape)
        problem = "truncated: " if body < count else ""
        raise corrupt(path, f"the {dims} = {count:,} values its header announces",
                      f"{problem}{body:,} bytes of values")
    return np.frombuffer(data, dtype=np.uint8, count=count, offset=start).reshape(shape), digest


def header_shape(path: Path, magic: int) -> tuple[int, ...]:
    """The dimensions of an IDX file from its header alone (for a memory estimate)."""
    try:
        with open(path, "rb") as handle:
            gzipped = handle.read(2) == GZIP_MAGIC
        with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as handle:
            head = handle.read(4 + 4 * 3)
    except (OSError, EOFError, zlib.error) as err:
        raise corrupt(path, "a readable IDX file, gzipped or not", getattr(err, "strerror", None) or f"{err}") \
            from None
    return _header(path, head, magic)[0]


def load(spec: PublicSet, folder: Path, why: str) -> Records:
    """The records of an IDX data set (module docstring): every image of both splits, the test ones marked."""
    paths, layout = locate(spec, folder, why), LAYOUTS[spec.name]
    xs, ys, marks, files, sizes = [], [], [], [], ()
    for split, is_test in layout.splits():
        images_path, labels_path = paths[f"{split}-images-idx3-ubyte"], paths[f"{split}-labels-idx1-ubyte"]
        images, images_sha = read_idx(images_path, IMAGES_MAGIC)
        labels, labels_sha = read_idx(labels_path, LABELS_MAGIC)
        if len(labels) != len(images):
            raise corrupt(labels_path, f"{len(images):,} labels, one per image of {images_path.name}",
                          f"{len(labels):,}")
        bad = np.flatnonzero(labels >= len(spec.classes))
        if len(bad):
            raise corrupt(labels_path, f"labels 0..{len(spec.classes) - 1}",
                          f"{labels[bad[0]]} at record {bad[0]} ({len(bad)} out of range)")
        if xs and images.shape[1:] != sizes:
            raise corrupt(images_path, f"{' x '.join(map(str, sizes))} images, as in the training images",
                          f"{' x '.join(map(str, images.shape[1:]))}")
        sizes = images.shape[1:]
        xs.append((images.transpose(0, 2, 1) if layout.transposed else images)[:, None])
        ys.append(labels.astype(np.int64))
        marks.append(np.full(len(labels), is_test))
        files += [{"file": path.name, "sha256": sha, "records": len(labels)}
                  for path, sha in ((images_path, images_sha), (labels_path, labels_sha))]
    return Records(x=np.concatenate(xs), y=np.concatenate(ys), test=np.concatenate(marks), writers=None,
                   pixel_scale=PIXEL_SCALE, files=files)


def shape_of(spec: PublicSet, folder: Path, why: str) -> Shape:
    """The records and image size from the image files' headers; the largest file's stored and decompressed bytes
    are the parse's own memory."""
    paths, splits = locate(spec, folder, why), LAYOUTS[spec.name].splits()
    shapes = [header_shape(paths[f"{split}-images-idx3-ubyte"], IMAGES_MAGIC) for split, _ in splits]
    parse = max(paths[f"{split}-images-idx3-ubyte"].stat().st_size + int(np.prod(shape))
                for (split, _), shape in zip(splits, shapes))
    height, width = shapes[0][1:]
    return Shape(records=sum(s[0] for s in shapes), test_records=shapes[1][0],
                 record_shape=(1, width, height) if LAYOUTS[spec.name].transposed else (1, height, width),
                 value_bytes=1, client_sizes=None, parse_bytes=parse)


__all__ = ["IMAGES_MAGIC", "LABELS_MAGIC", "LAYOUTS", "Layout", "PIXEL_SCALE", "read_idx", "header_shape", "load",
           "shape_of"]
