"""FedAvg, FedSGD, SCAFFOLD, SCAFFOLD-warm and their record-level DP versions: one algorithm, four switches.

Seed 000 (Noble, Bellet, Dieuleveut, AISTATS 2022), Algorithm 1 (DP-SCAFFOLD) and Algorithm 2 (DP-FedAvg). For a
cohort C_t of clients, each i in C_t starts from y = x_{t-1} and runs K local steps

    H~  = (1/b_i) sum_{j in S} clip_C(grad f_i(y, d_j)) + (2C/b_i) N(0, sigma_g^2 I) + lambda y        (Alg. 1, l. 9)
    y  <- y - eta_l (H~ - c_i + c)                                                                     (Alg. 1, l. 10)

with eta_l = eta0 / (s K) (seed 000 Sec. 5), fresh minibatches S of size b_i = floor(s n_i) at every step, and
lambda y the L2 regulariser's gradient, added after the noise (it does not touch the data: post-processing). Then

    c_i+ = c_i - c + (x_{t-1} - y) / (K eta_l)  ( = the mean of the K noisy gradients H~ )            (Alg. 1, l. 12)
    x_t  = x_{t-1} + eta_g mean_{i in C_t} (y_i - x_{t-1})
    c_t  = c_{t-1} + (1/M) sum_{i in C_t} (c_i+ - c_i)          (keeps c = mean_i c_i; notes 000 pitfall 2)

The switches:
* control_variates=False drops the correction c - c_i: DP-FedAvg (Algorithm 2).
* move_locally=False evaluates all K noisy gradients at x_{t-1} and sends -eta_l K (their mean): FedSGD, i.e. one
  large-batch gradient step per round (with K s = 1 one pass over the data in expectation, as the authors' code).
* warm_rounds > 0 (SCAFFOLD-warm): the first round(4/l) rounds only fit c_i0 = mean_k H~_k(x0) for the sampled
  clients and leave x unchanged; they sample users at rate l and are counted in T (seed 000 Sec. 4 "warm start").
* noise_multiplier = 0 and clip = None: the non-private algorithms.
* clip_heuristic = "median-nonprivate": the experiments' heuristic (seed 000 Sec. 5: C = the median per-example
  gradient norm of the current batch, per client and step). The bound then depends on the data, which the privacy
  analysis does not cover: the noise is still added (scaled to that C) but the run's events are NonPrivate, so every
  observer's epsilon is reported as infinite (null in JSON), and a warning says why. Never the default.

Control variates are post-processing of the noisy gradients (Noble et al. 2022, Claim 4.1), so every variant releases
the same mechanism per local step, ``step_noise_event``, towards an observer of one client's messages. Towards an
observer of the aggregate they differ: another client's noise share hides the owner's draw only if nothing computed
afterwards depends on it (``additive_steps``).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import local_steps_additive
from dpfl.engine.grads import CohortGradients
from dpfl.engine.noise import GaussianMechanism
from dpfl.engine.sampling import RecordSampler
from dpfl.errors import ConfigError, check_range


@dataclass
class ServerState:
    x: torch.Tensor  # [P] global model
    c: torch.Tensor  # [P] server control variate (zeros when unused)
    client_c: torch.Tensor | None  # [M, P] client control variates c_i (None when unused)


@dataclass
class CohortData:
    """The train split of this round's cohort: x [clients, max_records, ...], y [clients, max_records], counts."""

    x: torch.Tensor
    y: torch.Tensor
    counts: torch.Tensor

    def batch(self, indices: torch.Tensor):
        """Each client's records at ``indices`` [clients, b]: one index_select on the flattened arrays."""
        clients, width = self.x.shape[0], self.x.shape[1]
        flat = (indices + width * torch.arange(clients).unsqueeze(1)).reshape(-1)
        xb = self.x.reshape(clients * width, *self.x.shape[2:]).index_select(0, flat)
        yb = self.y.reshape(-1).index_select(0, flat)
        return xb.reshape(*indices.shape, *self.x.shape[2:]), yb.reshape(indices.shape)


