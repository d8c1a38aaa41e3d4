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
    """Over 200 independent audits of a mu-GDP pair (N(0,1) vs N(mu,1)), each planned at the true epsilon (the
    strongest plan), the 95% bound exceeds the true epsilon in at most 5% of them (measured, 400 audits: 0.25% at
    mu = 0, none at mu = 0.5, 1, 3), and grows with mu."""
    rng = np.random.default_rng(7)
    delta = 1e-5
    for mu in (0.0, 1.0, 3.0):
        truth = gdp_epsilon(mu, delta) if mu else 0.0
        found = np.array([bounds.many_run_lower_bound(rng.normal(0, 1, 1000), rng.normal(mu, 1, 1000), delta,
                                                      claimed_epsilon=truth).epsilon for _ in range(200)])
        assert (found > truth + 1e-12).sum() <= 0.05 * 200
        if mu == 3.0:
            assert np.median(found) > 3.0


def test_rank_test_exceeds_the_truth_at_most_alpha_of_the_time_at_every_rank():
    """The order-statistic bound on the FPR is exact for continuous scores: with mu = 0 (truth 0) the bound of each
    rate fails with probability alpha / 4 each, so the bound is > 0 in at most 5% of 2000 audits of 50 runs, at the
    extreme rank 1 and at a middle rank (expected: well below 5%; asserted: below 5% + 3 standard deviations)."""
    rng = np.random.default_rng(11)
    for rank in (1, 10):
        above = sum(bounds.many_run_lower_bound(rng.normal(0, 1, 50), rng.normal(0, 1, 50), 1e-5, rank=rank).epsilon
                    > 0 for _ in range(2000))
        assert above <= 0.05 * 2000 + 3 * (0.05 * 0.95 * 2000) ** 0.5


def test_rank_bound_counts_exact_errors_and_both_tests():
    """Test A at rank 2: the threshold is the 2nd largest negative (3.0); 1 negative above it, and the positives at
    or below it are false negatives. Its bound is the Clopper-Pearson formula at level 0.05 / 4 for both rates.
    Mirrored data pick test B with the mirrored threshold."""
    neg, pos = np.array([0.0, 1.0, 2.0, 3.0, 4.0]), np.array([2.5, 3.5, 5.0, 6.0, 7.0])
    bound = bounds.many_run_lower_bound(neg, pos, 1e-5, rank=2)
    assert (bound.test, bound.threshold, bound.false_positives, bound.false_negatives) == ("A", 3.0, 1, 1)
    fpr_ub = stats.beta.ppf(1 - 0.0125, 2, 4)
    fnr_ub = stats.beta.ppf(1 - 0.0125, 2, 4)
    expected = max(math.log((1 - 1e-5 - fnr_ub) / fpr_ub), 0.0)
    assert bound.epsilon == pytest.approx(expected, abs=1e-12)
    mirrored = bounds.many_run_lower_bound(-pos, -neg, 1e-5, rank=2)
    assert mirrored.test in ("A", "B") and mirrored.epsilon == pytest.approx(bound.epsilon)


def test_planned_rank_follows_the_claim():
    """A strong claim (large mu) plans the extreme rank 1; a weak one a rank deep enough to see the bulk."""
    assert bounds.claimed_mu(math.inf, 1e-5) == bounds.MU_RANGE[1]
    assert bounds.claimed_mu(2.0, 1e-5) == pytest.approx(0.5016, abs=1e-3)
    assert bounds.planned_rank(bounds.claimed_mu(math.inf, 1e-2), 1000, 1000, 1e-2, 0.0125) == 1
    assert 20 < bounds.planned_rank(bounds.claimed_mu(2.0, 1e-5), 10_000, 10_000, 1e-5, 0.0125) < 200


def test_many_run_bound_single_gaussian_release_strength():
    """N(0,1) against N(mu,1) at the mu of a claim of 2 at delta 1e-5 (mu = 0.502), planned at the claim: mean and
    min over 20 simulated audits. Measured: 10^3 runs mean 0.54 (min 0.30); 10^4 runs mean 0.95 (min 0.78): 0.47x."""
    rng = np.random.default_rng(5)
    mu = bounds.claimed_mu(2.0, 1e-5)
    for n, mean_at_least in ((1000, 0.35), (10_000, 0.85)):
        found = [bounds.many_run_lower_bound(rng.normal(0, 1, n), rng.normal(mu, 1, n), 1e-5,
                                             claimed_epsilon=2.0).epsilon for _ in range(20)]
        assert np.mean(found) >= mean_at_least and max(found) <= 2.0


def test_many_run_bound_refuses_bad_input():
    with pytest.raises(ValueError, match="at least 1"):
        bounds.many_run_lower_bound([], [0.0, 1.0, 2.0], 1e-5)
    with pytest.raises(ValueError, match="non-finite"):
        bounds.many_run_lower_bound([0.0, 1.0, np.nan, 2.0], [0.0, 1.0, 2.0, 3.0], 1e-5)
    with pytest.raises(ValueError, match="rank"):
        bounds.many_run_lower_bound([0.0, 1.0], [0.0, 1.0], 1e-5, rank=3)


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
