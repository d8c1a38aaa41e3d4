"""BandMF: FTRL on the prefix sums of the clients' clipped updates through a banded matrix factorization
(Choquette-Choo, Ganesh, McKenna, McMahan, Rush, Thakurta, Xu, NeurIPS 2023, "(Amplified) Banded Matrix
Factorization: A unified approach to private training"), with the banded square root of the prefix-sum matrix as its
strategy (Kalinin, Lampert, NeurIPS 2024, "Banded Square Root Matrix Factorization for Differentially Private Model
Training"), under b-min-separated participation enforced by round robin, or by Poisson sampling within b public
partitions taking turns (amplified BandMF, below).

**The algorithm.** A prefix-sum FTRL (``dpfl.algorithms.noisy_prefix_sums``: the clients' clipped updates u_i, the
round's sum g_t, the step x_t = x_{t-1} - (eta / n) (g_t + e_t), no restart: the anchor is x_0) whose factorization
of the T x T prefix-sum matrix A (lower-triangular ones) is A = B C with C the lower-triangular banded Toeplitz matrix

    C_{t,j} = c_{t-j} for 0 <= t - j < b (else 0),     c_k = |binom(-1/2, k)| = binom(2k, k) / 4^k,

the coefficients of (1 - x)^{-1/2}, i.e. of the Toeplitz square root of A (A's generating function is (1 - x)^{-1}),
truncated to b bands: Kalinin and Lampert's BSR, which needs no optimisation (c_0 = 1, c_1 = 1/2, c_2 = 3/8, ...).
The server releases A g + B nu = A (g + C^{-1} nu), nu_t ~ N(0, (z C ||c||)^2 I) one fresh draw per round from its
own stream (||c||^2 = sum_{k<b} c_k^2, a column of C), so the round's noise is w_t = (C^{-1} nu)_t, which the banded
C gives by forward substitution in O(b) per round:

    w_t = (nu_t - sum_{k=1}^{b-1} c_k w_{t-k}) / c_0.

The server keeps the b - 1 most recent w's (its own noise, independent of the data), never a partial sum of the
updates. C does not depend on T, so neither does the run: a resume or a longer run continues the same recurrence.

**Sensitivity** (Choquette-Choo et al. 2023, the banded case of their b-min-separated participation). Neighbouring
data sets differ in one client's data, replaced by the null client's whose update is 0 (user-level zero-out); the
owner's change to g is d_j, ||d_j|| <= C, in each round j of its participation set P, and 0 elsewhere. The data enter
the release only through y = C g + nu (x_t is a function of y_1..y_t: C^{-1} y = g + C^{-1} nu). Release y row by
row: given y_1..y_{t-1}, every other client's update is fixed (a function of the released models and its own data)
and the owner's d_j (j <= t) is a function of the earlier rows, so row t is a Gaussian mechanism of std z C ||c||
whose input moves by sum_{j in P, t-b < j <= t} c_{t-j} d_j. When every two rounds of P are at least b apart, at
most one j(t) in P lies in the window (t - b, t], so row t moves by at most |c_{t-j(t)}| C, a bound fixed by the
public schedule, not by the data. Adaptive composition of Gaussian mechanisms (Dong, Roth, Su 2022, Cor. 3.3) adds
their mu^2:

    mu^2 = sum_t c_{t-j(t)}^2 / (z ||c||)^2 = sum_{j in P} (sum_{k < min(b, T-j+1)} c_k^2) / (z ||c||)^2 <= |P| / z^2,

equality when no participation lies in the last b - 1 rounds. Non-adaptively this is the Frobenius bound
||C D||_F^2 = sum_{i,j in P} (C^T C)_{ij} <d_i, d_j> = sum_{j in P} ||C e_j||^2 ||d_j||^2 (columns at least b apart
have disjoint supports, so no sign condition on C^T C is needed): sens = sqrt(k) ||c|| C for k participations.
Participations closer than b make (C^T C)_{ij} > 0 count (``tests/algorithms/test_bandmf.py`` shows the excess).

**How the ledger charges it.** Each participation is the Gaussian mechanism GaussianDpEvent(z) (mu = 1 / z), charged
at the participation's round j: the rows it moves are j..j+b-1, none released before j, so the charge is never late,
and a budget stops a run before a participation it cannot pay for. Charging the whole horizon at the first
participation would be sound too, but overcharges a run that stops early; a column cut by the horizon (a participation
in the last b - 1 rounds) is charged whole, which is the only slack (the worst-case test measures it). Every round
declares the server's draw as GaussianDpEvent(z) and the owner's participation is the client sampler's: round robin
puts client 0 in rounds floor(k M / n), k = 0, 1, ..., and client i's k-th round floor((i + k M) / n) is never
earlier, so client 0 takes part at least as often as any client in every prefix of rounds (``ClientSampler.
participation``). The observers of the server's output (third party, another silo) are charged these events; the
server sees the clients' unnoised updates (plain) or their sum (secure aggregation): epsilon infinite. The family's
default boundary is "trusted", as dp-ftrl's.

**The participation schemas.** The separation is what the sampler enforces, not what is assumed. Round robin
(``algorithm.client_sampling = "round_robin"``, the default) with cohorts of n out of M clients puts every two rounds
of one client at least floor(M / n) apart, so b <= floor(M / n) is required (the default b is that separation, the
most the schema allows) and a larger b is refused naming ``algorithm.bands``. Fixed-size, Poisson and disjoint (a
fresh partition per epoch, which may put a client in consecutive rounds) cohorts are refused; the optimised strategy
is not implemented.

**Amplified BandMF** (``algorithm.client_sampling = "partitioned_poisson"``; Choquette-Choo et al. 2023, Sec. 4, their
amplification theorem). The clients are split into b public partitions, client i in partition i mod b; in round t only
partition t mod b may take part, each of its clients independently with probability q = l b (``engine.sampling``: the
expected cohort is still about l M; q <= 1 needs b <= floor(1 / l), the default b, and a larger b is refused naming
``algorithm.bands``). The divisor n is the public expected cohort round(l M). A client's rounds are a multiple of b
apart, so its columns' supports [j, j + b) tile the rounds. The derivation, for an owner of partition p, neighbours
differing in its data (zero-out), towards an observer who does not know the cohort: split y = C g + nu into blocks of
rows [j_k, j_k + b), j_k = p + k b (rows before j_0 do not depend on the owner). Given the earlier blocks, the owner's
update d = d_{j_k} (||d|| <= C) is fixed, and only its coin B_k ~ Bernoulli(q) (independent of everything else) decides
whether it enters; no other round of the block holds the owner, so row t of the block is f_t(y_{<t}) + c_{t - j_k} B_k d
+ nu_t, f_t the same function of the earlier rows and the other clients' data and coins on both neighbours. Subtracting
f_t row by row is the same invertible map on both, after which the block is (1 - q) N(0, s^2 I) + q N(v, s^2 I) against
N(0, s^2 I), ||v|| <= ||c|| C, s = z ||c|| C: after a rotation, the Poisson subsampled Gaussian of multiplier z, and a
mixture over the other clients' coins of such pairs (joint convexity of the hockey-stick divergence) is dominated by it
too. The blocks compose adaptively (a dominating pair composes adaptively: Zhu, Dong, Wang 2022). So the run is the
composition of ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` over the owner's eligible rounds, ceil((T - p) / b) of
them in T rounds, at most ceil(T / b) for p = 0; a block cut by the horizon moves y by less than ||c|| C and is charged
whole, as above. The ledger charges it through the sampler's participation (``ClientSampler.cohort``): partition 0's
rounds 0, b, 2b, ... (the most of any partition in every prefix, never later) as a Poisson cohort of rate q, other
rounds as no participation; ``dpfl.accounting.observers`` then amplifies the server's draw by the secret cohort
towards an observer who does not know it (``secret_cohort_event``: the third party, and another silo unless
privacy.cohort or secure aggregation tells it who takes part) and charges
``ParticipationDpEvent(q, GaussianDpEvent(z))`` to one who does (no amplification: it learns B_k). The worst case of ``tests/algorithms/test_bandmf.py`` runs the
instance in which this is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import OTHER_SILO, THIRD_PARTY, Release
from dpfl.algorithms.noisy_prefix_sums import PrefixSumFtrl, PrefixSumFtrlConfig, check_section, shared_fields
from dpfl.algorithms.registry import AlgorithmSpec, Calibration, Setting, register
from dpfl.counts import TOLERANCE
from dpfl.engine.protocol import State
from dpfl.engine.sampling import PARTITIONED, ClientSampler
from dpfl.errors import ConfigError, check_range

NAME = "bandmf"
#: the client samplers that enforce a minimum separation between a client's rounds: round robin, and Poisson within
#: b partitions taking turns (amplified BandMF)
SAMPLINGS = ("round_robin", PARTITIONED)
#: z when neither algorithm.noise_multiplier nor privacy.epsilon is given
DEFAULT_NOISE = 1.0


def banded_sqrt_coefficients(bands: int) -> tuple[float, ...]:
    """c_0..c_{b-1} of Kalinin and Lampert's banded square root: c_k = binom(2k, k) / 4^k = c_{k-1} (2k - 1) / (2k),
    the coefficients of (1 - x)^{-1/2}."""
    check_range("bands", bands, 1, integer=True)
    coefficients = [1.0]
    for k in range(1, bands):
        coefficients.append(coefficients[-1] * (2 * k - 1) / (2 * k))
    return tuple(coefficients)


@dataclass(frozen=True)
class BandMf(PrefixSumFtrl):
    """BandMF with the banded square root strategy (see the module docstring)."""

    coefficients: tuple[float, ...]  # c_0..c_{b-1}, the bands of C
    separation: int  # the fewest rounds between two rounds of one client, >= b
    partition_rate: float | None = None  # q, a client's chance in its partition's rounds; None: round robin

    @property
    def bands(self) -> int:
        return len(self.coefficients)

    @property
    def assumptions(self) -> dict[str, str]:
        if self.partition_rate is None:
            return {"participation": f"every two rounds of one client are at least {self.separation} >= b = "
                                     f"{self.bands} rounds apart (round robin)"}
        return {"participation": f"client i takes part only in rounds t = i mod b of the b = {self.bands} public "
                                 f"partitions, each time independently with probability q = {self.partition_rate:g} "
                                 "(partitioned Poisson; amplified towards observers who do not know the cohort)"}

    @property
    def column_norm(self) -> float:
        """||c||, the l2 norm of a whole column of C."""
        return math.sqrt(sum(c * c for c in self.coefficients))

    def draw_event(self, round_index: int) -> dp_event.DpEvent:
        """One participation's Gaussian: its column moves y by at most ||c|| C, the draw's std is z ||c|| C."""
        return dp_event.GaussianDpEvent(self.noise_multiplier)

    @property
    def draw_sensitivity(self) -> float:
        return self.column_norm * self.clip

    def noise_state(self, x0: torch.Tensor) -> dict[str, torch.Tensor]:
        """``recent`` [b - 1, P]: w_{t-1}, ..., w_{t-b+1}, the most recent first (0 before the first round)."""
        return {"recent": torch.zeros(self.bands - 1, x0.shape[0], dtype=x0.dtype)}

    def release(self, round_index: int, state: State | None, counts: torch.Tensor) -> Release:
        """The clients' updates unnoised (what a server behind a plain or secure-aggregation boundary sees); the
        server's draw, GaussianDpEvent(z), charged in the owner's rounds of the client sampler's schedule."""
        return Release((dp_event.NonPrivateDpEvent(),), (True,), server_events=(self.draw_event(round_index),))

    def round_noise(self, round_index: int, draw: torch.Tensor, server: dict) -> tuple[torch.Tensor, dict]:
        """w_t = (nu_t - sum_{k=1}^{b-1} c_k w_{t-k}) / c_0 (forward substitution in C w = nu), which becomes the most
        recent of the b - 1 kept."""
        recent = server["recent"]
        later = torch.tensor(self.coefficients[1:], dtype=draw.dtype)
        w = (draw - (later.unsqueeze(-1) * recent).sum(-2)) / self.coefficients[0]
        return w, {"recent": torch.cat([w.unsqueeze(-2), recent[..., :-1, :]], dim=-2)}

    def noise_encoder(self, rounds: int) -> torch.Tensor:
        """The banded Toeplitz C: C[t, r] = c_{t - r} for 0 <= t - r < b (each round's noise w solves C w = nu)."""
        encoder = torch.zeros(rounds, rounds, dtype=torch.float64)
        for k, c in enumerate(self.coefficients[:rounds]):
            encoder += torch.diag(torch.full((rounds - k,), c, dtype=torch.float64), -k)
        return encoder

    def divergence_hint(self, counts: torch.Tensor) -> str:
        return ("lower algorithm.global_lr or algorithm.lr (each round moves x by eta / n times noise of std at least "
                f"z ||c|| C = {self.noise_multiplier * self.draw_sensitivity:.3g})")