@dataclass(frozen=True)
class LocalSGD:
    """The FedAvg/FedSGD/SCAFFOLD family (see the module docstring for the equations)."""

    local_steps: int
    lr: float
    sampler: RecordSampler
    mechanism: GaussianMechanism
    clip: float | None = None
    global_lr: float = 1.0
    weight_decay: float = 0.0
    control_variates: bool = False
    move_locally: bool = True
    warm_rounds: int = 0
    clip_heuristic: str = "fixed"

    def __post_init__(self):
        if self.clip_heuristic not in CLIP_HEURISTICS:
            raise ConfigError("algorithm.clip_heuristic", self.clip_heuristic, f"one of {list(CLIP_HEURISTICS)}")
        if self.clip_heuristic == "median-nonprivate":
            warnings.warn("algorithm.clip_heuristic = 'median-nonprivate' clips at a data-dependent bound (the batch's "
                          "median gradient norm): the run is NOT differentially private and reports epsilon = inf",
                          stacklevel=2)
        check_range("algorithm.local_steps", self.local_steps, 1, integer=True)
        check_range("algorithm.lr", self.lr, 0.0, low_open=True)
        check_range("algorithm.global_lr", self.global_lr, 0.0, low_open=True)
        check_range("algorithm.weight_decay", self.weight_decay, 0.0)
        if self.clip is not None:
            check_range("algorithm.clip", self.clip, 0.0, low_open=True)
        if self.mechanism.is_private and self.clip is None:
            raise ConfigError("algorithm.clip", None, "a positive clip norm C when noise_multiplier > 0")

    @property
    def local_lr(self) -> float:
        """eta_l = eta0 / (s K) (seed 000 Sec. 5)."""
        return self.lr / (self.sampler.rate * self.local_steps)

    @property
    def step_noise_event(self) -> dp_event.DpEvent:
        """The noise mechanism of one local step of one client, in units of its sensitivity."""
        if self.clip_heuristic == "median-nonprivate":
            return dp_event.NonPrivateDpEvent()
        return self.mechanism.event

    @property
    def additive_steps(self) -> tuple[bool, ...]:
        """Which local steps' noise enters the round's aggregate additively with nothing computed after it, in this
        round or a later one (``dpfl.accounting.observers.local_steps_additive``): the last step of FedAvg, every step
        of FedSGD, none of SCAFFOLD (c_i carries the noisy steps into later rounds)."""
        return local_steps_additive(self.local_steps, self.move_locally, carries_noise=self.control_variates)

    def init_state(self, x0: torch.Tensor, num_clients: int) -> ServerState:
        client_c = torch.zeros(num_clients, x0.shape[0]) if self.control_variates else None
        return ServerState(x0.clone(), torch.zeros_like(x0), client_c)

    def noisy_gradient(self, grads: CohortGradients, point, data: CohortData, generator):
        """H~ for every client of the chunk at ``point`` [clients, P]: one fresh minibatch, clip, mean, noise."""
        indices, mask = self.sampler.sample(data.counts, generator)
        xb, yb = data.batch(indices)
        divisor = self.sampler.divisor(data.counts).to(point.dtype).unsqueeze(1)
        clip = self.clip
        if self.clip_heuristic == "median-nonprivate":  # data dependent: see the module docstring
            norms = grads.example_norms(point, xb, yb, mask).masked_fill(mask == 0, float("nan"))
            clip = torch.nanmedian(norms, dim=1).values
        mean = grads.clipped_sum(point, xb, yb, mask, clip) / divisor
        event = self.mechanism.event  # the event of the noise actually drawn (checked against the declaration)
        if self.mechanism.is_private:
            mean, event = self.mechanism(mean, self.sampler.mean_sensitivity(clip, data.counts), generator)
        if self.weight_decay:
            mean = mean + self.weight_decay * point
        return mean, event

    def client_round(self, state: ServerState, cohort: torch.Tensor, data: CohortData, grads, generator, warm: bool):
        """K local steps for the clients ``cohort`` (one chunk). Returns (dy, dc, events)."""
        n, P = cohort.shape[0], state.x.shape[0]
        x = state.x.unsqueeze(0).expand(n, P)
        y = x.clone()
        h_sum = torch.zeros(n, P)
        move = self.move_locally and not warm
        correction = (state.c.unsqueeze(0) - state.client_c[cohort]) if self.control_variates else None
        events = []
        for _ in range(self.local_steps):
            h, event = self.noisy_gradient(grads, y if move else x, data, generator)
            events.append(event)
            h_sum += h
            if move:
                y -= self.local_lr * (h if correction is None else h + correction)
        h_mean = h_sum / self.local_steps
        if warm:
            dy = torch.zeros_like(y)
        elif move:
            dy = y - x
        else:
            dy = -self.local_lr * self.local_steps * h_mean
        dc = h_mean - state.client_c[cohort] if self.control_variates else None
        return dy, dc, events

    def server_update(self, state: ServerState, cohort: torch.Tensor, dy: torch.Tensor, dc: torch.Tensor | None):
        """x += eta_g mean(dy); c += (1/M) sum(dc); c_i += dc_i."""
        if cohort.numel() == 0:
            return
        state.x += self.global_lr * dy.mean(0)
        if self.control_variates:
            state.client_c[cohort] += dc
            state.c += dc.sum(0) / state.client_c.shape[0]


CLIP_HEURISTICS = ("fixed", "median-nonprivate")
ALGORITHMS = ("fedavg", "fedsgd", "scaffold", "scaffold-warm", "dp-fedavg", "dp-fedsgd", "dp-scaffold",
              "dp-scaffold-warm")


def build_local_sgd(name: str, *, local_steps: int, lr: float, sampler: RecordSampler, client_rate: float,
                    clip: float | None, noise_multiplier: float, global_lr: float = 1.0,
                    weight_decay: float = 0.0, clip_heuristic: str = "fixed") -> LocalSGD:
    """Maps an algorithm name of the config to its switches. Non-DP names ignore clip and noise."""
    if name not in ALGORITHMS:
        raise ConfigError("algorithm.name", name, f"one of {list(ALGORITHMS)}")
    private = name.startswith("dp-")
    base = name.removeprefix("dp-")
    if private:
        check_range("algorithm.noise_multiplier", noise_multiplier, 0.0, low_open=True)
        if clip is None:
            raise ConfigError("algorithm.clip", None, f"a positive clip norm C for {name}")
    return LocalSGD(
        local_steps=local_steps,
        lr=lr,
        sampler=sampler,
        mechanism=GaussianMechanism(noise_multiplier if private else 0.0),
        clip=clip if private else None,
        global_lr=global_lr,
        weight_decay=weight_decay,
        control_variates=base.startswith("scaffold"),
        move_locally=base != "fedsgd",
        warm_rounds=round(4 / client_rate) if base == "scaffold-warm" else 0,
        clip_heuristic=clip_heuristic if private else "fixed",
    )
