"""What the parties of one secure aggregation round share: its configuration, its stages, its outcome and the
encodings both sides use (Bonawitz et al. 2017; the protocol is described in ``dpfl.protocols.secagg``)."""

from __future__ import annotations

import enum
import hashlib
import operator
import struct
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from dpfl.errors import ConfigError, check_range
from dpfl.protocols import shamir
from dpfl.protocols.messages import SERVER, VERSION

#: Largest ring Z_(2^bits) (sums are returned as int64).
MAX_BITS = 63
#: Longest session label.
MAX_SESSION_BYTES = 1024


class Stage(enum.IntEnum):
    """The protocol's rounds, in order; a client that drops out "at" a stage sends nothing from that stage on.
    CONSISTENCY_CHECK is a round of the actively secure variant only (``SecAggConfig.stages``)."""

    ADVERTISE_KEYS = 0
    SHARE_KEYS = 1
    MASKED_INPUT = 2
    CONSISTENCY_CHECK = 3
    UNMASKING = 4
    DONE = 5
    ABORTED = 6


@dataclass(frozen=True)
class SecAggConfig:
    """What every party of one round agrees on beforehand.

    Attributes:
      round_id: the round's id (every message carries it); fresh keys are drawn for every round.
      clients: the invited client ids, distinct integers in [0, 2^32 - 2].
      threshold: t, the Shamir threshold and the fewest clients that may remain: t > n/2 (module docstring), t <= n.
      dimension: d, the length of every input vector.
      bits: the ring Z_(2^bits) the vectors and their sum live in, 1..63.
      session: what the round belongs to beyond its id (on Flower: the run's release sha256 and run id), so that a
        message or signature of one run's round r is not one of another run's round r.
      active: the actively secure variant (Bonawitz et al. 2017, Sec. 4): the clients sign their advertised keys and
        the survivor set under a PKI and check each other's signatures (``dpfl.protocols.identity``); False: the
        honest-but-curious protocol, in which a client's messages are authenticated by a key of the round only.
    """

    round_id: int
    clients: tuple[int, ...]
    threshold: int
    dimension: int
    bits: int
    session: str = ""
    active: bool = False

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
        if not isinstance(self.session, str) or len(self.session.encode()) > MAX_SESSION_BYTES:
            raise ConfigError("session", self.session, f"a string of at most {MAX_SESSION_BYTES} bytes")
        if not isinstance(self.active, bool):
            raise ConfigError("active", self.active, "true or false")

    @property
    def modulus_mask(self) -> np.uint64:
        return np.uint64((1 << self.bits) - 1)

    @property
    def stages(self) -> tuple[Stage, ...]:
        """The stages a client answers in this round, in order (ConsistencyCheck in the active variant only)."""
        return tuple(s for s in Stage if s < Stage.DONE and (self.active or s != Stage.CONSISTENCY_CHECK))

    @property
    def digest(self) -> bytes:
        """SHA-256 of every field: each signature and commitment of the round covers it, so that none is valid in a
        round set up differently (another cohort, threshold, session or variant)."""
        fields = struct.pack(">BQIIB?I", VERSION, self.round_id, self.threshold, self.dimension, self.bits,
                             self.active, len(self.clients))
        ids = b"".join(c.to_bytes(4, "big") for c in self.clients)
        return hashlib.sha256(b"DPSA/config" + fields + ids + self.session.encode()).digest()


@dataclass(frozen=True)
class SecureSum:
    """The outcome of a round: ``total`` = sum of the contributors' inputs mod 2^bits (int64, [dimension])."""

    total: torch.Tensor
    contributors: tuple[int, ...]


@dataclass(frozen=True)
class PublicKeys:
    encryption: bytes  # c_u^PK
    mask: bytes  # s_u^PK


class DealtShare(NamedTuple):
    """A Shamir share as its dealer dealt it: its value, and the dealer's signature of it (``messages.share_statement``)
    in the actively secure variant (empty otherwise)."""

    value: int
    signature: bytes


def element_bytes(value: int) -> bytes:
    """A field element (a Shamir share) as 66 big-endian bytes."""
    return value.to_bytes(shamir.ELEMENT_BYTES, "big")


def seed_commitment(config: SecAggConfig, owner: int, seed: bytes) -> bytes:
    """The commitment to client ``owner``'s self-mask seed b_u that it sends with its shares: SHA-256 of the round's
    digest, the owner and b_u. It hides b_u (32 uniform bytes; SHA-256 as a random oracle) and binds the owner to it,
    so the server can check the b_u it reconstructs (a corrupted share gives another value)."""
    return hashlib.sha256(b"DPSA/commitment" + config.digest + owner.to_bytes(4, "big") + seed).digest()


__all__ = ["MAX_BITS", "MAX_SESSION_BYTES", "Stage", "SecAggConfig", "SecureSum", "PublicKeys", "DealtShare",
           "element_bytes", "seed_commitment"]
