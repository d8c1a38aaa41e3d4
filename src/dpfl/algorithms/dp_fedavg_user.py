"""User-level DP-FedAvg (McMahan, Ramage, Talwar, Zhang 2018, "Learning differentially private recurrent language
models", Alg. 1) with optional adaptive clipping (Andrew, Thakkar, McMahan, Ramaswamy 2021, "Differentially private
learning with adaptive clipping", Alg. 1 and 2).

Round t, with the global model x and the clip C_t (both server state), for every client i of the cohort:

    x_i      = K local non-private SGD steps from x (minibatches of floor(s n_i) records, step size eta)
    Delta_i  = x_i - x
    u_i      = w_i Delta_i min(1, C_t / ||Delta_i||)          (clipped, and weighted by w_i <= w_max)
    b_i      = 1[||Delta_i|| <= C_t] - 1/2                    (adaptive clipping only: the centred clipped bit)
    x       <- x + eta_g (sum_i u_i + N(0, (z_Delta S_t)^2 I)) / D
    C_{t+1}  = C_t exp(-eta_C (b~ - gamma)),   b~ = 1/2 + (sum_i b_i + N(0, sigma_b^2)) / D   (geometric update)

D is fixed in advance: the expected cohort size qM for Poisson cohorts (McMahan et al.'s fixed-denominator estimator
f~_f, whose sensitivity does not depend on who takes part), the cohort size n for fixed-size cohorts.

**The neighbouring relation and the sensitivity S_t** (McMahan et al., Sec. 2 and Thm 1). Two data sets are
user-adjacent when one is the other with every record of one client changed: the unit of privacy is a client's whole
data (``USER_LEVEL``), and nothing is assumed of n_i or the records. Whatever its data, client i's contribution u_i
has norm at most w_max C_t (the clip; w_i <= w_max), and no other client's u_j depends on it.

* Poisson cohorts (``client_sampling = "poisson"``): each client takes part independently with probability q.
  McMahan et al. (Sec. 2) add or remove one client. Adding client i adds u_i to the sum and nothing else (D is
  fixed), so S_t = w_max C_t (their Thm 1: S / (q W) for the estimator sum / (q W), here before the division by D).
  dpfl states this relation as zero-out (as for Poisson records, ``dpfl.engine.sampling``): client i's data replaced
  by a null client whose messages contribute 0 to every sum (u_i = 0, b_i = 0). Towards an observer of the
  server-noised model the two are the same (a null client and an absent one leave the same sums); but a server that
  sees the messages, or a sum that carries each client's noise share, tells an absent client from a present one,
  so add/remove would be vacuous towards them, while zero-out keeps the same sensitivity C towards every observer.
* Fixed-size cohorts (``"fixed"``, n of M without replacement): the cohort always holds n clients, so the relation
  is replacing one client (add/remove would change M and the cohort's law). Replacing client i's data moves u_i
  from one vector of norm <= w_max C_t to another: S_t = 2 w_max C_t.

The noise has std z S_t, so every declared draw is ``GaussianDpEvent(z)`` in units of S_t (``Release``), whatever
C_t is: C_t is a function of earlier noisy outputs only (post-processing), public to every observer.

**Weighting** (``weighting = "records"``, McMahan et al.'s bounded weights): w_i = min(n_i / n_hat, w_max), n_hat =
``weight_records`` a public constant. Replacing a client's data may change n_i arbitrarily, but w_i stays in
[0, w_max], so u_i stays in the ball of radius w_max C_t and the sensitivities above hold. D is not divided by the
weights' sum (which would depend on every n_i): it stays qM or n. ``"uniform"`` (the default): w_i = 1 = w_max.

**Where the noise is added** (``noise_at``); in every case the sum the server steps with carries N(0, (z S_t)^2 I):

* ``"server"`` (central DP): clients send u_i in the clear; the server draws the noise in ``server_update`` from its
  own stream and releases only the noisy model (``Release.server_events``: the third party and other silos are
  charged the server's draw). Sound because S_t bounds each u_i whatever the client sends through clipping, and the
  server keeps nothing computed from the unnoised sum. Sensible with ``privacy.boundary = "trusted"`` (the server
  sees every u_i: towards a server observer epsilon is infinite).
* ``"shares"`` (distributed DP, for secure aggregation): every client adds N(0, (z S_t)^2 / n_s) to u_i, n_s the
  cohort size (its expected size qM, rounded, for Poisson), so a cohort of n_s clients sums to z S_t. Declared as one
  Gaussian draw of multiplier z / sqrt(n_s) that enters the aggregate additively with nothing computed after it: the
  ledger credits the other members' shares as for Heikkilä et al.'s joint noise (``dpfl.accounting.observers``):
  z towards the third party and a secure-aggregation server, z sqrt((n - 1) / n) towards another silo (which knows
  its own share), z / sqrt(n) towards a plain server. A Poisson cohort may hold the owner alone, so there no share is
  credited (sound, but loose: use fixed-size cohorts with shares). ``privacy.secure_aggregation = true`` sums the
  shares with the real protocol (``message_bound``; not with adaptive clipping, whose C_t has no bound fixed in
  advance).
* ``"client"`` (local DP): every client adds N(0, (z S_t)^2) to u_i: every observer, the server included, sees at
  least noise multiplier z.

**Secure noise** (``run.secure_noise``): the update's mechanism is ``dpfl.noise.DiscreteGaussianMechanism`` at the
server or at each client; ``build`` refuses shares (discrete Gaussian shares do not sum to a discrete Gaussian, so
the other members' shares could not be credited) and adaptive clipping (its count has no secure mechanism).

**Adaptive clipping** (``target_quantile`` gamma set; Andrew et al. Alg. 2). The clipped-bit sum sum_i b_i has
sensitivity s_b = 1/2 under zero-out (b_i in {-1/2, 1/2} against a null client's 0: Andrew et al. centre the bit
for this reason) and 1 under replace-one; its noise N(0, sigma_b^2) (``count_noise``, Andrew et al.'s sigma_b) is the
Gaussian mechanism with multiplier z_b = sigma_b / s_b (2 sigma_b for Poisson cohorts). Two Gaussian mechanisms of
multipliers z_Delta and z_b on the same neighbours compose to one of multiplier (z_Delta^-2 + z_b^-2)^(-1/2) (Dong,
Roth, Su 2022, Cor. 3.3: mu^2 adds), so Andrew et al. (Sec. 3) run the update at

    z_Delta = (z^-2 - z_b^-2)^(-1/2)          (= (z^-2 - (2 sigma_b)^-2)^(-1/2) for Poisson cohorts)

and the pair costs what one round at z costs, whatever the split: privacy.epsilon solves z alone
(``searched_section``). Both draws are declared, each in units of its own sensitivity, so the ledger composes them
itself (the split is not trusted, it is accounted). z_b <= z leaves z_Delta undefined: a ConfigError naming
algorithm.count_noise, its value and the bound z s_b it must exceed. C_{t+1} depends only on the noisy count: it is
server state, sent to the next cohort with x (results.json reports the C_t of each evaluated round: ``clip_of``). The
noise of b_i is placed like the update's (server, shares or each client).

**The default count_noise** (``default_count_noise``): sigma_b = max(m / 20, s_b z / sqrt(``COUNT_SHARE``)), m the
expected cohort. Andrew et al.'s m / 20 gives the noisy fraction b~ a noise std of (m / 20) / m = 0.05, and costs
little at their cohorts of hundreds (m = 100, z = 1, Poisson: z_b = 10, z_Delta = 1.005 z); at a cohort of 2 (10
clients at rate 0.2) it is 0.1, below any useful z, and every run with privacy.epsilon would be refused. The second
term caps the count's share of the round's privacy: in GDP the round is mu = 1 / z, the count mu_b = 1 / z_b, and
(mu_b / mu)^2 = (z / z_b)^2 <= COUNT_SHARE iff sigma_b >= s_b z / sqrt(COUNT_SHARE); then z_Delta = z (1 - (z /
z_b)^2)^(-1/2) <= z / sqrt(1 - COUNT_SHARE) = 1.054 z. On such small cohorts the count's noise on b~, sigma_b / D,
is of order 1 or more, so C_t wanders (a fixed clip may serve better there); nothing is refused.

**McMahan et al.'s amplified epsilon** (``privacy.analysis = "paper"``; ``Release.paper = "mcmahan"``). By default
every observer is charged the participation mixture (``dpfl.accounting.observers``): exact for an observer that learns
whether the owner took part, so Poisson sampling of clients lowers delta but never epsilon. McMahan et al. (Thm 1),
and TF Federated, Opacus and dp_accounting after them, report instead what an observer that sees only the noisy model
and not the cohort meets: each round the Poisson subsampled Gaussian ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``
(zero-out: a null client leaves the sum as an absent one does; with adaptive clipping the pair's draws share the
owner's participation and compose to the one Gaussian at z). The paper analysis charges that to the third party and
the other silos, accounted by the tightest accountant (PLD; the paper analysis's default, RDP with the classic
conversion, is Noble et al.'s), and states its assumption in results.json (privacy.assumptions:
``observers.COHORT_SECRET``). It holds only for the server's own noise under secret Poisson cohorts, so it is refused
(a ConfigError naming the key) for ``noise_at`` other than "server" and for fixed-size cohorts, and the ledger refuses
public ones; the server keeps its sound charge. At M = 1000, q = 0.05, T = 200, z = 1, delta = 1e-6: 5.49 against the
sound 25.93 (an observer that learns the cohort meets the 25.93).

The local steps are ``dpfl.algorithms.local_sgd.LocalSGD``'s (its non-private FedAvg, clip None, noise 0): this module
adds only the clipping of the update, its noise and the clip's update.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import COHORT_SECRET, OTHER_SILO, SERVER, Release
from dpfl.accounting.units import USER_LEVEL
from dpfl.algorithms.joint_noise import TAIL_STDS
from dpfl.algorithms.local_sgd import LocalSGD
from dpfl.algorithms.registry import AlgorithmSpec, Calibration, Setting, register
from dpfl.engine.boundary import Delivery
from dpfl.engine.protocol import Algorithm, ClientContext, ClientData, ClientOutput, ServerContext, State
from dpfl.engine.sampling import ClientSampler, RecordSampler
from dpfl.errors import ConfigError, check_noise_multiplier, check_range
from dpfl.noise import DiscreteGaussianMechanism, GaussianMechanism

NAME = "dp-fedavg-user"
#: algorithm.noise_at: who adds the noise (module docstring)
PLACEMENTS = ("server", "shares", "client")
#: algorithm.weighting: w_i = 1, or min(n_i / n_hat, w_max)
WEIGHTINGS = ("uniform", "records")
#: the client sampling schemes whose user-level relation this family derives (module docstring)
CLIENT_SAMPLING = ("poisson", "fixed")
#: z when neither algorithm.noise_multiplier nor privacy.epsilon is given
DEFAULT_NOISE = 1.0
#: the largest share of a round's privacy (mu^2 in GDP) the default count_noise gives the clipped-bit count
#: (module docstring): z_b >= z / sqrt(0.1) = 3.16 z, z_Delta <= 1.054 z
COUNT_SHARE = 0.1
#: Andrew et al.'s sigma_b = m / ANDREW_COHORT_DIVISOR, m the expected cohort (the default where it leaves z_b > z)
ANDREW_COHORT_DIVISOR = 20


def relation_factor(client_sampling: str) -> float:
    """S_t / (w_max C_t): 1 under zero-out of one client (Poisson cohorts), 2 under replace-one (fixed cohorts)."""
    return 1.0 if client_sampling == "poisson" else 2.0


def default_count_noise(expected_cohort: float, z: float, count_sensitivity: float) -> float:
    """sigma_b = max(m / 20, s_b z / sqrt(COUNT_SHARE)): Andrew et al.'s m / 20 (m the expected cohort), raised where
    it would give the count more than ``COUNT_SHARE`` of the round's privacy at the round's multiplier z (module
    docstring, "The default count_noise")."""
    return max(expected_cohort / ANDREW_COHORT_DIVISOR, count_sensitivity * z / math.sqrt(COUNT_SHARE))


def update_multiplier(z: float, count_multiplier: float | None) -> float:
    """z_Delta = (z^-2 - z_b^-2)^(-1/2) (Andrew et al. 2021, Sec. 3), or z without adaptive clipping (None)."""
    if count_multiplier is None:
        return z
    return 1.0 / math.sqrt(z**-2 - count_multiplier**-2)


@dataclass(frozen=True)
class AdaptiveClip:
    """Andrew et al.'s geometric clip update (module docstring): gamma, eta_C, and z_b = sigma_b / s_b."""

    target_quantile: float  # gamma
    clip_lr: float  # eta_C
    count_noise: float  # sigma_b, the std of the noise on the sum of the b_i
    count_sensitivity: float  # s_b: 1/2 (zero-out) or 1 (replace-one)

    @property
    def count_multiplier(self) -> float:
        """z_b = sigma_b / s_b."""
        return self.count_noise / self.count_sensitivity

    def next_clip(self, clip: torch.Tensor, noisy_count: torch.Tensor, denominator: float) -> torch.Tensor:
        """C exp(-eta_C (b~ - gamma)), b~ = 1/2 + (sum b_i + noise) / D."""
        fraction = 0.5 + noisy_count / denominator
        return clip * torch.exp(-self.clip_lr * (fraction - self.target_quantile))


