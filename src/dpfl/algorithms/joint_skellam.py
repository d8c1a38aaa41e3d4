"""dp-fedavg-joint with integer Skellam noise shares (``algorithm.noise = "skellam"``): the shares are integers, so
the update a client sends through secure aggregation mod 2^b is exactly what the accounting describes (Agarwal,
Kairouz, Liu 2021, "The Skellam Mechanism for Differentially Private Federated Learning"; Heikkilä et al., Sec. 5,
whose experiments use it).

Round t, client i (n_i records; D_i = C / (q n_i), the sensitivity of its mean clipped gradient, as the Gaussian
path), from theta_i = theta^(t-1), with s = ``algorithm.skellam_scale`` (integer units per unit of the gradient):

    for j = 1..S:
        g_j      = (1 / (q n_i)) sum_{x in B_j} clip_C(grad l(theta_i; x))        (real: the Gaussian path's mean)
        v_j      = round(s g_j) + xi_j,   xi_j ~ Sk(lam_i, lam_i),  2 lam_i = (s sigma_i D_i)^2    (integers)
        theta_i <- theta_i - gamma v_j / s
    m_i       = sum_j v_j                     (the client's message: an integer vector, = -(s / gamma) Delta_i)
    theta^(t) = theta^(t-1) - gamma / (s |U|) sum_{i in U} m_i         (the integer sum, decoded exactly)

**Where the discretisation happens.** At every local step, on that step's clipped mean gradient, before its noise:
scaled by s and rounded at random without bias (``dpfl.protocols.quantize.randomised_round``, uniforms from the
client's "rounding" stream), then the integer share added (``dpfl.noise.skellam_noise``, the client's "noise"
stream); the local iterate moves by the integer step over s. This is Heikkilä et al.'s implementation (DP-SGD steps
with the Skellam mechanism of Agarwal et al., scale, round, add Skellam, unscale, then the optimiser's step). With no
weight decay (required) the update is exactly -gamma / s times the integer sum of the steps, so the message is that
integer sum: no second rounding, and the last step's integer shares reach the secure sum intact (the only draws the
sound analysis credits with other clients' shares, ``dpfl.accounting.observers``). Secure aggregation sums the
integer messages mod 2^b (``dpfl.engine.secure_sum``: refused before anything is sent when the sum could wrap);
without ``privacy.secure_aggregation`` the simulated sum adds the same integers exactly (int64).

**Why the rounding is inside the accounting.** Let y = s g(D), y' = s g(D') for zero-out neighbours, so
||y - y'||_2 <= s D_i. Rounding with the SAME uniforms u in both worlds moves each coordinate by less than 1, so the
integer inputs differ by Delta = round_u(y) - round_u(y') with |Delta_c| < |y_c - y'_c| + 1, hence

    ||Delta||_2 <= s D_i + sqrt(d) =: D2',     ||Delta||_1 <= min(||Delta||_2^2, sqrt(d') ||Delta||_2) <= D1'

(Delta is an integer vector: |Delta_c| <= Delta_c^2; ``skellam_l1_bound``). The step's output is the mixture over u of
Skellam mechanisms on round_u(y); exp((a - 1) D_a(P || Q)) is jointly convex in (P, Q), so the Renyi divergence of
the mixtures is at most the largest over u, which Agarwal et al.'s Thm 3.5 bounds at (D2', D1'): a proven bound,
cruder than their conditional rounding (which needs d / 4 in place of sqrt(d)'s square but a rejection loop). Poisson
record sampling is around this whole step (sample, round, add noise): Zhu & Wang 2019 Thm 6 (``accounting/skellam``).

Other clients' rounded values do not depend on the record; their shares Sk(lam_k, lam_k) sum with the owner's into
Sk(sum lam, sum lam) on the same integer lattice, so an additive step of owner j is the Skellam mechanism with
variance (s sigma_i)^2 (D_j^2 + sum_k D_k^2) >= (s sigma_i D_j)^2 (1 + others r^2), r = min/max D. In units of D_j
that is ``SkellamDpEvent(1 + sqrt(d) / (s D_j), D1' / (s D_j), sigma_i^2 (1 + others r^2), scale = s D_j)``, whose
RDP decreases in s D_j: the release declares it at the coarsest owner, s D_min (``SkellamRounding.event``), and each
client draws its share at ratio D_i / D_min to that unit. As s grows the event tends to the Gaussian path's (the
Skellam RDP to a D2^2 / (2 mu)), but Poisson sampling around it uses Zhu & Wang's general bound, above dp_accounting's
exact Poisson-subsampled Gaussian by at most log(3) / (a - 1) (docs/accounting.md, "Skellam and joint noise").

**The ring.** A client's |message coordinate| is at most S ceil(s C / q) (|g_j| <= C / q) plus its noise, which
exceeds ``skellam_tail_margin`` in some coordinate with probability at most 1e-9 (``message_bound``; a message past
its bound is an error, never a wrapped sum). So n clients need n (S ceil(s C / q) + margin) < 2^(b-1).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from dp_accounting import dp_event

from dpfl.accounting.events import SkellamDpEvent, skellam_l1_bound
from dpfl.algorithms.joint_noise import JointNoise
from dpfl.engine.boundary import Delivery
from dpfl.noise import skellam_noise
from dpfl.engine.protocol import ClientContext, ClientData, ClientOutput, ServerContext, State
from dpfl.errors import ConfigError, check_range
from dpfl.protocols.quantize import EXACT_FLOAT, randomised_round, skellam_tail_margin

#: the chance that a client's message exceeds ``JointSkellam.message_bound`` in some coordinate (then the round is
#: refused: ``dpfl.engine.secure_sum``)
OVERFLOW_PROBABILITY = 1e-9
#: algorithm.skellam_scale's default: integer units per unit of a client's mean clipped gradient
DEFAULT_SCALE = 2.0**16


@dataclass(frozen=True)
class SkellamRounding:
    """Where the shares become integers (module docstring): scale s, the model's dimension d and the unit
    sensitivity D_min = min_i C / (q n_i) of the step events."""

    scale: float
    dimension: int
    unit: float

    def __post_init__(self):
        check_range("algorithm.skellam_scale", self.scale, 0.0, low_open=True)
        check_range("dimension", self.dimension, 1, integer=True)
        check_range("unit sensitivity", self.unit, 0.0, low_open=True)

    @property
    def rounded_l2(self) -> float:
        """D2' = s D_min + sqrt(d), the integer inputs' l2 sensitivity after rounding (module docstring)."""
        return self.scale * self.unit + math.sqrt(self.dimension)

    def event(self, noise_multiplier: float) -> SkellamDpEvent:
        """One step of one client at share sigma_i, in units of the coarsest owner's sensitivity D_min: D2', D1' and
        the share's variance (s sigma_i D_min)^2 divided by (s D_min)^2 and (s D_min)."""
        unit = self.scale * self.unit
        return SkellamDpEvent(l2_sensitivity=self.rounded_l2 / unit,
                              l1_sensitivity=skellam_l1_bound(self.rounded_l2, self.dimension) / unit,
                              variance=noise_multiplier**2, scale=unit, dimension=self.dimension)


