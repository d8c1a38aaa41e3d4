"""DP-FedAvg with joint noise: S local DP-SGD steps per round, each client adding only its share of the noise
(Heikkilä, Koskela, Shimizu, Kaski, Honkela, "Differentially private cross-silo federated learning", Sec. 4).

Round t, for every client i of the cohort, starting from theta_i = theta^(t-1):

    for s = 1..S:
        B_s      = a Poisson(q) sample of the client's n_i records
        g_s      = (1 / (q n_i)) sum_{x in B_s} clip_C(grad l(theta_i; x))     (the EXPECTED batch size: a constant)
        theta_i <- theta_i - gamma (g_s + xi_s),   xi_s ~ N(0, (sigma_i C / (q n_i))^2 I)
    Delta_i = theta_i - theta^(t-1)
    theta^(t) = theta^(t-1) + (1 / |U|) sum_{i in U} Delta_i      (U: the clients whose update reached the sum)

The shares sigma_i are sized so that the shares that surely reach the sum, less those an observer can subtract, have
variance sigma^2 (only the sum of share variances matters, the noise being infinitely divisible; Heikkilä et al.
Thm 4.7):

    sigma_i = sigma / sqrt(t - m)      t = algorithm.min_clients (the fewest clients that reach the sum when clients
                                           may drop out; default the whole cohort N), m = the untrusted shares:

* ``trust = "aggregator"``: m = 0, sigma / sqrt(N) (a trusted aggregator; only released models are observed);
* ``trust = "clients"`` (default): m = 1, sigma / sqrt(N - 1) (honest-but-curious clients know their own share);
* ``trust = "coalition"``: m = ``colluders``, sigma / sqrt(N - m) (up to m colluding clients);
* ``trust = "local"``: m = t - 1, sigma_i = sigma (local DP: every client's message alone has the noise sigma).

**Privacy.** ``release`` declares the S draws of one client (Poisson(q) around Gaussian(sigma_i), in units of the
client's sensitivity C / (q n_i), zero-out neighbours), with the facts the observers need (``Release.contributors``
= t, ``Release.colluders`` = max(m, 1)). Two analyses (``privacy.analysis``):

* ``"sound"`` (default): only the last step's shares reach the sum intact, so the cohort's shares are credited to the
  last step (noise multiplier sqrt(t) sigma_i = sigma with equal clients; ``Release.shares`` otherwise) and the
  first S - 1 steps keep the owner's own sigma_i (``dpfl.accounting.observers``). For S = 1 both analyses agree.
* ``"paper"``: Heikkilä et al. Thm 4.7: every local step is a central Poisson-subsampled Gaussian with noise
  multiplier sigma, T S compositions, RDP with the classic conversion. Unproven for S > 1 (a client's later steps
  are computed at its own unreleased iterate, so other clients can cancel their earlier shares:
  ``observers.JOINT_PAPER_UNPROVEN``, reported in results.json "unproven"; ``tests/privacy`` holds the instance).

sigma is ``algorithm.noise_multiplier``, or, with ``privacy.epsilon``, the smallest sigma whose T rounds cost at most
that epsilon towards the observer the trust setting protects against (aggregator: a third party; clients and
coalition: the other-silo coalition; local: a server that sees each message), with the ledger's own accountant
(``dpfl.algorithms.dp_fedavg_joint``, the registered name with its keys and builder).

``noise = "skellam"`` makes the shares integers (``dpfl.algorithms.joint_skellam``): every step's gradient is rounded
at a scale s and given an integer Skellam share, the message is the integer sum of the steps, and the events hold the
rounding; the sizing of the shares above is the same.

The implementation is ``LocalSGD`` (FedAvg without control variates, Poisson record sampling) with gamma as its local
step and the share sigma_i as its mechanism's noise multiplier; only the release and the share sizing are new.
Clients with different n_i have different sensitivities C / (q n_i) (the appendix's client-specific learning rates
gamma / (q n_i) on the clipped sum): the sum is credited for the worst owner and the weakest shares, which is sound.

**Each owner's release** (``Release.owners``, ``dpfl.accounting.owners``). A record x lives on one client o, and in
round t only o's message depends on x: every other client j starts from the released theta^(t-1) and runs on its own
records and its own noise. The observer of the aggregate sees M_o + sum_{j != o} M_j, and each M_j is
U_j + gamma_S g_j xi_{j,S}: a part U_j computed from j's data and j's first S - 1 shares, and j's last share, a
Gaussian independent of U_j, of x and of o's draws (nothing is computed after it: Heikkilä et al. 2024, Sec. 4, whose
Thm 4.7 credits every step; only the last is credited here, see "sound" above). So the view is a post-processing
(adding the independent sum of the U_j) of M_o + N, N the Gaussian of the k others' last shares the observer cannot
subtract, and M_o + N is the adaptive composition of o's S steps: the first S - 1 Poisson(q)-subsampled Gaussians at
o's own multiplier sigma_o = f_o sigma' in units of Delta_o (releasing them is more than the sum shows), the last at
sqrt(s_o^2 + sum_{j in K} s_j^2) / Delta_o (``Release.credited_variance`` for owner o, K the weakest k others the
cohort can hold, as dropouts and colluders choose). None of this uses that o is the worst client: it bounds each
owner's records by that owner's own S draws, and a record stays on its client, so T rounds charge owner o the
composition of its own releases and the run's epsilon is the worst owner's. The single release above (z = min_i
sigma_i on every step, the worst owner's credit on the last, the largest fused rate) dominates every owner's and is
what the paper's analysis and federations beyond ``owners.PER_OWNER_CLIENTS`` clients are charged. It is the worst
owner's own release unless two owners' worsts combine: with equal f_i every owner's first S - 1 draws are the bound's
and the bound's last is the worst owner's credit (any n_i, g_i, C_i), and with S = 1 there is only that last draw;
so the owners gain over the bound when f_i (``client_noise``) differ and S > 1. Skellam shares keep the bound.

The appendix's relaxations (per-step and per-client learning rates, per-client clips and shares, fused local steps)
and their accounting: ``dpfl.algorithms.joint_relaxations``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import OTHER_SILO, SERVER, THIRD_PARTY, Release
from dpfl.accounting.owners import declare_owners
from dpfl.algorithms.joint_relaxations import FUSED_UNPROVEN, ClientRelaxations
from dpfl.algorithms.local_sgd import LocalSGD
from dpfl.engine.protocol import ClientContext, ClientData, ClientOutput, State
from dpfl.errors import ConfigError, check_noise_multiplier, check_range
from dpfl.noise import GaussianMechanism

TRUST = ("aggregator", "clients", "coalition", "local")
#: per trust setting, the (observer, boundary) whose epsilon privacy.epsilon bounds (module docstring)
PROTECTED = {"aggregator": (THIRD_PARTY, "secagg"), "clients": (OTHER_SILO, "secagg"),
             "coalition": (OTHER_SILO, "secagg"), "local": (SERVER, "plain")}
#: coordinates of a message beyond this many share standard deviations (per step) are clamped before secure
#: aggregation encodes them (``message_bound``)
TAIL_STDS = 12.0


@dataclass(frozen=True)
class NoiseShares:
    """Who must not be able to remove noise, and how large each client's share therefore is (module docstring)."""

    noise_multiplier: float  # sigma, the noise the sum must keep
    cohort: int  # N, the clients invited per round
    trust: str = "clients"
    colluders: int = 1  # m, for trust = "coalition"
    min_clients: int | None = None  # t, the fewest clients whose update reaches the sum (None: N)

    def __post_init__(self):
        if self.trust not in TRUST:
            raise ConfigError("algorithm.trust", self.trust, f"one of {list(TRUST)}")
        check_noise_multiplier("algorithm.noise_multiplier", self.noise_multiplier)
        check_range("algorithm.colluders", self.colluders, 1, integer=True)
        if self.min_clients is not None:
            check_range("algorithm.min_clients", self.min_clients, self.cohort // 2 + 1, self.cohort, integer=True)
        if self.trust == "coalition" and self.colluders >= self.contributors:
            raise ConfigError("algorithm.colluders", self.colluders,
                              f"fewer than the {self.contributors} clients whose shares reach the sum (min_clients, or "
                              "the cohort): a coalition of all of them could remove all the noise")
        if self.trust == "clients" and self.contributors < 2:
            raise ConfigError("algorithm.trust", self.trust,
                              f"'aggregator' or 'local' for a cohort of {self.contributors} client: honest-but-curious "
                              "clients need at least 2 shares in the sum")

    @property
    def contributors(self) -> int:
        """t: the fewest clients whose shares reach the sum."""
        return self.cohort if self.min_clients is None else self.min_clients

    @property
    def untrusted(self) -> int:
        """m: the shares an observer may know and subtract."""
        return {"aggregator": 0, "clients": 1, "coalition": self.colluders, "local": self.contributors - 1}[self.trust]

    @property
    def share(self) -> float:
        """sigma_i = sigma / sqrt(t - m)."""
        return self.noise_multiplier / math.sqrt(self.contributors - self.untrusted)


@dataclass(frozen=True)
class JointNoise(LocalSGD):
    """DP-FedAvg with joint noise (module docstring): ``LocalSGD`` with gamma = ``lr`` as the local step and the
    share sigma_i as the mechanism's noise multiplier (``build_joint_noise`` sizes it; the release declares whatever
    the mechanism draws, so the ledger follows the mechanism, never ``shares``)."""

    shares: NoiseShares | None = None
    #: l_s, gamma_s = gamma l_s (Heikkilä et al., Eq. 20); (): every l_s = 1
    step_lr: tuple[float, ...] = ()
    #: per-client g_i, C_i, f_i, k_i (``joint_relaxations``); None: g_i = f_i = k_i = 1, C_i = C
    relaxations: ClientRelaxations | None = None
    #: the ledger's accountant: RDP (PLDs of Poisson-subsampled Gaussians at share-sized noise multipliers, ~0.2,
    #: take minutes per round); under the paper's analysis at Heikkilä et al.'s integer orders 2..255 ("rdp-integer")
    accountant: str = "rdp"

    def __post_init__(self):
        super().__post_init__()
        if self.shares is None or self.sampler.scheme != "poisson" or self.control_variates or not self.move_locally:
            raise ValueError("JointNoise is FedAvg with Poisson record sampling and noise shares")
        if self.relaxations is None:
            object.__setattr__(self, "relaxations", ClientRelaxations(clip=(self.clip,)))
        if self.step_lr and len(self.step_lr) != self.local_steps:
            raise ValueError(f"{len(self.step_lr)} step-size factors for {self.local_steps} local steps")

    @property
    def local_lr(self) -> float:
        """gamma, the local step (Heikkilä et al. use it as it is, without LocalSGD's 1 / (s K))."""
        return self.lr

    @property
    def min_clients(self) -> int | None:
        """The fewest clients secure aggregation may finish a round with (None: all invited)."""
        return self.shares.min_clients

    def gamma(self, step: int) -> float:
        """gamma_s = gamma l_s."""
        return self.lr * (self.step_lr[step] if self.step_lr else 1.0)

    def release(self, round_index: int, state: State, counts: torch.Tensor) -> Release:
        """S draws of Gaussian(z), z = min_i sigma_i, sampled as a (fused) step samples (the last additive), with the
        shares' contributors, colluders and ratios (``joint_relaxations``), under Heikkilä et al.'s paper analysis;
        with Gaussian shares, per owner too (module docstring, "Each owner's release"): owner o's S draws at its own
        z f_o / min_i f_i, sampled as its own k_o fused steps, its last credited for o alone."""
        relaxed = self.relaxations
        step = relaxed.sampler(self.sampler).event(self.step_noise_event, counts)
        shares = relaxed.shares(self.shares.share, self.sampler, counts)
        bound = Release((step,) * self.local_steps, self.additive_steps, contributors=self.shares.contributors,
                        colluders=max(self.shares.untrusted, 1), paper="heikkila", shares=shares,
                        assumes=FUSED_UNPROVEN if relaxed.fuses else ())
        if not isinstance(self.step_noise_event, dp_event.GaussianDpEvent):  # Skellam shares: the single bound
            return bound
        _, _, noise, fused = relaxed.rows(torch.arange(len(counts)))
        own = (noise / min(relaxed.noise) * self.mechanism.noise_multiplier).tolist()  # sigma_o, z at the least f_i

        def own_steps(o: int) -> tuple:
            event = GaussianMechanism(own[o]).event
            return (relaxed.sampler(self.sampler, int(fused[o])).event(event, counts[o:o + 1]),) * self.local_steps

        return declare_owners(bound, own_steps, shares)

    def client_round(self, round_index: int, server: dict, clients: dict, data: ClientData,
                     ctx: ClientContext) -> ClientOutput:
        """S (fused) steps per client of the chunk (module docstring; ``joint_relaxations``): client i takes k_i
        local steps of gamma_s g_i at clip C_i / k_i per step s, its noise share on the last; message {dy}."""
        x = server["x"]
        n, P, S = data.counts.shape[0], x.shape[-1], self.local_steps
        lr, clip, _, fused = self.relaxations.rows(ctx.ids)
        keys = ctx.streams("records").uniform([(S * int(k), int(c)) for k, c in zip(fused, data.counts)])
        noise = ctx.streams("noise").normal((S, P))  # one share per (fused) step
        std = self.relaxations.noise_sensitivity(self.sampler, data.counts, ctx.ids)
        rows = torch.arange(n)
        start = x.expand(n, P)
        y = start.clone()
        events = []
        for s in range(S):
            for u in range(int(fused.max())):
                substep = torch.clamp(fused - 1, max=u)  # clients done with their k_i steps idle (step 0 below)
                last = (fused - 1 == u).to(y.dtype).unsqueeze(1)
                h, event = self.noisy_gradient(ctx.grads, y, data, keys[rows, s * fused + substep],
                                               noise[:, s] * last, (clip / fused).to(y.dtype), std)
                y = y - (self.gamma(s) * lr * (u < fused)).to(y.dtype).unsqueeze(1) * h
            events.append(event)
        return ClientOutput({"dy": y - start}, {}, events)

    def message_bound(self, counts: torch.Tensor) -> dict[str, float]:
        """|coordinate| of a message that secure aggregation must represent: S (fused) steps of gamma_s g_i (C_i / q
        + TAIL_STDS share stds), the k_i clipped means of Poisson batches being at most k_i C_i n_i / (k_i q n_i)."""
        ids = torch.arange(counts.shape[0])
        lr, clip, _, _ = self.relaxations.rows(ids)
        std = self.mechanism.noise_multiplier * self.relaxations.noise_sensitivity(self.sampler, counts, ids)
        steps = sum(self.gamma(s) for s in range(self.local_steps))
        return {"dy": steps * float((lr * (clip / self.sampler.rate + TAIL_STDS * std)).max())}

    def divergence_hint(self, counts: torch.Tensor) -> str:
        ids = torch.arange(counts.shape[0])
        std = self.mechanism.noise_multiplier * float(
            self.relaxations.noise_sensitivity(self.sampler, counts, ids).max())
        return (f"lower algorithm.lr (gamma = {self.lr:g}; each local step adds noise of std up to {std:.3g} x gamma), "
                "or raise algorithm.sample_rate")


__all__ = ["TRUST", "NoiseShares", "JointNoise"]
