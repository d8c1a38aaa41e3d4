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

**Alternate SPIDER** (``isrl-spider-alt``, Lowy et al. 2023, Appendix H.1, Algorithm 11: what their experiments ran).
In the paper's rounds r = 0, ..., R-1, with a prox step wherever the composite loss takes a gradient step:

    r >= 1:  w_a = w,  w_b = prox_{eta f1}(w_a - eta g2)                  (g2: the previous round's noisy gradient)
             each silo: ONE batch B of K records, at both points:
                 d_i = (1/K) sum_{x in B} [clip_C(grad f0(w_b, x)) - clip_C(grad f0(w_a, x))] + u1,
             v = g2 + mean_i d_i,   w = prox_{eta f1}(w_b - eta v)
    every r: each silo: a FRESH batch of K records,
                 g2_i = (1/K) sum_x clip_C(grad f0(w, x)) + u2,   g2 = mean_i g2_i

(Lowy et al. take plain gradient steps, f1 = 0; the prox keeps every point a gradient is evaluated at in dom f1.)
g2 is computed at the w that needs mean_i d_i, and d_i at the w_b that needs g2: each is a separate communication
round, and a silo cannot send both in one. As communication rounds, Algorithm 11 IS the recursion above with
period q = 2: round 2r sends g2 (a checkpoint, x = w, then x <- prox(x - eta h) = w_b), round 2r + 1 sends d_i
(x = w_b, x_prev = w_a, h = g2 + mean d_i = v, then x <- prox(w_b - eta v)); the paper's R rounds are 2R - 1
communication rounds, and ``algorithm.rounds`` counts communication rounds (T) as for every other algorithm. So the
alternate SPIDER is ``ISRLSpider`` with q = 2 and its own calibration, not a second implementation.

Sensitivities (replace-one, K = floor(s n_i)): one record's term in d_i is a difference of two clipped vectors, norm
<= 2C, and replacing the record replaces its term by another of norm <= 2C, so the mean moves by at most
2 (2C) / K = 4C/K (Poisson, zero-out: 2C/(s n_i)); g2's mean moves by 2C/K. No smoothness is assumed (Lowy et al.
calibrate the difference with C, having no a-priori beta). Both streams are declared, one per communication round,
and composed in the ledger. The calibration is ONE multiplier z for both, in units of each stream's sensitivity: the
ratio of Lowy et al.'s code constants, Var u1 / Var u2 = (32 C^2 R ln(2/delta)/(n^2 eps^2)) / (8 C^2 R ln(2/delta)/
(n^2 eps^2)) = 4 = (4C/K)^2 / (2C/K)^2, is the same multiplier on both sensitivities. z is the smallest for which the
composition of all T record-sampled Gaussians has epsilon <= privacy.epsilon; their code calibrates each stream as if
it alone spent (eps, delta) (``theory.isrl_alternate_spider_code_sigmas``, beside ``ISRLSpider.noise_std``).
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass, field
from typing import Any

import torch

