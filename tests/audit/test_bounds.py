"""Lower bounds on epsilon (dpfl.audit.bounds): Clopper-Pearson, the split many-run bound, the one-run bound."""

import math

import numpy as np
import pytest
from scipy import stats

from dpfl.accounting.exact import gdp_epsilon
from dpfl.audit import bounds


@pytest.mark.parametrize("k, n", [(0, 10), (3, 10), (10, 10), (17, 1000)])
def test_clopper_pearson_matches_scipy_exact_interval(k, n):
    expected = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
    assert bounds.clopper_pearson(k, n) == pytest.approx((expected.low, expected.high), abs=1e-9)
    assert bounds.clopper_pearson_upper([k], n, 0.025)[0] == pytest.approx(expected.high, abs=1e-9)


def test_many_run_bound_is_honest_for_gaussians():
    """Over 40 independent audits of a mu-GDP pair (N(0,1) vs N(mu,1)), the 95% bound never exceeds the true
    epsilon (it may, with probability <= 5% each; 0 of 40 here), and grows with mu."""
    rng = np.random.default_rng(7)
    delta = 1e-5
    for mu in (0.0, 1.0, 3.0):
        truth = gdp_epsilon(mu, delta) if mu else 0.0
        found = [bounds.many_run_lower_bound(rng.normal(0, 1, 1000), rng.normal(mu, 1, 1000), delta, rng=rng).epsilon
                 for _ in range(40)]
        assert max(found) <= truth + 1e-12
        if mu == 3.0:
            assert np.median(found) > 3.0


@pytest.mark.parametrize("selection", bounds.SELECTIONS)
def test_many_run_bound_finds_a_shift_in_either_direction(selection):
    rng = np.random.default_rng(1)
    neg = rng.normal(0, 1, 2000)
    up = bounds.many_run_lower_bound(neg, rng.normal(3, 1, 2000), 1e-5, selection=selection)
    down = bounds.many_run_lower_bound(neg, rng.normal(-3, 1, 2000), 1e-5, selection=selection)
    assert up.epsilon > 2.5 and down.epsilon > 2.5
    assert (up.direction, down.direction) == (1.0, -1.0)
    assert up.negatives == up.positives == 1000


def test_many_run_bound_refuses_too_few_or_non_finite_scores():
    with pytest.raises(ValueError, match="at least 2"):
        bounds.many_run_lower_bound([0.0, 1.0], [0.0, 1.0, 2.0], 1e-5)
    with pytest.raises(ValueError, match="non-finite"):
        bounds.many_run_lower_bound([0.0, 1.0, np.nan, 2.0], [0.0, 1.0, 2.0, 3.0], 1e-5)


def test_roc_curve_ends():
    fpr, tpr = bounds.roc_curve([0.0, 1.0], [2.0, 3.0])
    assert (fpr[0], tpr[0]) == (1.0, 1.0) and (fpr[-1], tpr[-1]) == (0.0, 0.0)


def test_one_run_p_value_without_delta_is_the_binomial_tail():
    q = 1 / (1 + math.exp(-1.0))
    assert bounds.one_run_p_value(1000, 100, 80, 1.0) == pytest.approx(stats.binom.sf(79, 100, q))
    # delta only adds to the p-value, so it only lowers the bound
    assert bounds.one_run_p_value(1000, 100, 80, 1.0, 1e-5) > bounds.one_run_p_value(1000, 100, 80, 1.0)
    assert bounds.one_run_lower_bound(1000, 100, 80, 1e-5) <= bounds.one_run_lower_bound(1000, 100, 80)


def test_one_run_bound_is_honest_for_randomized_response():
    """m canaries, each in or out with probability 1/2, each guessed by eps-DP randomized response: the bound from
    all m guesses stays below eps in (at least) 95% of audits, and is close to it with many canaries."""
    rng = np.random.default_rng(3)
    eps, m = 1.0, 2000
    q = 1 / (1 + math.exp(-eps))
    found = [bounds.one_run_lower_bound(m, m, int(rng.binomial(m, q))) for _ in range(400)]
    assert sum(f > eps for f in found) <= 30  # expected <= 20 (5%); 30 is 2.3 standard deviations above
    assert np.median(found) > 0.8 * eps
