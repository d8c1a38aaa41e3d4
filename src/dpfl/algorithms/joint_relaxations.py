"""Heikkilä et al. (2024), appendix "Loosening assumptions": dp-fedavg-joint with per-step and per-client learning
rates, per-client clips and noise shares, and per-client numbers of local steps (fused steps). This module sizes each
client's step and noise and says how much of the summed noise an observer may credit; ``joint_noise`` runs them.

Client i's fused step s (k_i local steps; k_i = 1 unless ``client_local_steps`` fuses), from theta_i:

    for u = 1..k_i:   theta_i <- theta_i - gamma_s g_i (mean_{B} clip_{C_i / k_i}(grad) + [u = k_i] xi_{i,s})
    xi_{i,s} ~ N(0, (f_i sigma' C_i / (q n_i))^2 I)

gamma_s = gamma l_s (``local_lr_schedule``: l_s), g_i = gamma_i / gamma (``client_lr``: Heikkilä et al.'s 1 / l_i),
C_i (``client_clip``), sigma_i = f_i sigma' (``client_noise``: f_i times the share sigma' = sigma / sqrt(t - m) of
``NoiseShares``). In model units client i's fused step has the sensitivity and noise std

    Delta_i = gamma_s g_i C_i / (q n_i),      s_i = sigma_i Delta_i.

**Per-step learning rates** (Heikkilä et al., Eq. 20): gamma_s multiplies every client's gradient and noise alike, so
the round is post-processing of the same S noisy sums: the release, and the ledger, do not depend on l_s.

**Client-specific learning rates, clips and shares** (Eq. 22-25): the sum of the clients' step-s updates is
gamma_s (sum_i g_i mean_i + xi) with xi ~ N(0, sum_i s_i^2 / gamma_s^2): the sum-dominating mechanism has the noise
of Eq. 25 (Eq. 24 when C_i = C, sigma_i = sigma) and a record of client o moves it by at most Delta_o. In the
owner's units the credited noise multiplier is sqrt(s_o^2 + sum_{j in K} s_j^2) / Delta_o for the set K of other
clients whose shares reach the sum. The release declares every client's (s_i, Delta_i) (``Release.shares``); an
observer credited k other shares gets the worst owner and the weakest k others the cohort can hold:

    z = min_i sigma_i  (the owner's own draw, on every step),
    credited multiplier  min_o sqrt(s_o^2 + the k smallest s_j^2, j != o) / Delta_o,

both lower bounds for every owner o (sigma_o >= z), so the composition of a round is (post-processing aside) at least
as noisy as declared. With k = N - 1 (every other share) the minimum is sqrt(sum_i s_i^2) / max_i Delta_i: Eq. 25,
and Eq. 24 when C_i = C and sigma_i = sigma. Both analyses use it: "sound" credits it to the last step only, with k
the shares that surely reach the sum less those the observer knows, "paper" to every step
(``dpfl.accounting.observers``). Client i's noise std is z times (sigma_i / z) C_i / (q n_i): the declared
Gaussian(z) with more noise.

**Different numbers of local steps** (Eq. 26-27): client i fuses k_i local steps, clips at C_i / k_i and adds its
noise share on the last of each k_i, so the fused step's k_i clipped means sum to at most C_i n_i / (q n_i) = the
S-step mechanism's sensitivity; a record is in some of the k_i batches with probability 1 - (1 - q)^k_i, which the
release declares (the worst client's). The triangle inequality bounds the record's own k_i terms, but the later
terms of every OTHER record are computed at an iterate the earlier, noise-free local steps moved with the record: the
fused step's sensitivity is not bounded by C_i for general losses. So the sound analysis refuses it
(``FUSED_UNSOUND``); the paper analysis runs it and reports ``FUSED_UNPROVEN`` in results.json "unproven".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dpfl.engine.sampling import RecordSampler
from dpfl.errors import ConfigError

#: the rules ``client_lr`` may name instead of a list: g_i = n_i / max_j n_j (steps proportional to the data size)
CLIENT_LR_RULES = ("proportional_to_size",)
FUSED_UNSOUND = ("None under privacy.analysis = 'sound' (or privacy.analysis = 'paper'): a fused step's later local "
                 "steps are computed at an iterate that earlier noise-free steps moved with the record, so every "
                 "other record's clipped gradient may change too and the fused step's sensitivity is not C_i "
                 "(Heikkilä et al.'s appendix bounds only the record's own terms)")
#: What the paper analysis assumes of fused local steps that does not hold for general losses.
FUSED_UNPROVEN = (
    "fused local steps: k_i local steps clipped at C_i / k_i with one noise share taken as one step of sensitivity "
    "C_i (Heikkilä et al., appendix, Eq. 26-27); the later steps' other records are computed at an iterate the "
    "earlier noise-free steps moved with the record, so their gradients change too (sound: refused)",
)


@dataclass(frozen=True)
class ClientRelaxations:
    """Per-client factors of Heikkilä et al.'s appendix (module docstring), one value per client id, or one value for
    every client: g_i (``lr``), C_i (``clip``), f_i (``noise``), k_i (``fused``)."""

    lr: tuple[float, ...] = (1.0,)
    clip: tuple[float, ...] = (1.0,)
    noise: tuple[float, ...] = (1.0,)
    fused: tuple[int, ...] = (1,)

    @classmethod
    def of_config(cls, config, counts: tuple[int, ...], analysis: str) -> "ClientRelaxations":
        """The factors of a dp-fedavg-joint [algorithm] table (``client_lr``, ``client_clip``, ``client_noise``,
        ``client_local_steps``) for clients with ``counts`` train records."""
        clients = len(counts)
        if config.client_lr in CLIENT_LR_RULES:  # proportional_to_size
            lr = tuple(n / max(counts) for n in counts)
        elif isinstance(config.client_lr, str):
            raise ConfigError("algorithm.client_lr", config.client_lr,
                              f"one of {list(CLIENT_LR_RULES)} or a list of {clients} positive factors")
        else:
            lr = per_client("algorithm.client_lr", config.client_lr, clients, 1.0, "positive learning-rate factors")
        if config.client_local_steps is not None and analysis == "sound":
            raise ConfigError("algorithm.client_local_steps", config.client_local_steps, FUSED_UNSOUND)
        fused = per_client("algorithm.client_local_steps", config.client_local_steps, clients, 1,
                           "positive integers (local steps fused into each of the S steps)", integer=True)
        return cls(lr, per_client("algorithm.client_clip", config.client_clip, clients, config.clip,
                                  "positive clip norms"),
                   per_client("algorithm.client_noise", config.client_noise, clients, 1.0,
                              "positive factors of the noise share"), fused)

    def rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(g, C, f, k) of the clients ``ids``, each [len(ids)]."""
        return (_column(self.lr, ids), _column(self.clip, ids), _column(self.noise, ids),
                _column(self.fused, ids, torch.long))

    @property
    def fuses(self) -> bool:
        return max(self.fused) > 1

    def sampler(self, sampler: RecordSampler, fused: int | None = None) -> RecordSampler:
        """The record sampling of a step that fuses ``fused`` = k local steps (default: the worst client's k): in some
        of k batches w.p. 1 - (1 - q)^k."""
        k = max(self.fused) if fused is None else fused
        return RecordSampler(1 - (1 - sampler.rate) ** k, sampler.scheme) if k > 1 else sampler

    def own_multiplier(self, share: float) -> float:
        """z = min_i sigma_i: every client's own draw has at least this multiplier."""
        return share * min(self.noise)

    def noise_sensitivity(self, sampler: RecordSampler, counts: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """std_i / z = (sigma_i / z) C_i / (q n_i) of the clients ``ids`` (the declared Gaussian(z) with more noise)."""
        _, clip, noise, _ = self.rows(ids)
        return noise / min(self.noise) * sampler.mean_sensitivity(clip, counts)

    def shares(self, share: float, sampler: RecordSampler, counts: torch.Tensor) -> tuple[tuple[float, float], ...]:
        """(s_i, Delta_i) / gamma_s of every client (``Release.shares``; module docstring)."""
        ids = torch.arange(counts.shape[0])
        lr, clip, noise, _ = self.rows(ids)
        sensitivity = lr * sampler.mean_sensitivity(clip, counts)
        return tuple(zip((share * noise * sensitivity).tolist(), sensitivity.tolist()))


def per_client(field: str, values, clients: int, default, allowed: str, integer: bool = False) -> tuple:
    """``values`` (one per client id) checked, or (``default``,) for None."""
    if values is None:
        return (default,)
    kind = int if integer else (int, float)
    if (not isinstance(values, list) or len(values) != clients
            or any(isinstance(v, bool) or not isinstance(v, kind) or not v > 0 for v in values)):
        raise ConfigError(field, values, f"a list of {clients} {allowed}, one per client id")
    return tuple(values)


def step_lr_factors(values, steps: int) -> tuple[float, ...]:
    """l_s of ``algorithm.local_lr_schedule`` (gamma_s = gamma l_s), checked; () for None (every l_s = 1)."""
    if values is None:
        return ()
    if (not isinstance(values, list) or len(values) != steps
            or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 for v in values)):
        raise ConfigError("algorithm.local_lr_schedule", values,
                          f"a list of {steps} positive factors (algorithm.local_steps), gamma_s = lr x factor_s")
    return tuple(float(v) for v in values)


def _column(values: tuple, ids: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
    if len(values) == 1:  # the same for every client (any id)
        return torch.full(ids.shape, values[0], dtype=dtype)
    return torch.tensor(values, dtype=dtype)[ids]
