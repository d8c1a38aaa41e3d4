"""A federated data set as a folder of stacked client arrays, memory-mapped when read (``data.name = "clients"``,
``data.path`` the folder): for populations whose records do not fit in RAM (10^5 clients and more), and for a data
set built once and run many times.

The folder holds, for each split s in (train, test), ``s_x.npy`` [M, max_records, *feature_shape] float32,
``s_y.npy`` [M, max_records] int64 and ``s_counts.npy`` [M] int64 (the layout of ``ClientArrays``: client i's
records are its first counts[i] rows, the rest zero), and ``dataset.json`` {"format", "name", "num_classes",
"info"}. ``save`` writes it from any ``FederatedDataset``; ``load`` maps the x and y arrays (numpy's copy-on-write
mode: the process reads only the pages a round's cohort touches and writes nothing back) and reads the counts.
The features are not read on loading (that would defeat the mapping): their shapes and dtype are checked, the
counts against the room for records, and the labels (8 bytes a record) in [0, num_classes).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from dpfl.data.federated import ClientArrays, FederatedDataset
from dpfl.errors import ConfigError

FORMAT = "dpfl-stacked-clients-1"
SPLITS = ("train", "test")
PARTS = {"x": np.float32, "y": np.int64, "counts": np.int64}
MANIFEST = "dataset.json"


def files() -> list[str]:
    """The names of the folder's files."""
    return [MANIFEST, *(f"{split}_{part}.npy" for split in SPLITS for part in PARTS)]


def save(dataset: FederatedDataset, directory: str | Path) -> Path:
    """Writes ``dataset`` into ``directory`` (created; files already there are replaced) as ``load`` reads it."""
    directory = Path(directory)
    for split in SPLITS:
        y = getattr(dataset, split).y
        if y.numel() and not (0 <= int(y.min()) and int(y.max()) < dataset.num_classes):
            raise ValueError(f"{split} labels must lie in [0, {dataset.num_classes}); found "
                             f"[{int(y.min())}, {int(y.max())}]")
    directory.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        arrays = getattr(dataset, split)
        for part in PARTS:
            np.save(directory / f"{split}_{part}.npy", getattr(arrays, part).cpu().numpy())
    manifest = {"format": FORMAT, "name": dataset.name, "num_classes": dataset.num_classes, "info": dataset.info}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return directory


def _refuse(directory: Path, expected: str) -> ConfigError:
    return ConfigError("data.path", str(directory), expected)


def _manifest(directory: Path) -> dict:
    if not directory.is_dir():
        raise _refuse(directory, f"a folder written by dpfl.data.stacked.save, holding {', '.join(files())} (found "
                                 f"{'no such folder' if not directory.exists() else 'a file'})")
    missing = [name for name in files() if not (directory / name).is_file()]
    if missing:
        raise _refuse(directory, f"a folder holding {', '.join(files())} (dpfl.data.stacked.save writes them); "
                                 f"missing: {', '.join(missing)}")
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _refuse(directory, f"a readable {MANIFEST} ({type(err).__name__}: {err})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise _refuse(directory, f"{MANIFEST} with format {FORMAT!r} (found "
                                 f"{manifest.get('format') if isinstance(manifest, dict) else manifest!r})")
    classes = manifest.get("num_classes")
    if not isinstance(classes, int) or classes < 2:
        raise _refuse(directory, f"{MANIFEST} with num_classes an integer >= 2 (found {classes!r})")
    return manifest


def _mapped(directory: Path, split: str, part: str, mmap: bool) -> np.ndarray:
    path = directory / f"{split}_{part}.npy"
    try:
        array = np.load(path, mmap_mode="c" if mmap else None, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise _refuse(directory, f"{path.name} a .npy array file ({type(err).__name__}: {err})") from None
    if array.dtype != PARTS[part]:
        raise _refuse(directory, f"{path.name} of dtype {np.dtype(PARTS[part]).name} (found {array.dtype.name})")
    return array


def _split(directory: Path, split: str) -> ClientArrays:
    x, y = (_mapped(directory, split, part, True) for part in ("x", "y"))
    counts = _mapped(directory, split, "counts", False)
    if x.ndim < 2 or x.shape[:2] != y.shape or counts.shape != y.shape[:1]:
        raise _refuse(directory, f"{split} arrays of shapes x [clients, records, ...], y [clients, records], counts "
                                 f"[clients] (found x {x.shape}, y {y.shape}, counts {counts.shape})")
    if counts.size and not (0 <= counts.min() and counts.max() <= y.shape[1]):
        raise _refuse(directory, f"{split}_counts.npy within [0, {y.shape[1]}], the records a client has room for "
                                 f"(found [{counts.min()}, {counts.max()}])")
    return ClientArrays(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(counts))


def _check_labels(directory: Path, split: str, arrays: ClientArrays, num_classes: int) -> None:
    labels = arrays.y[arrays.mask]
    if labels.numel() and not (0 <= int(labels.min()) and int(labels.max()) < num_classes):
        raise _refuse(directory, f"{split}_y.npy labels in [0, {num_classes}) (num_classes of {MANIFEST}; found "
                                 f"[{int(labels.min())}, {int(labels.max())}])")


def load(directory: str | Path) -> FederatedDataset:
    """The data set ``save`` wrote to ``directory``, its records memory-mapped (module docstring); a missing or
    inconsistent folder is a ``ConfigError`` naming data.path and what is wrong."""
    directory = Path(directory)
    manifest = _manifest(directory)
    train, test = (_split(directory, split) for split in SPLITS)
    if train.num_clients != test.num_clients or train.feature_shape != test.feature_shape:
        raise _refuse(directory, f"train and test of the same clients and features (found {train.num_clients} and "
                                 f"{test.num_clients} clients, features {train.feature_shape} and "
                                 f"{test.feature_shape})")
    for split, arrays in zip(SPLITS, (train, test)):
        _check_labels(directory, split, arrays, manifest["num_classes"])
    info = {**manifest.get("info", {}), "stored": {"format": FORMAT, "path": str(directory), "memory_mapped": True}}
    return FederatedDataset(train, test, manifest["num_classes"], manifest.get("name", "clients"), info)


def shape_of(directory: str | Path) -> dict:
    """What a memory estimate needs, from the arrays' headers: clients, max_records, features, held_bytes (what
    ``load`` reads into memory: the counts; the records are mapped)."""
    directory = Path(directory)
    _manifest(directory)
    x = _mapped(directory, "train", "x", True)
    return {"clients": x.shape[0], "max_records": x.shape[1], "features": int(np.prod(x.shape[2:])),
            "held_bytes": 2 * 8 * x.shape[0]}


__all__ = ["FORMAT", "files", "save", "load", "shape_of"]
