"""Why SCAFFOLD-warm's warm rounds credit no other client's noise: the control variate c_i re-releases it.

The instance (tests/helpers/worst_case.py's, run through the real ``LocalSGD``): n clients, all in every round, K
local steps, s = 1 (each client's b records are its batch), noise multiplier z, local step eta_l, ONE warm round
(``warm_rounds = 1``) then one SCAFFOLD round. In units of the replace-one sensitivity Delta = 2C / b of a step's
mean gradient (so each step's noise xi is N(0, z^2)):

Warm round (Noble et al. 2022, Sec. 4: the start x0 stays; each client fits c_i = the mean of K noisy gradients at
x0): dy_i = 0, dc_i = c_i - 0, so an observer of the aggregate (a third party: x and c; a secure-aggregation server)
sees

    W = sum_i c_i = sum_i g_i(x0) + n_o + N,     n_o = xbar_o (variance z^2 / K),  N = sum_{j != o} xbar_j

FedSGD's view (``worst_case.SCAFFOLD_WARM``): taken alone, the owner's K draws are hidden by everyone's,
mu = sqrt(K / n) / z.

SCAFFOLD round (Alg. 1): from y_0 = x0, y_{k+1} = y_k - eta_l (H_k + c - c_i), H_k the noisy gradient at y_k, c = W / n;
then c_i+ = h_i = mean_k H_k, dc_i = h_i - c_i and dy_i = -eta_l sum_k (H_k + c - c_i) = -eta_l K (dc_i + c). So the
round's aggregate view is exactly H = sum_i h_i given W. The other clients have the quadratic losses
||theta - x0||^2 / (2 eta_l) (gradient 0 at x0: they add only noise to W), whose gradient (y - x0) / eta_l erases the
iterate: y_k - x0 = -eta_l (xi_{k-1} + c - c_j) for k >= 1, hence

    sum_k H_k = xi_{K-1} - (K - 1)(c - c_j),   h_j = xi_{K-1} / K + beta (c_j - c),   beta = (K - 1) / K,

and, as sum_{j != o} (c_j - c) = (W - c_o) - (n - 1) W / n = c - c_o,

    sum_{j != o} h_j = F + beta (c - c_o),     F = sum_{j != o} xi_{j, K-1} / K  (variance (n - 1) z^2 / K^2):

the other clients' round-2 messages re-release the owner's warm mean c_o with its OWN noise n_o alone (the shares N
cancel) plus fresh noise F of (n - 1) / K of n_o's variance. The owner has linear losses; its differing record (+C
against -C) has that gradient at x0 and the opposite one elsewhere (a record whose gradient flips with the model;
every y_k, k >= 1, differs from x0), so its own h_o moves by delta_2 = (1 - (K - 1)) / K, with noise e_o of variance
z^2 / K. W and H = h_o + F + beta (W / n - c_o) form a linear Gaussian mechanism whose noises are uncorrelated
(Cov(n_o + N, beta (N / n - (n - 1) n_o / n)) = beta (n - 1) z^2 / (n K) - beta (n - 1) z^2 / (n K) = 0):

    W: shift 1, variance n z^2 / K;   H: shift delta_2 - beta (n - 1) / n,
                                         variance z^2 (1 / K + (n - 1) / K^2 + beta^2 (n - 1) / (n K)),
    mu^2 = K / (n z^2) + (delta_2 - beta (n - 1) / n)^2 / Var H      (mu-GDP; Dong, Roth, Su 2022, Cor. 2.13)

(the quadratic clients' clipping never binds at b = 120, as in FedAvg's instance; ``measure`` counts it). For
n = 20, K = 50, z = 10 this gives mu = 0.897, while crediting the warm round with every client's share (FedSGD's
sqrt(K / n) / z = 0.158) and charging the SCAFFOLD round the owner's own K draws (sqrt(K) / z = 0.707) claims
sqrt(0.158^2 + 0.707^2) = 0.725: the credit would under-state the privacy loss. The ledger's claim (no credit: the
owner's 2K draws, sqrt(2K) / z = 1) holds. The warm round ALONE is FedSGD's view (the tightness table's 5.24x row,
exact for a run that stops there), but a ledger composes per-round events and never lowers a later epsilon, so a
credit given in the warm round could not be withdrawn when a later round re-releases c_o; under client sampling the
same happens within the warm rounds (a later warm round's dc_j = h_j - c_j subtracts the earlier c_j of every
client sampled again).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from worst_case import EngineInstance, LinearQuadraticOracle, build_algorithm, one_thread

#: the review's instance (n = 20, K = 50, z = 10) with FedAvg's b = 120 (clipping never binds), one warm round
INSTANCE = EngineInstance(move_locally=True, records=120, control_variates=True, warm_rounds=1)


def shifts(instance: EngineInstance) -> np.ndarray:
    """The owner's mean shift in (W, H), in units of Delta: (1, delta_2 - beta (n - 1) / n) (module docstring)."""
    n, k = instance.num_clients, instance.local_steps
    return np.array([1.0, (1 - (k - 1)) / k - (k - 1) / k * (n - 1) / n])


