"""Randomness per client: every draw comes from a stream named by (noise key, round, client id, purpose).

The noise key is a secret (``dpfl.engine.keys``: drawn from the operating system's entropy, or ``run.noise_seed`` in
the research mode); the "seed" arguments below are that key, never the public ``run.seed``.

A client's minibatches and noise in round t depend on nothing else: not on which other clients share its memory chunk
(``run.memory_mb``), not on the order clients are processed in, not on the machine (only on the kind of device,
``generator``). So a simulation's results are the same for any chunking, and a client running on another machine (a
Flower SuperNode) can reproduce exactly the draws the simulation makes. Streams are seeded through numpy's ``SeedSequence`` (spawn key = (round, client, purpose)), whose
derived seeds are statistically independent for distinct keys (O'Neill 2015; numpy's documentation).

The empirical audit's independent trials are the one exception: their rows need independent draws, not each row's
reproducible stream, and draw from one batched stream per call (``batch_generator``), whose numbers depend on the
chunk (its first id and every row's shape).

Each client draws what a round needs at the round's start, in one call per purpose (``ClientStreams.uniform`` and
``.normal`` with a per-client shape), so that the cost is a few generator seedings per client and round, not one per
local step.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from dpfl.engine.secure_streams import SecureStream
from dpfl.engine.stream_names import PURPOSES, SERVER, SERVER_PURPOSES, check_purpose

def stream_seed(seed: int, round_index: int, client: int, purpose: str) -> int:
    """The 63-bit seed of stream (key ``seed``, round, client, purpose): SeedSequence(seed, spawn_key=(round,
    client + 1, purpose code)) (a key of any size is SeedSequence's entropy); the server is client -1."""
    return stream_seeds(seed, round_index, [client], purpose)[0]


def stream_seeds(seed: int, round_index: int, clients: Sequence[int], purpose: str) -> list[int]:
    """``stream_seed`` of each of ``clients``: numpy's SeedSequence hash (O'Neill's seed_seq: ``_seed_sequences``)
    evaluated for all clients at once, word for word the numbers ``np.random.SeedSequence(...).generate_state``
    gives (a test compares them); ids or rounds past 32 bits go through numpy's own SeedSequence."""
    check_purpose(purpose)
    ids = [int(c) + 1 for c in clients]
    if int(seed) < 0 or not 0 <= int(round_index) <= _MASK or not all(0 <= i <= _MASK for i in ids):
        return [int(np.random.SeedSequence(int(seed), spawn_key=(int(round_index), i, PURPOSES[purpose]))
                    .generate_state(1, np.uint64)[0] >> np.uint64(1)) for i in ids]
    return _seed_sequences(_words(int(seed)), [int(round_index)], np.array(ids, dtype=np.uint32),
                           [PURPOSES[purpose]])


# -- numpy's SeedSequence (pool size 4, one 64-bit word of state), vectorised over one varying entropy word --------
_MASK = 0xFFFFFFFF
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R, _POOL = 0xCA01F9DD, 0x4973F715, 4


def _words(n: int) -> list[int]:
    """A non-negative int as SeedSequence reads it: its 32-bit words, least significant first ([0] for 0)."""
    words = [n & _MASK]
    while n > _MASK:
        n >>= 32
        words.append(n & _MASK)
    return words


def _seed_sequences(key: list[int], before: list[int], varying: np.ndarray, after: list[int]) -> list[int]:
    """SeedSequence(entropy = ``key`` words, spawn_key = (*before, v, *after)).generate_state(1, uint64) >> 1 for each
    v of ``varying``: the key padded to the pool size (the spawn key is not empty), then the spawn key's words."""
    columns = [*key, *[0] * (_POOL - len(key)), *before]
    entropy = [np.full(len(varying), w, dtype=np.uint32) for w in columns] + [varying.astype(np.uint32)] + \
        [np.full(len(varying), w, dtype=np.uint32) for w in after]
    h = _INIT_A

    def hashmix(value: np.ndarray) -> np.ndarray:
        nonlocal h
        value = value ^ np.uint32(h)
        h = (h * _MULT_A) & _MASK
        value = value * np.uint32(h)
        return value ^ (value >> np.uint32(16))

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        result = np.uint32(_MIX_L) * x - np.uint32(_MIX_R) * y
        return result ^ (result >> np.uint32(16))

    pool = [hashmix(entropy[i]) for i in range(_POOL)]
    for source in range(_POOL):
        for target in range(_POOL):
            if source != target:
                pool[target] = mix(pool[target], hashmix(pool[source]))
    for source in range(_POOL, len(entropy)):
        for target in range(_POOL):
            pool[target] = mix(pool[target], hashmix(entropy[source]))
    state, h = [], _INIT_B
    for word in pool[:2]:  # two 32-bit words, the first the low half of the 64-bit state
        value = word ^ np.uint32(h)
        h = (h * _MULT_B) & _MASK
        value = value * np.uint32(h)
        state.append((value ^ (value >> np.uint32(16))).astype(np.uint64))
    return ((state[0] | (state[1] << np.uint64(32))) >> np.uint64(1)).tolist()


def generator(seed: int, round_index: int, client: int, purpose: str) -> torch.Generator:
    """A torch generator seeded with ``stream_seed``, on torch's default device (a run's ``run.device``:
    ``dpfl.engine.device.on_device``), so that the draws are made where they are used. The stream is the same for the
    same key on the same kind of device; a GPU's generator (Philox) draws other numbers than the CPU's (Mersenne
    twister) from the same seed, with the same distribution (the declared events do not change)."""
    return generators(seed, round_index, [client], purpose)[0]


def generators(seed: int, round_index: int, clients: Sequence[int], purpose: str) -> list[torch.Generator]:
    """``generator`` of each of ``clients``, their seeds computed together (``stream_seeds``)."""
    device = torch.get_default_device()
    return [torch.Generator(device=device).manual_seed(s) for s in stream_seeds(seed, round_index, clients, purpose)]


class ClientStreams:
    """The streams of one purpose for a cohort's clients in one round: one per client, or with ``batched`` one for
    all of them (``batch_generator``)."""

    def __init__(self, seed: int, round_index: int, clients: Sequence[int] | torch.Tensor, purpose: str,
                 batched: bool = False):
        if purpose in SERVER_PURPOSES:  # the audit's server rows are numbered like clients: never share a stream
            raise ValueError(f"purpose = {purpose!r} is the server step's stream, not a client's")
        ids = clients.tolist() if isinstance(clients, torch.Tensor) else list(clients)
        self._name, self.batched = (seed, round_index, ids, purpose), batched
        self._generators = None if batched else generators(seed, round_index, ids, purpose)
        self._batch = batch_generator(seed, round_index, ids, purpose) if batched and ids else None

    @property
    def generators(self) -> list[torch.Generator]:
        """Each client's own generator (made on first use where the streams are batched: a row-wise sampler's)."""
        if self._generators is None:
            self._generators = generators(*self._name)
        return self._generators

    def __len__(self) -> int:
        return len(self._name[2])

    def secure(self) -> list[SecureStream]:
        """Each client's cryptographically secure stream of the same name (``dpfl.engine.secure_streams``: ChaCha20
        keyed by the noise key and the name), for the exact samplers of ``run.secure_noise`` (``dpfl.noise``)."""
        seed, round_index, ids, purpose = self._name
        return [SecureStream(seed, round_index, client, purpose) for client in ids]

    def uniform(self, shapes: Sequence[tuple[int, ...]], fill: float = float("inf")) -> torch.Tensor:
        """U[0, 1) draws of shape ``shapes[i]`` from client i's stream, padded with ``fill`` to a common shape and
        stacked: [clients, *max shape]. A client's draws depend only on its own shape (batched: on every shape)."""
        return self._stacked(shapes, fill, lambda shape, g: torch.rand(shape, generator=g))

    def normal(self, shape: tuple[int, ...]) -> torch.Tensor:
        """N(0, 1) draws of ``shape`` from each client's stream: [clients, *shape]."""
        return self._stacked([shape] * len(self), 0.0, lambda s, g: torch.randn(s, generator=g))

    def exponential(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Exp(1) draws of ``shape`` from each client's stream: [clients, *shape]."""
        return self._stacked([shape] * len(self), 0.0,
                             lambda s, g: torch.empty(s).exponential_(generator=g))

    def _stacked(self, shapes, fill, draw) -> torch.Tensor:
        if len(shapes) != len(self):
            raise ValueError(f"{len(shapes)} shapes for {len(self)} clients")
        if not shapes:
            return torch.empty(0)
        rank = len(shapes[0])
        widest = tuple(max(s[d] for s in shapes) for d in range(rank))
        if self.batched:
            return _padded(draw((len(shapes), *widest), self._batch), shapes, fill)
        out = torch.full((len(shapes), *widest), fill)
        for i, (shape, g) in enumerate(zip(shapes, self.generators)):
            out[(i, *(slice(0, n) for n in shape))] = draw(shape, g)
        return out


def batch_generator(seed: int, round_index: int, ids: Sequence[int], purpose: str) -> torch.Generator:
    """The one generator of batched streams (the empirical audit's independent trials, whose rows need independent
    draws, not each row's own reproducible stream): seeded by SeedSequence(key, spawn_key=(round, first id + 1,
    purpose code, 1)), a spawn key of another length than any row's own stream (``stream_seed``), so it shares
    no stream with one. Rows of one call are independent (disjoint parts of one stream); calls of one round and
    purpose are independent when their first ids differ (the trials' chunks: disjoint ids)."""
    state = np.random.SeedSequence(int(seed), spawn_key=(int(round_index), int(ids[0]) + 1, PURPOSES[purpose], 1))
    return torch.Generator(device=torch.get_default_device()).manual_seed(
        int(state.generate_state(1, np.uint64)[0] >> np.uint64(1)))


def _padded(drawn: torch.Tensor, shapes: Sequence[tuple[int, ...]], fill: float) -> torch.Tensor:
    """``drawn`` [rows, *widest] with every position past row i's ``shapes[i]`` set to ``fill``."""
    if all(shape == shapes[0] for shape in shapes) and tuple(shapes[0]) == tuple(drawn.shape[1:]):
        return drawn
    beyond = torch.zeros(drawn.shape, dtype=torch.bool)
    for d in range(drawn.dim() - 1):
        sizes = torch.tensor([shape[d] for shape in shapes])
        outside = torch.arange(drawn.shape[d + 1])[None, :] >= sizes[:, None]  # [rows, widest_d]
        beyond |= outside.reshape(len(shapes), *[1] * d, -1, *[1] * (drawn.dim() - 2 - d))
    return drawn.masked_fill_(beyond, fill)


class ServerStreams:
    """The stream of one purpose of the server's step in one round (``dpfl.engine.protocol.ServerContext``): the
    server's (client id SERVER), or with ``rows`` one stream per row id (the empirical audit's independent trials;
    ``batched``: one for all rows, ``batch_generator``). Unlike a client's, a server stream is kept: successive draws
    continue it."""

    def __init__(self, seed: int, round_index: int, rows: Sequence[int] | torch.Tensor | None, purpose: str,
                 batched: bool = False):
        if purpose not in SERVER_PURPOSES:
            raise ValueError(f"purpose = {purpose!r} is not a server step's stream: expected one of "
                             f"{list(SERVER_PURPOSES)}")
        ids = [SERVER] if rows is None else rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)
        self.rows = rows is not None
        self._batch = batch_generator(seed, round_index, ids, purpose) if batched and self.rows and ids else None
        self.generators = [] if self._batch is not None else generators(seed, round_index, ids, purpose)
        self._name, self._secure = (seed, round_index, ids, purpose), None

    def secure(self) -> list[SecureStream]:
        """The secure stream of the same name of the server, or of each row (``ClientStreams.secure``), made on the
        first call (the default mode never asks) and kept, like the generators: successive draws continue it."""
        if self._secure is None:
            seed, round_index, ids, purpose = self._name
            self._secure = [SecureStream(seed, round_index, row, purpose) for row in ids]
        return self._secure

    def normal(self, shape: tuple[int, ...]) -> torch.Tensor:
        """N(0, 1) draws of ``shape`` from the server's stream, or [rows, *shape] from each row's."""
        if not self.rows:
            return torch.randn(tuple(shape), generator=self.generators[0])
        if self._batch is not None:
            return torch.randn((len(self._name[2]), *shape), generator=self._batch)
        if not self.generators:
            return torch.empty(0, *shape)
        return torch.stack([torch.randn(tuple(shape), generator=g) for g in self.generators])


__all__ = ["PURPOSES", "SERVER_PURPOSES", "SERVER", "stream_seed", "stream_seeds", "generator", "generators",
           "batch_generator", "ClientStreams", "ServerStreams"]
