"""Who takes part and which records they use: user sampling and record sampling, each with its privacy event.

Sampling is part of the mechanism: an accountant that assumes Poisson sampling while the simulator samples fixed-size
batches is a classic accounting bug (notes/anchors.md, pitfalls). So every sampler here states the dp_accounting event
of the sampling it really performs, and the simulator wraps the noise event with exactly that.

* fixed size without replacement (seed 000 Alg. 1: |C_t| = floor(lM), |S| = floor(sR)): replace-one neighbouring,
  amplified with Wang, Balle, Kasiviswanathan 2019;
* Poisson (each one independently with probability q; seed 002): add/remove neighbouring. Drawn as a
  Binomial(n, q) size followed by a uniform subset of that size, which is the same distribution and lets the batch be
  gathered into a dense tensor.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from dp_accounting import dp_event

from dpfl.counts import TOLERANCE, sampled_count
from dpfl.errors import ConfigError, check_range

SCHEMES = ("fixed", "poisson")


def _uniform_subsets(counts: torch.Tensor, sizes: torch.Tensor, width: int, generator: torch.Generator):
    """For each row i, sizes[i] distinct indices drawn uniformly from range(counts[i]); padded to `width`.

    Returns (indices [rows, width] long, mask [rows, width] float): random keys on real records, +inf on padding,
    the `width` smallest keys per row; entries past sizes[i] are masked out.
    """
    rows, max_count = counts.shape[0], int(counts.max())
    keys = torch.rand(rows, max_count, generator=generator)
    keys.masked_fill_(torch.arange(max_count).unsqueeze(0) >= counts.unsqueeze(1), float("inf"))
    width = max(width, 1)
    # When some row keeps fewer than `width` indices, its first sizes[i] columns must be its sizes[i] smallest keys
    # (a uniform subset of real records): sort. When every row keeps all `width`, any order will do (faster).
    ragged = bool((sizes != width).any())
    indices = torch.topk(keys, width, dim=1, largest=False, sorted=ragged).indices
    mask = (torch.arange(width).unsqueeze(0) < sizes.unsqueeze(1)).to(torch.float32)
    return indices, mask


@dataclass(frozen=True)
class RecordSampler:
    """Samples each client's minibatch from its own records at rate ``rate``."""

    rate: float
    scheme: str = "fixed"

    def __post_init__(self):
        check_range("algorithm.sample_rate", self.rate, 0.0, 1.0, low_open=True)
        if self.scheme not in SCHEMES:
            raise ConfigError("algorithm.record_sampling", self.scheme, f"one of {SCHEMES}")

    def batch_sizes(self, counts: torch.Tensor) -> torch.Tensor:
        """Fixed scheme: floor(s n_i), at least 1 (seed 000 Alg. 1). Poisson: the expected size q n_i."""
        if self.scheme == "fixed":
            return torch.clamp(torch.floor(self.rate * counts.double() + TOLERANCE).long(), min=1)
        return self.rate * counts.double()

    def sample(self, counts: torch.Tensor, generator: torch.Generator):
        """Indices [clients, width] and mask [clients, width] of each client's minibatch."""
        if self.scheme == "fixed":
            sizes = self.batch_sizes(counts)
        else:
            sizes = torch.binomial(counts.double(), torch.full(counts.shape, self.rate, dtype=torch.float64),
                                   generator=generator).long()
        return _uniform_subsets(counts, sizes, int(sizes.max()), generator)

    def divisor(self, counts: torch.Tensor) -> torch.Tensor:
        """What each client divides its clipped sum by: the batch size, or for Poisson the EXPECTED batch size (a
        constant, so the sensitivity stays C/(q n_i); dividing by the realised size would be data dependent, seed 002)."""
        return self.batch_sizes(counts).double()

    def mean_sensitivity(self, clip, counts: torch.Tensor) -> torch.Tensor:
        """l2 sensitivity of each client's mean of clipped per-example gradients, sum_j clip(g_j) / divisor_i.

        Fixed size (replace-one neighbours): swapping one record changes one term of norm <= C into another, so the
        sum moves by at most 2C and the mean by 2C / floor(s n_i) (seed 000 Alg. 1: noise (2C/(sR)) N(0, sigma_g^2)).
        Poisson (add/remove neighbours): one record more or less moves the sum by at most C, and the divisor is the
        constant expected size, so C / (q n_i) (seed 002 Sec. 4, with the expected batch size).
        """
        changed_terms = 2.0 if self.scheme == "fixed" else 1.0
        return changed_terms * clip / self.divisor(counts)

    def event(self, noise_event: dp_event.DpEvent, counts: torch.Tensor) -> dp_event.DpEvent:
        """The event of one client's release: this sampling around ``noise_event``, for the worst-case client."""
        if isinstance(noise_event, (dp_event.NonPrivateDpEvent, dp_event.NoOpDpEvent)):
            return noise_event
        if self.scheme == "poisson":
            return dp_event.PoissonSampledDpEvent(self.rate, noise_event)
        sizes = self.batch_sizes(counts)
        worst = int(torch.argmax(sizes.double() / counts.double()))  # the largest sampling ratio amplifies least
        n, b = int(counts[worst]), int(sizes[worst])
        if b >= n:
            return noise_event
        return dp_event.SampledWithoutReplacementDpEvent(n, b, noise_event)


@dataclass(frozen=True)
class ClientSampler:
    """Samples the cohort of a round from ``num_clients`` clients at rate ``rate``."""

    num_clients: int
    rate: float
    scheme: str = "fixed"

    def __post_init__(self):
        check_range("algorithm.client_rate", self.rate, 0.0, 1.0, low_open=True)
        if self.scheme not in SCHEMES:
            raise ConfigError("algorithm.client_sampling", self.scheme, f"one of {SCHEMES}")
        if self.scheme == "fixed" and self.cohort_size < 1:
            raise ConfigError("algorithm.client_rate", self.rate,
                              f"a rate with floor(rate * {self.num_clients}) >= 1 client per round")

    @property
    def cohort_size(self) -> int:
        """floor(l M) for the fixed scheme; the expected size l M for Poisson."""
        if self.scheme == "fixed":
            return sampled_count(self.rate, self.num_clients)
        return round(self.rate * self.num_clients)

    def sample(self, generator: torch.Generator) -> torch.Tensor:
        """The sorted ids of this round's cohort."""
        if self.scheme == "fixed":
            return torch.randperm(self.num_clients, generator=generator)[: self.cohort_size].sort().values
        picked = torch.rand(self.num_clients, generator=generator) < self.rate
        return picked.nonzero().squeeze(1)
