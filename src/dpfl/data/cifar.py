"""CIFAR-10 from the batches of its python version.

Format (Krizhevsky 2009, "Learning multiple layers of features from tiny images"; the "CIFAR-10 python version",
cifar-10-python.tar.gz, published by A. Krizhevsky, V. Nair and G. Hinton at the University of Toronto): each batch
is a Python 2 pickle of a dict whose b"data" is a uint8 array [N, 3072] (N = 10,000; each row a 32 x 32 colour
image: 1,024 red values, then 1,024 green, then 1,024 blue, each channel row by row) and whose b"labels" is a list of
N class numbers 0..9 (airplane, automobile, bird, cat, deer, dog, frog, horse, ship, truck); b"batch_label" and
b"filenames" are not read.

Files: data_batch_1 ... data_batch_5 (the 50,000 training images) and test_batch (10,000), in the data set's folder
(``library.folder_of``) or in its cifar-10-batches-py folder, where the archive unpacks them; batches.meta is not
needed. Records: images [N, 3, 32, 32] of uint8 pixels (scaled to [0, 1] by the public constant 1/255 when
federated), the official split kept.

Unpickling a file can run code of the file's choosing, so the batches are read by an unpickler that builds nothing
but dicts, lists, numbers, strings and numpy arrays (``numpy.ndarray``, ``numpy.dtype`` and numpy's own array
reconstructors, under the names numpy 1 and 2 pickle them with), and refuses a file that names anything else.
"""

from __future__ import annotations

import codecs
import io
import pickle
from pathlib import Path

import numpy as np

from dpfl.data.library import PublicSet, Records, Shape, corrupt, missing, read_file

TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
FILES = (*TRAIN_FILES, TEST_FILE)
ARCHIVE_FOLDER = "cifar-10-batches-py"
IMAGE_SHAPE = (3, 32, 32)
ROW_BYTES = 3 * 32 * 32
PIXEL_SCALE = 1 / 255

_RECONSTRUCT = np.zeros(1).__reduce__()[0]  # numpy's ndarray reconstructor, whatever module it lives in
_FROM_BUFFER = np.zeros(1).__reduce_ex__(5)[0]  # its out-of-band (pickle protocol 5) reconstructor
#: (module, name) a batch may name -> what it gets; nothing else is built
ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy.core.numeric", "_frombuffer"): _FROM_BUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROM_BUFFER,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,  # how Python 3 pickles bytes at protocol 2
}


class _Refused(Exception):
    """A pickle naming something a data batch never holds."""


class _BatchUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        try:
            return ALLOWED[(module, name)]
        except KeyError:
            raise _Refused(f"{module}.{name}") from None


def _folder(folder: Path) -> Path:
    """The folder holding the batches: ``folder`` itself, or its cifar-10-batches-py folder."""
    if not any((folder / name).is_file() for name in FILES) and (folder / ARCHIVE_FOLDER).is_dir():
        return folder / ARCHIVE_FOLDER
    return folder


def locate(spec: PublicSet, folder: Path, why: str) -> list[Path]:
    """The six batch files; refused naming those missing."""
    base = _folder(folder)
    absent = [name for name in FILES if not (base / name).is_file()]
    if absent:
        raise missing(spec, base, why, f"{', '.join(FILES)} (in the folder or its {ARCHIVE_FOLDER} folder)", absent)
    return [base / name for name in FILES]


def _entry(batch: dict, key: str):
    """batch[b"key"] (Python 2's strings, read as bytes), or batch["key"] (a batch written by Python 3)."""
    return batch.get(key.encode(), batch.get(key))


def read_batch(path: Path) -> tuple[np.ndarray, np.ndarray, str]:
    """(images [N, 3, 32, 32] uint8, labels [N] int64, sha256 of the file) of one batch, checked."""
    raw, digest = read_file(path)
    expected = "a CIFAR-10 python batch: a pickled dict of b'data' (uint8 [N, 3072]) and b'labels' (N numbers 0..9)"
    try:
        batch = _BatchUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except _Refused as err:
        raise corrupt(path, expected, f"a pickle that names {err}, which a data batch never holds; dpfl does not "
                                      "unpickle it") from None
    except Exception as err:  # noqa: BLE001 - any failure of the (restricted) unpickler is a corrupt file
        raise corrupt(path, expected, f"an unreadable pickle: {type(err).__name__}: {err}") from None
    if not isinstance(batch, dict):
        raise corrupt(path, expected, f"a pickled {type(batch).__name__}")
    data, labels = _entry(batch, "data"), _entry(batch, "labels")
    if data is None or labels is None:
        raise corrupt(path, expected, f"the keys {sorted(map(repr, batch))}")
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != ROW_BYTES:
        found = (f"{data.dtype} {list(data.shape)}" if isinstance(data, np.ndarray) else type(data).__name__)
        raise corrupt(path, f"b'data', a uint8 array [N, {ROW_BYTES}] (32 x 32 pixels x 3 colours)", found)
    labels = np.asarray(labels)
    if labels.ndim != 1 or len(labels) != len(data) or labels.dtype.kind not in "iu":
        raise corrupt(path, f"b'labels', {len(data):,} class numbers (one per row of b'data')",
                      f"{labels.dtype} {list(labels.shape)}")
    bad = np.flatnonzero((labels < 0) | (labels >= 10))
    if len(bad):
        raise corrupt(path, "labels 0..9", f"{labels[bad[0]]} at record {bad[0]} ({len(bad)} out of range)")
    return data.reshape(len(data), *IMAGE_SHAPE), labels.astype(np.int64), digest


def load(spec: PublicSet, folder: Path, why: str) -> Records:
    """CIFAR-10's 60,000 records (module docstring): the five training batches, then the test batch marked test."""
    xs, ys, marks, files = [], [], [], []
    for path in locate(spec, folder, why):
        images, labels, digest = read_batch(path)
        xs.append(images)
        ys.append(labels)
        marks.append(np.full(len(labels), path.name == TEST_FILE))
        files.append({"file": path.name, "sha256": digest, "records": len(labels)})
    return Records(x=np.concatenate(xs), y=np.concatenate(ys), test=np.concatenate(marks), writers=None,
                   pixel_scale=PIXEL_SCALE, files=files)


def shape_of(spec: PublicSet, folder: Path, why: str) -> Shape:
    """Records from the files' sizes: a batch of N images holds their N x 3,072 bytes and a little more, so
    size // 3,072 bounds N from above (10,000 for a published batch). Reading a batch holds its bytes and the array
    built from them."""
    sizes = {path.name: path.stat().st_size for path in locate(spec, folder, why)}
    return Shape(records=sum(size // ROW_BYTES for size in sizes.values()),
                 test_records=sizes[TEST_FILE] // ROW_BYTES, record_shape=IMAGE_SHAPE, value_bytes=1,
                 client_sizes=None, parse_bytes=2 * max(sizes.values()))


__all__ = ["FILES", "ALLOWED", "PIXEL_SCALE", "read_batch", "load", "shape_of"]
