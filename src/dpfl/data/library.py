"""Where the public data sets' files are, and what a loader of their real formats hands on: a local folder only.

A data set's folder is ``data.path`` when the config gives one; otherwise ``$DPFL_DATA/<data.name>`` (the environment
variable ``DPFL_DATA`` names a folder holding one folder per data set); otherwise ``~/.dpfl/data/<data.name>``.
dpfl never downloads: a missing folder or file is refused naming the files it expected, the folder it looked in
(and why there), and where the data set is published. A file that is there but corrupt is refused naming the file
and what is wrong with it.

Each format's loader (``idx.py``, ``cifar.py``, ``leaf.py``) returns ``Records``: the pooled records with the data
set's own split and, where it has them, its natural clients; ``public.py`` federates them.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dpfl.errors import ConfigError

DATA_ENV = "DPFL_DATA"
DEFAULT_ROOT = "~/.dpfl/data"


@dataclass(frozen=True)
class PublicSet:
    """A public data set dpfl reads in its published format.

    ``name`` is its data.name (and its folder's name under the data root), ``title`` how people call it, ``source``
    who publishes it and where (named in the message when its files are missing; dpfl fetches nothing), ``classes``
    the names of classes 0..C-1, ``natural`` whether its records come with their writers (the natural clients).
    """

    name: str
    title: str
    source: str
    classes: tuple[str, ...]
    natural: bool = False


@dataclass
class Records:
    """A public data set's records, pooled, as its loader read them.

    Attributes:
      x: [N, *record shape]: uint8 pixels (images [N, C, H, W]), float32 values, or uint8 symbol ids.
      y: [N] int64 class numbers 0..C-1 (``PublicSet.classes``).
      test: [N] bool, True for a record of the data set's own test split; None when it brings none.
      writers: [N] the natural client of each record (LEAF's writers, speaking roles); None when there are none.
      pixel_scale: the public constant that brings ``x`` to [0, 1] (1/255 for 8-bit pixels), 1 if it is already.
      files: provenance of each file read: {"file": path relative to the folder, "sha256": ..., "records": n}.
      details: anything else the format records (e.g. a sequence length, characters outside a vocabulary).
    """

    x: np.ndarray
    y: np.ndarray
    test: np.ndarray | None
    writers: np.ndarray | None
    pixel_scale: float
    files: list[dict]
    details: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Shape:
    """What a memory estimate needs of a public data set, read from its files' headers (``public.shape_of``).

    ``records`` N (an upper bound where the headers do not say exactly), ``test_records`` those of its own test split
    (0 without one), ``record_shape`` of one record's features, ``value_bytes`` of one stored value as the loader keeps
    it, ``client_sizes`` the (train, test) records of each natural client (None without them), ``parse_bytes`` the
    most memory reading one file takes besides the records kept (its bytes, decompressed, and the parser's objects),
    ``id_bytes`` what a record's class number, split mark and writer id take as the loader keeps them (int64, bool, a
    numpy string of 4 bytes a character).
    """

    records: int
    test_records: int
    record_shape: tuple[int, ...]
    value_bytes: int
    client_sizes: list[tuple[int, int]] | None
    parse_bytes: int
    id_bytes: int = 8 + 1

    @property
    def features(self) -> int:
        return int(np.prod(self.record_shape))


def data_root() -> tuple[Path, str]:
    """The folder holding one folder per data set, and why that one ($DPFL_DATA, or the default)."""
    root = os.environ.get(DATA_ENV)
    if root:
        return Path(root).expanduser(), f"${DATA_ENV}"
    return Path(DEFAULT_ROOT).expanduser(), f"the default folder ({DATA_ENV} is not set)"


def folder_of(spec: PublicSet, path: str | None) -> tuple[Path, str]:
    """The folder of ``spec``'s files: ``path`` (data.path), else the data root's folder named ``spec.name``; and
    why that folder, for messages."""
    if path:
        return Path(path).expanduser(), "data.path"
    root, why = data_root()
    return root / spec.name, f"{why}/{spec.name}"


def missing(spec: PublicSet, folder: Path, why: str, expected: str, absent: list[str] | None = None) -> ConfigError:
    """The refusal of a folder without ``spec``'s files: which files (``expected``; ``absent``, those not found),
    where dpfl looked and why there, and where the data set is published."""
    if not folder.exists():
        found = "no such folder"
    elif not folder.is_dir():
        found = "not a folder"
    else:
        found = f"missing {', '.join(absent)}" if absent else "none of them"
    return ConfigError(
        "data.path", str(folder),
        f"a folder holding the {spec.title} files: {expected} (found {found}; dpfl looked in {folder}, from {why}). "
        f"dpfl never downloads data: get {spec.title} from {spec.source}, then put its files in {folder}, or set "
        f"data.path to the folder holding them, or {DATA_ENV} to a folder holding a '{spec.name}' folder")


def corrupt(path: Path, expected: str, found: str) -> ConfigError:
    """The refusal of a file that is there but not what its format says: the file, what was expected, what found."""
    return ConfigError("data.path", str(path), f"{expected} (found {found})")


def read_file(path: Path) -> tuple[bytes, str]:
    """The bytes of ``path`` and their sha256 (the file as stored: a gzipped file's compressed bytes)."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise corrupt(path, "a readable file", err.strerror or str(err)) from None
    return raw, hashlib.sha256(raw).hexdigest()


__all__ = ["DATA_ENV", "DEFAULT_ROOT", "PublicSet", "Records", "Shape", "data_root", "folder_of", "missing",
           "corrupt", "read_file"]
