"""The varying piece of the ISRL-DP and shuffle-DP rounds (Lowy, Ghafelebashi, Razaviyayn 2023): how each silo's
round vectors become its message, what that message releases about a record, and how the server reads the cohort's
mean back.

In every round of ``isrl-prox-sgd``, ``isrl-spider(-alt)``, ``isrl-prox-(pl-)svrg`` and of their shuffle-DP versions
``sdp-prox-sgd`` and ``sdp-spider``, each silo i of the cohort computes one vector per record x of its batch B_i of
K_i records (``SiloVectors``):

    v(x) = clip_C(grad f0(w, x))                              a gradient round:   ||v(x)|| <= L = C
    v(x) = clip_C(grad f0(w, x)) - clip_C(grad f0(w', x))     a difference round: ||v(x)|| <= L = B_r

(w' the round's reference point, B_r = min(2C, beta ||w - w'||), ``isrl_spider.difference_bound``), and the server
needs mean_{i in S} (1/K_i) sum_{x in B_i} v(x). An aggregator (``NoisyMean``) is how:

* ``GaussianMean`` (ISRL-DP, Lowy et al. Sec. 2-3): silo i sends its mean plus N(0, (z Delta_i)^2 I), Delta_i the
  mean's l2 sensitivity (``RecordSampler.mean_sensitivity`` of L: a record's vector moves by at most 2L, so 2L/K_i
  under replace-one); the server averages the messages. Each draw is charged to its silo alone (not additive).
* ``dpfl.algorithms.sdp.BinomialMean`` (shuffle DP, Lowy et al.'s SDP algorithms): each of silo i's K_i vectors
  goes through Cheu et al.'s (2021) local randomiser P_vec with bound L; the server's analyser reads the shuffled
  counts.

The amount of noise is the ``noise`` argument of every method, one per stream of the algorithm (SPIDER's checkpoint
and difference streams): a ``dpfl.noise.GaussianMechanism`` (z) for the Gaussian, ``sdp.NoiseBits`` (b) for P_vec.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import Cohort, Release
from dpfl.algorithms.projected_noisy_sgd import scale_to_norm
from dpfl.engine.boundary import Delivery
from dpfl.engine.grads import CohortGradients
from dpfl.engine.protocol import ClientContext, ClientData, Messages
from dpfl.engine.sampling import RecordSampler
from dpfl.noise import GaussianMechanism


@dataclass(frozen=True)
class SiloVectors:
    """The round vectors v(x) of a chunk of silos (module docstring): each silo's batch, the point w and, in a
    difference round, the reference w' ([silos, P] each), and L, each vector's l2 bound (C, or B_r per silo)."""

    grads: CohortGradients
    point: torch.Tensor
    reference: torch.Tensor | None
    x: torch.Tensor
    y: torch.Tensor
    mask: torch.Tensor
    clip: float
    bound: float | torch.Tensor
    records: RecordSampler
    counts: torch.Tensor

    @property
    def sensitivity(self) -> torch.Tensor:
        """Delta_i [silos]: the l2 sensitivity of silo i's mean of its vectors."""
        return self.records.mean_sensitivity(self.bound, self.counts)

    def mean(self) -> torch.Tensor:
        """[silos, P]: (1/K_i) sum_{x in B_i} v(x), from the clipped sums (``CohortGradients.clipped_sum``)."""
        divisor = self.records.divisor(self.counts).to(self.point.dtype).unsqueeze(1)
        value = self.grads.clipped_sum(self.point, self.x, self.y, self.mask, self.clip) / divisor
        if self.reference is None:
            return value
        return value - self.grads.clipped_sum(self.reference, self.x, self.y, self.mask, self.clip) / divisor

    def examples(self, radius: float) -> torch.Tensor:
        """[silos, batch, P]: every v(x) (0 on masked slots), a difference projected onto the l2 ball of ``radius``
        (it changes nothing when the bound B_r holds, and makes it hold when a verified beta is wrong; a clipped
        gradient lies in the C-ball already)."""
        vectors = self.grads.clipped_examples(self.point, self.x, self.y, self.mask, self.clip)
        if self.reference is None:
            return vectors
        vectors = vectors - self.grads.clipped_examples(self.reference, self.x, self.y, self.mask, self.clip)
        norms = vectors.norm(dim=-1, keepdim=True)
        return vectors * torch.clamp(radius / norms.clamp_min(1e-300), max=1.0)


