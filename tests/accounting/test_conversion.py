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


@pytest.mark.parametrize("conversion", ["classic", "modern"])
def test_nan_reads_as_no_bound(conversion):
    """Defect 8: a NaN in an RDP curve is 'no bound' (+inf), never 0. With NaN everywhere but one order, epsilon is
    that order's; with NaN everywhere, infinite. (Read as 0, NaN at the high orders would give a tiny epsilon.)"""
    orders = np.array([2.0, 8.0, 64.0, 1024.0])
    delta = 1e-5
    only_order_2 = np.array([0.5, np.nan, np.nan, np.nan])
    eps, order = rdp_to_epsilon(orders, only_order_2, delta, conversion)
    assert order == 2.0
    assert eps == pytest.approx(rdp_to_epsilon(orders[:1], only_order_2[:1], delta, conversion)[0])
    assert eps > 5  # log(1/delta)/(2-1) dominates; NaN read as 0 at order 1024 would give ~0.01
    assert rdp_to_epsilon(orders, np.full(4, np.nan), delta, conversion)[0] == math.inf


def test_rdp_curve_never_returns_nan():
    from dp_accounting import dp_event

    from dpfl.accounting.events import ParticipationDpEvent
    from dpfl.accounting.rdp import rdp_curve

    noiseless = dp_event.SampledWithoutReplacementDpEvent(10, 5, dp_event.GaussianDpEvent(0.0))
    for bound in ("paper", "tight"):
        assert np.isposinf(rdp_curve(noiseless, subsampling_bound=bound)).all()
        assert np.isposinf(rdp_curve(ParticipationDpEvent(0.5, noiseless), subsampling_bound=bound)).all()
    huge = rdp_curve(ParticipationDpEvent(0.5, dp_event.GaussianDpEvent(1e-6)))  # (a-1) eps_in would overflow exp
    assert np.isfinite(huge).all() and huge[0] > 1e10
