"""A disk that fills up, for the tests of dpfl.durable's writes (on the tests' path: pyproject's ``pythonpath``)."""

from __future__ import annotations

import errno
import io
import os


class FullDisk(io.FileIO):
    """A file on a disk with ``room`` bytes left: a write past it fails as the kernel's write(2) does (ENOSPC)."""

    def __init__(self, path, mode, room: int):
        super().__init__(path, mode)
        self.room = room

    def write(self, data) -> int:
        if len(data) > self.room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return super().write(data)
