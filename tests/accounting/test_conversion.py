"""RDP -> DP conversions (dpfl.accounting.conversion): classic (Mironov 2017 Prop. 3) and modern (Balle et al. 2020)."""

import math

import numpy as np
import pytest
from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS, compute_epsilon

from dpfl.accounting.conversion import CONVERSIONS, rdp_to_epsilon
from dpfl.errors import ConfigError

ORDERS = np.array(DEFAULT_RDP_ORDERS, dtype=float)
GAUSSIAN_1 = ORDERS / 2  # RDP of the Gaussian mechanism with noise multiplier 1


def test_classic_on_gaussian_curve():
    epsilon, order = rdp_to_epsilon(ORDERS, GAUSSIAN_1, 1e-5)
    assert order == pytest.approx(5.8)
    assert epsilon == pytest.approx(5.8 / 2 + math.log(1e5) / 4.8)
    # the continuous optimum 1/2 + sqrt(2 log(1/delta)) is a lower bound a fine grid nearly attains
    assert 0.5 + math.sqrt(2 * math.log(1e5)) <= epsilon < 0.5 + math.sqrt(2 * math.log(1e5)) + 1e-3


def test_modern_is_dp_accountings_and_tighter():
    epsilon, order = rdp_to_epsilon(ORDERS, GAUSSIAN_1, 1e-5, "modern")
    assert epsilon == pytest.approx(4.7285, abs=1e-4)  # anchors: Gaussian sigma=1, delta=1e-5, RDP 4.7285
    assert (epsilon, order) == pytest.approx(compute_epsilon(ORDERS, GAUSSIAN_1, 1e-5))
    assert epsilon < rdp_to_epsilon(ORDERS, GAUSSIAN_1, 1e-5, "classic")[0]


@pytest.mark.parametrize("conversion", CONVERSIONS)
@pytest.mark.parametrize(
    "rdp",
    [
        np.zeros(len(ORDERS)),
        np.full(len(ORDERS), -1e-3),
        np.where(ORDERS < 3, np.nan, 1e-9),
        np.where(ORDERS < 3, np.inf, ORDERS / 2),
    ],
)
def test_never_negative_or_nan(rdp, conversion):
    epsilon, order = rdp_to_epsilon(ORDERS, rdp, 1e-5, conversion)
    assert epsilon >= 0 and not math.isnan(epsilon)
    assert order in ORDERS


@pytest.mark.parametrize("conversion", CONVERSIONS)
def test_all_infinite_gives_infinity(conversion):
    assert rdp_to_epsilon(ORDERS, np.full(len(ORDERS), np.inf), 1e-5, conversion)[0] == math.inf


def test_zero_curve_classic_is_the_delta_term_only():
    epsilon, order = rdp_to_epsilon(ORDERS, np.zeros(len(ORDERS)), 1e-5)
    assert order == ORDERS.max()
    assert epsilon == pytest.approx(math.log(1e5) / (ORDERS.max() - 1))


@pytest.mark.parametrize("delta", [0, 1, -0.1, 1.5, float("nan"), "1e-5"])
def test_bad_delta(delta):
    with pytest.raises(ConfigError, match="delta"):
        rdp_to_epsilon(ORDERS, GAUSSIAN_1, delta)


def test_bad_conversion_names_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"conversion = 'tight'.*classic.*modern"):
        rdp_to_epsilon(ORDERS, GAUSSIAN_1, 1e-5, "tight")


def test_bad_orders_and_shapes():
    with pytest.raises(ConfigError, match="orders"):
        rdp_to_epsilon([1.0, 2.0], [0.1, 0.2], 1e-5)
    with pytest.raises(ConfigError, match="rdp"):
        rdp_to_epsilon([2.0, 3.0], [0.1], 1e-5)
