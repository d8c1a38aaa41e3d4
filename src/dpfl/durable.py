"""Durable, atomic writes of a run directory's files (ledger.json, checkpoint.pt, run.json, results.json).

A temporary file beside the target is written, flushed to disk and renamed over the target, so a crash leaves either
the old file or the new one, never a truncated one. That is what lets a crashed run resume without losing the
privacy already spent.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO, Callable

from dpfl.errors import RunDirectoryError


def write_atomically(path: Path, write: Callable[[BinaryIO], object], what: str) -> None:
    """Calls ``write`` on a binary temporary file, syncs it and renames it over ``path``; RunDirectoryError naming
    ``what`` (e.g. "the privacy ledger") if it cannot be written."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except OSError as err:
        raise RunDirectoryError(f"cannot write {what} {path}: {err.strerror or err}") from None


def write_text_atomically(path: Path, text: str, what: str) -> None:
    """``write_atomically`` for a UTF-8 text file."""
    write_atomically(path, lambda file: file.write(text.encode("utf-8")), what)