@dataclass(frozen=True)
class DpFedAvgUser(Algorithm):
    """User-level DP-FedAvg (module docstring)."""

    local: LocalSGD  # the K non-private local steps
    clip: float  # C_0
    mechanism: GaussianMechanism | DiscreteGaussianMechanism  # z, what one round costs (adaptive: the pair's)
    noise_at: str
    client_sampling: str
    denominator: float  # D: qM (Poisson) or n (fixed)
    shares: int  # n_s, the clients whose shares sum to the noise (noise_at = "shares")
    server_lr: float = 1.0
    max_weight: float = 1.0  # w_max
    weight_records: float | None = None  # n_hat (weighting = "records"); None: uniform weights
    adaptive: AdaptiveClip | None = None
    amplified: bool = False  # McMahan et al.'s amplified epsilon (privacy.analysis = "paper"; module docstring)

    privacy_unit = USER_LEVEL

    def __post_init__(self):
        if self.noise_at not in PLACEMENTS:
            raise ConfigError("algorithm.noise_at", self.noise_at, f"one of {list(PLACEMENTS)}")
        if self.client_sampling not in CLIENT_SAMPLING:
            raise ConfigError("algorithm.client_sampling", self.client_sampling,
                              f"one of {list(CLIENT_SAMPLING)} for {NAME!r} (the user-level relation is derived for "
                              "Poisson cohorts, zero-out, and fixed-size ones, replace-one)")
        z = check_noise_multiplier("algorithm.noise_multiplier", self.mechanism.noise_multiplier)
        check_range("algorithm.clip", self.clip, 0.0, low_open=True)
        check_range("algorithm.server_lr", self.server_lr, 0.0, low_open=True)
        check_range("algorithm.max_weight", self.max_weight, 0.0, low_open=True)
        if self.adaptive is not None and self.adaptive.count_multiplier <= z:
            bound = z * self.adaptive.count_sensitivity
            raise ConfigError("algorithm.count_noise", self.adaptive.count_noise,
                              f"more than z s_b = {bound:.6g} (z = {z:.6g}, the round's noise multiplier: algorithm."
                              f"noise_multiplier, or solved for privacy.epsilon; s_b = "
                              f"{self.adaptive.count_sensitivity:g}, the clipped-bit sum's sensitivity): the update's "
                              "multiplier z_Delta = (z^-2 - (sigma_b / s_b)^-2)^(-1/2) is otherwise undefined, and "
                              "unbounded just above it; leave algorithm.count_noise unset for its default "
                              f"max(m / 20, s_b z / sqrt({COUNT_SHARE:g})) = {self._default_count_noise():.6g}, which "
                              f"gives the count at most {COUNT_SHARE:g} of the round's privacy (or raise "
                              "privacy.epsilon, which lowers z)")
        if self.amplified:
            self._check_amplified()

    def _default_count_noise(self) -> float:
        """``default_count_noise`` at this algorithm's z and expected cohort (qM for Poisson cohorts, n for fixed)."""
        return default_count_noise(self.denominator, self.mechanism.noise_multiplier, self.adaptive.count_sensitivity)

    def _check_amplified(self) -> None:
        """McMahan et al.'s amplification holds only for the server's own noise under Poisson cohorts."""
        if self.noise_at != "server":
            raise ConfigError("algorithm.noise_at", self.noise_at,
                              "'server' under privacy.analysis = 'paper' (McMahan et al.'s amplified epsilon is that "
                              "of the server's noise towards observers the cohort is secret from; shares and client "
                              "noise are accounted by the sound analysis)")
        if self.client_sampling != "poisson":
            raise ConfigError("algorithm.client_sampling", self.client_sampling,
                              "'poisson' under privacy.analysis = 'paper' (McMahan et al.'s amplified epsilon needs "
                              "each client to take part independently; a fixed-size cohort is accounted by the sound "
                              "analysis)")

    # -- what the analysis reads --------------------------------------------------------------------------------
    @property
    def neighboring(self) -> str:
        """Zero-out one client (Poisson cohorts) or replace one (fixed-size cohorts): module docstring."""
        return "zero_out" if self.client_sampling == "poisson" else "replace_one"

    @property
    def accountant(self) -> str | None:
        """The amplified epsilon's accountant: the tightest (PLD), as dp_accounting reports it; else the analysis's."""
        return "tightest" if self.amplified else None

    @property
    def assumptions(self) -> dict[str, str] | None:
        """What the amplified epsilon assumes (results.json's privacy.assumptions); None: nothing beyond the sound
        analysis."""
        return {"cohort": COHORT_SECRET} if self.amplified else None

    @property
    def noise_multipliers(self) -> dict[str, float]:
        """results.json's privacy.noise_multipliers: z, the round's (given, or solved for privacy.epsilon), and with
        adaptive clipping the split it composes from, z_Delta (the update's) and z_b (the count's), and sigma_b = z_b
        s_b (algorithm.count_noise, or its default)."""
        z = {"z": self.mechanism.noise_multiplier}
        if self.adaptive is None:
            return z
        return {**z, "z_delta": self.update_mechanism.noise_multiplier, "z_b": self.adaptive.count_multiplier,
                "sigma_b": self.adaptive.count_noise}

    def clip_of(self, server: dict) -> float:
        """C_t, the clip of the round that starts from the server state ``server`` (results.json's per-round
        "clip"): the configured C without adaptive clipping."""
        return float(server["clip"])

    @property
    def update_mechanism(self) -> GaussianMechanism | DiscreteGaussianMechanism:
        """z_Delta, the update's multiplier in units of S_t."""
        return self.mechanism.with_multiplier(update_multiplier(
            self.mechanism.noise_multiplier, None if self.adaptive is None else self.adaptive.count_multiplier))

    @property
    def share_factor(self) -> float:
        """What one client's draw is of the whole noise: 1 / sqrt(n_s) for shares, else 1."""
        return 1.0 / math.sqrt(self.shares) if self.noise_at == "shares" else 1.0

    def mechanisms(self) -> list[GaussianMechanism | DiscreteGaussianMechanism]:
        """The round's noise draws, in units of their sensitivities: the update's, then the count's (adaptive; never
        under run.secure_noise, which ``build`` refuses with adaptive clipping)."""
        drawn = [self.update_mechanism]
        if self.adaptive is not None:
            drawn.append(GaussianMechanism(self.adaptive.count_multiplier))
        return drawn

    def sensitivity(self, clip: torch.Tensor) -> torch.Tensor:
        """S_t = (1 or 2) w_max C_t (module docstring)."""
        return relation_factor(self.client_sampling) * self.max_weight * clip

    def weights(self, counts: torch.Tensor) -> torch.Tensor:
        """w_i = min(n_i / n_hat, w_max), or 1 (uniform)."""
        if self.weight_records is None:
            return torch.ones(counts.shape[0])
        return torch.clamp(counts.double() / self.weight_records, max=self.max_weight).float()

    # -- the protocol -------------------------------------------------------------------------------------------
    def init_state(self, x0: torch.Tensor, num_clients: int) -> State:
        return State({"x": x0.clone(), "clip": torch.tensor(float(self.clip))})

    def release(self, round_index: int, state: State | None, counts: torch.Tensor) -> Release:
        """One Gaussian draw per mechanism (the update's; the count's with adaptive clipping), each in units of its
        own user-level sensitivity, drawn by each client (shares: at z / sqrt(n_s), credited with the cohort's) or,
        with noise_at = "server", by the server (the clients' messages are then not private; the paper analysis is
        McMahan et al.'s)."""
        events = [m.event for m in self.mechanisms()]
        if self.noise_at == "server":
            return Release((dp_event.NonPrivateDpEvent(),), (True,), server_events=events, paper="mcmahan")
        drawn = [m.with_multiplier(m.noise_multiplier * self.share_factor).event for m in self.mechanisms()]
        return Release(drawn, (True,) * len(drawn))

    def examples_per_client(self, counts: torch.Tensor) -> int:
        return self.local.examples_per_client(counts)

    def client_round(self, round_index: int, server: dict, clients: dict, data: ClientData,
                     ctx: ClientContext) -> ClientOutput:
        """K local steps (``LocalSGD``), the update clipped to C_t and weighted; with the noise at the clients, each
        adds its draw(s) from its stream "noise". Messages {u[, b]}."""
        delta = self.local.client_round(round_index, server, {}, data, ctx).messages["dy"]
        n, P = delta.shape
        clip = server["clip"].to(delta.dtype).expand(n)
        norms = delta.norm(dim=1)
        clipped = delta * torch.clamp(clip / norms, max=1.0).unsqueeze(1)  # ||Delta|| = 0: inf -> 1
        messages = {"u": self.weights(data.counts).to(delta.dtype).unsqueeze(1) * clipped}
        if self.adaptive is not None:
            messages["b"] = (norms <= clip).to(delta.dtype).unsqueeze(1) - 0.5
        if self.noise_at == "server":
            return ClientOutput(messages, {}, [dp_event.NonPrivateDpEvent()])
        draws = self.update_mechanism.draws(ctx.streams("noise"), (P + 1,))
        messages, events = self.add_noise(messages, clip, draws, self.share_factor)
        return ClientOutput(messages, {}, events)

    def add_noise(self, messages: dict, clip: torch.Tensor, standard_normal: torch.Tensor, factor: float):
        """Each mechanism's draw added to its message, row-wise: u + N(0, (factor z_Delta S_t)^2 I), and b +
        N(0, (factor z_b s_b)^2) with adaptive clipping (``factor``: 1, or a share's 1 / sqrt(n_s));
        ``standard_normal`` [rows, P + 1] (the update mechanism's ``draws``: int64 discrete Gaussian draws under
        run.secure_noise), ``clip`` [rows]. Returns (the noisy messages, the draws' events)."""
        width, rows = messages["u"].shape[-1], standard_normal.shape[0]
        parts = [("u", self.sensitivity(clip), slice(0, width))]
        if self.adaptive is not None:
            parts.append(("b", torch.full((rows,), self.adaptive.count_sensitivity), slice(width, width + 1)))
        noisy, events = dict(messages), []
        for (name, sensitivity, columns), mechanism in zip(parts, self.mechanisms()):
            share = mechanism if factor == 1 else mechanism.with_multiplier(mechanism.noise_multiplier * factor)
            noisy[name], event = share(messages[name], sensitivity, standard_normal[:, columns])
            events.append(event)
        return noisy, events

    def server_update(self, round_index: int, server: dict, delivered: Delivery, ctx: ServerContext) -> dict:
        """x + eta_g (sum u [+ noise]) / D; with adaptive clipping C exp(-eta_C (b~ - gamma)). Row-wise where the
        state carries a leading row axis. An empty cohort still moves x by the server's noise (it was declared)."""
        x, clip = server["x"], server["clip"]
        total = delivered.sums.get("u", torch.zeros_like(x))
        count = delivered.sums.get("b", torch.zeros(*x.shape[:-1], 1, dtype=x.dtype))
        if self.noise_at == "server":
            P = total.shape[-1]
            sums = {"u": total.reshape(-1, P), "b": count.reshape(-1, 1)}
            rows = sums["u"].shape[0]
            standard_normal = self.update_mechanism.draws(ctx.streams("server_noise"), (P + 1,)).reshape(rows, P + 1)
            noisy, events = self.add_noise(sums, clip.reshape(-1).expand(rows), standard_normal, 1.0)
            for event in events:
                ctx.drew(event)
            total, count = noisy["u"].reshape(total.shape), noisy["b"].reshape(count.shape)
        updated = {"x": x + self.server_lr * total / self.denominator, "clip": clip}
        if self.adaptive is not None:
            updated["clip"] = self.adaptive.next_clip(clip, count[..., 0], self.denominator).to(clip.dtype)
        return updated

    def message_bound(self, counts: torch.Tensor) -> dict[str, float] | None:
        """|coordinate| of u that secure aggregation must represent (it clamps beyond: ``dpfl.engine.secure_sum``):
        w_max C plus ``TAIL_STDS`` stds of a client's draw. None with adaptive clipping: C_t moves, so no bound fixed
        before the run holds."""
        if self.adaptive is not None:
            return None
        std = 0.0 if self.noise_at == "server" else \
            self.mechanism.noise_multiplier * self.share_factor * float(self.sensitivity(torch.tensor(self.clip)))
        return {"u": self.max_weight * self.clip + TAIL_STDS * std}

    def regulariser(self, x: torch.Tensor) -> float:
        return self.local.regulariser(x)

    def noise_to_signal(self, dimension: int) -> tuple[float, float]:
        """(z_sum s sqrt(d) / D, the cohort D' where it is 1): the step eta_g (sum_i w_i u_i + xi) / D has a noiseless
        part of norm at most w_max C_t (D clients' weighted clipped updates, aligned), and xi ~ N(0, (z_sum S_t)^2 I_d)
        with S_t = s w_max C_t has E||xi|| ~ z_sum S_t sqrt(d) (s = 1 or 2, ``relation_factor``). z_sum is the whole
        noise's multiplier: z from the server or from the cohort's shares, so the ratio falls as 1 / D (D' = D ratio);
        sqrt(D) z when each client adds all of it (``"client"``), so it falls as 1 / sqrt(D) (D' = D ratio^2).
        Neither eta_g nor C_t moves the ratio: only the cohort, the noise and the model's size do."""
        local = self.noise_at == "client"
        z_sum = self.mechanism.noise_multiplier * (math.sqrt(self.denominator) if local else 1.0)
        ratio = z_sum * relation_factor(self.client_sampling) * math.sqrt(dimension) / self.denominator
        return ratio, self.denominator * (ratio ** 2 if local else ratio)

    def divergence_hint(self, counts: torch.Tensor) -> str:
        return (f"lower algorithm.lr or algorithm.server_lr (the noise on the summed update has std "
                f"z S_t = {self.mechanism.noise_multiplier:.3g} x {relation_factor(self.client_sampling) * self.max_weight:g} "
                f"x C_t, divided by D = {self.denominator:g})")


