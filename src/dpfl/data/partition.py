"""Partitions of a pooled labelled dataset over clients; each returns one array of record indices per client.

Schemes (``data.partition``, parameter ``data.partition_param``):

* ``iid``: a uniform random permutation cut into equal parts. No parameter.
* ``similar``: gamma% of each client's records drawn iid, the rest taken in order from the remaining records
  sorted by label (Noble, Bellet, Dieuleveut 2022, DP-SCAFFOLD, Sec. 5: "gamma% similar" data). gamma in [0, 100];
  gamma = 100 is iid, gamma = 0 gives each client a contiguous block of sorted labels. (The authors' FEMNIST script
  fills the non-iid part of user u from label u mod C; cutting the sorted pool is the same when labels are
  balanced and clients are a multiple of classes, and never runs out of records otherwise.)
* ``k_labels``: each client holds exactly k labels, (i k + j) mod C for j < k over a random order of the classes;
  each label's records are divided equally among its holders (the "pathological non-iid" split of McMahan et al.
  2017, made exact). k an integer in [1, C].
* ``one_class``: ``k_labels`` with k = 1: one class per client (silo), classes reused when clients > classes.
* ``dirichlet``: client i draws label proportions q_i ~ Dir(alpha p), p the global label frequencies (Hsu, Qi,
  Brown 2019); each class's records are divided among clients in proportion to q_{i,c}, so client i's histogram is
  close to (N/M) q_i. Small alpha concentrates each client on few labels. A client left empty receives one record
  from the largest client. alpha > 0.
* ``parity_pairs``: one client per (even, odd) pair of classes, classes numbered 0..C-1 in sorted order (for digits,
  the digit itself): ceil(C/2) x floor(C/2) clients, client e floor(C/2) + o holding even class 2e and odd class
  2o + 1; each class's records divided equally among the floor(C/2) or ceil(C/2) clients holding it (Lowy,
  Ghafelebashi, Razaviyayn 2023, Sec. 4: MNIST in 25 silos, 5 even x 5 odd digits). ``data.num_clients`` must be
  that product. No parameter.
"""

from __future__ import annotations

import numpy as np

from dpfl.errors import ConfigError, check_range

PARTITIONS = ("iid", "similar", "k_labels", "one_class", "dirichlet", "parity_pairs")


def _split_sizes(total: int, parts: int) -> np.ndarray:
    """Sizes of ``parts`` near-equal parts of ``total`` (the first ``total % parts`` get one more)."""
    return np.array([len(p) for p in np.array_split(np.arange(total), parts)], dtype=np.int64)


def _cut(indices: np.ndarray, sizes: np.ndarray) -> list[np.ndarray]:
    return np.split(indices, np.cumsum(sizes)[:-1])