@dataclass(frozen=True)
class JointSkellam(JointNoise):
    """dp-fedavg-joint whose local steps are discretised and noised with integer Skellam shares (module docstring);
    its message {dy} is the integer sum of its S noisy integer steps."""

    rounding: SkellamRounding | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.rounding is None:
            raise ValueError("JointSkellam needs its SkellamRounding")
        if self.weight_decay:
            raise ConfigError("algorithm.weight_decay", self.weight_decay,
                              "0 with algorithm.noise = 'skellam' (the update must be the integer sum of the noisy "
                              "steps, which a decay of the real iterate is not)")
        largest = self.rounding.scale * self.clip / self.sampler.rate
        if self.local_steps * (largest + 1) >= EXACT_FLOAT:
            raise ConfigError("algorithm.skellam_scale", self.rounding.scale,
                              f"a scale with S s C / q below 2^52 (exact rounding in float64); got "
                              f"{self.local_steps * largest:.3g}")

    @property
    def step_noise_event(self) -> dp_event.DpEvent:
        """The integer share of one step, rounding included (``SkellamRounding.event``)."""
        return self.rounding.event(self.mechanism.noise_multiplier)

    def release(self, round_index: int, state: State, counts: torch.Tensor):
        """JointNoise's release of the Skellam step events; refused if a client is coarser than the events' unit."""
        least = float(self.sampler.mean_sensitivity(self.clip, counts).min())
        if least < self.rounding.unit * (1 - 1e-12):
            raise ValueError(f"a client's sensitivity {least:g} is below the Skellam events' unit "
                             f"{self.rounding.unit:g}: the algorithm was built for other record counts")
        return super().release(round_index, state, counts)

    def client_round(self, round_index: int, server: dict, clients: dict, data: ClientData,
                     ctx: ClientContext) -> ClientOutput:
        """S discretised noisy local steps for a chunk of the cohort; message {dy}: each client's integer sum."""
        x = server["x"]
        n, P, S, s = data.counts.shape[0], x.shape[-1], self.local_steps, self.rounding.scale
        if P != self.rounding.dimension:
            raise ValueError(f"a model of {P} parameters; the Skellam events were declared for "
                             f"{self.rounding.dimension}")
        event = self.step_noise_event
        keys = ctx.streams("records").uniform([(S, int(c)) for c in data.counts.tolist()])  # [n, S, max count]
        # each client's rounding uniforms and shares come step after step from its own two streams (memory O(n P))
        rounding, noise = ctx.streams("rounding").generators, ctx.streams("noise").generators
        ratios = (self.sampler.mean_sensitivity(self.clip, data.counts) / self.rounding.unit).tolist()
        coordinates = torch.empty(P)  # the shape of one client's share
        divisor = self.sampler.divisor(data.counts).unsqueeze(1)
        y = x.expand(n, P).clone()
        message = torch.zeros(n, P, dtype=torch.int64)
        for j in range(S):
            indices, mask = self.sampler.sample(data.counts, keys[:, j])
            xb, yb = data.batch(indices)
            mean = ctx.grads.clipped_sum(y, xb, yb, mask, self.clip).to(torch.float64) / divisor
            uniform = torch.stack([torch.rand(P, generator=g, dtype=torch.float64) for g in rounding])
            shares = torch.stack([skellam_noise(event, coordinates, g, ratio=r) for g, r in zip(noise, ratios)])
            step = randomised_round(s * mean, uniform) + shares
            message += step
            y -= (self.lr * step.to(torch.float64) / s).to(y.dtype)
        return ClientOutput({"dy": message}, {}, [event] * S)

    def server_update(self, round_index: int, server: dict, delivered: Delivery, ctx: ServerContext) -> dict:
        """theta += -gamma / (s |U|) times the integer sum (JointNoise's step on the decoded update)."""
        update = -self.lr * delivered.sum("dy").to(torch.float64) / self.rounding.scale
        decoded = Delivery({"dy": update.to(server["x"].dtype)}, delivered.count, delivered.population)
        return super().server_update(round_index, server, decoded, ctx)

    def message_bound(self, counts: torch.Tensor) -> dict[str, float]:
        """|coordinate| of a client's integer message (module docstring, "The ring"): S ceil(s C / q) plus the
        Chernoff margin of S shares at the largest client sensitivity, exceeded with probability
        ``OVERFLOW_PROBABILITY``."""
        s, worst = self.rounding.scale, float(self.sampler.mean_sensitivity(self.clip, counts).max())
        variance = self.local_steps * (s * self.mechanism.noise_multiplier * worst) ** 2
        margin = skellam_tail_margin(variance, OVERFLOW_PROBABILITY / self.rounding.dimension)
        return {"dy": float(self.local_steps * math.ceil(s * self.clip / self.sampler.rate) + math.ceil(margin))}


