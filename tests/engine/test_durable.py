"""A run directory's files on a full disk (dpfl.durable): wherever the write fails (the first byte, inside
torch.save's archive, its last buffered bytes, the sync), the error is a RunDirectoryError naming the file and the
system's reason, the temporary file is gone and the previous file is intact."""

from __future__ import annotations

import errno
import io
import os

import pytest
import torch

from dpfl import durable
from dpfl.engine import checkpoint
from dpfl.engine.protocol import State
from dpfl.errors import RunDirectoryError
from full_disk import FullDisk

STATE = State({"x": torch.arange(3000.0)}, {"c": torch.ones(4, 3000)})


def full_disk(monkeypatch, room: int) -> None:
    """The run directory's disk has ``room`` bytes left (``open`` in dpfl.durable, buffered as open() buffers)."""
    monkeypatch.setattr(durable, "open", lambda path, mode: io.BufferedWriter(FullDisk(path, mode, room)),
                        raising=False)


def checkpoint_bytes(tmp_path) -> int:
    path = tmp_path / "size" / "checkpoint.pt"
    checkpoint.save(path, 3, "release", STATE, [], 1.0)
    return path.stat().st_size


@pytest.mark.parametrize("where", ["first byte", "inside the archive", "its last bytes", "the sync"])
def test_a_checkpoint_on_a_full_disk_is_a_clear_error_and_the_previous_one_survives(tmp_path, monkeypatch, where):
    size = checkpoint_bytes(tmp_path)  # about 61 kB: the 8 kB write buffer is flushed several times
    path = tmp_path / "run" / "checkpoint.pt"
    checkpoint.save(path, 2, "release", STATE, [{"round": 2}], 1.0)
    before = path.read_bytes()
    if where == "the sync":
        monkeypatch.setattr(durable.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space "
                                                                                             "left on device")))
    else:
        full_disk(monkeypatch, {"first byte": 0, "inside the archive": size // 2, "its last bytes": size - 100}[where])
    with pytest.raises(RunDirectoryError, match=r"cannot write the checkpoint .*checkpoint.pt: No space left on "
                                                r"device$"):
        checkpoint.save(path, 3, "release", STATE, [{"round": 2}, {"round": 3}], 2.0)
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.pt"]  # no checkpoint.pt.tmp
    assert path.read_bytes() == before
    monkeypatch.undo()
    assert checkpoint.load(path, "release", STATE, 2).next_round == 2


def test_a_full_disk_that_is_a_real_device_is_reported_the_same(tmp_path):
    """The operating system's own ENOSPC: the temporary file is /dev/full (every write fails)."""
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"previous")
    (tmp_path / "checkpoint.pt.tmp").symlink_to("/dev/full")
    with pytest.raises(RunDirectoryError, match="cannot write the checkpoint .*: No space left on device"):
        checkpoint.save(path, 3, "release", STATE, [], 0.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"] and path.read_bytes() == b"previous"


def test_any_other_failure_of_the_write_removes_the_temporary_file_and_is_not_relabelled(tmp_path):
    path = tmp_path / "results.json"

    def fails(file):
        file.write(b"partial")
        raise ValueError("not a disk problem")

    with pytest.raises(ValueError, match="not a disk problem"):
        durable.write_atomically(path, fails, "the results")
    assert list(tmp_path.iterdir()) == []
