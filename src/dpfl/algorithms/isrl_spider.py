"""ISRL-DP FedProx-SPIDER (Lowy, Ghafelebashi, Razaviyayn 2023, Algorithm 3): variance-reduced proximal SGD whose
silos are private against the server and the other silos (ISRL-DP, ``dpfl.algorithms.isrl``).

Every q rounds (a checkpoint, r mod q = 0) each silo in the cohort sends a noisy minibatch gradient; in between it sends
a noisy gradient DIFFERENCE on one minibatch B of K records evaluated at both of the last two (public) iterates:

    r mod q = 0:  h_i = (1/K) sum_{x in B} clip_C(grad f0(w_r, x)) + u1,               u1 ~ N(0, (z1 Delta1)^2 I)
                  h   = mean_i h_i
    otherwise:    H_i = (1/K) sum_{x in B} [clip_C(grad f0(w_r, x)) - clip_C(grad f0(w_{r-1}, x))] + u2,
                                                                                     u2 ~ N(0, (z2 Delta2_r)^2 I)
                  h   = h + mean_i H_i
    w_{r+1} = prox_{eta f1}(w_r - eta h)

**Sensitivities** (replace-one, fixed minibatches of K = floor(s n_i); Poisson: zero-out, divisor s n_i, half). One
record's term in the checkpoint mean has norm <= C: Delta1 = 2C/K. Its term in the difference has norm
<= B_r = min(2C, beta ||w_r - w_{r-1}||): 2C always (two clipped vectors), and beta ||w_r - w_{r-1}|| when the
per-example loss is beta-smooth, because clipping (the projection onto the C-ball) is 1-Lipschitz. So
Delta2_r = 2 B_r / K, and the noise std z2 Delta2_r is proportional to ||w_r - w_{r-1}|| while beta ||.|| < 2C, the
paper's sigma_2 = sigma_2hat ||w_r - w_{r-1}||. dpfl uses beta only where it verifies it
(``projected_noisy_sgd.verified_smoothness``: logistic regression on features scaled to norm <= ``feature_clip``,
beta = (R^2 + b)/2); otherwise B_r = 2C. w_r - w_{r-1} is public (post-processing of earlier releases).

**Both streams are declared and composed.** A checkpoint round releases one sampled Gaussian of multiplier z1, a
difference round one of multiplier z2 (each in units of its own sensitivity), none of them credited with another
silo's noise; the run's ledger composes the ceil(R/q) checkpoint and R - ceil(R/q) difference events. (Lowy et al.'s
code calibrates each stream as if it alone spent the budget; here they share it.) The budget is split as in the
paper's derivation, equal zCDP halves: z2 = z1 sqrt(D / Q) for Q checkpoints and D difference rounds, and the common
scale is the smallest for which the composition of all R events has epsilon <= privacy.epsilon (tightest accountant,
with record-sampling amplification). The paper's closed form (``theory.isrl_spider_sigmas``, with K1 = K2 = K, L = C)
is the zCDP bound without amplification, z1 = 2 sqrt(2 Q ln(1/delta))/eps, which the calibration never exceeds.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass, field

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import Release
from dpfl.algorithms.isrl import ISRLKeys, calibrated_noise, checked_target
from dpfl.algorithms.projected_noisy_sgd import scale_to_norm, verified_smoothness
from dpfl.algorithms.prox import Regularizer
from dpfl.algorithms.registry import AlgorithmSpec, Setting, register
from dpfl.engine.boundary import Delivery
from dpfl.engine.noise import GaussianMechanism
from dpfl.engine.protocol import ClientContext, ClientData, ClientOutput, State
from dpfl.engine.sampling import RecordSampler
from dpfl.errors import check_range


@dataclass(frozen=True)
class SpiderConfig(ISRLKeys):
    """The ``[algorithm]`` keys of isrl-spider: the ISRL-DP family's, and the checkpoint period and feature bound."""

    period: int = field(default=5, metadata={"help": "q, a checkpoint gradient every q rounds (q = 1: ISRL-DP "
                                                     "MB-SGD)", "min": 1})
    feature_clip: float | None = field(default=None, metadata={"help": "R: features scaled to norm <= R, so that "
                                                                       "dpfl verifies the logistic loss's smoothness "
                                                                       "and scales the difference noise to "
                                                                       "||w_r - w_{r-1}||"})


