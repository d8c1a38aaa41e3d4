"""Federated datasets as stacked tensors: clients are the leading axis (docs/architecture.md).

Every client's records are padded with zeros to the largest client's size, so one batched computation serves the
whole cohort; ``counts`` (and the derived ``mask``) say which rows are real. Samplers must draw record indices below
``counts[i]`` only; padded rows hold x = 0 and y = 0 and carry no data.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class ClientArrays:
    """One split (train or test) of all clients, stacked with a leading client axis.

    Attributes:
      x: [num_clients, max_records, *feature_shape] float32, zero past ``counts[i]``.
      y: [num_clients, max_records] int64, zero past ``counts[i]``.
      counts: [num_clients] int64, the number of real records of each client.
    """

    x: torch.Tensor
    y: torch.Tensor
    counts: torch.Tensor

    def __post_init__(self):
        if self.x.dtype != torch.float32 or self.y.dtype != torch.int64 or self.counts.dtype != torch.int64:
            raise TypeError(
                f"ClientArrays expects x float32, y int64, counts int64; got {self.x.dtype}, {self.y.dtype}, "
                f"{self.counts.dtype}"
            )
        if self.x.dim() < 2 or self.x.shape[:2] != self.y.shape or self.counts.shape != self.y.shape[:1]:
            raise ValueError(
                f"ClientArrays shapes disagree: x {tuple(self.x.shape)}, y {tuple(self.y.shape)}, counts "
                f"{tuple(self.counts.shape)}; expected x [clients, records, ...], y [clients, records], "
                "counts [clients]"
            )

    @classmethod
    def from_lists(cls, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], scale: float = 1.0) -> ClientArrays:
        """Stacks per-client arrays (x_i [n_i, *feature_shape], y_i [n_i]) into zero-padded tensors, the features
        multiplied by ``scale`` (a public constant, e.g. 1/255 for 8-bit pixels) in place once stacked."""
        if len(xs) != len(ys) or not xs:
            raise ValueError(
                f"need one x and one y array per client, and at least one client; got {len(xs)} x, {len(ys)} y"
            )
        feature_shape = np.shape(xs[0])[1:]
        counts = np.array([len(y) for y in ys], dtype=np.int64)
        max_records = int(counts.max())
        x = np.zeros((len(xs), max_records, *feature_shape), dtype=np.float32)
        y = np.zeros((len(ys), max_records), dtype=np.int64)
        for i, (x_i, y_i) in enumerate(zip(xs, ys)):
            if np.shape(x_i) != (counts[i], *feature_shape):
                raise ValueError(
                    f"client {i}: x has shape {np.shape(x_i)}, expected {(int(counts[i]), *feature_shape)} "
                    "(one row per label, same feature shape for every client)"
                )
            x[i, : counts[i]] = x_i
            y[i, : counts[i]] = y_i
        if scale != 1:
            x *= np.float32(scale)
        return cls(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(counts))

    @property
    def mask(self) -> torch.Tensor:
        """[num_clients, max_records] bool, True on real records."""
        return torch.arange(self.y.shape[1], device=self.counts.device) < self.counts[:, None]

    @property
    def num_clients(self) -> int:
        return self.y.shape[0]

    @property
    def feature_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[2:])

    def to(self, device: torch.device) -> ClientArrays:
        """This split on ``device`` (itself when it is there already, or when it holds shapes only, on torch's meta
        device: a Flower server's view of its silos' records)."""
        if self.x.device == torch.device(device) or self.x.is_meta:
            return self
        return ClientArrays(self.x.to(device), self.y.to(device), self.counts.to(device))

    def flat(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All real records of all clients concatenated: x [N, *feature_shape], y [N]."""
        mask = self.mask
        return self.x[mask], self.y[mask]

    def clients(self, ids: torch.Tensor) -> ClientArrays:
        """The split of the clients ``ids`` only (their rows gathered: a memory-mapped split reads only those)."""
        return ClientArrays(self.x[ids], self.y[ids], self.counts[ids])

    def flat_chunks(self, chunk: int = 65536) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``flat()`` in consecutive pieces of ``chunk`` records (the last shorter), each gathered when it is reached:
        a pass over memory-mapped records holds one piece, not a copy of them all."""
        x, y = self.x.reshape(-1, *self.feature_shape), self.y.reshape(-1)
        if bool((self.counts == self.y.shape[1]).all()):  # no padding: the pieces are views, nothing is gathered
            for start in range(0, y.numel(), chunk):
                yield x[start : start + chunk], y[start : start + chunk]
            return
        rows = self.mask.reshape(-1).nonzero().squeeze(1)  # the real rows of the flattened [M * max_records]
        for start in range(0, rows.numel(), chunk):
            piece = rows[start : start + chunk]
            yield x[piece], y[piece]


@dataclass(frozen=True)
class FederatedDataset:
    """Train and test splits of the same clients, with provenance.

    ``info`` is JSON-safe and records how the data was made: source or generator parameters, partition, split and
    preprocessing steps (which statistics were used, and that they are computed without privacy).
    """

    train: ClientArrays
    test: ClientArrays
    num_classes: int
    name: str
    info: dict

    def __post_init__(self):
        if self.train.num_clients != self.test.num_clients or self.train.feature_shape != self.test.feature_shape:
            raise ValueError(
                f"train and test disagree: {self.train.num_clients} vs {self.test.num_clients} clients, feature "
                f"shapes {self.train.feature_shape} vs {self.test.feature_shape}"
            )

    @property
    def num_features(self) -> int:
        return math.prod(self.train.feature_shape)

    @property
    def num_clients(self) -> int:
        return self.train.num_clients


#: Each client's test share when the data brings no split of its own (Noble et al. 2022: 80/20 per user).
TEST_FRACTION = 0.2
#: Clients to partition pooled records over when neither the config nor the data says how many (Noble et al. 2022's M).
NUM_CLIENTS = 100


def num_test_records(n: int, test_fraction: float) -> int:
    """Test records of a client with n records: round(test_fraction * n), leaving at least one for training."""
    return max(0, min(n - 1, round(test_fraction * n)))


def split_clients(
    xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], test_fraction: float, rng: np.random.Generator
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """Splits each client's records at random into train and test (Noble et al. 2022: 80/20 per user).

    A client of n records keeps ``num_test_records(n, test_fraction)`` of them for testing.
    Returns (train_xs, train_ys, test_xs, test_ys).
    """
    train_xs, train_ys, test_xs, test_ys = [], [], [], []
    for x_i, y_i in zip(xs, ys):
        n = len(y_i)
        num_test = num_test_records(n, test_fraction)
        order = rng.permutation(n)
        train, test = order[num_test:], order[:num_test]
        train_xs.append(x_i[train])
        train_ys.append(y_i[train])
        test_xs.append(x_i[test])
        test_ys.append(y_i[test])
    return train_xs, train_ys, test_xs, test_ys


__all__ = ["ClientArrays", "FederatedDataset", "NUM_CLIENTS", "TEST_FRACTION", "num_test_records", "split_clients"]