def _iid(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    return _cut(rng.permutation(len(labels)), _split_sizes(len(labels), num_clients))


def _similar(labels: np.ndarray, num_clients: int, gamma: float, rng: np.random.Generator) -> list[np.ndarray]:
    sizes = _split_sizes(len(labels), num_clients)
    iid_sizes = np.round(sizes * gamma / 100).astype(np.int64)
    order = rng.permutation(len(labels))
    iid_pool, rest = order[: iid_sizes.sum()], order[iid_sizes.sum() :]
    rest_by_label = rest[np.argsort(labels[rest], kind="stable")]
    return [
        np.concatenate([a, b]) for a, b in zip(_cut(iid_pool, iid_sizes), _cut(rest_by_label, sizes - iid_sizes))
    ]


def _k_labels(labels: np.ndarray, num_clients: int, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    classes = rng.permutation(np.unique(labels))
    held = [classes[(i * k + np.arange(k)) % len(classes)] for i in range(num_clients)]
    return _divide_classes(labels, held, classes, k, rng)


def _parity_pairs(labels: np.ndarray, num_clients: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Lowy et al. 2023's silos: client (e, o) holds classes 2e and 2o + 1 (labels are 0..C-1)."""
    classes = np.unique(labels)
    evens, odds = classes[0::2], classes[1::2]
    if len(odds) == 0:
        raise ConfigError("data.partition", "parity_pairs", f"another scheme: the data has {len(classes)} class, and "
                                                            "'parity_pairs' pairs an even class with an odd one")
    if num_clients != len(evens) * len(odds):
        raise ConfigError("data.num_clients", num_clients,
                          f"{len(evens) * len(odds)}: data.partition = 'parity_pairs' gives one client per (even, odd) "
                          f"pair of the data's {len(classes)} classes ({len(evens)} x {len(odds)})")
    held = [np.array([e, o]) for e in evens for o in odds]
    return _divide_classes(labels, held, classes, 2, rng)


def _divide_classes(labels: np.ndarray, held: list[np.ndarray], classes: np.ndarray, k: int,
                    rng: np.random.Generator) -> list[np.ndarray]:
    """Each class's records, in a random order, cut into equal shares for the clients holding it (``held[i]``: the
    classes of client i, ``k`` of them)."""
    num_clients = len(held)
    parts = [[] for _ in range(num_clients)]
    for label in classes:
        holders = [i for i in range(num_clients) if label in held[i]]
        records = rng.permutation(np.flatnonzero(labels == label))
        if holders and len(records) < len(holders):
            raise ConfigError(
                "data.num_clients",
                num_clients,
                f"at most as many clients holding a class as it has records (class {label} has {len(records)} "
                f"records for {len(holders)} clients with {k} label(s) each): use fewer clients",
            )
        for i, share in zip(holders, np.array_split(records, len(holders)) if holders else []):
            parts[i].append(share)
    return [np.concatenate(p) for p in parts]


def _dirichlet(labels: np.ndarray, num_clients: int, alpha: float, rng: np.random.Generator) -> list[np.ndarray]:
    classes, class_counts = np.unique(labels, return_counts=True)
    proportions = rng.dirichlet(alpha * class_counts / class_counts.sum(), size=num_clients)  # [M, C]
    parts = [[] for _ in range(num_clients)]
    for c, label in enumerate(classes):
        weights = proportions[:, c]
        weights = weights / weights.sum() if weights.sum() > 0 else np.full(num_clients, 1 / num_clients)
        records = rng.permutation(np.flatnonzero(labels == label))
        cuts = np.round(np.cumsum(weights)[:-1] * len(records)).astype(np.int64)
        for i, share in enumerate(np.split(records, cuts)):
            parts[i].append(share)
    parts = [np.concatenate(p) for p in parts]
    for empty in [i for i, p in enumerate(parts) if len(p) == 0]:
        largest = int(np.argmax([len(p) for p in parts]))
        parts[empty], parts[largest] = parts[largest][-1:], parts[largest][:-1]
    return parts


def check_partition(scheme: str, param, num_classes: int):
    """Validates (data.partition, data.partition_param) and returns the parameter with its proper type."""
    if scheme not in PARTITIONS:
        raise ConfigError("data.partition", scheme, f"one of {PARTITIONS}")
    if scheme in ("iid", "one_class", "parity_pairs"):
        if param is not None:
            raise ConfigError("data.partition_param", param, f"no value (None) for data.partition = {scheme!r}")
        return None
    if param is None:
        allowed = {
            "similar": "gamma, a number in [0, 100] (percentage of iid data per client)",
            "k_labels": f"k, an integer in [1, {num_classes}] (labels per client)",
            "dirichlet": "alpha, a number in (0, inf) (Dirichlet concentration)",
        }[scheme]
        raise ConfigError("data.partition_param", param, f"{allowed} for data.partition = {scheme!r}")
    if scheme == "similar":
        return check_range("data.partition_param", param, 0, 100)
    if scheme == "k_labels":
        return check_range("data.partition_param", param, 1, num_classes, integer=True)
    return check_range("data.partition_param", param, 0, float("inf"), low_open=True, high_open=True)


def partition(
    labels: np.ndarray, num_clients: int, scheme: str = "iid", param=None, *, rng: np.random.Generator
) -> list[np.ndarray]:
    """Splits records 0..N-1 (with the given labels) over ``num_clients`` clients; returns their index arrays.

    Every record goes to at most one client (k_labels and one_class drop the classes no client holds); every
    client receives at least one record.
    """
    labels = np.asarray(labels)
    num_clients = check_range("data.num_clients", num_clients, 1, len(labels), integer=True)
    param = check_partition(scheme, param, len(np.unique(labels)))
    if scheme == "iid":
        return _iid(labels, num_clients, rng)
    if scheme == "similar":
        return _similar(labels, num_clients, param, rng)
    if scheme == "k_labels":
        return _k_labels(labels, num_clients, param, rng)
    if scheme == "one_class":
        return _k_labels(labels, num_clients, 1, rng)
    if scheme == "parity_pairs":
        return _parity_pairs(labels, num_clients, rng)
    return _dirichlet(labels, num_clients, param, rng)


def stratified_subsample(indices: np.ndarray, labels: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` of a client's records chosen at random, keeping its label proportions (systematic sampling).

    Records are shuffled, then ordered by (rank within their label + 1/2) / label count, so any prefix holds each
    label in proportion to its share (within one record); labels stay present whenever their share allows it.
    """
    indices = rng.permutation(indices)
    client_labels = labels[indices]
    _, inverse, counts = np.unique(client_labels, return_inverse=True, return_counts=True)
    rank = np.empty(len(indices), dtype=np.int64)
    for c in range(len(counts)):
        members = np.flatnonzero(inverse == c)
        rank[members] = np.arange(len(members))
    key = (rank + 0.5) / counts[inverse]
    return indices[np.argsort(key, kind="stable")[:size]]


__all__ = ["PARTITIONS", "partition", "check_partition", "stratified_subsample"]