@dataclass(frozen=True)
class BandMfConfig(PrefixSumFtrlConfig):
    """The ``[algorithm]`` keys of bandmf (beyond name, rounds, client_rate and client_sampling)."""

    noise_multiplier: float | None = field(default=None, metadata={
        "help": "z, each round's fresh draw has std z ||c|| C, ||c|| the norm of a column of the strategy (default: "
                f"calibrated to privacy.epsilon, else {DEFAULT_NOISE})"})
    bands: int | None = field(default=None, metadata={
        "help": "b, the bands of the strategy C (Kalinin and Lampert's banded square root); at most the separation "
                "floor(M / n) of a client's rounds under round robin, and the public partitions, at most floor(1 / l), "
                "under partitioned_poisson (default: that most)", "min": 1})


def partitions(config: BandMfConfig, num_clients: int, rate: float) -> int:
    """b, the public partitions of amplified BandMF (``partitioned_poisson``): algorithm.bands, by default
    floor(1 / l) (q = l b <= 1, at most M partitions), the most the schema allows."""
    most = min(max(1, math.floor(1 / rate + TOLERANCE)), num_clients)
    bands = most if config.bands is None else config.bands
    check_range("algorithm.bands", bands, 1, integer=True)
    if bands > most:
        raise ConfigError("algorithm.bands", bands,
                          f"at most {most} for {NAME!r} under {PARTITIONED!r}: each client of the round's partition "
                          f"takes part with probability q = l b, at most 1 for l = {rate:g}, and the M = "
                          f"{num_clients} clients fill at most M partitions (or lower algorithm.client_rate)")
    return bands


