"""projected-noisy-sgd's linear instance for the last-iterate analysis (Asoodeh et al. 2021): the algorithm, the
ledger's claim and the instance's exact epsilon; shared by tests/privacy/test_last_iterate_engine.py (which runs the
instance through the engine and measures mu) and benchmarks/tightness.py.

n users with one record each and linear losses (gradient v_j, |v_j| <= L = C), a ball the iterates never reach:
W_T = W_0 - sum_t eta (mean_{j in B_t} v_j + (sigma / m) sum_j Z_j) is Gaussian with variance T eta^2 sigma^2 / m
(T = n / m batches of m); the neighbour turns the owner's v = +L into -L, a shift 2 eta L / m. The last iterate is the
Gaussian mechanism with mu = 2L / (sigma sqrt(T m)) = 1 / (z sqrt(n)) (sigma = 2 L z), exactly mu-GDP (Dong, Roth,
Su 2022), whatever m.
"""

from __future__ import annotations

import math

from dpfl.accounting import accountants
from dpfl.accounting import last_iterate as li
from dpfl.algorithms import projected_noisy_sgd as pns
from dpfl.noise import GaussianMechanism


def algorithm(n: int, m: int, z: float, lr: float = 0.5, clip: float = 1.0) -> pns.ProjectedNoisySGD:
    """One pass of T = n // m disjoint batches of m users, the ball (radius 1e6) never binding."""
    return pns.ProjectedNoisySGD(population=n, batch_size=m, horizon=n // m, mechanism=GaussianMechanism(z),
                                 clip=clip, radius=1e6, lr=lr)


def claimed_epsilon(algorithm: pns.ProjectedNoisySGD, delta: float) -> float:
    """The ledger's claim: the last-iterate accountant over the run's declared hidden steps."""
    accountant = accountants.make("last_iterate", accountants.NeighborRel.REPLACE_ONE)
    for t in range(algorithm.horizon):
        accountant.compose(algorithm.release(t, None, None).hidden)
    return accountant.get_epsilon(delta)


def exact_mu(n: int, z: float) -> float:
    return 1 / (z * math.sqrt(n))


def exact_epsilon(mu: float, delta: float) -> float:
    """The exact epsilon of mu-GDP at ``delta`` (Asoodeh et al.'s theta_eps(mu), Lemma 1)."""
    return li.solve_epsilon(lambda eps: li.log_theta(eps, mu), delta)


__all__ = ["algorithm", "claimed_epsilon", "exact_mu", "exact_epsilon"]
