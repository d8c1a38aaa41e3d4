"""Shuffle-DP federated learning (Lowy, Ghafelebashi, Razaviyayn 2023, SDP algorithms): the ISRL-DP algorithms with
each silo's Gaussian noise replaced by Cheu et al.'s (2021) binomial vector summation P_vec over the round's M K
clipped per-example gradients, the messages shuffled (``dpfl.protocols.shuffler``).

``sdp-prox-sgd`` (Lowy et al.'s SDP Prox-SGD; the ISRL-DP ``isrl-prox-sgd`` of ``dpfl.algorithms.isrl`` with P_vec):
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

import dataclasses
import functools
from dataclasses import dataclass, field

import torch

from dpfl.accounting import accountants
from dpfl.accounting.accountant import NEIGHBORING
from dpfl.accounting.events import BinomialSumDpEvent
from dpfl.accounting.observers import OBSERVERS, Cohort, Release, observer_events
from dpfl.accounting.shuffle import default_grid, gaussian_trials_guess, smallest_trials
from dpfl.algorithms.isrl import ISRLKeys, checked_target, disjoint_keys
from dpfl.algorithms.prox import Regularizer
from dpfl.algorithms.registry import AlgorithmSpec, Setting, register
from dpfl.engine.boundary import Delivery
from dpfl.engine.protocol import ClientContext, ClientData, ClientOutput, State
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
def calibrated_trials(model: ShuffleModel, dimension: int) -> int:
    """b for a one-pass run: one own event per record (``sdp-prox-sgd``)."""
    return smallest_trials(lambda b: model.epsilon_of([(model.own_event(b, dimension), 1)]), model.epsilon,
                           model.initial_trials(dimension))


@dataclass(frozen=True)
class SDPProxSGD:
    """SDP Prox-SGD (module docstring)."""

    lr: float
    clip: float
    sampler: RecordSampler
    regularizer: Regularizer
    model: ShuffleModel
    population: int
    cohort_size: int
    accountant: str = "tightest"
    neighboring: str = "replace_one"

    def summation(self, dimension: int) -> BinomialVectorSum:
        return BinomialVectorSum(self.clip, self.model.grid_for(dimension), calibrated_trials(self.model, dimension),
                                 PROBABILITY)

    def release(self, round_index: int, state: State, train) -> Release:
        """One additive P_vec release per record, charged in round 0 with the sampler's participation; nothing
        later (module docstring)."""
        dimension = state.server["x"].shape[-1]
        event = self.model.own_event(calibrated_trials(self.model, dimension), dimension)
        cohort = None if round_index == 0 else Cohort.scheduled(self.population, self.cohort_size, 1, False)
        return Release((event,), (True,), 1.0, cohort)

    def init_state(self, x0: torch.Tensor, num_clients: int) -> State:
        return State({"x": x0.clone()})

    def examples_per_client(self, counts: torch.Tensor) -> int:
        return int(self.sampler.batch_sizes(counts).max())

    def client_round(self, round_index: int, server: dict, clients: dict, data: ClientData,
                     ctx: ClientContext) -> ClientOutput:
        """Messages {ones, slots}: the silo's labelled bits of round r's block of its permutation."""
        x = server["x"]
        n, P = data.counts.shape[0], x.shape[-1]
        permutation = dataclasses.replace(ctx, round=0).streams("records").uniform([(int(c),) for c in data.counts])
        keys = disjoint_keys(permutation, data.counts, round_index, self.sampler.batch_sizes(data.counts))
        indices, mask = self.sampler.sample(data.counts, keys)
        xb, yb = data.batch(indices)
        examples = ctx.grads.clipped_examples(x.expand(n, P), xb, yb, mask, self.clip)
        summation = self.summation(P)
        event = self.model.own_event(summation.trials, P)
        return ClientOutput(encode(summation, examples, mask, ctx), {}, [event])

    def server_update(self, round_index: int, server: dict, delivered: Delivery) -> dict:
        """w_{r+1} = prox_{eta f1}(w_r - eta * (P_vec's estimate of the sum) / U)."""
        if delivered.count == 0:
            return server
        x = server["x"]
        mean = decode_mean(self.summation(x.shape[-1]), delivered).to(x.dtype)
        return {"x": self.regularizer.prox(x - self.lr * mean, self.lr)}

    def regulariser(self, x: torch.Tensor) -> float:
        return self.regularizer.value(x)

    def divergence_hint(self, counts: torch.Tensor) -> str:
        return "lower algorithm.lr, or raise privacy.epsilon (fewer noise bits)"


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
    return SDPProxSGD(lr=config.lr, clip=config.clip, sampler=sampler, regularizer=config.regularizer_of(),
                      model=model, population=setting.num_clients, cohort_size=cohort_size)


register(AlgorithmSpec(
    names=("sdp-prox-sgd",), config=SDPConfig, build=build_sdp, private=lambda name: True,
    common_defaults={"client_rate": 1.0},  # cross-silo: a few silos, every one in every round
    help="SDP Prox-SGD: disjoint batches, Cheu et al.'s binomial vector summation through a shuffler, silo "
         "sampling, calibrated to privacy.epsilon, with a prox step for f1 (Lowy et al. 2023)",
    release_keys=("algorithm.rounds",), noise_key=None,
    privacy_defaults={"boundary": "shuffler", "shuffler": "real"},  # the shuffle model it is calibrated for
))

__all__ = ["ShuffleModel", "SDPProxSGD", "SDPConfig", "encode", "decode_mean", "calibrated_trials", "build_sdp",
           "shuffle_model", "checked_grid", "PROBABILITY"]