def _clients(config: BandMfConfig, setting: Setting) -> ClientSampler:
    """The run's client sampler, refused unless it enforces a separation (round robin, or partitioned Poisson with
    the bands as partitions). A config validated before its data is built (``Setting.num_clients`` None) gets a
    stand-in of one client per round; the run builds the real one."""
    if setting.client_sampling not in SAMPLINGS:
        raise ConfigError("algorithm.client_sampling", setting.client_sampling,
                          f"one of {list(SAMPLINGS)} for {NAME!r}: its accounting needs every two rounds of a client "
                          "at least b apart, which round robin enforces, and Poisson sampling within b public "
                          "partitions taking turns (amplified BandMF)")
    if setting.num_clients is None:
        return ClientSampler(1, 1.0, setting.client_sampling)
    if setting.client_sampling == PARTITIONED:
        return ClientSampler(setting.num_clients, setting.client_rate, PARTITIONED,
                             partitions=partitions(config, setting.num_clients, setting.client_rate))
    return ClientSampler(setting.num_clients, setting.client_rate, setting.client_sampling)


def build(name: str, config: BandMfConfig, setting: Setting) -> BandMf:
    if name != NAME:
        raise ConfigError("algorithm.name", name, f"{NAME!r}")
    check_section(NAME, config, setting)
    clients = _clients(config, setting)
    fields = {**shared_fields(config, setting, DEFAULT_NOISE), "population": clients.num_clients,
              "cohort_size": clients.cohort_size}
    if clients.scheme == PARTITIONED:
        return BandMf(**fields, coefficients=banded_sqrt_coefficients(clients.partitions),
                      separation=clients.partitions, partition_rate=clients.partition_rate)
    separation = clients.num_clients // clients.cohort_size
    bands = separation if config.bands is None else config.bands
    check_range("algorithm.bands", bands, 1, integer=True)
    if setting.num_clients is not None and bands > separation:
        raise ConfigError("algorithm.bands", bands,
                          f"at most {separation} for {NAME!r}: round robin puts a client's rounds floor(M / n) = "
                          f"floor({clients.num_clients} / {clients.cohort_size}) apart, and the sensitivity of a "
                          "b-banded strategy holds for participations at least b apart (or lower "
                          "algorithm.client_rate)")
    return BandMf(**fields, coefficients=banded_sqrt_coefficients(bands), separation=separation)


