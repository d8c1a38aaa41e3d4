"""checkpoint.pt: an algorithm's state (through its ``state_dict``), the round to run next (the number of rounds
done), the metrics so far and the wall time the run has taken so far (across resumes).

Written atomically (temporary file, flush, fsync, rename). Read back only after every check passes: a readable zip
(torch.save's format) whose entries pass their CRC, plain tensors and data (``weights_only``: no code from the file
runs), written by a run with the same release config, with tensors of this run's shapes, and not ahead of the ledger
beside it (a checkpoint ahead of its ledger would hide privacy spent). Anything else is a ``RunDirectoryError`` that
names the file and the problem: nothing starts over silently.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import NamedTuple

import torch

from dpfl.durable import write_atomically
from dpfl.engine.protocol import State
from dpfl.errors import RunDirectoryError


class Saved(NamedTuple):
    """What a checkpoint restores."""

    next_round: int  # the index of the round to run next, i.e. the number of rounds done
    state: State
    history: list[dict]
    wall_seconds: float  # the run's time in its round loop so far, over every session


def save(path: Path, next_round: int, release: str, state: State, history: list[dict],
         wall_seconds: float = 0.0) -> None:
    """Writes the checkpoint atomically, its tensors as CPU tensors (whatever device the run is on)."""
    on_cpu = {part: {name: value.cpu() if isinstance(value, torch.Tensor) else value for name, value in tensors.items()}
              for part, tensors in state.state_dict().items()}
    payload = {"next_round": next_round, "release": release, "state": on_cpu, "history": history,
               "wall_seconds": wall_seconds}
    write_atomically(path, lambda file: torch.save(payload, file), "the checkpoint")


def load(path: Path, release: str, like: State, recorded: int) -> Saved:
    """The checkpoint at ``path``, checked against the run's ``release`` hash, the shapes of ``like`` (this config's
    fresh state) and ``recorded``, the last round (numbered from 1) the ledger beside it records (0: none). A
    checkpoint without wall time (written before it was kept) restores 0 seconds. Its tensors are read onto the CPU
    (``map_location``: a checkpoint written on a GPU resumes on a machine without one) and restored onto the devices
    of ``like``'s tensors (the resuming run's ``run.device``)."""

    def invalid(problem: str) -> RunDirectoryError:
        return RunDirectoryError(
            f"{path} is not a valid checkpoint of this run ({problem}); restore it, or move it away to resume from "
            "the first round with the ledger kept (rounds replayed identically are not charged again)")

    try:  # torch.save writes a zip archive: a truncated one has no central directory, a damaged one bad CRCs
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError):
        raise invalid("empty file" if path.stat().st_size == 0 else "truncated, or not written by torch.save") from None
    if damaged is not None:
        raise invalid(f"damaged: its entry {damaged} fails its CRC check")
    try:  # weights_only: tensors and plain data, no code from the file is run
        payload = torch.load(path, weights_only=True, map_location="cpu")
    except pickle.UnpicklingError:
        raise invalid("it holds objects other than tensors and plain data") from None
    except Exception as err:  # anything else torch fails on inside a well-formed zip: report its first line
        raise invalid(f"unreadable by torch: {(str(err).strip().splitlines() or [type(err).__name__])[0]}") from None
    if not isinstance(payload, dict):
        raise invalid(f"a {type(payload).__name__}, not a dict")
    missing = [k for k in ("next_round", "release", "state", "history") if k not in payload]
    if missing:
        raise invalid(f"no {', '.join(missing)}")
    if payload["release"] != release:
        raise invalid("it was written by a run with another release config (its run.json differs)")
    try:
        state = State.from_state_dict(payload["state"])
    except (KeyError, TypeError, ValueError) as err:
        raise invalid(f"its state is not a state_dict ({type(err).__name__}: {err})") from None
    for part in ("server", "clients"):
        expected, stored = getattr(like, part), getattr(state, part)
        if set(expected) != set(stored):
            raise invalid(f"its {part} state holds {sorted(stored)}, this config's {sorted(expected)}")
        for name, tensor in expected.items():
            got = stored[name]
            if not isinstance(got, type(tensor)) or got.shape != tensor.shape:
                raise invalid(f"{part} {name} has shape {tuple(getattr(got, 'shape', ()))}, this config's "
                              f"{tuple(tensor.shape)}")
            stored[name] = got.to(tensor.device)
    next_round = payload["next_round"]
    if not isinstance(next_round, int) or next_round < 0:
        raise invalid(f"next_round = {next_round!r}")
    if next_round > recorded:
        raise RunDirectoryError(
            f"cannot resume: {path} is after round {next_round} but the ledger beside it records rounds only up to "
            f"round {recorded}, so privacy spent is missing from it (an older ledger.json?); restore the newer ledger")
    history = payload["history"]
    if not isinstance(history, list):
        raise invalid("its history is not a list")
    wall_seconds = payload.get("wall_seconds", 0.0)
    if not isinstance(wall_seconds, (int, float)) or not wall_seconds >= 0:
        raise invalid(f"wall_seconds = {wall_seconds!r}")
    return Saved(next_round, state, history, float(wall_seconds))


__all__ = ["Saved", "save", "load"]
