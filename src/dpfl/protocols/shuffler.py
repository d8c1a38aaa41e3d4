"""Cheu, Joseph, Mao, Peng (2021, "Shuffle private stochastic convex optimization", ICLR 2022) binomial vector
summation P_vec, with a real shuffler: the protocol Lowy et al. (2023, Alg. 4-5) run for their SDP algorithms.

* **Local randomiser** (each user, each coordinate j of x in [-L, L]^d): w_j = (x_j + L)/(2L) in [0, 1], scaled by the
  grid g and randomly rounded, r_j = floor(g w_j) + Bern(g w_j - floor(g w_j)) (E r_j = g w_j); plus
  eta_j ~ Bin(b, p) noise bits. The user emits g + b messages labelled j: (j, 1) r_j + eta_j times, (j, 0) the rest.
* **Shuffler**: a uniformly random permutation of ALL messages of the round from all users; the sender is stripped
  (a message is only (label, bit)).
* **Analyser**: per coordinate, the count c_j of (j, 1) messages over U users; the unbiased estimate of the sum is

      (2L/g) (c_j - U b p) - U L,     Var = (2L/g)^2 (sum_users Var r_j + U b p (1 - p)) <= (2L/g)^2 U (1/4 + b p (1-p)).

The multiset of labelled bits is a function of the counts and vice versa, so ``counts`` (count path, for simulation
speed) and ``messages`` -> ``shuffle`` -> ``analyse_messages`` (message path) give the same estimate from the same
draws. All randomness (rounding coins, noise bits) is drawn by ``dpfl.noise`` from the caller's generators
(``dpfl.engine.randomness`` streams); the shuffle's permutation too comes from a caller's generator.

Privacy: ``dpfl.accounting.binomial`` (an observer of the shuffled messages sees exactly the counts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpfl.noise import BinomialBits, randomised_rounding
from dpfl.errors import ConfigError, check_range


@dataclass(frozen=True)
class BinomialVectorSum:
    """P_vec with bound L, grid g, b noise bits per user and coordinate, each 1 with probability p."""

    bound: float
    grid: int
    trials: int
    probability: float = 0.5

    def __post_init__(self):
        check_range("bound", self.bound, 0.0, low_open=True)
        check_range("grid", self.grid, 1, integer=True)
        BinomialBits(self.trials, self.probability)  # validates trials and probability

    @property
    def messages_per_coordinate(self) -> int:
        """g + b: the messages each user sends per coordinate."""
        return self.grid + self.trials

    def counts(self, x: torch.Tensor, rounding: torch.Generator, noise: torch.Generator) -> torch.Tensor:
        """The local randomiser's 1-messages per coordinate, r_j + eta_j: int64 [users, d] from x [users, d]."""
        if x.dim() != 2:
            raise ConfigError("x", tuple(x.shape), "a [users, d] tensor")
        largest = float(x.abs().max()) if x.numel() else 0.0
        if not largest <= self.bound:  # also catches NaN
            raise ConfigError("x", largest, f"coordinates in [-L, L] = [{-self.bound}, {self.bound}] (clip the "
                                            "vectors to l2 norm <= L first)")
        scaled = (x.double() + self.bound) / (2.0 * self.bound) * self.grid
        rounded = randomised_rounding(scaled, rounding).clamp(0, self.grid)  # clamp: float error at the ends only
        return rounded + BinomialBits(self.trials, self.probability)(tuple(x.shape), noise)

    def messages(self, counts: torch.Tensor) -> torch.Tensor:
        """The users' messages, all of them: int64 [users * d * (g + b), 2] rows (coordinate label, bit), each user's
        g + b messages per coordinate in order (the shuffler hides that order and the sender)."""
        return labelled_bits(counts, torch.full((counts.shape[0],), self.messages_per_coordinate))

    def estimate(self, ones: torch.Tensor, users: int) -> torch.Tensor:
        """The analyser: (2L/g) (c_j - U b p) - U L from the per-coordinate counts c [d] of U users' 1-messages."""
        check_range("users", users, 0, integer=True)
        noise_mean = users * self.trials * self.probability
        return (2.0 * self.bound / self.grid) * (ones.double() - noise_mean) - users * self.bound

    def analyse_counts(self, counts: torch.Tensor) -> torch.Tensor:
        """Count path: the estimate of the sum of the users' vectors from their counts [users, d]."""
        return self.estimate(counts.sum(0), counts.shape[0])

    def analyse_messages(self, shuffled: torch.Tensor, dim: int, users: int) -> torch.Tensor:
        """Message path: the estimate from shuffled (label, bit) rows of ``users`` users (any order)."""
        expected = users * dim * self.messages_per_coordinate
        if shuffled.shape != (expected, 2):
            raise ConfigError("messages", tuple(shuffled.shape), f"[{expected}, 2] rows: {users} users x {dim} "
                                                                f"coordinates x {self.messages_per_coordinate}")
        return self.estimate(count_labelled_bits(shuffled, dim)[0], users)

    def noise_variance(self, users: int) -> float:
        """Var of the binomial noise in one coordinate of the estimate: (2L/g)^2 U b p (1 - p)."""
        return (2.0 * self.bound / self.grid) ** 2 * users * self.trials * self.probability * (1 - self.probability)

    def variance_bound(self, users: int) -> float:
        """Var of one coordinate of the estimate, at most: rounding (2L/g)^2 U / 4 plus the binomial noise."""
        return (2.0 * self.bound / self.grid) ** 2 * users / 4.0 + self.noise_variance(users)