def initial_noise(name: str, config: BandMfConfig, setting: Setting) -> float:
    """z ~ sqrt(k) / epsilon over the k participations the ledger charges (ceil(T n / M) under round robin, ceil(T / b)
    under partitioned Poisson), where the search for privacy.epsilon starts."""
    clients = _clients(config, setting)
    if clients.scheme == PARTITIONED:
        participations = -(-setting.rounds // clients.partitions)
    else:
        participations = -(-setting.rounds * clients.cohort_size // clients.num_clients)
    return max(0.1, math.sqrt(participations) / setting.epsilon)


register(AlgorithmSpec(
    names=(NAME,), config=BandMfConfig, build=build, private=lambda name: True,
    help="BandMF: FTRL on prefix sums through the banded square root factorization, each client in round robin at "
         "least b rounds apart, or amplified by Poisson sampling within b partitions taking turns (user-level; "
         "Choquette-Choo et al. 2023, Kalinin and Lampert 2024)",
    privacy_defaults={"boundary": "trusted"}, common_defaults={"client_sampling": "round_robin"},
    partitions=partitions,
    calibration=Calibration(lambda name, config, setting: (THIRD_PARTY, OTHER_SILO), initial_noise),
))

__all__ = ["NAME", "SAMPLINGS", "DEFAULT_NOISE", "banded_sqrt_coefficients", "BandMf", "BandMfConfig", "partitions",
           "build", "initial_noise"]