from dpfl.accounting.observers import Release
from dpfl.algorithms.isrl import ISRLKeys, ServerProx, calibration, checked_target, register_cross_silo
from dpfl.algorithms.noisy_mean import GAUSSIAN, NoisyMean, silo_vectors
from dpfl.algorithms.projected_noisy_sgd import verified_smoothness
from dpfl.algorithms.prox import Regularizer
from dpfl.algorithms.registry import Setting
from dpfl.engine.boundary import Delivery
from dpfl.noise import GaussianMechanism
from dpfl.engine.protocol import ClientContext, ClientData, ClientOutput, ServerContext, State
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
class ISRLSpider(ServerProx):
    """ISRL-DP FedProx-SPIDER, and with q = 2 and one z the alternate SPIDER (see the module docstring). The
    ``aggregator`` turns each silo's round vectors into its message (``dpfl.algorithms.noisy_mean``): the Gaussian,
    with the streams' mechanisms ``checkpoint`` (z1) and ``difference`` (z2); ``sdp-spider`` is this class with
    P_vec and the streams' noise bits (``dpfl.algorithms.sdp_spider``)."""

    lr: float
    clip: float
    period: int
    sampler: RecordSampler
    #: the streams' noise, as the aggregator takes it (the Gaussian: a ``GaussianMechanism``; P_vec: its bits)
    checkpoint: Any
    difference: Any
    regularizer: Regularizer
    smoothness: float | None = None
    feature_clip: float | None = None
    accountant: str = "tightest"
    #: the alternate SPIDER's q = 2 is not a key
    period_fixed: bool = False
    aggregator: NoisyMean = GAUSSIAN

    @property
    def neighboring(self) -> str:
        return self.sampler.neighboring

    def is_checkpoint(self, round_index: int) -> bool:
        return round_index % self.period == 0

    def stream(self, round_index: int):
        """The round's noise stream: the checkpoint one (z1) or the difference one (z2)."""
        return self.checkpoint if self.is_checkpoint(round_index) else self.difference

    def records(self, round_index: int) -> RecordSampler:
        """The records a round's message is computed on: a minibatch of ``sampler`` in both streams."""
        return self.sampler

    def reference(self, server: dict) -> torch.Tensor:
        """The point the difference rounds subtract the gradient at: the last iterate w_{r-1}."""
        return server["x_prev"]

    def bound(self, round_index: int, server: dict) -> float | torch.Tensor:
        """L, each round vector's l2 bound: C (checkpoint), B_r per row of the server state (difference)."""
        if self.is_checkpoint(round_index):
            return self.clip
        return self.difference_bound(server["x"], self.reference(server))

    def release(self, round_index: int, state: State, counts: torch.Tensor) -> Release:
        """The round's one draw: the checkpoint stream (z1) or the difference stream (z2), record-sampled, not
        additive (ISRL-DP)."""
        return self.aggregator.declared(self.stream(round_index), self.records(round_index), counts, state)

    def init_state(self, x0: torch.Tensor, num_clients: int) -> State:
        return State({"x": x0.clone(), "x_prev": x0.clone(), "h": torch.zeros_like(x0)})

    def examples_per_client(self, counts: torch.Tensor) -> int:
        return int(self.sampler.batch_sizes(counts).max())

    def difference_bound(self, x: torch.Tensor, x_prev: torch.Tensor) -> torch.Tensor:
        return difference_bound(x, x_prev, self.clip, self.smoothness)

    def client_round(self, round_index: int, server: dict, clients: dict, data: ClientData,
                     ctx: ClientContext) -> ClientOutput:
        """Messages {h}: the silo's noisy checkpoint gradient or noisy gradient difference."""
        keys = ctx.streams("records").uniform([(int(c),) for c in data.counts.tolist()])
        reference = None if self.is_checkpoint(round_index) else self.reference(server)
        vectors = silo_vectors(ctx, self.records(round_index), keys, data, server["x"], reference, self.clip,
                               self.bound(round_index, server), self.feature_clip)
        messages, event = self.aggregator.send(self.stream(round_index), vectors, ctx)
        return ClientOutput(messages, {}, [event])

    def mean(self, round_index: int, server: dict, delivered: Delivery) -> torch.Tensor:
        """The server's estimate of the cohort's mean round vector."""
        return self.aggregator.mean(self.stream(round_index), delivered, self.bound(round_index, server), self.clip,
                                    server["x"])

    def server_update(self, round_index: int, server: dict, delivered: Delivery, ctx: ServerContext) -> dict:
        """h = mean h_i (checkpoint) or h + mean H_i; w_{r+1} = prox_{eta f1}(w_r - eta h)."""
        if delivered.count == 0:
            return server
        mean = self.mean(round_index, server, delivered)
        h = mean if self.is_checkpoint(round_index) else server["h"] + mean
        return {"x": self.regularizer.prox(server["x"] - self.lr * h, self.lr), "x_prev": server["x"], "h": h}

    def noise_std(self, round_index: int, counts: torch.Tensor) -> torch.Tensor:
        """Each silo's noise std [clients] in the round: z1 Delta1 in a checkpoint round, z2 2 B_r / K at the
        unverified bound B_r = 2C in a difference round (the alternate SPIDER's sigma_u2 and sigma_u1)."""
        bound = self.clip if self.is_checkpoint(round_index) else 2.0 * self.clip
        return self.stream(round_index).noise_multiplier * self.records(round_index).mean_sensitivity(bound, counts)

    def divergence_hint(self, counts: torch.Tensor) -> str:
        period = "" if self.period_fixed else " lower algorithm.period,"
        return f"lower algorithm.lr,{period} or raise privacy.epsilon ({self.aggregator.less_noise})"


