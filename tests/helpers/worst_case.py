"""A worst-case instance run through the real ``LocalSGD`` code, and its Gaussian privacy measured and derived.

A counterexample to "noise credited from other clients at every local step" (Noble et al. 2022, App. B; Heikkilä 2024,
Lemma 4.6 / Thm 4.7 for S > 1): a cohort of n clients runs K local steps of noisy SGD (s = 1: every client's whole
data is its batch of b records, so no record sampling). The record's owner (client 0) has linear losses <theta, v_j>
(gradient v_j, ||v_j|| <= C; on the neighbouring dataset one record's v = +C becomes v = -C: the batch mean moves by
2C/b = Delta, the replace-one sensitivity). Every other client has quadratic losses ||theta - a_j||^2 / (2 eta_l) with
a_j = x, the round's start point: its gradient (y - x) / eta_l pulls the iterate back to x in one step, y <- y - eta_l
((y - x)/eta_l + xi_k) = x - eta_l xi_k, so its update y_K - x = -eta_l xi_{K-1} keeps only its LAST noise draw. In
units of the step noise std z Delta:

    owner:       dy_0 = -eta_l (K gbar + xi_0 + ... + xi_{K-1})     shift eta_l K Delta, variance eta_l^2 K
    other i:     dy_i = -eta_l xi_{i, K-1}                          variance eta_l^2

so the observers see Gaussian mechanisms with (mu = shift / std, mu-GDP; Dong, Roth, Su 2019)

    (a) sum of the cohort's dy (third party, or a secure-aggregation server):  mu = K / (z sqrt(K + n - 1))
    (b) the sum minus another silo's own dy:                                    mu = K / (z sqrt(K + n - 2))
    (c) the owner's dy alone (plain server):                                    mu = sqrt(K) / z

For n = 20, K = 50, z = 10 (docs/accounting.md, section 1): 0.6019, 0.6063, 0.7071, while crediting every step with
the noise of the whole cohort (z sqrt(n) per step) claims mu = sqrt(K) / (z sqrt(n)) = 0.1581. FedSGD
(``move_locally=False``) evaluates all K gradients at x, so every noise draw of every client reaches the sum: (a)
sqrt(K / n) / z = 0.1581, (b) sqrt(K / (n - 1)) / z = 0.1622, (c) sqrt(K) / z = 0.7071.

DP-SCAFFOLD (Noble et al. 2022, Alg. 1) also sends dc = c_i+ - c_i, c_i+ the mean of the K noisy gradients. In its
first round c = c_i = 0, so the local steps are FedAvg's and c_i+ = (x - y) / (K eta_l): dc = -dy / (K eta_l), a
function of dy, and every observer's view is FedAvg's (a)-(c). SCAFFOLD-warm's warm rounds (4 / l of them) leave x
unchanged (dy = 0) and send dc = the mean of K noisy gradients at x: FedSGD's -dy / (K eta_l), so FedSGD's (a)-(c)
(``scaffold_view`` maps the messages to that dy; tests/privacy/test_worst_case_engine.py checks it on the engine).

Clipping must not bind on the quadratic clients, or their erasure is partial and their updates non-Gaussian: their
per-example gradient (y - x)/eta_l = -xi_{k-1} has std z 2C / b = 20 / b (C = 1, z = 10). With b = 20 (std 1 = C)
it binds on about a third of the steps (measured: 6.7M of 19M per-example gradients), so FedAvg uses b = 120
(std 1/6: binding needs a 6-sigma draw, ~2e-9 per draw; the oracle counts and the tests require zero). FedSGD's
quadratic gradients are exactly 0 (evaluated at x = a_j), so it keeps b = 20.

Measurement (``measure``): trials sit on the client axis (a cohort of n T clients, reshaped to [T, n, P]) and one
``LocalSGD.client_round`` call runs them all. The shift between the datasets is measured with common random
numbers: both datasets run with the same seed, so the same noise; the per-trial difference of each statistic is
constant (its spread is float round-off, which also shows the two output laws are translates of each other) and
equals the exact shift. The noise std is the sample std of one large run, with a chi-square confidence interval
(the statistics are sums of Gaussians); mu's interval is shift / (that interval). torch is imported lazily (the
module's analytic part serves torch-free tests).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math

from scipy import stats

VIEWS = ("sum", "sum_minus_other", "owner")


@dataclasses.dataclass(frozen=True)
class EngineInstance:
    """The instance of the module docstring. ``records`` is b, each client's record count = batch size."""

    move_locally: bool = True
    num_clients: int = 20
    local_steps: int = 50
    noise_multiplier: float = 10.0
    clip: float = 1.0
    local_lr: float = 0.01
    records: int = 120
    control_variates: bool = False
    warm_rounds: int = 0

    @property
    def name(self) -> str:
        if self.control_variates:
            return "scaffold-warm" if self.warm_rounds else "scaffold"
        return "fedavg" if self.move_locally else "fedsgd"


