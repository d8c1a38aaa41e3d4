"""Named datasets and user files, turned into federated datasets; ``build_dataset`` maps the config's ``data.*``.

* ``synthetic``: Li et al. 2020 (FedProx) (alpha, beta) data, one generated user per client (``synthetic.py``).
* ``digits``: scikit-learn's 8x8 handwritten digits (1,797 records, 64 features, 10 classes).
* ``breast_cancer``: scikit-learn's Wisconsin diagnostic breast cancer (569 records, 30 features, 2 classes).
* ``load_npz`` / ``load_csv``: the user's own records, partitioned by a scheme of ``partition.py`` or naturally by a
  client-id array / column.

Pooled records go through: partition over clients -> optional per-client subsample to exactly
``samples_per_client`` records (label proportions kept) -> per-client train/test split -> standardisation with
training statistics (per client by default: non-private preprocessing of each client's own data, see
``preprocess.py``).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
from sklearn import datasets as sklearn_datasets

from dpfl.data.federated import ClientArrays, FederatedDataset, split_clients
from dpfl.data.partition import partition as partition_records
from dpfl.data.partition import stratified_subsample
from dpfl.data.preprocess import STANDARDIZE_SCOPES, describe_standardize, standardize
from dpfl.data.synthetic import synthetic_dataset
from dpfl.errors import ConfigError, check_range

DATASETS = ("synthetic", "digits", "breast_cancer")
SYNTHETIC_SAMPLES_PER_CLIENT = 5000  # R of DP-SCAFFOLD's synthetic experiments (Noble et al. 2022)
_SKLEARN_LOADERS = {"digits": sklearn_datasets.load_digits, "breast_cancer": sklearn_datasets.load_breast_cancer}


def _check_common(samples_per_client, seed, test_fraction, standardize_scope) -> tuple[int | None, int]:
    """Validates the keys every source shares; returns (samples_per_client, seed) as integers."""
    if samples_per_client is not None:
        samples_per_client = check_range("data.samples_per_client", samples_per_client, 1, integer=True)
    seed = check_range("data.seed", seed, 0, integer=True)
    check_range("data.test_fraction", test_fraction, 0, 1, high_open=True)
    if standardize_scope not in STANDARDIZE_SCOPES:
        raise ConfigError("data.standardize", standardize_scope, f"one of {STANDARDIZE_SCOPES}")
    return samples_per_client, seed


def _require_natural(partition, partition_param, reason: str):
    """Data that comes with its clients takes no partition scheme."""
    if partition not in (None, "natural"):
        raise ConfigError("data.partition", partition, f"None or 'natural' {reason}")
    if partition_param is not None:
        raise ConfigError("data.partition_param", partition_param, f"None {reason}")


def _natural_parts(client_ids: np.ndarray, num_clients: int | None) -> tuple[list[np.ndarray], list]:
    """One index array per distinct client id (sorted ids), and the ids."""
    ids, inverse = np.unique(client_ids, return_inverse=True)
    if num_clients is not None and num_clients != len(ids):
        raise ConfigError(
            "data.num_clients", num_clients, f"None or {len(ids)}, the number of distinct client ids in the data"
        )
    return [np.flatnonzero(inverse == i) for i in range(len(ids))], ids.tolist()


def federate(
    x: np.ndarray,
    y: np.ndarray,
    *,
    name: str,
    num_clients: int | None = None,
    partition: str | None = None,
    partition_param: float | None = None,
    client_ids: np.ndarray | None = None,
    samples_per_client: int | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    standardize_scope: str = "none",
    source: dict | None = None,
) -> FederatedDataset:
    """Distributes pooled records (x [N, ...] numeric, y [N] labels of any type) over clients.

    With ``client_ids`` the partition is natural (``partition`` must be None or "natural"); otherwise ``partition``
    (default "iid") and ``partition_param`` choose a scheme of ``partition.py`` over ``num_clients`` clients.
    Labels are renumbered 0..C-1 in sorted order of their values (kept in ``info["classes"]``).
    """
    samples_per_client, seed = _check_common(samples_per_client, seed, test_fraction, standardize_scope)
    classes, labels = np.unique(y, return_inverse=True)
    x = np.asarray(x, dtype=np.float64)
    rng = np.random.default_rng(seed)
    partition_info = {"scheme": partition or "iid", "param": partition_param}
    if client_ids is not None:
        _require_natural(partition, partition_param, "when the data carries client ids")
        parts, ids = _natural_parts(client_ids, num_clients)
        partition_info = {"scheme": "natural", "param": None, "client_ids": ids}
    elif num_clients is None:
        raise ConfigError("data.num_clients", None, "an integer in [1, number of records] (the data has no client ids)")
    else:
        parts = partition_records(labels, num_clients, partition or "iid", partition_param, rng=rng)
    if samples_per_client is not None:
        smallest = min(len(p) for p in parts)
        if samples_per_client > smallest:
            raise ConfigError(
                "data.samples_per_client",
                samples_per_client,
                f"None (keep every record) or an integer in [1, {smallest}] (the smallest client's share)",
            )
        parts = [stratified_subsample(p, labels, samples_per_client, rng) for p in parts]
    xs, ys = [x[p] for p in parts], [labels[p] for p in parts]
    train_xs, train_ys, test_xs, test_ys = split_clients(xs, ys, test_fraction, rng)
    train_xs, test_xs = standardize(train_xs, test_xs, standardize_scope)
    info = {
        "source": source or {"name": name},
        "classes": classes.tolist(),
        "num_clients": len(parts),
        "samples_per_client": samples_per_client,
        "partition": partition_info,
        "split": {"test_fraction": test_fraction, "per_client": True},
        "preprocessing": [describe_standardize(standardize_scope)],
        "seed": seed,
    }
    return FederatedDataset(
        train=ClientArrays.from_lists(train_xs, train_ys),
        test=ClientArrays.from_lists(test_xs, test_ys),
        num_classes=len(classes),
        name=name,
        info=info,
    )


def load_npz(path, *, x_key: str = "x", y_key: str = "y", client_key: str = "client", **options) -> FederatedDataset:
    """Federated dataset from an .npz file with arrays ``x`` [N, ...] and ``y`` [N] and, optionally, client ids.

    With a ``client`` array ([N], any type) each distinct id is one client (natural partition); without it, pass
    ``num_clients`` and optionally ``partition`` / ``partition_param``. Other ``options`` are those of ``federate``.
    """
    path = Path(path)
    with np.load(path, allow_pickle=False) as arrays:
        missing = [key for key in (x_key, y_key) if key not in arrays.files]
        if missing:
            raise ConfigError(f"{path.name} arrays", sorted(arrays.files), f"arrays named {x_key!r} and {y_key!r}")
        x, y = arrays[x_key], arrays[y_key]
        client_ids = arrays[client_key] if client_key in arrays.files else None
    if x.ndim < 2 or y.shape != (len(x),) or (client_ids is not None and client_ids.shape != y.shape):
        raise ConfigError(
            f"{path.name} shapes",
            {"x": x.shape, "y": y.shape, "client": None if client_ids is None else client_ids.shape},
            "x [N, features...], y [N] and client [N]",
        )
    if not np.issubdtype(x.dtype, np.number):
        raise ConfigError(f"{path.name}[{x_key!r}] dtype", str(x.dtype), "a numeric array")
    source = {"name": path.stem, "format": "npz", "path": str(path)}
    return federate(x, y, name=path.stem, client_ids=client_ids, source=source, **options)


def load_csv(path, label_column: str, client_column: str | None = None, **options) -> FederatedDataset:
    """Federated dataset from a CSV file with a header row: numeric feature columns, a label column and optionally a
    client-id column (natural partition). Every column other than the label and client columns is a feature; blank
    lines are skipped."""
    path = Path(path)
    with open(path, newline="") as handle:
        rows = [row for row in csv.reader(handle) if row]
    if not rows:
        raise ConfigError(path.name, "empty file", "a header row naming the columns, then one row per record")
    header, records = rows[0], rows[1:]
    for column in [label_column] + ([client_column] if client_column is not None else []):
        if column not in header:
            raise ConfigError(f"{path.name} column", column, f"one of the header's columns {header}")
    special = {label_column, client_column}
    feature_columns = [j for j, column in enumerate(header) if column not in special]
    if not feature_columns or not records:
        raise ConfigError(
            path.name, f"{len(feature_columns)} feature columns, {len(records)} records",
            "at least one feature column and one record",
        )
    for number, record in enumerate(records, start=1):
        if len(record) != len(header):
            raise ConfigError(f"{path.name} record {number}", record, f"{len(header)} fields, as in the header")
    x = np.empty((len(records), len(feature_columns)))
    for j, index in enumerate(feature_columns):
        try:
            x[:, j] = [float(record[index]) for record in records]
        except ValueError as error:
            raise ConfigError(f"{path.name} column {header[index]!r}", str(error), "numbers in every row") from None
    y = np.array([record[header.index(label_column)] for record in records])
    client_ids = None
    if client_column is not None:
        client_ids = np.array([record[header.index(client_column)] for record in records])
    source = {
        "name": path.stem,
        "format": "csv",
        "path": str(path),
        "label_column": label_column,
        "client_column": client_column,
        "feature_columns": [header[j] for j in feature_columns],
    }
    return federate(x, _as_numbers(y), name=path.stem, client_ids=client_ids, source=source, **options)


def _as_numbers(values: np.ndarray) -> np.ndarray:
    """CSV labels as integers when they all are (so "10" sorts after "9"), else kept as strings."""
    try:
        return values.astype(np.int64)
    except ValueError:
        return values


def build_dataset(
    name: str,
    *,
    num_clients: int,
    samples_per_client: int | None = None,
    alpha: float = 0.0,
    beta: float = 0.0,
    partition: str | None = None,
    partition_param: float | None = None,
    seed: int = 0,
    test_fraction: float = 0.2,
    standardize: str = "none",
) -> FederatedDataset:
    """The federated dataset a config's ``data.*`` keys describe.

    ``synthetic`` uses alpha, beta and samples_per_client (default 5000, DP-SCAFFOLD's R); its partition is natural
    (one generated user per client), so ``partition`` must be None or "natural". ``digits`` and ``breast_cancer``
    are partitioned by ``partition`` (default "iid") over ``num_clients`` clients; ``samples_per_client`` (default:
    every record of the client's share) trims each client to exactly that many records. ``standardize`` is the
    scope of feature standardisation: "none" (default: no statistic shared between records, so nothing escapes the privacy analysis), "client" or "pooled" (both NON-PRIVATE: statistics of the data are used without noise) (see ``preprocess.py``).
    """
    if name not in DATASETS:
        raise ConfigError("data.name", name, f"one of {DATASETS}")
    check_range("data.num_clients", num_clients, 1, integer=True)
    if name == "synthetic":
        check_range("data.alpha", alpha, 0, float("inf"), high_open=True)
        check_range("data.beta", beta, 0, float("inf"), high_open=True)
        _require_natural(partition, partition_param, "for data.name = 'synthetic': each generated user is a client")
        samples_per_client, seed = _check_common(samples_per_client, seed, test_fraction, standardize)
        return synthetic_dataset(
            int(num_clients),
            samples_per_client or SYNTHETIC_SAMPLES_PER_CLIENT,
            alpha,
            beta,
            seed=seed,
            test_fraction=test_fraction,
            standardize_scope=standardize,
        )
    for field, value in (("data.alpha", alpha), ("data.beta", beta)):
        if value != 0:
            raise ConfigError(field, value, f"0 for data.name = {name!r} (alpha and beta only shape 'synthetic')")
    bunch = _SKLEARN_LOADERS[name]()
    source = {"name": name, "provider": f"sklearn.datasets.load_{name}", "num_records": len(bunch.target)}
    return federate(
        bunch.data,
        bunch.target,
        name=name,
        num_clients=num_clients,
        partition=partition,
        partition_param=partition_param,
        samples_per_client=samples_per_client,
        seed=seed,
        test_fraction=test_fraction,
        standardize_scope=standardize,
        source=source,
    )


__all__ = ["DATASETS", "build_dataset", "federate", "load_npz", "load_csv"]