def skellam_variant(algorithm: JointNoise, scale: float, dimension: int | None, counts) -> JointSkellam:
    """``algorithm`` with integer Skellam shares at scale s, for a model of ``dimension`` parameters and clients with
    ``counts`` records (the events' unit is the smallest sensitivity C / (q max n_i)). The sound analysis accounts
    with the "tightest" accountant: the exact PLD of the steps of a model of one coordinate
    (``dpfl.accounting.discrete_pld``), and for more coordinates the RDP bound the Gaussian shares' "rdp" gives."""
    if dimension is None:
        raise ConfigError("algorithm.noise", "skellam", "'gaussian' here: the Skellam accounting needs the model's "
                                                        "number of parameters (a run built by dpfl's runner)")
    unit = float(algorithm.sampler.mean_sensitivity(algorithm.clip, torch.as_tensor(counts)).min())
    fields = {f.name: getattr(algorithm, f.name) for f in dataclasses.fields(algorithm)}
    if algorithm.accountant == "rdp":  # the sound analysis: the exact PLD of a 1-D model's steps, else the same RDP
        fields["accountant"] = "tightest"
    return JointSkellam(**fields, rounding=SkellamRounding(scale, dimension, unit))


__all__ = ["OVERFLOW_PROBABILITY", "DEFAULT_SCALE", "SkellamRounding", "JointSkellam", "skellam_variant"]