def silo_vectors(ctx: ClientContext, records: RecordSampler, keys: torch.Tensor, data: ClientData,
                 point: torch.Tensor, reference: torch.Tensor | None, clip: float, bound: float | torch.Tensor,
                 feature_clip: float | None = None) -> SiloVectors:
    """Each silo's batch (``records`` on ``keys``: the records of its smallest keys), its features scaled to norm <=
    ``feature_clip`` when given (``projected_noisy_sgd.scale_to_norm``), at the server's point (and reference)."""
    indices, mask = records.sample(data.counts, keys)
    xb, yb = data.batch(indices)
    if feature_clip is not None:
        xb = scale_to_norm(xb, feature_clip)
    n, P = data.counts.shape[0], point.shape[-1]
    if isinstance(bound, torch.Tensor):
        bound = bound.expand(n)
    return SiloVectors(ctx.grads, point.expand(n, P), None if reference is None else reference.expand(n, P), xb, yb,
                       mask, clip, bound, records, data.counts)


class NoisyMean(Protocol):
    """How a silo's vectors become its message and the server reads the cohort's mean back (module docstring).
    ``noise``: the stream's amount of noise (what the aggregator's builder calibrated)."""

    #: whether a one-pass release (Prox-SGD) is credited with the client sampler's participation
    credits_silo_sampling: ClassVar[bool]
    #: what less noise means, for the divergence hint
    less_noise: ClassVar[str]

    def declared(self, noise: Any, records: RecordSampler, counts: torch.Tensor, state, sampled: bool = True,
                 cohort: Cohort | None = None) -> Release:
        """What one silo's message releases about one of its records, ``records``' sampling credited when
        ``sampled``, with the owner's ``cohort`` (None: the client sampler's)."""

    def send(self, noise: Any, vectors: SiloVectors, ctx: ClientContext,
             scale: float | None = None) -> tuple[Messages, dp_event.DpEvent]:
        """Each silo's message and the event of the noise drawn; the server's ``mean`` of the messages estimates the
        cohort's mean times ``scale`` (None: 1)."""

    def mean(self, noise: Any, delivered: Delivery, bound: float | torch.Tensor, clip: float, like: torch.Tensor,
             scale: float | None = None) -> torch.Tensor:
        """The estimate of mean_i ``scale`` (1/K_i) sum_x v(x), shaped like the server's model ``like``, from what the
        boundary delivered (``bound``: L as the silos had it, from the server state)."""


@dataclass(frozen=True)
class GaussianMean:
    """ISRL-DP: each silo's mean plus N(0, (z Delta_i)^2 I), sent as ``message`` (module docstring); the server
    averages. A ``scale`` multiplies the noisy mean in the silo (so ``message`` = dy = -eta times it is a model
    change). Lowy et al. take no credit for silo sampling in the one-pass Prox-SGD (their Thm 2.1).

    ``additive``: whether the draw enters the round's sum with nothing computed from it afterwards, by its silo or
    anyone (``Release.additive``), so that an observer of the sum alone (the third party, another silo, a server
    behind secure aggregation) is credited with the other silos' draws; a server that sees each message never is.
    True for Prox-SGD's one step per round; False (the default) where a later round's message is not checked to be
    free of the silo's earlier draws (the SPIDER and SVRG recursions)."""

    message: str = "h"
    additive: bool = False
    credits_silo_sampling: ClassVar[bool] = False
    less_noise: ClassVar[str] = "less noise per step"

    def declared(self, noise: GaussianMechanism, records: RecordSampler, counts: torch.Tensor, state,
                 sampled: bool = True, cohort: Cohort | None = None) -> Release:
        """One Gaussian of multiplier z in units of Delta (record-sampled when ``sampled``), ``additive`` or not;
        r = min/max Delta_i."""
        event = records.event(noise.event, counts) if sampled else noise.event
        divisors = records.divisor(counts)  # Delta_i is proportional to 1 / divisor_i
        return Release((event,), (self.additive,), float(divisors.min() / divisors.max()), cohort)

    def send(self, noise: GaussianMechanism, vectors: SiloVectors, ctx: ClientContext,
             scale: float | None = None) -> tuple[Messages, dp_event.DpEvent]:
        standard_normal = ctx.streams("noise").normal((vectors.point.shape[-1],))
        noisy, event = noise(vectors.mean(), vectors.sensitivity, standard_normal)
        return {self.message: noisy if scale is None else scale * noisy}, event

    def mean(self, noise: GaussianMechanism, delivered: Delivery, bound: float | torch.Tensor, clip: float,
             like: torch.Tensor, scale: float | None = None) -> torch.Tensor:
        """The messages' mean (each already scaled in its silo)."""
        return delivered.sum(self.message) / delivered.count


#: ISRL-DP SPIDER's and SVRG's aggregator: messages h, the noisy means
GAUSSIAN = GaussianMean()

__all__ = ["SiloVectors", "silo_vectors", "NoisyMean", "GaussianMean", "GAUSSIAN"]
