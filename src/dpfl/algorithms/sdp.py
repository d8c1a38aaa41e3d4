"""Shuffle-DP federated learning (Lowy, Ghafelebashi, Razaviyayn 2023, SDP algorithms): the ISRL-DP algorithms with
each silo's Gaussian noise replaced by Cheu et al.'s (2021) binomial vector summation P_vec over the round's M K
clipped per-example gradients, the messages shuffled (``dpfl.protocols.shuffler``). P_vec is the aggregator
``BinomialMean`` (``dpfl.algorithms.noisy_mean``: the piece the ISRL-DP rounds vary), its noise bits ``NoiseBits``.

``sdp-prox-sgd`` (Lowy et al.'s SDP Prox-SGD) is the one-pass round ``isrl.ProxSGD`` of ``isrl-prox-sgd`` with P_vec:
every silo i in the cohort S_r takes round r's block of K_i = floor(n_i / R) records of its secret permutation
(disjoint across rounds), clips each record's gradient at C (l2) and runs P_vec's local randomiser on each, with
L = C: it sends the labelled bits of its K_i users as ``ones`` (1-bits per coordinate) and ``slots`` (messages per
coordinate, K_i (g + b)). Through the real shuffler (privacy.boundary = "shuffler", privacy.shuffler = "real") the
server learns only the shuffled multiset, i.e. the counts; the analyser's estimate divided by U = sum_i K_i is the
mean clipped gradient, and w_{r+1} = prox_{eta f1}(w_r - eta * estimate / U).

**Privacy** (``dpfl.accounting.binomial``: the counts are approximately RDP under replacing one user's vector,
l2_shift g since L = C and replacing a record moves its clipped gradient by <= 2C). A record is used in one round
only (parallel composition, as for isrl-prox-sgd), in which its silo takes part with the client sampler's
probability M/N, so the release declares ONE event in round 0, with the sampler's participation (the silo-sampling
amplification of Lowy et al.), and none later. The event is the owner's own K_min b noise bits (K_min the smallest
silo's block), additive (nothing is computed after the sum): behind the real shuffler every observer is charged
the aggregate, the cohort's n K_min b bits (``observers.scale_noise``), another silo (n - 1) K_min b (it subtracts
its own bits); behind a boundary that shows each silo's message (plain, or the simulated shuffler) the server is
charged the owner's silo's own bits. b is the smallest number of bits per user and coordinate (to 5%) for which
every observer of the shuffle model meets privacy.epsilon at privacy.delta over the run's rounds, by the run's own
ledger (``shuffle_calibration``: the runner's one calibration route, ``dpfl.experiments.noise_level``), at the model's
dimension d.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch
from dp_accounting import dp_event

from dpfl.accounting.events import BinomialSumDpEvent
from dpfl.accounting.observers import OBSERVERS, Cohort, Release
from dpfl.accounting.shuffle import default_grid, gaussian_trials_guess
from dpfl.algorithms.isrl import ISRLKeys, ProxSGD, checked_target, register_cross_silo
from dpfl.algorithms.noisy_mean import SiloVectors
from dpfl.algorithms.registry import Calibration, Setting
from dpfl.engine.boundary import Delivery
from dpfl.engine.protocol import ClientContext, Messages
from dpfl.engine.sampling import ClientSampler, RecordSampler
from dpfl.errors import ConfigError, check_range
from dpfl.protocols.shuffler import BinomialVectorSum

PROBABILITY = 0.5  # p of the noise bits: Bin(m, 1/2) is symmetric, so one direction of the accounting suffices


@dataclass(frozen=True)
class ShuffleModel:
    """P_vec's shape in a run: the smallest silo's users per round and the rounding grid (None: ceil(sqrt(d)))."""

    per_silo: int
    grid: int | None

    def grid_for(self, dimension: int) -> int:
        return default_grid(dimension) if self.grid is None else self.grid

    def own_event(self, trials: int, dimension: int) -> BinomialSumDpEvent:
        """The owner silo's own noise bits, K_min b per coordinate (the event every release declares)."""
        grid = self.grid_for(dimension)
        return BinomialSumDpEvent(self.per_silo * trials, PROBABILITY, dimension, grid, float(grid))