@dataclass(frozen=True)
class DpFedAvgUserConfig:
    """The ``[algorithm]`` keys of dp-fedavg-user (beyond name, rounds, client_rate, client_sampling)."""

    local_steps: int = field(default=5, metadata={"help": "K, non-private local SGD steps per round", "min": 1})
    sample_rate: float = field(default=0.2, metadata={"help": "s, each local step's minibatch is floor(s n_i) "
                                                               "records"})
    lr: float = field(default=0.1, metadata={"help": "eta, the local step size"})
    server_lr: float = field(default=1.0, metadata={"help": "eta_g, the server's step on the noisy sum / D"})
    weight_decay: float = field(default=0.0, metadata={"help": "L2 regularisation lambda of the local steps"})
    clip: float = field(default=1.0, metadata={"help": "C, the l2 clip of each client's update (the initial C_0 "
                                                       "with target_quantile)"})
    noise_multiplier: float | None = field(default=None, metadata={
        "help": f"z, the summed update's noise std over its user-level sensitivity (default: calibrated to "
                f"privacy.epsilon, else {DEFAULT_NOISE})"})
    noise_at: str = field(default="shares", metadata={
        "choices": PLACEMENTS, "help": "who adds the noise: the server (central DP), every client a share "
                                       "(distributed DP, with secure aggregation), or every client all of it (local "
                                       "DP)"})
    weighting: str = field(default="uniform", metadata={
        "choices": WEIGHTINGS, "help": "w_i = 1, or min(n_i / weight_records, max_weight) (sensitivity max_weight C)"})
    weight_records: float | None = field(default=None, metadata={
        "help": "n_hat, the record count of weight 1 (weighting = 'records'; a public constant)"})
    max_weight: float = field(default=1.0, metadata={"help": "w_max, the largest weight (weighting = 'records')"})
    target_quantile: float | None = field(default=None, metadata={
        "help": "gamma: adapt C_t towards this quantile of the update norms (Andrew et al. 2021); None: a fixed C"})
    clip_lr: float = field(default=0.2, metadata={"help": "eta_C, the geometric clip update's step"})
    count_noise: float | None = field(default=None, metadata={
        "help": f"sigma_b, the noise std on the clipped-bit sum (default: max(m / 20, s_b z / sqrt({COUNT_SHARE:g})), "
                "m the expected cohort: Andrew et al.'s m / 20, raised so that the count takes at most "
                f"{COUNT_SHARE:g} of the round's privacy; more than z s_b is required)"})


