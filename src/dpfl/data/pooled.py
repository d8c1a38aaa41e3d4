"""Pooled records -> a federated dataset: partition over clients, optional per-client subsample, per-client
train/test split, standardisation with training statistics.

The split is either drawn at random per client (``test_fraction``, Noble et al. 2022: 80/20 per user) or given with
the data (a ``test`` mark per record), in which case it is kept exactly: each client's test records are those
marked, its training records the others, none re-drawn.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dpfl.data.federated import NUM_CLIENTS, TEST_FRACTION, ClientArrays, FederatedDataset, split_clients
from dpfl.data.partition import partition as partition_records
from dpfl.data.partition import stratified_subsample
from dpfl.data.preprocess import STANDARDIZE_SCOPES, describe_scale, describe_standardize, standardize
from dpfl.errors import ConfigError, check_range

#: ``data.labels``: the records' classes as they are, or mapped to their class number's parity (1 = even, 0 = odd).
LABEL_MAPS = ("original", "parity")


def check_common(samples_per_client, seed, test_fraction, standardize_scope) -> tuple[int | None, int]:
    """Validates the keys every source shares; returns (samples_per_client, seed) as integers."""
    if samples_per_client is not None:
        samples_per_client = check_range("data.samples_per_client", samples_per_client, 1, integer=True)
    seed = check_range("data.seed", seed, 0, integer=True)
    if test_fraction is not None:
        check_range("data.test_fraction", test_fraction, 0, 1, high_open=True)
    if standardize_scope not in STANDARDIZE_SCOPES:
        raise ConfigError("data.standardize", standardize_scope, f"one of {STANDARDIZE_SCOPES}")
    return samples_per_client, seed


def require_natural(partition, partition_param, reason: str):
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


def map_labels(labels: np.ndarray, classes: np.ndarray, label_map: str) -> tuple[np.ndarray, list]:
    """Labels 0..C-1 (``classes[c]`` the value of class c) after ``data.labels``, with the new classes' names.

    "parity" makes a binary task of the class number's parity, even = 1 and odd = 0 (Lowy, Ghafelebashi, Razaviyayn
    2023, Sec. 4: MNIST's digits as even / odd); it is applied after the partition, which still sees every class.
    """
    if label_map not in LABEL_MAPS:
        raise ConfigError("data.labels", label_map, f"one of {LABEL_MAPS}")
    if label_map == "original":
        return labels, classes.tolist()
    return (labels % 2 == 0).astype(labels.dtype), ["odd", "even"]


def _given_split(xs, ys, marks):
    """Each client's records as marked: (train_xs, train_ys, test_xs, test_ys), in the records' order."""
    train = [(x[~m], y[~m]) for x, y, m in zip(xs, ys, marks)]
    test = [(x[m], y[m]) for x, y, m in zip(xs, ys, marks)]
    return [x for x, _ in train], [y for _, y in train], [x for x, _ in test], [y for _, y in test]


def federate(
    x: np.ndarray,
    y: np.ndarray,
    *,
    name: str,
    num_clients: int | None = None,
    partition: str | None = None,
    partition_param: float | None = None,
    client_ids: np.ndarray | None = None,
    test_mask: np.ndarray | None = None,
    samples_per_client: int | None = None,
    seed: int = 0,
    test_fraction: float | None = None,
    standardize_scope: str = "none",
    source: dict | None = None,
    label_map: str = "original",
    classes: Sequence | None = None,
    scale: float = 1.0,
    steps: list[dict] = (),
) -> FederatedDataset:
    """Distributes pooled records (x [N, ...] numeric, y [N] labels of any type) over clients.

    With ``client_ids`` the partition is natural (``partition`` must be None or "natural"); otherwise ``partition``
    (default "iid") and ``partition_param`` choose a scheme of ``partition.py`` over ``num_clients`` clients (default
    100).
    With ``test_mask`` ([N] bool, True for a test record) the split is the data's own and ``test_fraction`` must be
    None; without it each client's records are split at random, ``test_fraction`` (default 0.2) of them for testing.
    ``samples_per_client`` trims each client to exactly that many records (label proportions kept; a trimmed
    client's records keep their marks). Labels are renumbered 0..C-1 in sorted order of their values (kept in
    ``info["classes"]``), unless ``classes`` names the C classes of a data set whose labels already are class numbers
    0..C-1 (then C is the data set's, whichever classes the records hold); then they are mapped by ``label_map`` after
    the partition (``map_labels``). ``source`` (provenance, JSON-safe) names the data in errors by its "path" when it
    has one. The features keep their type (e.g. uint8 pixels) until they are stacked as float32, exactly, unless they
    are standardised (in float64); once stacked they are multiplied by ``scale``, a public constant (1/255 brings
    8-bit pixels to [0, 1]), in place (``preprocess.rescale`` does the same on a built data set, with a copy).
    ``steps``: the provenance of per-record preprocessing already applied to ``x`` (e.g. ``data.bounds``), listed
    before the standardisation in ``info["preprocessing"]``.
    """
    samples_per_client, seed = check_common(samples_per_client, seed, test_fraction, standardize_scope)
    origin = (source or {}).get("path", name)
    if test_mask is not None and test_fraction is not None:
        raise ConfigError("data.test_fraction", test_fraction,
                          f"no value: {origin} marks each record train or test, and that split is kept as it is")
    if classes is None:
        classes, labels = np.unique(y, return_inverse=True)
    else:
        classes, labels = np.asarray(classes), np.asarray(y, dtype=np.int64)
    x = np.asarray(x)
    if standardize_scope != "none":  # statistics in float64; otherwise the records are only copied
        x = x.astype(np.float64, copy=False)
    rng = np.random.default_rng(seed)
    partition_info = {"scheme": partition or "iid", "param": partition_param}
    if client_ids is not None:
        require_natural(partition, partition_param, "when the data carries client ids")
        parts, ids = _natural_parts(client_ids, num_clients)
        partition_info = {"scheme": "natural", "param": None, "client_ids": ids}
    else:
        ids = None
        num_clients = NUM_CLIENTS if num_clients is None else num_clients
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
    labels, class_names = map_labels(labels, classes, label_map)
    xs, ys = [x[p] for p in parts], [labels[p] for p in parts]
    if test_mask is None:
        test_fraction = TEST_FRACTION if test_fraction is None else test_fraction
        train_xs, train_ys, test_xs, test_ys = split_clients(xs, ys, test_fraction, rng)
        split_info = {"test_fraction": test_fraction, "per_client": True}
    else:
        train_xs, train_ys, test_xs, test_ys = _given_split(xs, ys, [np.asarray(test_mask, bool)[p] for p in parts])
        _check_training_records(train_ys, test_ys, ids, origin)
        split_info = {"given": True, "per_client": True, "test_records": sum(len(t) for t in test_ys)}
    train_xs, test_xs = standardize(train_xs, test_xs, standardize_scope)
    info = {
        "source": source or {"name": name},
        "classes": class_names,
        "num_clients": len(parts),
        "samples_per_client": samples_per_client,
        "partition": partition_info,
        "split": split_info,
        "preprocessing": [*steps, describe_standardize(standardize_scope),
                          *([describe_scale(scale)] if scale != 1 else [])],
        "seed": seed,
    }
    return FederatedDataset(
        train=ClientArrays.from_lists(train_xs, train_ys, scale),
        test=ClientArrays.from_lists(test_xs, test_ys, scale),
        num_classes=len(class_names),
        name=name,
        info=info,
    )


def _check_training_records(train_ys, test_ys, ids, origin) -> None:
    """Every client needs a training record under a given split."""
    empty = [i for i, y in enumerate(train_ys) if len(y) == 0]
    if empty:
        named = [ids[i] if ids is not None else i for i in empty]
        raise ConfigError("data.path", origin,
                          f"at least one training record for every client after the split (found {len(empty)} "
                          f"client(s) whose records are all marked test, the first {named[0]!r} with "
                          f"{len(test_ys[empty[0]])} test records)")


__all__ = ["LABEL_MAPS", "federate", "check_common", "map_labels", "require_natural"]