def covariance(instance: EngineInstance) -> np.ndarray:
    """The noise covariance of (W, H) in units of Delta: diagonal (module docstring)."""
    n, k, z = instance.num_clients, instance.local_steps, instance.noise_multiplier
    beta = (k - 1) / k
    return z**2 * np.diag([n / k, 1 / k + (n - 1) / k**2 + beta**2 * (n - 1) / (n * k)])


def exact_mu(instance: EngineInstance) -> float:
    """mu of the two-round aggregate view (W, H): sqrt(d^T S^-1 d), d = ``shifts``, S = ``covariance``."""
    d = shifts(instance)
    return float(np.sqrt(d @ np.linalg.solve(covariance(instance), d)))


class FlippingRecordOracle(LinearQuadraticOracle):
    """``LinearQuadraticOracle`` with one more flag: y = 2, a record whose gradient is x_j at theta = 0 (the start
    point x0) and -x_j anywhere else."""

    def _gradients(self, theta, x, y):
        import torch

        g, linear = super()._gradients(theta, x, torch.where(y == 2, torch.zeros_like(y), y))
        at_start = (theta == 0).all(dim=-1).reshape(-1, 1, 1)
        flip = (y == 2).unsqueeze(-1) & ~at_start
        return torch.where(flip, -g, g), linear | (y == 2).unsqueeze(-1)


def views(instance: EngineInstance, trials: int, sign: float, seed: int):
    """(W, H) [trials, 2] in units of Delta for ``trials`` copies of the instance (client axis), the owner's
    flipping record at x_0 = sign C, and the oracle (its ``clipped`` count)."""
    import torch

    from dpfl.engine.protocol import ClientContext, ClientData

    n, b = instance.num_clients, instance.records
    algorithm = build_algorithm(instance)
    clients = n * trials
    x = torch.zeros(clients, b, 1)
    y = torch.ones(clients, b, dtype=torch.long)  # quadratic clients anchored at x0 = 0
    y[::n] = 0  # the owner: linear losses with v_j = 0 ...
    y[::n, 0] = 2  # ... but its differing record, which flips
    x[::n, 0, 0] = sign * instance.clip
    data = ClientData(x, y, torch.full((clients,), b))
    oracle = FlippingRecordOracle(1, instance.local_lr)
    state = algorithm.init_state(oracle.initial_params(), clients)
    ids = torch.arange(clients)
    warm = algorithm.client_round(0, state.server, state.rows(ids), data, ClientContext(oracle, seed, 0, ids))
    unit = 2 * instance.clip / b
    w = warm.messages["dc"].double().reshape(trials, n).sum(1)  # c_i = 0 before: dc_i = c_i
    server = {"x": torch.zeros(clients, 1), "c": (w / n).repeat_interleave(n).unsqueeze(1).float()}
    second = algorithm.client_round(1, server, warm.state, data, ClientContext(oracle, seed, 1, ids))
    h = (second.messages["dc"] + warm.state["c"]).double().reshape(trials, n).sum(1)  # dc_i + c_i = h_i
    return (torch.stack([w, h], dim=1) / unit).numpy(), oracle


@dataclasses.dataclass(frozen=True)
class Measurement:
    shift: np.ndarray  # the coupled mean difference of (W, H) between the datasets, per Delta
    covariance: np.ndarray  # the sample covariance of (W, H)
    mu: float  # sqrt(shift^T covariance^-1 shift)
    clipped: int  # quadratic clients' per-example gradients that clipping shrank


def measure(instance: EngineInstance = INSTANCE, trials: int = 2000, coupled: int = 8, seed: int = 7) -> Measurement:
    """The law of (W, H) measured on the engine: the shift from coupled runs (same seed, the record at +C and -C),
    the covariance from ``trials`` copies."""
    with one_thread():
        big, oracle = views(instance, trials, +1.0, seed)
        plus, _ = views(instance, coupled, +1.0, seed + 1)
        minus, _ = views(instance, coupled, -1.0, seed + 1)
    shift = (plus - minus).mean(0)  # +C against -C moves a step's mean by 2C / b = Delta, one unit
    cov = np.cov(big.T)
    return Measurement(shift, cov, float(np.sqrt(shift @ np.linalg.solve(cov, shift))), oracle.clipped)
