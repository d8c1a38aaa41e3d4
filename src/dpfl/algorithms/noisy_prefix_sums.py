"""FTRL on noisy prefix sums of the clients' clipped updates: what DP-FTRL's tree (Kairouz et al. 2021,
``dpfl.algorithms.dp_ftrl``) and BandMF's banded factorization (Choquette-Choo et al. 2023, ``dpfl.algorithms.bandmf``)
share.

Both are matrix-factorization mechanisms (Denisov, McMahan, Rush, Smith, Thakurta 2022, "Improved Differential
Privacy for SGD via Optimal Private Linear Operators on Adaptive Streams"). Round t's cohort sends its clients'
updates clipped to l2 norm C (K local SGD steps of floor(s n_i) records from the broadcast x_{t-1}),

    u_i = clip_C(x_{t-1} - y_i),     g_t = sum_{i in C_t} u_i,

and the server releases the noisy prefix sums of g through a factorization A = B C of the prefix-sum matrix A (lower
triangular ones): A g + B nu = B (C g + nu), nu_t ~ N(0, (z Delta)^2 I) one fresh draw per round, so the data enter
only through C g + nu, a Gaussian mechanism (B is post-processing). The released model is FTRL with the quadratic
regulariser around the anchor x_a (Kairouz et al. 2021, Algorithm 1 without momentum):

    x_t = x_a - (eta / n) (A g + B nu)_t,  i.e.  x_t = x_{t-1} - (eta / n) (g_t + e_t),  e_t = (B nu)_t - (B nu)_{t-1},

n = floor(l M) the public cohort size. What differs between the mechanisms is the factor: how the round's noise e_t
follows from the fresh draw nu_t and the server's record of its earlier draws (``round_noise``), the sensitivity
Delta of one draw (``draw_sensitivity``) and the event it is declared as (``draw_event``). The server's state holds
the released x and that record of its own noise, never a raw partial sum of the clients' updates
(``dpfl.accounting.observers``, "The server's own noise"). The clients' side (``client_round``) is the same for
both.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass, field

import torch
from dp_accounting import dp_event

from dpfl.accounting.units import USER_LEVEL
from dpfl.algorithms.registry import Setting
from dpfl.engine.boundary import Delivery
from dpfl.engine.protocol import Algorithm, ClientContext, ClientData, ClientOutput, ServerContext, State
from dpfl.engine.sampling import RecordSampler
from dpfl.errors import ConfigError, check_noise_multiplier, check_range
from dpfl.noise import gaussian_noise


@dataclass(frozen=True)
class PrefixSumFtrl(Algorithm):
    """FTRL on the noisy prefix sums of a factorization (module docstring); a subclass names its factor."""

    local_steps: int  # K
    lr: float  # the client's local step
    sampler: RecordSampler  # each local step's minibatch
    clip: float  # C, the bound on each client's update
    noise_multiplier: float  # z, each fresh draw's std over its sensitivity Delta
    global_lr: float  # eta
    population: int  # M
    cohort_size: int  # n = floor(l M), the public divisor of the sum

    neighboring = "zero_out"
    privacy_unit = USER_LEVEL

    # -- what a factorization names --------------------------------------------------------------------------------
    @abstractmethod
    def draw_event(self, round_index: int) -> dp_event.DpEvent:
        """The event round ``round_index``'s fresh draw is declared (and reported) as."""

    @property
    @abstractmethod
    def draw_sensitivity(self) -> float:
        """Delta: the fresh draw's std is z Delta."""

    @abstractmethod
    def noise_state(self, x0: torch.Tensor) -> dict[str, torch.Tensor]:
        """The server's record of its own earlier draws at the start (beside x)."""

    @abstractmethod
    def round_noise(self, round_index: int, draw: torch.Tensor, server: dict) -> tuple[torch.Tensor, dict]:
        """(e_t, the updated record) from round t's fresh draw nu_t and the record in ``server``."""

    # -- the protocol -------------------------------------------------------------------------------------------
    def init_state(self, x0: torch.Tensor, num_clients: int) -> State:
        return State({"x": x0.clone(), **self.noise_state(x0)})

    def examples_per_client(self, counts: torch.Tensor) -> int:
        return int(self.sampler.batch_sizes(counts).max())

    def message_bound(self, counts: torch.Tensor) -> dict[str, float]:
        """Every coordinate of an update clipped to norm C is at most C in magnitude."""
        return {"u": self.clip}

    def client_round(self, round_index: int, server: dict, clients: dict, data: ClientData,
                     ctx: ClientContext) -> ClientOutput:
        """K local SGD steps from x, then u_i = clip_C(x - y_i): {u}. The server state may carry a leading row
        axis (one server state per row: ``dpfl.engine.protocol``)."""
        x = server["x"]
        n, P = data.counts.shape[0], x.shape[-1]
        keys = ctx.streams("records").uniform([(self.local_steps, int(c)) for c in data.counts.tolist()])
        divisor = self.sampler.divisor(data.counts).to(x.dtype).unsqueeze(1)
        start = x.expand(n, P)
        y = start.clone()
        for k in range(self.local_steps):
            indices, mask = self.sampler.sample(data.counts, keys[:, k])
            xb, yb = data.batch(indices)
            y = y - self.lr * ctx.grads.clipped_sum(y, xb, yb, mask, None) / divisor
        return ClientOutput({"u": clip_rows(start - y, self.clip)}, {}, [dp_event.NonPrivateDpEvent()])

    def server_update(self, round_index: int, server: dict, delivered: Delivery, ctx: ServerContext) -> dict:
        """Draws nu_t ~ N(0, (z Delta)^2 I) from the server's stream, turns it into the round's noise e_t
        (``round_noise``) and steps x by -eta/n (g_t + e_t); row-wise where the state carries a leading row axis."""
        x = server["x"]
        normals = ctx.streams("server_noise").normal(tuple(x.shape[-1:])).reshape(-1, x.shape[-1])
        draw = gaussian_noise(dp_event.GaussianDpEvent(self.noise_multiplier),
                              torch.full((normals.shape[0],), self.draw_sensitivity), normals.to(x.dtype),
                              normals).reshape(x.shape)
        ctx.drew(self.draw_event(round_index))
        noise, record = self.round_noise(round_index, draw, server)
        total = delivered.sum("u") if delivered.count else torch.zeros_like(x)
        return {"x": x - (self.global_lr / self.cohort_size) * (total + noise), **record}