def encode(summation: BinomialVectorSum, vectors: torch.Tensor, mask: torch.Tensor,
           ctx: ClientContext) -> dict[str, torch.Tensor]:
    """Each silo's labelled bits for its users (rows of ``vectors`` [clients, batch, P] where ``mask`` is 1): the
    1-bits per coordinate ``ones`` [clients, P] and the messages per coordinate ``slots`` [clients]. Each silo's
    rounding coins and noise bits come from its own streams."""
    rounding, noise = ctx.streams("rounding").generators, ctx.streams("noise").generators
    bound = summation.bound
    ones = torch.stack([summation.counts(vectors[i][mask[i] > 0].clamp(-bound, bound), rounding[i], noise[i]).sum(0)
                        for i in range(vectors.shape[0])])
    slots = mask.sum(1).round().to(torch.int64) * summation.messages_per_coordinate
    return {"ones": ones, "slots": slots}


def decode_mean(summation: BinomialVectorSum, delivered: Delivery) -> torch.Tensor:
    """The analyser's estimate of the users' mean vector from the delivered counts (U = slots / (g + b)); with a
    leading axis of independent runs (the audit's trials), one estimate per run."""
    ones, slots = delivered.sum("ones"), delivered.sum("slots")
    if slots.dim() == 0:
        users = int(slots) // summation.messages_per_coordinate
        return summation.estimate(ones, users) / users
    return torch.stack([decode_mean(summation, Delivery({"ones": o, "slots": s}, delivered.count,
                                                        delivered.population))
                        for o, s in zip(ones, slots)])


@dataclass(frozen=True)
class NoiseBits:
    """One P_vec stream's noise: b bits per user and coordinate."""

    trials: int


def solved_bits(setting: Setting) -> int:
    """b1, the first stream's bits: the noise level solved for privacy.epsilon (``Setting.noise``) rounded up (each
    trial of the search builds the algorithm with its level, so the bits the run draws are those it is charged)."""
    return max(1, math.ceil(setting.calibrated_noise()))


def shuffle_calibration(model_of: Callable, rounds_of: Callable) -> Calibration:
    """How privacy.epsilon sets an SDP family's bits (``registry.Calibration``): against every observer of the shuffle
    model (behind the real shuffler each sees the shuffled sum: accounted as behind secure aggregation), whatever the
    run's boundary, crediting silo sampling, to 5% (``Calibration.rtol``); the search starts at the bits whose
    binomial noise has the variance of the Gaussian for ``rounds_of(config, setting)`` rounds over the cohort's other
    users (``accounting.shuffle.gaussian_trials_guess``). ``model_of(config, setting)``: the family's ``ShuffleModel``."""

    def initial(name: str, config, setting: Setting) -> float:
        model, dimension = model_of(config, setting), dimension_of(setting)
        cohort = ClientSampler(setting.num_clients, setting.client_rate, setting.client_sampling).cohort(0)
        users = model.per_silo * max(cohort.min_size - 1, 1)
        return max(1.0, rounds_of(config, setting) * gaussian_trials_guess(
            setting.epsilon, setting.delta, users, dimension, model.grid_for(dimension), PROBABILITY))

    return Calibration(lambda name, config, setting: OBSERVERS, initial, lambda name, config, setting: "secagg",
                       rtol=0.05)


def dimension_of(setting: Setting) -> int:
    """d, the model's parameters, which P_vec's accounting depends on (every coordinate carries noise bits)."""
    if setting.dimension is None:
        raise ValueError("an sdp-* algorithm calibrated to privacy.epsilon needs Setting.dimension (the model's "
                         "number of parameters): build it through dpfl.experiments.assembly")
    return setting.dimension


def radius(bound: float | torch.Tensor, clip: float) -> float:
    """P_vec's L for the round: the vectors' l2 bound, the largest over the rows of the server state, at least
    1e-12 C (a difference round with B_r = 0 sends zeros)."""
    largest = float(bound.max()) if isinstance(bound, torch.Tensor) else float(bound)
    return max(largest, 1e-12 * clip)