def labelled_bits(ones: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Messages (label j, bit) of senders that each send ``slots[i]`` messages per coordinate, ``ones[i, j]`` of them
    1: int32 [sum_i d slots_i, 2] rows (a sender's multiset of labelled bits is exactly its counts), 8 bytes each."""
    senders, dim = ones.shape
    if slots.shape != (senders,) or bool((ones < 0).any()) or bool((ones > slots.unsqueeze(1)).any()):
        raise ConfigError("ones", tuple(ones.shape), f"per-sender counts in [0, slots] with one slot count per sender "
                                                    f"(slots of shape {tuple(slots.shape)})")
    block = slots.repeat_interleave(dim)  # messages of each (sender, label), sender-major
    labels = torch.arange(dim, dtype=torch.int32).repeat(senders).repeat_interleave(block)
    runs = torch.stack([ones.reshape(-1), block - ones.reshape(-1)], dim=1).reshape(-1)  # each block: 1s, then 0s
    bits = torch.tensor([1, 0], dtype=torch.int32).repeat(senders * dim).repeat_interleave(runs)
    return torch.stack([labels, bits], dim=1)


def count_labelled_bits(messages: torch.Tensor, dim: int) -> tuple[torch.Tensor, int]:
    """What a multiset of labelled bits says: the 1-bits per label [d] and the messages per label (the same for
    every label when each sender sends the same number per coordinate; the first label's count is returned)."""
    labels, bits = messages[:, 0], messages[:, 1]
    return torch.bincount(labels[bits == 1], minlength=dim), int((labels == 0).sum())


def shuffle(messages: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The shuffler: a uniform permutation of all the round's message rows (senders are not part of a message)."""
    return messages.index_select(0, torch.randperm(messages.shape[0], generator=generator))


def shuffled_sum(ones: torch.Tensor, slots: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, int]:
    """The real shuffle stage of a round: every sender's labelled bits (``labelled_bits``), one uniform permutation of
    all of them, and what the analyser can read from the shuffled multiset (``count_labelled_bits``)."""
    return count_labelled_bits(shuffle(labelled_bits(ones, slots), generator), ones.shape[1])


__all__ = ["BinomialVectorSum", "labelled_bits", "count_labelled_bits", "shuffle", "shuffled_sum"]
