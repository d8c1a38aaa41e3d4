"""SDP FedProx-SPIDER (Lowy, Ghafelebashi, Razaviyayn 2023, Alg. 10): ISRL-DP FedProx-SPIDER
(``dpfl.algorithms.isrl_spider.ISRLSpider``) with both noise streams replaced by Cheu et al.'s (2021) binomial vector
summation P_vec through a shuffler: its aggregator is ``sdp.BinomialMean``, its streams' noise ``sdp.NoiseBits``.

Every round each silo in the cohort takes a minibatch of K_i = floor(s n_i) records (fixed size, without replacement)
and runs P_vec's local randomiser on one vector per record:

* checkpoint rounds (r mod q = 0): the clipped gradient clip_C(grad f0(w_r, x)), norm <= C, so P_vec's bound L = C;
* difference rounds: clip_C(grad f0(w_r, x)) - clip_C(grad f0(w_{r-1}, x)), projected onto the l2 ball of radius
  B_r = min(2C, beta ||w_r - w_{r-1}||) (``isrl_spider.difference_bound``; 2C without a verified beta; the
  projection changes nothing when beta is right, and makes the bound hold when it is not,
  ``noisy_mean.SiloVectors.examples``), so L = B_r and the noise shrinks with ||w_r - w_{r-1}|| as the paper's
  sigma_2 does.

The server's estimate of the mean (``sdp.decode_mean``) is h (checkpoint) or is added to h; w_{r+1} =
prox_{eta f1}(w_r - eta h).

**Privacy.** Replacing one record moves its vector by at most 2L, so both streams' events have l2_shift = g
(``dpfl.accounting.binomial``) and differ only in their noise bits: b1 per user and coordinate for the Q = ceil(R/q)
checkpoint rounds, b2 = ceil(b1 D / Q) for the D = R - Q difference rounds (the Gaussian version's equal zCDP halves,
z2 = z1 sqrt(D / Q), variance being proportional to the bits). Period q = 1 has no difference rounds (every round a
checkpoint: SDP minibatch SGD, as q = 1 makes FedProx-SPIDER MB-SGD). Every round declares its own-silo event with the
client sampler's participation (silo-sampling amplification); record sampling is not credited (the approximate-RDP
event has no subsampling bound here; coupling the minibatches shows it cannot hurt). All R events are composed, and
b1 is the smallest (to 5%) for which every observer of the shuffle model meets privacy.epsilon over the R rounds, by the
run's own ledger (``sdp.shuffle_calibration``).
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass, field

import torch

from dpfl.algorithms.isrl import checked_target, register_cross_silo
from dpfl.algorithms.isrl_spider import ISRLSpider, SpiderConfig, stream_counts
from dpfl.algorithms.projected_noisy_sgd import verified_smoothness
from dpfl.algorithms.registry import Setting
from dpfl.algorithms.sdp import (GRID_KEY, BinomialMean, NoiseBits, ShuffleModel, checked_grid, shuffle_calibration,
                               solved_bits)
from dpfl.engine.sampling import RecordSampler
from dpfl.errors import ConfigError, check_range
from dpfl.protocols.shuffler import BinomialVectorSum


def stream_bits(b1: int, rounds: int, period: int) -> tuple[NoiseBits, NoiseBits]:
    """(checkpoint, difference) streams' bits: b1, and b2 = ceil(b1 D / Q) (at least 1; 0 when D = 0: period 1 has
    no difference rounds)."""
    checkpoints, differences = stream_counts(rounds, period)
    return NoiseBits(b1), NoiseBits(max(1, math.ceil(b1 * differences / checkpoints)) if differences else 0)


@dataclass(frozen=True)
class SDPSpider(ISRLSpider):
    """SDP FedProx-SPIDER (module docstring): ``ISRLSpider`` with ``aggregator`` P_vec and the streams' noise bits
    as ``checkpoint`` and ``difference``; what it adds reads them."""

    @property
    def model(self) -> ShuffleModel:
        """What the noise bits are calibrated to."""
        return self.aggregator.model

    def trials(self, round_index: int) -> int:
        """b of the round's stream."""
        return self.stream(round_index).trials

    def summation(self, round_index: int, server: dict) -> BinomialVectorSum:
        """P_vec of the round: L = C (checkpoint) or B_r (difference; at least 1e-12 C, B_r = 0 sends zeros)."""
        return self.aggregator.summation(self.stream(round_index), self.bound(round_index, server), self.clip,
                                         server["x"].shape[-1])


@dataclass(frozen=True)
class SDPSpiderConfig(SpiderConfig):
    """The keys of sdp-spider: isrl-spider's, and P_vec's grid."""

    grid: int | None = field(default=None, metadata=GRID_KEY)


def minibatches(config: SDPSpiderConfig) -> RecordSampler:
    if config.record_sampling != "fixed":
        raise ConfigError("algorithm.record_sampling", config.record_sampling,
                          "'fixed' for sdp-spider (every silo's users per round must be known to size the bits)")
    return RecordSampler(config.sample_rate, "fixed")


def minibatch_model(config: SDPSpiderConfig, setting: Setting) -> ShuffleModel:
    counts = torch.tensor(setting.train_counts, dtype=torch.long)
    per_silo = int(minibatches(config).batch_sizes(counts).min())
    if per_silo < 1:
        raise ConfigError("algorithm.sample_rate", config.sample_rate,
                          f"a rate with floor(s n_i) >= 1 record for the smallest silo ({int(counts.min())} records)")
    return ShuffleModel(per_silo, checked_grid(config.grid))


def build_sdp_spider(name: str, config: SDPSpiderConfig, setting: Setting) -> SDPSpider:
    _, rounds = checked_target(name, config, setting)
    period = check_range("algorithm.period", config.period, 1, integer=True)
    if config.feature_clip is not None:
        check_range("algorithm.feature_clip", config.feature_clip, 0.0, low_open=True)
    model = minibatch_model(config, setting)
    smoothness = None
    if config.feature_clip is not None:  # verified for logistic regression only (None elsewhere: B_r = 2C)
        smoothness, _ = verified_smoothness(types.SimpleNamespace(feature_clip=config.feature_clip, clip=config.clip,
                                                                  weight_decay=0.0), setting)
    checkpoint, difference = stream_bits(solved_bits(setting), rounds, period)
    return SDPSpider(lr=config.lr, clip=config.clip, period=period, sampler=minibatches(config),
                     checkpoint=checkpoint, difference=difference, regularizer=config.regularizer_of(),
                     smoothness=smoothness, feature_clip=config.feature_clip, aggregator=BinomialMean(model))


def checkpoint_rounds(config: SDPSpiderConfig, setting: Setting) -> int:
    """2 Q: where the calibration's search starts (the two streams' zCDP halves of Q rounds each)."""
    return 2 * stream_counts(setting.rounds, check_range("algorithm.period", config.period, 1, integer=True))[0]


register_cross_silo(
    ("sdp-spider",), SDPSpiderConfig, build_sdp_spider,
    "SDP FedProx-SPIDER: checkpoint gradients and gradient differences, each through Cheu et al.'s binomial vector "
    "summation and a shuffler, both streams composed, calibrated to privacy.epsilon (Lowy et al. 2023, Alg. 10)",
    shuffle_calibration(minibatch_model, checkpoint_rounds), boundary="shuffler", shuffler="real")  # the shuffle model it is calibrated for
