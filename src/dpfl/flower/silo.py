"""A silo's own records, read from the file its SuperNode's config names (npz or csv, as ``dpfl.data.files`` reads
them), for the ClientApp.

A silo file holds one client's records: ``x`` [N, features...] and ``y`` [N] (class indices 0..C-1, the labels the
whole federation shares: a silo cannot renumber its labels on its own), optionally a client-id column (every record
the same id: the silo's dpfl client id) and a split column (only the "train" records are used; a silo's test records
stay with it). A csv has a header row, the label column ``label`` and numeric features in every other column.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dpfl.data import files
from dpfl.errors import ConfigError


@dataclass
class Silo:
    """One client's training records: x [N, features...] float32, y [N] int64, and the client id the file names
    (None: the file names none)."""

    x: torch.Tensor
    y: torch.Tensor
    client: int | None


def load_silo(path: str | Path, client_column: str | None = None, label_column: str = "label") -> Silo:
    """The silo file ``path`` (.npz or .csv; see the module docstring); ConfigError naming the node config's
    ``data-path`` for anything unusable."""
    path = Path(path)
    if path.suffix == ".npz":
        arrays = files._read_npz(files._existing(path, ".npz"))
        x, y = arrays["x"], arrays["y"]
        clients, split = arrays.get("client"), arrays.get("split")
    elif path.suffix == ".csv":
        header, _, records = files._read_csv(files._existing(path, ".csv"))
        if any(len(row) != len(header) for row in records):
            raise ConfigError("data-path", str(path), f"{len(header)} fields in every row, as in the header")
        table = np.array(records, dtype=str).reshape(len(records), len(header))
        special = {"label": label_column, "client": client_column, "split": "split" if "split" in header else None}
        columns = {key: header.index(name) for key, name in special.items() if name is not None}
        for key, name in special.items():
            if name is not None and name not in header:
                raise ConfigError("data-path", str(path), f"a csv with a {key} column {name!r} (found {header})")
        y, clients = table[:, columns["label"]], table[:, columns["client"]] if "client" in columns else None
        split = table[:, columns["split"]] if "split" in columns else None
        features = [i for i in range(len(header)) if i not in columns.values()]
        try:
            x = table[:, features].astype(np.float64)
        except ValueError:
            raise ConfigError("data-path", str(path), "numeric features in every column but the label, client and "
                                                       "split columns") from None
    else:
        raise ConfigError("data-path", str(path), "a .npz or .csv file")
    if split is not None:
        keep = ~files._npz_test_mask(path, split)
        x, y = x[keep], y[keep]
        clients = None if clients is None else clients[keep]
    try:
        labels = np.asarray(y).astype(np.int64)
    except (TypeError, ValueError):
        raise ConfigError("data-path", str(path), "class indices 0..C-1 as labels (the federation's shared "
                                                   "numbering)") from None
    if len(labels) == 0:
        raise ConfigError("data-path", str(path), "a silo with training records (found none)")
    return Silo(torch.as_tensor(np.asarray(x, dtype=np.float32)), torch.as_tensor(labels),
                _client_id(path, clients))


def write_silos(train, folder: str | Path) -> list[Path]:
    """Writes each client's training records of ``train`` (``ClientArrays``: x, y, counts) as its own silo file,
    ``folder/silo-{i}.npz`` with a client column, the files a test bed's or a simulation's SuperNodes read; their
    paths, by client id."""
    paths = []
    for i in range(train.num_clients):
        n = int(train.counts[i])
        paths.append(Path(folder) / f"silo-{i}.npz")
        np.savez(paths[-1], x=train.x[i, :n].numpy(), y=train.y[i, :n].numpy(), client=np.full(n, i))
    return paths


def _client_id(path: Path, clients) -> int | None:
    if clients is None:
        return None
    ids = sorted({str(c) for c in np.asarray(clients).tolist()})
    if len(ids) != 1 or not ids[0].lstrip("-").isdigit():
        raise ConfigError("data-path", str(path), f"one integer client id in the client column (found {ids[:5]})")
    return int(ids[0])


__all__ = ["Silo", "load_silo", "write_silos"]
