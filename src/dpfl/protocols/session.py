"""What the parties of one secure aggregation round share: its configuration, its stages, its outcome and the
encodings both sides use (Bonawitz et al. 2017; the protocol is described in ``dpfl.protocols.secagg``)."""

from __future__ import annotations

import enum
import operator
from dataclasses import dataclass

import numpy as np
import torch

from dpfl.errors import ConfigError, check_range
from dpfl.protocols import shamir
from dpfl.protocols.messages import SERVER

#: Largest ring Z_(2^bits) (sums are returned as int64).
MAX_BITS = 63


class Stage(enum.IntEnum):
    """The protocol's rounds, in order; a client that drops out "at" a stage sends nothing from that stage on."""

    ADVERTISE_KEYS = 0
    SHARE_KEYS = 1
    MASKED_INPUT = 2
    UNMASKING = 3
    DONE = 4
    ABORTED = 5


@dataclass(frozen=True)
class SecAggConfig:
    """What every party of one round agrees on beforehand.

    Attributes:
      round_id: the round's id (every message carries it); fresh keys are drawn for every round.
      clients: the invited client ids, distinct integers in [0, 2^32 - 2].
      threshold: t, the Shamir threshold and the fewest clients that may remain: t > n/2 (module docstring), t <= n.
      dimension: d, the length of every input vector.
      bits: the ring Z_(2^bits) the vectors and their sum live in, 1..63.
    """

    round_id: int
    clients: tuple[int, ...]
    threshold: int
    dimension: int
    bits: int

    def __post_init__(self):
        allowed = "distinct integer client ids in [0, 2^32 - 2], at least one"
        try:
            ids = tuple(operator.index(c) for c in self.clients)
        except TypeError:
            raise ConfigError("clients", self.clients, allowed) from None
        n = len(ids)
        if n == 0 or len(set(ids)) != n or not all(0 <= c < SERVER for c in ids):
            raise ConfigError("clients", list(ids), allowed)
        object.__setattr__(self, "clients", ids)
        check_range("round_id", self.round_id, 0, 2**64 - 1, integer=True)
        check_range("threshold", self.threshold, n // 2 + 1, n, integer=True)
        check_range("dimension", self.dimension, 1, integer=True)
        check_range("bits", self.bits, 1, MAX_BITS, integer=True)

    @property
    def modulus_mask(self) -> np.uint64:
        return np.uint64((1 << self.bits) - 1)


@dataclass(frozen=True)
class SecureSum:
    """The outcome of a round: ``total`` = sum of the contributors' inputs mod 2^bits (int64, [dimension])."""

    total: torch.Tensor
    contributors: tuple[int, ...]


@dataclass(frozen=True)
class PublicKeys:
    encryption: bytes  # c_u^PK
    mask: bytes  # s_u^PK


def element_bytes(value: int) -> bytes:
    """A field element (a Shamir share) as 66 big-endian bytes."""
    return value.to_bytes(shamir.ELEMENT_BYTES, "big")


__all__ = ["MAX_BITS", "Stage", "SecAggConfig", "SecureSum", "PublicKeys", "element_bytes"]
