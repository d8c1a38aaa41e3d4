"""Who takes part and which records they use: user sampling and record sampling, each with its privacy event.

Sampling is part of the mechanism: an accountant that assumes Poisson sampling while the simulator samples fixed-size
batches is a classic accounting bug. So every sampler here states the dp_accounting event
of the sampling it really performs, and the simulator wraps the noise event with exactly that.

* fixed size without replacement (Noble et al. 2022 Alg. 1: |C_t| = floor(lM), |S| = floor(sR)): replace-one neighbouring,
  amplified with Wang, Balle, Kasiviswanathan 2019;
* Poisson (each one independently with probability q; Heikkilä 2024): zero-out neighbouring (one
  record replaced by a null record that contributes nothing). A record is in the batch when its uniform key is below
  q; the batch is gathered into a dense tensor. Not add/remove: the divisor q n_i is the client's expected batch size,
  and adding or removing a record would change n_i, hence the divisor and the noise's scale, which the Gaussian
  mechanism's analysis does not cover (an empirical audit measured epsilon 3.47 against a claimed 0.36). Under
  zero-out n_i is the same on both datasets, so the divisor is a public constant.

Clients are sampled per round, ``ClientSampler.sample(t, seed)`` (from the server's stream of round t): fixed size, Poisson, round robin (cohort t is
the next floor(l M) clients in id order), disjoint batches (a fresh random partition of the clients each epoch of
ceil(1 / l) rounds, drawn from the round's stream, so no cursor needs saving), or partitioned Poisson
(Choquette-Choo et al. 2023, Sec. 4: the clients in b public partitions, client i in partition i mod b; in round t
only partition t mod b takes part, each of its clients independently with probability q = l b, so the expected
cohort is still about l M and every two rounds of one client are a multiple of b apart). ``ClientSampler.participation(t)`` says
how likely the record owner is to take part in round t, for the accounting (``dpfl.accounting.observers``).
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import Cohort
from dpfl.counts import TOLERANCE, sampled_count
from dpfl.engine import randomness
from dpfl.errors import ConfigError, check_range

SCHEMES = ("fixed", "poisson")
#: b public partitions in turn, Poisson within the round's partition (module docstring)
PARTITIONED = "partitioned_poisson"
CLIENT_SCHEMES = ("fixed", "poisson", "round_robin", "disjoint", PARTITIONED)
#: the schemes whose cohort is drawn by independent coins (its size random)
POISSON_SCHEMES = ("poisson", PARTITIONED)


def uniform_keys(counts: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """[rows, max count] U[0, 1) keys on each row's real records, +inf on padding, from one generator."""
    keys = torch.rand(counts.shape[0], int(counts.max()), generator=generator)
    return keys.masked_fill_(torch.arange(keys.shape[1]).unsqueeze(0) >= counts.unsqueeze(1), float("inf"))


def _batch_shape(sizes: torch.Tensor) -> tuple[int, bool]:
    """The width of a batch of rows keeping ``sizes`` indices (the largest size, at least 1) and whether it is ragged
    (some row keeps fewer): two numbers read from the device."""
    width = max(int(sizes.max()) if sizes.numel() else 1, 1)
    return width, bool((sizes != width).any())


class _LastBatchShape:
    """``_batch_shape`` of the fixed scheme's sizes at ``rate`` for the last ``counts`` tensor seen (the same object,
    unmodified since: its version counter): a round's K local steps sample from the same counts, and on a GPU each
    read waits for all the work queued before it, so it is read once a round rather than once a step."""

    def __init__(self):
        self.counts, self.key, self.shape = None, None, None

    def __call__(self, counts: torch.Tensor, rate: float, sizes: torch.Tensor) -> tuple[int, bool]:
        seen = self.counts() if self.counts is not None else None
        if seen is not counts or self.key != (counts._version, rate):
            self.counts, self.key, self.shape = weakref.ref(counts), (counts._version, rate), _batch_shape(sizes)
        return self.shape


_fixed_batch_shape = _LastBatchShape()


