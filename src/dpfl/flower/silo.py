"""A silo's own records, read from the file its SuperNode's config names (npz or csv, as ``dpfl.data.files`` reads
them), for the ClientApp.

A silo file holds one client's records: ``x`` [N, features...] and ``y`` [N] (class indices 0..C-1, the labels the
whole federation shares: a silo cannot renumber its labels on its own), optionally a client-id column (every record
the same id: the silo's dpfl client id) and a split column (a silo trains on its "train" records; its "test" records
stay with it, read only by federated evaluation). A csv has a header row, the label column ``label`` and numeric
features in every other column.
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
    """One client's records: its training records x [N, features...] float32, y [N] int64, its test records
    ``test_x``, ``test_y`` (those its split column marks "test"; none without one: only federated evaluation reads
    them, ``dpfl.flower.evaluation``), and the client id the file names (None: the file names none)."""

    x: torch.Tensor
    y: torch.Tensor
    client: int | None
    test_x: torch.Tensor
    test_y: torch.Tensor


def load_silo(path: str | Path, client_column: str | None = None, label_column: str = "label") -> Silo:
    """The silo file ``path`` (.npz or .csv; see the module docstring); ConfigError naming the node config's
    ``data-path`` for anything unusable."""
    x, y, clients, test = read_records(path, "data-path", client_column, label_column)
    if not (~test).any():
        raise ConfigError("data-path", str(path), "a silo with training records (found none)")
    return Silo(x[~test], y[~test], _client_id(Path(path), clients), x[test], y[test])


def load_records(path: str | Path, key: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The records (x, y) of a file in a silo file's format (.npz or .csv), e.g. an evaluation set the server holds:
    those its split column marks "test", or all of them without one; ConfigError naming ``key``."""
    x, y, _, test = read_records(path, key)
    keep = test if test.any() else torch.ones_like(test)
    if not keep.any():
        raise ConfigError(key, str(path), "a file with records (found none)")
    return x[keep], y[keep]


def read_records(path: str | Path, key: str, client_column: str | None = None, label_column: str = "label"):
    """(x [N, ...] float32, y [N] int64, the client column or None, test mask [N] bool) of an .npz or .csv in a silo
    file's format; ConfigError naming ``key`` (the node or run config key that names the file) for anything
    unusable."""
    path = Path(path)
    if path.suffix == ".npz":
        arrays = files._read_npz(files._existing(path, ".npz"))
        x, y = arrays["x"], arrays["y"]
        clients, split = arrays.get("client"), arrays.get("split")
    elif path.suffix == ".csv":
        header, _, records = files._read_csv(files._existing(path, ".csv"))
        if any(len(row) != len(header) for row in records):
            raise ConfigError(key, str(path), f"{len(header)} fields in every row, as in the header")
        table = np.array(records, dtype=str).reshape(len(records), len(header))
        special = {"label": label_column, "client": client_column, "split": "split" if "split" in header else None}
        columns = {name: header.index(column) for name, column in special.items() if column is not None and
                   column in header}
        for name, column in special.items():
            if column is not None and column not in header:
                raise ConfigError(key, str(path), f"a csv with a {name} column {column!r} (found {header})")
        y, clients = table[:, columns["label"]], table[:, columns["client"]] if "client" in columns else None
        split = table[:, columns["split"]] if "split" in columns else None
        features = [i for i in range(len(header)) if i not in columns.values()]
        try:
            x = table[:, features].astype(np.float64)
        except ValueError:
            raise ConfigError(key, str(path), "numeric features in every column but the label, client and split "
                                              "columns") from None
    else:
        raise ConfigError(key, str(path), "a .npz or .csv file")
    test = np.zeros(len(y), dtype=bool) if split is None else files._npz_test_mask(path, split)
    try:
        labels = np.asarray(y).astype(np.int64)
    except (TypeError, ValueError):
        raise ConfigError(key, str(path), "class indices 0..C-1 as labels (the federation's shared "
                                          "numbering)") from None
    return (torch.as_tensor(np.asarray(x, dtype=np.float32)), torch.as_tensor(labels), clients,
            torch.as_tensor(test))


def write_silos(dataset, folder: str | Path) -> list[Path]:
    """Writes each client's records of ``dataset`` (``FederatedDataset``) as its own silo file,
    ``folder/silo-{i}.npz``: its training records, then its test records, with a client column and a split column,
    the files a test bed's or a simulation's SuperNodes read; their paths, by client id."""
    paths = []
    for i in range(dataset.num_clients):
        n, m = int(dataset.train.counts[i]), int(dataset.test.counts[i])
        paths.append(Path(folder) / f"silo-{i}.npz")
        np.savez(paths[-1], x=torch.cat([dataset.train.x[i, :n], dataset.test.x[i, :m]]).numpy(),
                 y=torch.cat([dataset.train.y[i, :n], dataset.test.y[i, :m]]).numpy(), client=np.full(n + m, i),
                 split=np.array(["train"] * n + ["test"] * m))
    return paths


def _client_id(path: Path, clients) -> int | None:
    if clients is None:
        return None
    ids = sorted({str(c) for c in np.asarray(clients).tolist()})
    if len(ids) != 1 or not ids[0].lstrip("-").isdigit():
        raise ConfigError("data-path", str(path), f"one integer client id in the client column (found {ids[:5]})")
    return int(ids[0])


__all__ = ["Silo", "load_silo", "load_records", "read_records", "write_silos"]
