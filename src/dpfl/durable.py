"""Durable, atomic writes of a run directory's files (ledger.json, checkpoint.pt, run.json, results.json).

A temporary file beside the target is written, flushed to disk and renamed over the target, so a crash leaves either
the old file or the new one, never a truncated one. That is what lets a crashed run resume without losing the
privacy already spent.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO, Callable

from dpfl.errors import RunDirectoryError


def write_atomically(path: Path, write: Callable[[BinaryIO], object], what: str) -> None:
    """Calls ``write`` on a binary temporary file, syncs it and renames it over ``path``; RunDirectoryError naming
    ``what`` (e.g. "the privacy ledger") and the system's reason if it cannot be written (a full disk, no permission),
    also when the error reaches it through ``write``'s own error (torch.save reports a failed write of its file as a
    RuntimeError raised while handling the OSError). On any failure the temporary file is removed and ``path`` is
    left as it was."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException as err:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        cause = _os_error(err) if isinstance(err, Exception) else None  # Ctrl-C stays Ctrl-C
        if cause is None:
            raise
        raise RunDirectoryError(f"cannot write {what} {path}: {cause.strerror or cause}") from None


def _os_error(err: BaseException | None) -> OSError | None:
    """The OSError ``err`` is, or was raised while handling (its chain of causes and contexts); None if none."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def write_text_atomically(path: Path, text: str, what: str) -> None:
    """``write_atomically`` for a UTF-8 text file."""
    write_atomically(path, lambda file: file.write(text.encode("utf-8")), what)