def difference_bound(x: torch.Tensor, x_prev: torch.Tensor, clip: float, smoothness: float | None) -> torch.Tensor:
    """B_r = min(2C, beta ||w_r - w_{r-1}||) (2C without a verified beta), per row of the server state."""
    bound = torch.full(x.shape[:-1], 2.0 * clip, dtype=torch.float64)
    if smoothness is None:
        return bound
    return torch.minimum(bound, smoothness * (x - x_prev).double().norm(dim=-1))


def stream_counts(rounds: int, period: int) -> tuple[int, int]:
    """(Q, D): the checkpoint rounds ceil(R/q) and the difference rounds R - Q."""
    checkpoints = -(-rounds // period)
    return checkpoints, rounds - checkpoints


def build_spider(name: str, config: SpiderConfig, setting: Setting) -> ISRLSpider:
    _, rounds = checked_target(name, config, setting)
    period = check_range("algorithm.period", config.period, 1, integer=True)
    if config.feature_clip is not None:
        check_range("algorithm.feature_clip", config.feature_clip, 0.0, low_open=True)
    regularizer = config.regularizer_of()
    sampler = RecordSampler(config.sample_rate, config.record_sampling)
    checkpoints, differences = stream_counts(rounds, period)
    ratio = math.sqrt(differences / checkpoints)  # z2 / z1: equal zCDP halves
    z1 = setting.calibrated_noise()  # the checkpoint stream's; the difference stream's is the fixed split z1 ratio
    smoothness = None
    if config.feature_clip is not None:  # verified for logistic regression only (None elsewhere: B_r = 2C)
        smoothness, _ = verified_smoothness(types.SimpleNamespace(feature_clip=config.feature_clip, clip=config.clip,
                                                                  weight_decay=0.0), setting)
    return ISRLSpider(lr=config.lr, clip=config.clip, period=period, sampler=sampler,
                      checkpoint=GaussianMechanism(z1), difference=GaussianMechanism(z1 * ratio if differences else z1),
                      regularizer=regularizer, smoothness=smoothness, feature_clip=config.feature_clip)


register_cross_silo(
    ("isrl-spider",), SpiderConfig, build_spider,
    "ISRL-DP FedProx-SPIDER: checkpoint gradients and gradient differences, both noise streams composed, "
    "calibrated to privacy.epsilon, with a prox step for f1 (Lowy et al. 2023, Alg. 3)", calibration(lambda *_: 1))


def build_alternate_spider(name: str, config: ISRLKeys, setting: Setting) -> ISRLSpider:
    """Lowy et al.'s Algorithm 11 (module docstring): period 2, one z for both streams, calibrated over the T
    communication rounds' draws."""
    _, rounds = checked_target(name, config, setting)
    sampler = RecordSampler(config.sample_rate, config.record_sampling)
    z = setting.calibrated_noise()
    return ISRLSpider(lr=config.lr, clip=config.clip, period=2, sampler=sampler, checkpoint=GaussianMechanism(z),
                      difference=GaussianMechanism(z), regularizer=config.regularizer_of(), period_fixed=True)


register_cross_silo(
    ("isrl-spider-alt",), ISRLKeys, build_alternate_spider,
    "ISRL-DP alternate SPIDER: a gradient round, then a gradient difference on one batch at w and one step ahead, "
    "both noise streams composed, one noise multiplier calibrated to privacy.epsilon, with a prox step for f1 "
    "(Lowy et al. 2023, Alg. 11)", calibration(lambda name, config, setting: setting.rounds))
