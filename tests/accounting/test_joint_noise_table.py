"""Seed 002 (Heikkila, joint noise with secure aggregation), Table 1 and the experiments' per-client noise.

Poisson-subsampled Gaussian RDP (q = 0.1), composed over 1 step / 1 epoch (10 steps) / 5 epochs (50 steps), classic
conversion over integer orders 2..255, delta = 1e-5: sigma_LDP gives each local model eps = 5, and averaging
``parties`` models has noise multiplier sqrt(parties) sigma_LDP.
"""

import math

import numpy as np
import pytest
from dp_accounting import dp_event
from scipy.optimize import brentq

from dpfl.accounting.conversion import rdp_to_epsilon
from dpfl.accounting.rdp import rdp_curve

ORDERS = np.arange(2, 256, dtype=float)
SEARCH_ORDERS = ORDERS[:63]  # 2..64 (fast): the optimal orders here are small; `calibrate` checks on 2..255
DELTA = 1e-5


def epsilon(sigma: float, q: float, steps: int, orders=ORDERS) -> float:
    step = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(sigma))
    return rdp_to_epsilon(orders, rdp_curve(dp_event.SelfComposedDpEvent(step, steps), orders), DELTA, "classic")[0]


def calibrate(target: float, q: float, steps: int, low: float, high: float) -> float:
    sigma = brentq(lambda s: epsilon(s, q, steps, SEARCH_ORDERS) - target, low, high, xtol=1e-6)
    assert epsilon(sigma, q, steps) == pytest.approx(target, abs=1e-4)  # same answer over all orders 2..255
    return sigma


# steps -> [(parties, sigma_total, avg model eps)]
TABLE_1 = {
    1: [(1, 0.69, 5.0), (2, 0.98, 2.78), (5, 1.54, 1.22), (10, 2.18, 0.64)],
    10: [(1, 0.90, 5.0), (2, 1.28, 2.61), (5, 2.02, 1.19), (10, 2.85, 0.72)],
    50: [(1, 1.18, 5.0), (2, 1.67, 2.85), (5, 2.64, 1.55), (10, 3.73, 1.03)],
}
SIGMA_LDP = {1: 0.690, 10: 0.902, 50: 1.179}  # notes 002 write 1.175 for 50 steps; the table's 1.18/1.67 need 1.179


@pytest.mark.parametrize("steps", sorted(TABLE_1))
def test_table_1(steps):
    sigma_ldp = calibrate(5.0, 0.1, steps, 0.98 * SIGMA_LDP[steps], 1.02 * SIGMA_LDP[steps])
    assert sigma_ldp == pytest.approx(SIGMA_LDP[steps], abs=5e-4)
    for parties, sigma_total, avg_eps in TABLE_1[steps]:
        total = math.sqrt(parties) * sigma_ldp
        assert round(total, 2) == pytest.approx(sigma_total)
        assert round(epsilon(total, 0.1, steps), 2) == pytest.approx(avg_eps)


# (setting, q, compositions T*S, sigma_total at eps = 1)
PER_CLIENT = [
    ("FMNIST 1 step", 128 / 5600, 20, 1.3682),
    ("FMNIST 1 epoch", 512 / 5600, 220, 6.8221),
    ("CIFAR 1 step", 128 / 4800, 20, 1.4140),
    ("CIFAR 1 epoch", 256 / 4800, 380, 5.2540),
    ("Income 1 step", 0.05, 10, 1.6201),
    ("Income 1 epoch", 0.05, 200, 3.6883),
]


@pytest.mark.parametrize("name, q, compositions, sigma_total", PER_CLIENT, ids=[p[0] for p in PER_CLIENT])
def test_experiment_noise(name, q, compositions, sigma_total):
    sigma = calibrate(1.0, q, compositions, 0.98 * sigma_total, 1.02 * sigma_total)
    assert sigma == pytest.approx(sigma_total, abs=5e-4)