def build(name: str, config: DpFedAvgUserConfig, setting: Setting) -> DpFedAvgUser:
    """The algorithm of a config: z from algorithm.noise_multiplier or solved for privacy.epsilon."""
    sampling = setting.client_sampling
    if sampling not in CLIENT_SAMPLING:
        raise ConfigError("algorithm.client_sampling", sampling, f"one of {list(CLIENT_SAMPLING)} for {NAME!r}")
    if config.weighting not in WEIGHTINGS:
        raise ConfigError("algorithm.weighting", config.weighting, f"one of {list(WEIGHTINGS)}")
    _check_keys(config)
    clients = cohort_sampler(setting)
    cohort = max(1, clients.cohort_size)
    denominator = clients.rate * clients.num_clients if sampling == "poisson" else float(cohort)
    if config.weighting == "records" and config.weight_records is None:
        raise ConfigError("algorithm.weight_records", None, "a record count n_hat > 0 with weighting = 'records'")
    records = config.weighting == "records"
    sampler = RecordSampler(config.sample_rate, "fixed")
    local = LocalSGD(local_steps=config.local_steps, lr=config.lr * sampler.rate * config.local_steps,
                     sampler=sampler, mechanism=GaussianMechanism(0.0), weight_decay=config.weight_decay)
    z = setting.noise_multiplier(config.noise_multiplier, DEFAULT_NOISE)
    if setting.secure_noise_bits is not None:
        _check_secure_noise(config)
    return DpFedAvgUser(local, config.clip, setting.gaussian(z), config.noise_at, sampling, denominator, cohort,
                        server_lr=config.server_lr, max_weight=config.max_weight if records else 1.0,
                        weight_records=config.weight_records if records else None,
                        adaptive=adaptive_clip(config, sampling, denominator, z), amplified=setting.analysis == "paper")


