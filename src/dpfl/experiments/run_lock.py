"""The lock of a run directory: one run at a time in it.

Two runs in one directory would interleave their ledgers, checkpoints and results: each process's ledger.json
would miss the rounds the other charged (privacy spent and not on record), and a resume would replay one run's noise
onto the other's computation. So a run (``dpfl run``, ``dpfl.run``, the Flower ServerApp's ``serve``: every caller of
``runner.run_experiment`` with a run directory) holds an exclusive lock on it from before it reads the directory
(``check_resumable``, ``check_free``) to after it writes its last file: ``fcntl.flock`` on DIR/.lock (``LOCK_FILE``),
which holds the holder's pid for the refusal's message. A second run is refused at once (RunDirectoryError: "another
dpfl run holds DIR (pid N)"); it never waits.

The kernel releases a flock when the last descriptor of its open file closes, however the process ends (kill -9
included), so a lock file a killed run leaves behind blocks nothing: the next run takes the lock on that file. A run
that ends removes the file while it still holds the lock; a process that opened the file before the removal finds,
once it holds the lock, that the path no longer names its file, and opens it again (so two processes never hold
locks on two files of the same name). A run refused before it wrote anything also removes the folders it created
for the lock (empty ones only), so a refused ``--out`` is left as it was.

A flock belongs to an open file description: a child process forked during the run (without exec) shares it, and
the lock is held until the child ends too.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from dpfl.errors import RunDirectoryError

LOCK_FILE = ".lock"


@contextlib.contextmanager
def run_lock(out: Path) -> Iterator[None]:
    """Holds the lock of the run directory ``out`` within ``with`` (creating ``out`` if needed); RunDirectoryError
    naming the holder's pid if another process holds it. On exit removes the lock file, and the folders it created
    when they are still empty."""
    out = Path(out)
    created = _missing_folders(out)
    descriptor = _acquire(out / LOCK_FILE)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out / LOCK_FILE)  # still locked: whoever opened it now finds it gone (``_acquire``)
        os.close(descriptor)
        for folder in created:  # deepest first; a folder the run wrote to is not empty and stays
            try:
                folder.rmdir()
            except OSError:
                break


def _missing_folders(out: Path) -> list[Path]:
    """``out`` and its ancestors that do not exist yet, deepest first."""
    missing = []
    while not out.exists():
        missing.append(out)
        out = out.parent
    return missing


def _acquire(path: Path) -> int:
    """A descriptor of the lock file at ``path``, exclusively flock'ed, with this process's pid written in it."""
    while True:
        path.parent.mkdir(parents=True, exist_ok=True)  # again, if a refused run removed it since
        try:
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(descriptor)
            os.close(descriptor)
            raise RunDirectoryError(
                f"another dpfl run holds {path.parent} (pid {holder}); wait for it to end, or stop it (Ctrl-C, or kill "
                f"{holder}: it stops after its round) and continue it with --resume, or use another run directory"
            ) from None
        try:
            current = os.stat(path).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(descriptor).st_ino:
            os.ftruncate(descriptor, 0)
            os.write(descriptor, f"{os.getpid()}\n".encode())
            return descriptor
        os.close(descriptor)  # the holder removed this file before releasing it: lock the one at the path now


def _holder(descriptor: int) -> str:
    """The pid written in a lock file ("unknown" if its holder has not written it yet)."""
    text = os.pread(descriptor, 32, 0).decode(errors="replace").strip()
    return text if text.isdigit() else "unknown"


__all__ = ["LOCK_FILE", "run_lock"]