def clip_rows(v: torch.Tensor, bound: float) -> torch.Tensor:
    """clip_C(v) = v min(1, C / ||v||) row-wise (the last axis)."""
    norm = v.norm(dim=-1, keepdim=True)
    return v * torch.clamp(bound / norm.clamp(min=torch.finfo(v.dtype).tiny), max=1.0)


@dataclass(frozen=True)
class PrefixSumFtrlConfig:
    """The ``[algorithm]`` keys every prefix-sum FTRL family has (beyond name, rounds, client_rate and
    client_sampling); a family restates ``noise_multiplier`` with its own help."""

    local_steps: int = field(default=1, metadata={"help": "K, local SGD steps of each client per round", "min": 1})
    sample_rate: float = field(default=0.5, metadata={"help": "s, each local step's minibatch is floor(s n_i) records"})
    lr: float = field(default=0.5, metadata={"help": "the client's local SGD step size"})
    #: eta = 0.1 by default: at 1, a minimal config on digits diverges within 3 rounds at z = 1 (each round moves x by
    #: eta / n times noise of std about z C); at 0.1 it trains (benchmarks/default_sweep.py)
    global_lr: float = field(default=0.1, metadata={"help": "eta, the FTRL step: x_t = x_a - eta (noisy prefix sum of "
                                                            "the clipped updates) / n"})
    clip: float = field(default=1.0, metadata={"help": "C, the l2 bound on each client's whole update (user level)"})
    noise_multiplier: float | None = None


def check_section(name: str, config: PrefixSumFtrlConfig, setting: Setting) -> None:
    """ConfigError naming the key of a shared key out of its range, or of an analysis other than 'sound'."""
    if setting.analysis != "sound":
        raise ConfigError("privacy.analysis", setting.analysis, f"'sound' for {name!r} (the paper analysis is Noble "
                                                                "et al.'s, for DP-SCAFFOLD)")
    check_range("algorithm.local_steps", config.local_steps, 1, integer=True)
    check_range("algorithm.lr", config.lr, 0.0, low_open=True)
    check_range("algorithm.global_lr", config.global_lr, 0.0, low_open=True)
    check_range("algorithm.clip", config.clip, 0.0, low_open=True)
    if config.noise_multiplier is not None:
        check_noise_multiplier("algorithm.noise_multiplier", config.noise_multiplier)


def shared_fields(config: PrefixSumFtrlConfig, setting: Setting, default_noise: float) -> dict:
    """The ``PrefixSumFtrl`` fields a section sets but the population and cohort (the family's client sampler)."""
    return {"local_steps": config.local_steps, "lr": config.lr, "sampler": RecordSampler(config.sample_rate, "fixed"),
            "clip": config.clip, "noise_multiplier": setting.noise_multiplier(config.noise_multiplier, default_noise),
            "global_lr": config.global_lr}


__all__ = ["PrefixSumFtrl", "clip_rows", "PrefixSumFtrlConfig", "check_section", "shared_fields"]