def cohort_sampler(setting: Setting) -> ClientSampler:
    """The run's client sampler, which checks the cohort (a fixed-size one holds at least one client). A config
    validated before its data is built (``Setting.num_clients`` None: the data brings its clients, e.g. an npz
    file's client ids) gets a stand-in of one client per round, as dp-ftrl's; the run builds the real one on the
    data."""
    if setting.num_clients is None:
        return ClientSampler(1, 1.0, setting.client_sampling)
    return ClientSampler(setting.num_clients, setting.client_rate, setting.client_sampling)


def adaptive_clip(config: DpFedAvgUserConfig, client_sampling: str, expected_cohort: float,
                  z: float) -> AdaptiveClip | None:
    """Andrew et al.'s clip update of a config (None without algorithm.target_quantile), for the round's multiplier
    z: s_b = 1/2 (zero-out) or 1 (replace-one); sigma_b = algorithm.count_noise, or ``default_count_noise``."""
    if config.target_quantile is None:
        return None
    sensitivity = relation_factor(client_sampling) / 2
    count_noise = default_count_noise(expected_cohort, z, sensitivity) if config.count_noise is None else \
        config.count_noise
    return AdaptiveClip(config.target_quantile, config.clip_lr, count_noise, sensitivity)


def _check_secure_noise(config: DpFedAvgUserConfig) -> None:
    """run.secure_noise covers the update's own noise at the server or at each client: shares of discrete Gaussian
    noise do not sum to a discrete Gaussian (the credit for the other members' shares would not hold), and the
    clipped-bit count's noise of adaptive clipping has no secure mechanism here."""
    if config.noise_at == "shares":
        raise ConfigError("algorithm.noise_at", config.noise_at,
                          "'client' or 'server' with run.secure_noise = true (discrete Gaussian shares do not sum to "
                          "a discrete Gaussian, so the other members' shares could not be credited)")
    if config.target_quantile is not None:
        raise ConfigError("algorithm.target_quantile", config.target_quantile,
                          "None with run.secure_noise = true (adaptive clipping's noisy count has no secure "
                          "mechanism)")