FEDAVG = EngineInstance(move_locally=True, records=120)
FEDSGD = EngineInstance(move_locally=False, records=20)
#: DP-SCAFFOLD's first round (c = c_i = 0) on FedAvg's instance, and SCAFFOLD-warm's first warm round (4 / l of
#: them at l = 1) on FedSGD's: their messages are functions of the instance's dy (``scaffold_view``)
SCAFFOLD = dataclasses.replace(FEDAVG, control_variates=True)
SCAFFOLD_WARM = dataclasses.replace(FEDSGD, control_variates=True, warm_rounds=4)


def analytic_mu(instance: EngineInstance, view: str) -> float:
    """mu of ``view`` ("sum", "sum_minus_other", "owner") derived in the module docstring."""
    k, n, z = instance.local_steps, instance.num_clients, instance.noise_multiplier
    if view not in VIEWS:
        raise ValueError(f"view = {view!r} is not allowed: expected one of {VIEWS}")
    if view == "owner":
        return math.sqrt(k) / z
    shares = n if view == "sum" else n - 1  # clients whose noise reaches the statistic
    if instance.move_locally and not instance.warm_rounds:  # the owner's K draws, one (the last) of every other one
        return k / (z * math.sqrt(k + shares - 1))
    return math.sqrt(k / shares) / z


def scaffold_view(instance: EngineInstance, messages: dict) -> "torch.Tensor":
    """The dy of FedAvg (SCAFFOLD's first round) or FedSGD (a warm round) that SCAFFOLD's dc determines:
    -K eta_l dc (module docstring)."""
    return -instance.local_steps * instance.local_lr * messages["dc"]


def paper_mu(instance: EngineInstance, view: str) -> float:
    """mu claimed by crediting every local step with the noise of every client in the statistic."""
    k, n, z = instance.local_steps, instance.num_clients, instance.noise_multiplier
    shares = {"sum": n, "sum_minus_other": n - 1, "owner": 1}[view]
    return math.sqrt(k / shares) / z


@dataclasses.dataclass(frozen=True)
class Measurement:
    """mu = shift / std of one view, with its confidence interval [low, high]."""

    view: str
    mu: float
    low: float
    high: float
    shift: float  # the exact (coupled) mean difference between the datasets
    shift_spread: float  # std over trials of the coupled difference (float round-off: a pure translate)
    std: float  # the sample std of the statistic
    trials: int
    clipped: int  # per-example gradients of the quadratic clients whose clipping bound (C) was active


class LinearQuadraticOracle:
    """Duck-typed ``CohortGradients`` for ``LocalSGD``: per-record losses chosen by a flag in y.

    y = 0: linear loss <theta, x_j>, gradient x_j (the caller keeps ||x_j|| <= C).
    y = 1: quadratic loss ||theta - x_j||^2 / (2 eta), gradient (theta - x_j) / eta.
    Per-example gradients are clipped like the real engine, g min(1, C / ||g||), and summed over the mask.
    ``clipped`` counts the quadratic records' gradients that the clipping actually shrank.
    """

    def __init__(self, dim: int, eta: float):
        self.dim, self.eta, self.clipped = dim, eta, 0

    def initial_params(self):
        import torch

        return torch.zeros(self.dim)

    def _gradients(self, theta, x, y):
        import torch

        linear = (y == 0).unsqueeze(-1)
        return torch.where(linear, x.to(theta.dtype), (theta.unsqueeze(1) - x) / self.eta), linear

    def example_norms(self, theta, x, y, mask):
        return self._gradients(theta, x, y)[0].norm(dim=-1)

    def clipped_sum(self, theta, x, y, mask, clip):
        import torch

        g, linear = self._gradients(theta, x, y)
        if clip is not None:
            clip = torch.as_tensor(clip, dtype=g.dtype)
            clip = clip.reshape(-1, 1, 1) if clip.ndim else clip
            norm = g.norm(dim=-1, keepdim=True)
            over = norm > clip
            self.clipped += int((over & ~linear & (mask.unsqueeze(-1) > 0)).sum())
            g = torch.where(over, g * (clip / norm), g)
        return (g * mask.unsqueeze(-1).to(g.dtype)).sum(1)


def build_algorithm(instance: EngineInstance):
    """The ``LocalSGD`` of the instance (FedAvg, FedSGD or SCAFFOLD(-warm), s = 1: every record in every step)."""
    from dpfl.algorithms.local_sgd import LocalSGD
    from dpfl.engine.sampling import RecordSampler
    from dpfl.noise import GaussianMechanism

    sampler = RecordSampler(1.0)
    k = instance.local_steps
    algorithm = LocalSGD(local_steps=k, lr=instance.local_lr * sampler.rate * k, sampler=sampler,
                         mechanism=GaussianMechanism(instance.noise_multiplier), clip=instance.clip,
                         move_locally=instance.move_locally, control_variates=instance.control_variates,
                         warm_rounds=instance.warm_rounds)
    assert math.isclose(algorithm.local_lr, instance.local_lr)
    return algorithm