@dataclass(frozen=True)
class ISRLSpider:
    """ISRL-DP FedProx-SPIDER (see the module docstring)."""

    lr: float
    clip: float
    period: int
    sampler: RecordSampler
    checkpoint: GaussianMechanism
    difference: GaussianMechanism
    regularizer: Regularizer
    smoothness: float | None = None
    feature_clip: float | None = None
    accountant: str = "tightest"

    @property
    def neighboring(self) -> str:
        return self.sampler.neighboring

    def is_checkpoint(self, round_index: int) -> bool:
        return round_index % self.period == 0

    def stream(self, round_index: int) -> GaussianMechanism:
        """The round's noise stream: the checkpoint one (z1) or the difference one (z2)."""
        return self.checkpoint if self.is_checkpoint(round_index) else self.difference

    def records(self, round_index: int) -> RecordSampler:
        """The records a round's message is computed on: a minibatch of ``sampler`` in both streams."""
        return self.sampler

    def reference(self, server: dict) -> torch.Tensor:
        """The point the difference rounds subtract the gradient at: the last iterate w_{r-1}."""
        return server["x_prev"]

    def release(self, round_index: int, state: State, train) -> Release:
        """The round's one draw: the checkpoint stream (z1) or the difference stream (z2), record-sampled, not
        additive (ISRL-DP)."""
        records = self.records(round_index)
        event = records.event(self.stream(round_index).event, train.counts)
        divisors = records.divisor(train.counts)
        return Release((event,), (False,), float(divisors.min() / divisors.max()))

    def init_state(self, x0: torch.Tensor, num_clients: int) -> State:
        return State({"x": x0.clone(), "x_prev": x0.clone(), "h": torch.zeros_like(x0)})

    def examples_per_client(self, counts: torch.Tensor) -> int:
        return int(self.sampler.batch_sizes(counts).max())

    def difference_bound(self, x: torch.Tensor, x_prev: torch.Tensor) -> torch.Tensor:
        """B_r = min(2C, beta ||w_r - w_{r-1}||) (2C without a verified beta), per row of the server state."""
        bound = torch.full(x.shape[:-1], 2.0 * self.clip, dtype=torch.float64)
        if self.smoothness is None:
            return bound
        return torch.minimum(bound, self.smoothness * (x - x_prev).double().norm(dim=-1))

    def client_round(self, round_index: int, server: dict, clients: dict, data: ClientData,
                     ctx: ClientContext) -> ClientOutput:
        """Messages {h}: the silo's noisy checkpoint gradient or noisy gradient difference."""
        x = server["x"]
        n, P = data.counts.shape[0], x.shape[-1]
        records = self.records(round_index)
        keys = ctx.streams("records").uniform([(int(c),) for c in data.counts])
        indices, mask = records.sample(data.counts, keys)
        xb, yb = data.batch(indices)
        if self.feature_clip is not None:
            xb = scale_to_norm(xb, self.feature_clip)
        divisor = records.divisor(data.counts).to(x.dtype).unsqueeze(1)
        point = x.expand(n, P)
        value = ctx.grads.clipped_sum(point, xb, yb, mask, self.clip) / divisor
        if self.is_checkpoint(round_index):
            sensitivity = records.mean_sensitivity(self.clip, data.counts)
        else:
            reference = self.reference(server)
            value = value - ctx.grads.clipped_sum(reference.expand(n, P), xb, yb, mask, self.clip) / divisor
            bound = self.difference_bound(x, reference).expand(n)
            sensitivity = records.mean_sensitivity(bound, data.counts)
        noisy, event = self.stream(round_index)(value, sensitivity, ctx.streams("noise").normal((P,)))
        return ClientOutput({"h": noisy}, {}, [event])

    def server_update(self, round_index: int, server: dict, delivered: Delivery) -> dict:
        """h = mean h_i (checkpoint) or h + mean H_i; w_{r+1} = prox_{eta f1}(w_r - eta h)."""
        if delivered.count == 0:
            return server
        mean = delivered.sum("h") / delivered.count
        h = mean if self.is_checkpoint(round_index) else server["h"] + mean
        return {"x": self.regularizer.prox(server["x"] - self.lr * h, self.lr), "x_prev": server["x"], "h": h}

    def regulariser(self, x: torch.Tensor) -> float:
        return self.regularizer.value(x)

    def divergence_hint(self, counts: torch.Tensor) -> str:
        return "lower algorithm.lr, lower algorithm.period, or raise privacy.epsilon (less noise per step)"


def stream_counts(rounds: int, period: int) -> tuple[int, int]:
    """(Q, D): the checkpoint rounds ceil(R/q) and the difference rounds R - Q."""
    checkpoints = -(-rounds // period)
    return checkpoints, rounds - checkpoints


def build_spider(name: str, config: SpiderConfig, setting: Setting) -> ISRLSpider:
    epsilon, rounds = checked_target(name, config, setting)
    period = check_range("algorithm.period", config.period, 1, integer=True)
    if config.feature_clip is not None:
        check_range("algorithm.feature_clip", config.feature_clip, 0.0, low_open=True)
    regularizer = config.regularizer_of()
    sampler = RecordSampler(config.sample_rate, config.record_sampling)
    counts = torch.tensor(setting.train_counts, dtype=torch.long)
    checkpoints, differences = stream_counts(rounds, period)
    ratio = math.sqrt(differences / checkpoints)  # z2 / z1: equal zCDP halves

    def composed(z1: float) -> dp_event.DpEvent:
        parts = [dp_event.SelfComposedDpEvent(sampler.event(dp_event.GaussianDpEvent(z1), counts), checkpoints)]
        if differences:
            parts.append(dp_event.SelfComposedDpEvent(sampler.event(dp_event.GaussianDpEvent(z1 * ratio), counts),
                                                      differences))
        return dp_event.ComposedDpEvent(parts)

    z1 = calibrated_noise(composed, 1, sampler.neighboring, epsilon, setting.delta)
    smoothness = None
    if config.feature_clip is not None:  # verified for logistic regression only (None elsewhere: B_r = 2C)
        smoothness, _ = verified_smoothness(types.SimpleNamespace(feature_clip=config.feature_clip, clip=config.clip,
                                                                  weight_decay=0.0), setting)
    return ISRLSpider(lr=config.lr, clip=config.clip, period=period, sampler=sampler,
                      checkpoint=GaussianMechanism(z1), difference=GaussianMechanism(z1 * ratio if differences else z1),
                      regularizer=regularizer, smoothness=smoothness, feature_clip=config.feature_clip)


register(AlgorithmSpec(
    names=("isrl-spider",), config=SpiderConfig, build=build_spider, private=lambda name: True,
    help="ISRL-DP FedProx-SPIDER: checkpoint gradients and gradient differences, both noise streams composed, "
         "calibrated to privacy.epsilon, with a prox step for f1 (Lowy et al. 2023, Alg. 3)",
    release_keys=("algorithm.rounds",), noise_key=None,
))
