"""``run.tensorboard = DIR``: each evaluated round's metrics written to TensorBoard event files in DIR, where torch
users look for them (``torch.utils.tensorboard.SummaryWriter``; the optional ``tensorboard`` package, the
``dpfl[tensorboard]`` extra).

A round's scalars are those of its results.json row (``RoundMetrics.to_dict``), under the same names, at step = the
round (numbered from 1, as results.json numbers it): ``test_accuracy``, ``train_loss``, ``epsilon/<observer>`` for each
observer, and, where the row carries them, ``clip`` (an adaptive clip's C_t) and ``gradient_mapping``. A value
results.json holds as null is not written: a metric not measured, an infinite epsilon (no privacy towards that observer;
TensorBoard has no honest point for it), or a row's whole epsilon off run.epsilon_every's schedule. The events are
flushed after every round, so TensorBoard shows a run while it runs. A resumed run appends to DIR (a new event file); a
round replayed after a stop before its checkpoint is written again at the same step.

Nothing here touches privacy: the scalars are what results.json already reports.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dpfl.errors import ConfigError

#: The row keys written as scalars of their own name, when present and not null.
SCALARS = ("test_accuracy", "train_loss", "clip", "gradient_mapping")
#: How to get the package the writer needs.
INSTALL = "pip install tensorboard (or pip install 'dpfl[tensorboard]')"


def check_tensorboard(directory: str | None) -> None:
    """ConfigError naming run.tensorboard unless it is None or a non-empty path and the tensorboard package is
    installed (looked up, not imported: before any data is built)."""
    if directory is None:
        return
    if not isinstance(directory, str) or not directory:
        raise ConfigError("run.tensorboard", directory, "a directory for TensorBoard event files, or None")
    if importlib.util.find_spec("tensorboard") is None:
        raise _missing(directory)


def _missing(directory: str) -> ConfigError:
    return ConfigError("run.tensorboard", directory, f"the tensorboard package to write event files: {INSTALL}; or "
                                                     "leave run.tensorboard unset")


def round_scalars(row: dict) -> dict[str, float]:
    """{tag: value} of one results.json row (module docstring)."""
    scalars = {key: float(row[key]) for key in SCALARS if row.get(key) is not None}
    scalars.update({f"epsilon/{observer}": float(eps) for observer, eps in (row.get("epsilon") or {}).items()
                    if eps is not None})
    return scalars


class TensorBoardLog:
    """Writes each evaluated round's scalars to event files in ``directory`` (made on the first round)."""

    def __init__(self, directory: str):
        check_tensorboard(directory)
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise _missing(directory) from None
        self.directory = Path(directory)
        self._writer_class, self._writer = SummaryWriter, None

    def write(self, row: dict) -> None:
        """One results.json row at step row["round"], flushed."""
        if self._writer is None:
            self._writer = self._writer_class(log_dir=str(self.directory))
        for tag, value in round_scalars(row).items():
            self._writer.add_scalar(tag, value, global_step=int(row["round"]))
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()


__all__ = ["SCALARS", "INSTALL", "check_tensorboard", "round_scalars", "TensorBoardLog"]