def claimed_epsilon(instance: EngineInstance, boundary: str, delta: float) -> dict[str, float]:
    """The ledger's epsilon towards each observer of ``boundary`` after one round of the whole cohort, as the
    simulator declares and accounts it (``declared_epsilon``)."""
    from dpfl.algorithms.registry import Setting
    from dpfl.engine.boundary import Boundary
    from dpfl.engine.sampling import ClientSampler
    from dpfl.experiments.noise_level import declared_epsilon

    n = instance.num_clients
    setting = Setting(client_rate=1.0, num_clients=n, train_counts=(instance.records,) * n, rounds=1, delta=delta)
    return declared_epsilon(build_algorithm(instance), setting, Boundary(boundary), ClientSampler(n, 1.0))


def run_round(instance: EngineInstance, trials: int, sign: float, seed: int):
    """One ``LocalSGD.client_round`` for ``trials`` independent copies of the instance (client axis).

    ``sign`` = +1 or -1: the owner's differing record has v = sign C. Returns (dy [trials, n, 1], oracle).
    """
    messages, oracle = round_messages(instance, trials, sign, seed)
    return messages["dy"], oracle


def round_messages(instance: EngineInstance, trials: int, sign: float, seed: int):
    """``run_round``'s round: (every message {dy[, dc]} [trials, n, 1], oracle)."""
    import torch

    from dpfl.engine.protocol import ClientContext, ClientData

    n, b, k = instance.num_clients, instance.records, instance.local_steps
    algorithm = build_algorithm(instance)
    clients = n * trials
    x = torch.zeros(clients, b, 1)  # quadratic clients: a_j = x = 0; the owner: v_j = 0 but for record 0
    y = torch.ones(clients, b, dtype=torch.long)
    y[::n] = 0  # client 0 of every trial is the owner, with linear losses
    x[::n, 0, 0] = sign * instance.clip
    data = ClientData(x, y, torch.full((clients,), b))
    oracle = LinearQuadraticOracle(1, instance.local_lr)
    state = algorithm.init_state(oracle.initial_params(), clients)
    ids = torch.arange(clients)
    out = algorithm.client_round(0, state.server, state.rows(ids), data, ClientContext(oracle, seed, 0, ids))
    assert len(out.events) == k
    return {key: value.reshape(trials, n, 1).double() for key, value in out.messages.items()}, oracle


def _statistics(dy):
    total = dy.sum(dim=1)[:, 0]
    return {"sum": total, "sum_minus_other": total - dy[:, 1, 0], "owner": dy[:, 0, 0]}


@contextlib.contextmanager
def one_thread():
    """torch on one intra-op thread inside the block (more cost than gain on these small tensors), the thread count
    restored after."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=8)
def measure(instance: EngineInstance, trials: int = 1200, coupled_trials: int = 16, seed: int = 2024,
            alpha: float = 1e-4) -> dict:
    """Measured mu of every view, with a (1 - alpha) confidence interval. Cached (deterministic for a seed).

    Runs single-threaded (torch intra-op threads cost more than they give on these small tensors), restoring the
    thread count after.
    """
    with one_thread():
        dy, oracle = run_round(instance, trials, +1.0, seed)
        dy_plus, oracle_plus = run_round(instance, coupled_trials, +1.0, seed + 1)
        dy_minus, oracle_minus = run_round(instance, coupled_trials, -1.0, seed + 1)
    clipped = oracle.clipped + oracle_plus.clipped + oracle_minus.clipped
    big, plus, minus = _statistics(dy), _statistics(dy_plus), _statistics(dy_minus)
    upper_q = stats.chi2.ppf(1 - alpha / 2, trials - 1)
    lower_q = stats.chi2.ppf(alpha / 2, trials - 1)
    out = {}
    for view in VIEWS:
        difference = minus[view] - plus[view]
        shift = abs(float(difference.mean()))
        std = float(big[view].std())
        std_low, std_high = std * math.sqrt((trials - 1) / upper_q), std * math.sqrt((trials - 1) / lower_q)
        out[view] = Measurement(view, shift / std, shift / std_high, shift / std_low, shift,
                                float(difference.std()), std, trials, clipped)
    return out


__all__ = ["VIEWS", "EngineInstance", "FEDAVG", "FEDSGD", "SCAFFOLD", "SCAFFOLD_WARM", "analytic_mu", "paper_mu",
           "scaffold_view", "Measurement", "LinearQuadraticOracle", "build_algorithm", "claimed_epsilon", "run_round",
           "round_messages", "measure"]
