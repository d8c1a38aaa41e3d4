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
charged the owner's silo's own bits. b is the smallest number of bits per user and coordinate for which every
observer of the shuffle model meets privacy.epsilon at privacy.delta (the RDP accountant), found when the model's
dimension d is first seen.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, ClassVar

import torch
from dp_accounting import dp_event

from dpfl.accounting import accountants
from dpfl.accounting.accountant import NEIGHBORING
from dpfl.accounting.events import BinomialSumDpEvent
from dpfl.accounting.observers import OBSERVERS, Cohort, Release, observer_events
from dpfl.accounting.shuffle import default_grid, gaussian_trials_guess, smallest_trials
from dpfl.algorithms.isrl import ISRLKeys, ProxSGD, checked_target, register_cross_silo
from dpfl.algorithms.noisy_mean import SiloVectors
from dpfl.algorithms.registry import Setting
from dpfl.engine.boundary import Delivery
from dpfl.engine.protocol import ClientContext, Messages
from dpfl.engine.sampling import ClientSampler, RecordSampler
from dpfl.errors import ConfigError, check_range
from dpfl.protocols.shuffler import BinomialVectorSum

PROBABILITY = 0.5  # p of the noise bits: Bin(m, 1/2) is symmetric, so one direction of the accounting suffices


@dataclass(frozen=True)
class ShuffleModel:
    """What the noise bits are calibrated to: privacy.epsilon at privacy.delta for every observer of the shuffle
    model, the cohort's participation, the smallest silo's users per round, and P_vec's grid (None: ceil(sqrt(d)))."""

    epsilon: float
    delta: float
    cohort: Cohort
    per_silo: int
    grid: int | None

    def grid_for(self, dimension: int) -> int:
        return default_grid(dimension) if self.grid is None else self.grid

    def own_event(self, trials: int, dimension: int) -> BinomialSumDpEvent:
        """The owner silo's own noise bits, K_min b per coordinate (the event every release declares)."""
        grid = self.grid_for(dimension)
        return BinomialSumDpEvent(self.per_silo * trials, PROBABILITY, dimension, grid, float(grid))

    def epsilon_of(self, streams: list[tuple[BinomialSumDpEvent, int]]) -> float:
        """The largest epsilon over the shuffle model's observers of ``count`` rounds of each own event."""
        worst = 0.0
        for observer in OBSERVERS:
            accountant = accountants.make("tightest", NEIGHBORING["replace_one"])
            for event, count in streams:
                view = observer_events(Release((event,), (True,)), self.cohort, "secagg")[observer]
                accountant.compose(view, count)
            worst = max(worst, accountant.get_epsilon(self.delta))
        return worst

    def initial_trials(self, dimension: int, rounds: int = 1) -> float:
        users = self.per_silo * max(self.cohort.min_size - 1, 1)
        return rounds * gaussian_trials_guess(self.epsilon, self.delta, users, dimension, self.grid_for(dimension),
                                              PROBABILITY)


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


@functools.lru_cache(maxsize=64)
def calibrated_trials(model: ShuffleModel, dimension: int) -> tuple[int]:
    """(b,) for a one-pass run: one own event per record (``sdp-prox-sgd``)."""
    return (smallest_trials(lambda b: model.epsilon_of([(model.own_event(b, dimension), 1)]), model.epsilon,
                            model.initial_trials(dimension)),)


@dataclass(frozen=True)
class NoiseBits:
    """One P_vec stream's noise: b bits per user and coordinate, found when the model's dimension d is first seen
    (``calibration(d)``: every stream's b, this one's at ``stream``)."""

    calibration: Callable[[int], tuple[int, ...]]
    stream: int = 0

    def trials(self, dimension: int) -> int:
        return self.calibration(dimension)[self.stream]


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
        return BinomialVectorSum(radius(bound, clip), self.model.grid_for(dimension), noise.trials(dimension),
                                 PROBABILITY)

    def declared(self, noise: NoiseBits, records: RecordSampler, counts: torch.Tensor, state, sampled: bool = True,
                 cohort: Cohort | None = None) -> Release:
        dimension = state.server["x"].shape[-1]
        return Release((self.model.own_event(noise.trials(dimension), dimension),), (True,), 1.0, cohort)

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


def shuffle_model(setting: Setting, epsilon: float, per_silo: int, grid: int | None) -> tuple[ShuffleModel, int]:
    """The shuffle model a family calibrates to, and the cohort size."""
    clients = ClientSampler(setting.num_clients, setting.client_rate, setting.client_sampling)
    return ShuffleModel(epsilon, setting.delta, clients.cohort(0), per_silo, grid), clients.cohort_size


def build_sdp(name: str, config: SDPConfig, setting: Setting) -> SDPProxSGD:
    epsilon, rounds = checked_target(name, config, setting)
    counts = torch.tensor(setting.train_counts, dtype=torch.long)
    if rounds > int(counts.min()):
        raise ConfigError("algorithm.rounds", rounds, f"at most {int(counts.min())} for {name!r} (the smallest "
                                                      "silo's records: each round uses floor(n_i / R) >= 1 records no "
                                                      "other round uses)")
    RecordSampler(config.sample_rate, config.record_sampling)  # the family's keys, validated for every name
    sampler = RecordSampler(1.0 / rounds, "fixed")
    model, cohort_size = shuffle_model(setting, epsilon, int(sampler.batch_sizes(counts).min()),
                                       checked_grid(config.grid))
    return SDPProxSGD(lr=config.lr, clip=config.clip, sampler=sampler,
                      noise=NoiseBits(functools.partial(calibrated_trials, model)),
                      regularizer=config.regularizer_of(), population=setting.num_clients, cohort_size=cohort_size,
                      aggregator=BinomialMean(model))


register_cross_silo(
    ("sdp-prox-sgd",), SDPConfig, build_sdp,
    "SDP Prox-SGD: disjoint batches, Cheu et al.'s binomial vector summation through a shuffler, silo sampling, "
    "calibrated to privacy.epsilon, with a prox step for f1 (Lowy et al. 2023)",
    boundary="shuffler", shuffler="real")  # the shuffle model it is calibrated for

__all__ = ["ShuffleModel", "NoiseBits", "BinomialMean", "SDPProxSGD", "SDPConfig", "encode", "decode_mean",
           "calibrated_trials", "build_sdp", "shuffle_model", "checked_grid", "PROBABILITY"]