def _check_keys(config: DpFedAvgUserConfig) -> None:
    """Every numeric key in its range, whether or not the other keys make it apply."""
    check_range("algorithm.lr", config.lr, 0.0, low_open=True)
    check_range("algorithm.local_steps", config.local_steps, 1, integer=True)
    check_range("algorithm.server_lr", config.server_lr, 0.0, low_open=True)
    check_range("algorithm.max_weight", config.max_weight, 0.0, low_open=True)
    check_range("algorithm.clip_lr", config.clip_lr, 0.0, low_open=True)
    for key in ("weight_records", "count_noise"):
        if getattr(config, key) is not None:
            check_range(f"algorithm.{key}", getattr(config, key), 0.0, low_open=True)
    if config.target_quantile is not None:
        check_range("algorithm.target_quantile", config.target_quantile, 0.0, 1.0)


def protected_observers(name: str, config: DpFedAvgUserConfig, setting: Setting) -> tuple[str, ...]:
    """Whom privacy.epsilon protects: another silo, whose epsilon bounds the third party's (the same draws, with at
    most the third party's credit and at least its participation), for server noise and shares (behind secure
    aggregation); a server that sees each message, hence everyone, for client noise."""
    return (SERVER,) if config.noise_at == "client" else (OTHER_SILO,)