@dataclass(frozen=True)
class BinomialMean:
    """The shuffle-DP aggregator (``dpfl.algorithms.noisy_mean.NoisyMean``): P_vec's local randomiser on each of a
    silo's vectors, sent as labelled bits; the analyser's estimate of the users' mean from the delivered counts. The
    owner silo's own bits are its event (additive: nothing is computed after the sum), record sampling is not
    credited, silo sampling is (module docstring)."""

    model: ShuffleModel
    credits_silo_sampling: ClassVar[bool] = True
    less_noise: ClassVar[str] = "fewer noise bits"

    def summation(self, noise: NoiseBits, bound: float | torch.Tensor, clip: float,
                  dimension: int) -> BinomialVectorSum:
        return BinomialVectorSum(radius(bound, clip), self.model.grid_for(dimension), noise.trials, PROBABILITY)

    def declared(self, noise: NoiseBits, records: RecordSampler, counts: torch.Tensor, state, sampled: bool = True,
                 cohort: Cohort | None = None) -> Release:
        dimension = state.server["x"].shape[-1]
        return Release((self.model.own_event(noise.trials, dimension),), (True,), 1.0, cohort)

    def send(self, noise: NoiseBits, vectors: SiloVectors, ctx: ClientContext,
             scale: float | None = None) -> tuple[Messages, dp_event.DpEvent]:
        """Messages {ones, slots}: the labelled bits of the silo's vectors (``scale`` is the server's)."""
        dimension = vectors.point.shape[-1]
        summation = self.summation(noise, vectors.bound, vectors.clip, dimension)
        event = self.model.own_event(summation.trials, dimension)
        return encode(summation, vectors.examples(summation.bound), vectors.mask, ctx), event

    def mean(self, noise: NoiseBits, delivered: Delivery, bound: float | torch.Tensor, clip: float,
             like: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        mean = decode_mean(self.summation(noise, bound, clip, like.shape[-1]), delivered).to(like.dtype)
        return mean if scale is None else scale * mean


@dataclass(frozen=True)
class SDPProxSGD(ProxSGD):
    """SDP Prox-SGD (module docstring): ``isrl.ProxSGD`` with ``aggregator`` P_vec and ``noise`` its bits; what it
    adds reads them."""

    def summation(self, dimension: int) -> BinomialVectorSum:
        """P_vec of every round at dimension d: L = C."""
        return self.aggregator.summation(self.noise, self.clip, self.clip, dimension)


#: the ``algorithm.grid`` key's metadata (sdp-prox-sgd and sdp-spider)
GRID_KEY = {"help": "g, P_vec's rounding grid (None: ceil(sqrt(d)), d the model's parameters)", "min": 1}


@dataclass(frozen=True)
class SDPConfig(ISRLKeys):
    """The keys of sdp-prox-sgd: the ISRL-DP family's, and P_vec's grid."""

    grid: int | None = field(default=None, metadata=GRID_KEY)


def checked_grid(grid: int | None) -> int | None:
    return None if grid is None else check_range("algorithm.grid", grid, 1, integer=True)


def cohort_size(setting: Setting) -> int:
    """n, the silos per round."""
    return ClientSampler(setting.num_clients, setting.client_rate, setting.client_sampling).cohort_size


def one_pass_sampler(setting: Setting) -> RecordSampler:
    """Round r's block of floor(n_i / R) records of each silo (one pass over the data in R rounds)."""
    return RecordSampler(1.0 / check_range("algorithm.rounds", setting.rounds, 1, integer=True), "fixed")


def one_pass_model(config: SDPConfig, setting: Setting) -> ShuffleModel:
    counts = torch.tensor(setting.train_counts, dtype=torch.long)
    return ShuffleModel(int(one_pass_sampler(setting).batch_sizes(counts).min()), checked_grid(config.grid))


def build_sdp(name: str, config: SDPConfig, setting: Setting) -> SDPProxSGD:
    _, rounds = checked_target(name, config, setting)
    counts = torch.tensor(setting.train_counts, dtype=torch.long)
    if rounds > int(counts.min()):
        raise ConfigError("algorithm.rounds", rounds, f"at most {int(counts.min())} for {name!r} (the smallest "
                                                      "silo's records: each round uses floor(n_i / R) >= 1 records no "
                                                      "other round uses)")
    RecordSampler(config.sample_rate, config.record_sampling)  # the family's keys, validated for every name
    return SDPProxSGD(lr=config.lr, clip=config.clip, sampler=one_pass_sampler(setting),
                      noise=NoiseBits(solved_bits(setting)), regularizer=config.regularizer_of(),
                      population=setting.num_clients, cohort_size=cohort_size(setting),
                      aggregator=BinomialMean(one_pass_model(config, setting)))


register_cross_silo(
    ("sdp-prox-sgd",), SDPConfig, build_sdp,
    "SDP Prox-SGD: disjoint batches, Cheu et al.'s binomial vector summation through a shuffler, silo sampling, "
    "calibrated to privacy.epsilon, with a prox step for f1 (Lowy et al. 2023)",
    shuffle_calibration(one_pass_model, lambda config, setting: 1), boundary="shuffler", shuffler="real")  # the shuffle model it is calibrated for

__all__ = ["ShuffleModel", "NoiseBits", "BinomialMean", "SDPProxSGD", "SDPConfig", "encode", "decode_mean",
           "solved_bits", "shuffle_calibration", "build_sdp", "cohort_size", "checked_grid", "PROBABILITY"]
