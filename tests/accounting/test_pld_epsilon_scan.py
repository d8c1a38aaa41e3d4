"""dpfl.accounting.pld.epsilon_for_delta: dp_accounting's PrivacyLossDistribution.get_epsilon_for_delta, the same
number bit for bit (its dense PMFs scanned in numpy blocks instead of a Python loop over their points)."""

import math

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from dpfl.accounting import pld

GRID = 1e-3  # dp_accounting's default grid is 1e-4: its Python loop, the reference here, is the slow part
PLDS = {  # symmetric and not, one mechanism and compositions, dense (from 911 to 91721 points) and sparse
    "gaussian": lambda: pld_lib.from_gaussian_mechanism(1.0, value_discretization_interval=GRID),
    "gaussian 0.3": lambda: pld_lib.from_gaussian_mechanism(0.3, value_discretization_interval=GRID),
    "poisson-sampled gaussian": lambda: pld_lib.from_gaussian_mechanism(0.7, sampling_prob=0.2,
                                                                        value_discretization_interval=GRID),
    "50 sampled steps": lambda: pld_lib.from_gaussian_mechanism(
        3.0, sampling_prob=0.01, value_discretization_interval=GRID).self_compose(50),
    "20 gaussians": lambda: pld_lib.from_gaussian_mechanism(1.0, value_discretization_interval=GRID).self_compose(20),
    "laplace": lambda: pld_lib.from_laplace_mechanism(1.0, value_discretization_interval=GRID),
    "gaussian and laplace": lambda: pld_lib.from_gaussian_mechanism(2.0, value_discretization_interval=GRID).compose(
        pld_lib.from_laplace_mechanism(3.0, value_discretization_interval=GRID)),
    "randomized response": lambda: pld_lib.from_randomized_response(0.1, 4, value_discretization_interval=GRID),
}


@pytest.mark.parametrize("name", PLDS)
def test_epsilon_for_delta_is_dp_accountings_bit_for_bit(name):
    distribution = PLDS[name]()
    if name == "20 gaussians":  # a scan across several blocks
        assert len(distribution._pmf_remove._probs) > 3 * pld._SCAN_BLOCK
    for delta in (1e-12, 1e-6, 1e-3, 0.1, 0.9):
        expected = distribution.get_epsilon_for_delta(delta)
        found = pld.epsilon_for_delta(distribution, delta)
        assert found == expected or (math.isnan(found) and math.isnan(expected)), (delta, found, expected)


@pytest.mark.parametrize("name", ["gaussian", "poisson-sampled gaussian", "50 sampled steps"])
def test_the_masses_carry_across_blocks(name, monkeypatch):
    """Blocks of 7 points: every stop lies blocks away from the top loss."""
    monkeypatch.setattr(pld, "_SCAN_BLOCK", 7)
    distribution = PLDS[name]()
    for delta in (1e-6, 0.1):
        assert pld.epsilon_for_delta(distribution, delta) == distribution.get_epsilon_for_delta(delta)


def test_a_loss_whose_exp_overflows_is_left_to_dp_accounting(monkeypatch):
    """e^{-l} overflows for l < -709.8: the whole PMF goes to dp_accounting's own loop (it raises or stops first)."""
    distribution = PLDS["laplace"]()
    pmf = distribution._pmf_remove
    monkeypatch.setattr(pmf, "_lower_loss", pmf._lower_loss - int(800 / GRID))  # the same masses, every loss -800
    calls = []
    monkeypatch.setattr(type(pmf), "get_epsilon_for_delta",
                        lambda self, delta: calls.append(delta) or 1.0)
    assert pld.epsilon_for_delta(distribution, 0.999999) == 1.0 and calls == [0.999999]


def test_a_pld_without_dp_accountings_private_layout_is_read_by_its_own_method():
    """Another dp_accounting whose PLD keeps its PMFs elsewhere: epsilon_for_delta falls back to its own loop."""
    from types import SimpleNamespace

    from dpfl.accounting.pld import epsilon_for_delta

    assert epsilon_for_delta(SimpleNamespace(get_epsilon_for_delta=lambda delta: 1.25), 1e-5) == 1.25


@pytest.mark.parametrize("exp_is_libm", [True, False])
def test_numpys_exp_where_it_is_the_c_librarys_gives_the_same_epsilon(exp_is_libm, monkeypatch):
    """The scan's e^{-l} from numpy where the probe finds it is the C library's, else from math.exp
    (``pld._EXP_IS_LIBM``): dp_accounting's epsilon bit for bit either way."""
    distribution = PLDS["50 sampled steps"]()
    monkeypatch.setattr(pld, "_EXP_IS_LIBM", exp_is_libm and pld._numpy_exp_is_libm())
    for delta in (1e-6, 1e-3):
        assert pld.epsilon_for_delta(distribution, delta) == distribution.get_epsilon_for_delta(delta)