def _smallest_keys(keys: torch.Tensor, sizes: torch.Tensor, shape: tuple[int, bool] | None = None):
    """For each row i, the indices of its sizes[i] smallest keys (a uniform subset of its real records when the keys
    are i.i.d. uniform), padded to the largest size. Returns (indices [rows, width] long, mask [rows, width] float).
    ``shape``: (width, ragged) when known (``_batch_shape``)."""
    # When some row keeps fewer than `width` indices, its first sizes[i] columns must be its sizes[i] smallest keys
    # (a uniform subset of real records): sort. When every row keeps all `width`, any order will do (faster).
    width, ragged = shape or _batch_shape(sizes)
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

    @property
    def neighboring(self) -> str:
        """The record-level relation this sampling is accounted under: replace-one (fixed size; Wang et al. 2019)
        or zero-out (Poisson; see the module docstring)."""
        return "replace_one" if self.scheme == "fixed" else "zero_out"

    def batch_sizes(self, counts: torch.Tensor) -> torch.Tensor:
        """Fixed scheme: floor(s n_i), at least 1 (Noble et al. 2022 Alg. 1). Poisson: the expected size q n_i."""
        if self.scheme == "fixed":
            return torch.clamp(torch.floor(self.rate * counts.double() + TOLERANCE).long(), min=1)
        return self.rate * counts.double()

    def sample(self, counts: torch.Tensor, randomness: torch.Generator | torch.Tensor):
        """Indices [clients, width] and mask [clients, width] of each client's minibatch.

        ``randomness`` is a generator, or the uniform keys themselves ([clients, >= max count], U[0, 1) on real
        records, +inf on padding; ``dpfl.engine.randomness.ClientStreams.uniform`` draws them per client). Fixed size:
        the floor(s n_i) smallest keys, a uniform subset. Poisson: the records whose key is below q, each included
        independently with probability q.
        """
        keys = uniform_keys(counts, randomness) if isinstance(randomness, torch.Generator) else randomness
        if self.scheme == "fixed":
            sizes = self.batch_sizes(counts)
            return _smallest_keys(keys, sizes, _fixed_batch_shape(counts, self.rate, sizes))
        return _smallest_keys(keys, (keys < self.rate).sum(1))

    def divisor(self, counts: torch.Tensor) -> torch.Tensor:
        """What each client divides its clipped sum by: the batch size, or for Poisson the EXPECTED batch size (a
        constant, so the sensitivity stays C/(q n_i); dividing by the realised size would be data dependent,
        Heikkilä 2024)."""
        return self.batch_sizes(counts).double()

    def mean_sensitivity(self, clip, counts: torch.Tensor) -> torch.Tensor:
        """l2 sensitivity of each client's mean of clipped per-example gradients, sum_j clip(g_j) / divisor_i.

        Fixed size (replace-one neighbours): swapping one record changes one term of norm <= C into another, so the
        sum moves by at most 2C and the mean by 2C / floor(s n_i) (Noble et al. 2022 Alg. 1: noise (2C/(sR)) N(0, sigma_g^2)).
        Poisson (zero-out neighbours): a record replaced by a null one moves the sum by at most C, and the divisor is
        the constant expected size q n_i (n_i does not change under zero-out), so C / (q n_i) (Heikkilä 2024, Sec. 4,
        with the expected batch size).
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
    """Samples the cohort of round t from ``num_clients`` clients at rate ``rate`` (see the module docstring)."""

    num_clients: int
    rate: float
    scheme: str = "fixed"
    #: a public seed that names the cohort streams instead of the run's noise key, for a family whose analysis
    #: treats its cohorts as public (``registry.AlgorithmSpec.public_cohorts``); None: cohorts are secret
    public_seed: int | None = None
    #: b, the public partitions of the partitioned Poisson scheme (1 for every other scheme)
    partitions: int = 1

    def __post_init__(self):
        check_range("algorithm.client_rate", self.rate, 0.0, 1.0, low_open=True)
        if self.scheme not in CLIENT_SCHEMES:
            raise ConfigError("algorithm.client_sampling", self.scheme, f"one of {list(CLIENT_SCHEMES)}")
        if self.partitions != 1 and self.scheme != PARTITIONED:
            raise ValueError(f"partitions = {self.partitions}: only the {PARTITIONED!r} scheme has partitions")
        if self.scheme == PARTITIONED:
            check_range("algorithm.bands", self.partitions, 1, self.num_clients, integer=True)  # b: bandmf's key
            if self.rate * self.partitions > 1 + TOLERANCE:
                raise ConfigError("algorithm.client_rate", self.rate,
                                  f"at most 1 / b = 1 / {self.partitions} for {PARTITIONED!r} with b = "
                                  f"{self.partitions} partitions (each client of the round's partition takes part "
                                  "with probability q = l b)")
        if self.scheme != "poisson" and self.cohort_size < 1:
            raise ConfigError("algorithm.client_rate", self.rate,
                              f"a rate with floor(rate * {self.num_clients}) >= 1 client per round")

    @property
    def cohort_size(self) -> int:
        """floor(l M); for Poisson and partitioned Poisson the expected size l M, rounded."""
        if self.scheme in POISSON_SCHEMES:
            return round(self.rate * self.num_clients)
        return sampled_count(self.rate, self.num_clients)

    @property
    def partition_rate(self) -> float:
        """q = l b, each client's chance of taking part in a round of its partition (partitioned Poisson)."""
        return min(1.0, self.rate * self.partitions)

    @property
    def epoch(self) -> int:
        """Rounds in which every client takes part once (round robin, disjoint): ceil(M / n)."""
        return -(-self.num_clients // self.cohort_size)

    @property
    def partition_size(self) -> int:
        """ceil(M / b), the clients of partition 0, the largest (partitioned Poisson)."""
        return -(-self.num_clients // self.partitions)

    def sample(self, round_index: int, seed: int) -> torch.Tensor:
        """The sorted ids of round ``round_index``'s cohort, drawn from the server's cohort stream of the run's noise
        key ``seed`` (``dpfl.engine.randomness``; ``public_seed`` instead when set): the same cohort for the same
        (key, round), however the run got there."""
        n, m = self.cohort_size, self.num_clients
        seed = seed if self.public_seed is None else self.public_seed
        if self.scheme == "round_robin":
            return ((round_index * n + torch.arange(n)) % m).unique()
        if self.scheme == "disjoint":  # one partition per epoch, drawn from the stream of the epoch's first round
            epoch_start, position = round_index - round_index % self.epoch, round_index % self.epoch
            order = torch.randperm(m, generator=randomness.generator(seed, epoch_start, randomness.SERVER, "cohort"))
            return order[position * n : (position + 1) * n].sort().values
        generator = randomness.generator(seed, round_index, randomness.SERVER, "cohort")
        if self.scheme == "fixed":
            return torch.randperm(m, generator=generator)[:n].sort().values
        if self.scheme == PARTITIONED:  # partition t mod b: clients t mod b, t mod b + b, ...
            members = torch.arange(round_index % self.partitions, m, self.partitions)
            return members[torch.rand(members.numel(), generator=generator) < self.partition_rate]
        return (torch.rand(m, generator=generator) < self.rate).nonzero().squeeze(1)

    def independent_cohorts(self, round_index: int, trials: int, seed: int) -> torch.Tensor:
        """[trials, num_clients] bools: ``trials`` independent cohorts of round ``round_index`` with ``sample``'s law
        (the empirical audit's trials), drawn for all trials at once from the cohort stream of key ``seed``: a fixed
        size cohort is the n clients of the smallest of M i.i.d. uniform keys (a uniformly random n-subset, as
        ``sample``'s randperm prefix); Poisson and partitioned Poisson keep each eligible client whose key is below
        its rate; disjoint batches cut each trial's permutation, drawn at the epoch's first round, so that a trial's
        cohorts of one epoch partition the clients; round robin is the same schedule in every trial. The numbers
        differ from ``sample``'s (one draw for every trial, not one stream per trial); the law of each row is the
        same (tests/engine/test_sampling.py)."""
        n, m = self.cohort_size, self.num_clients
        inside = torch.zeros(trials, m, dtype=torch.bool)
        if self.scheme == "round_robin" or (self.scheme == "fixed" and n == m):
            inside[:, self.sample(round_index, seed)] = True
            return inside
        start = round_index - round_index % self.epoch if self.scheme == "disjoint" else round_index
        keys = torch.rand(trials, m, generator=randomness.generator(seed, start, randomness.SERVER, "cohort"))
        if self.scheme == "disjoint":
            position = round_index % self.epoch
            return inside.scatter_(1, keys.argsort(1)[:, position * n : (position + 1) * n], True)
        if self.scheme == "fixed":
            return inside.scatter_(1, keys.argsort(1)[:, :n], True)
        if self.scheme == PARTITIONED:
            members = torch.arange(round_index % self.partitions, m, self.partitions)
            inside[:, members] = keys[:, members] < self.partition_rate
            return inside
        return keys < self.rate

    def cohort(self, round_index: int) -> Cohort:
        """How the record owner takes part in round ``round_index``, for the accounting (``participation``); marked
        public when drawn from ``public_seed``."""
        if self.scheme == "fixed":
            cohort = Cohort.fixed(self.num_clients, self.cohort_size)
        elif self.scheme == "poisson":
            cohort = Cohort.poisson(self.num_clients, self.rate)
        elif self.scheme == PARTITIONED and self.participation(round_index) > 0:
            cohort = Cohort.poisson(self.partition_size, self.partition_rate)
        elif self.scheme == PARTITIONED:
            cohort = Cohort.scheduled(self.num_clients, self.cohort_size, 1, False)
        else:
            smallest = self.num_clients - (self.epoch - 1) * self.cohort_size if self.scheme == "disjoint" else \
                self.cohort_size
            cohort = Cohort.scheduled(self.num_clients, self.cohort_size, min(smallest, self.cohort_size),
                                      self.participation(round_index) > 0)
        return cohort if self.public_seed is None else dataclasses.replace(cohort, public=True)

    def participation(self, round_index: int) -> float:
        """The chance that the record owner takes part in round ``round_index``, for the worst-placed owner.

        Fixed size: n / M; Poisson: l. Round robin: client 0 is in every cycle's first cohort and so takes part at
        least as often as any client: 1 in the rounds it is in, else 0. Disjoint batches: every client takes part
        once per epoch, in a round it cannot be sure of in advance; it is charged at the epoch's first round (1),
        which is the same total, charged early. Partitioned Poisson: partition 0's clients may take part in rounds
        0, b, 2b, ..., ceil(t / b) of the first t rounds, at least as many as any partition's in every prefix and
        never later: q = l b in those rounds, else 0.
        """
        if self.scheme == "fixed":
            return self.cohort_size / self.num_clients
        if self.scheme == "poisson":
            return self.rate
        if self.scheme == PARTITIONED:
            return self.partition_rate if round_index % self.partitions == 0 else 0.0
        if self.scheme == "round_robin":
            return 1.0 if bool((self.sample(round_index, 0) == 0).any()) else 0.0
        return 1.0 if round_index % self.epoch == 0 else 0.0