def protected_boundary(name: str, config: DpFedAvgUserConfig, setting: Setting) -> str | None:
    """The boundary the guarantee is stated behind: secure aggregation for shares, a plain one for local noise, the
    run's own for server noise."""
    return {"server": None, "shares": "secagg", "client": "plain"}[config.noise_at]


def initial_noise(name: str, config: DpFedAvgUserConfig, setting: Setting) -> float:
    """Where the search for privacy.epsilon starts: z ~ sqrt(T) q / epsilon (at least 0.5)."""
    return max(0.5, math.sqrt(setting.rounds) * setting.client_rate / setting.epsilon)


def searched_section(name: str, config: DpFedAvgUserConfig) -> DpFedAvgUserConfig:
    """The section whose levels the search for privacy.epsilon tries: ``config`` with the default count_noise, which
    follows z (``default_count_noise``) and so never leaves a trial level without room for the update. The run is
    then built with the config's own count_noise at the solved z, and refused, naming algorithm.count_noise, the
    bound z s_b it must exceed and the default, where it leaves z_Delta undefined (``DpFedAvgUser.__post_init__``).

    Why the solved z holds for every split: the round's two draws, of shifts 1 / z_Delta and 1 / z_b in their own
    units, are one Gaussian mechanism of shift (z_Delta^-2 + z_b^-2)^(1/2) = 1 / z (Dong, Roth, Su 2022, Cor. 3.3:
    the likelihood ratio depends on the outputs only through their projection on the shift), and they share the
    owner's participation and shares, so every observer's privacy curve of a round is the same for every split. The
    ledger's pessimistic accounting of the default split is at most privacy.epsilon, so the run's true epsilon is;
    its report for the config's own split is another upper bound of the same curve (they agree to about 1e-8)."""
    return dataclasses.replace(config, count_noise=None)


register(AlgorithmSpec(
    names=(NAME,), config=DpFedAvgUserConfig, build=build, private=lambda name: True,
    help="user-level DP-FedAvg: clipped client updates, Gaussian noise at the server, in shares or at every client, "
         "optional adaptive clipping (McMahan et al. 2018; Andrew et al. 2021)",
    release_keys=("algorithm.rounds",),
    calibration=Calibration(protected_observers, initial_noise, protected_boundary, searched=searched_section),
    secure_noise=True,
))

__all__ = ["NAME", "PLACEMENTS", "WEIGHTINGS", "CLIENT_SAMPLING", "DEFAULT_NOISE", "COUNT_SHARE",
           "ANDREW_COHORT_DIVISOR", "relation_factor", "default_count_noise", "update_multiplier", "AdaptiveClip",
           "DpFedAvgUser", "DpFedAvgUserConfig", "build", "cohort_sampler", "adaptive_clip", "protected_observers",
           "protected_boundary", "initial_noise", "searched_section"]
