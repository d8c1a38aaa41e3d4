"""Lower bounds on epsilon (dpfl.audit.bounds): Clopper-Pearson, the rank tests and their planned grid, the one-run
bound."""

import math

import numpy as np
import pytest
from scipy import stats

from dpfl.accounting.theory import gdp_epsilon
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
    min over 20 simulated audits. Measured with the grid of planned ranks: 10^3 runs mean 0.48 (min 0.28); 10^4 runs
    mean 0.92 (min 0.76): 0.46x (the single rank planned at the claim: 0.54 and 0.95)."""
    rng = np.random.default_rng(5)
    mu = bounds.claimed_mu(2.0, 1e-5)
    for n, mean_at_least in ((1000, 0.35), (10_000, 0.85)):
        found = [bounds.many_run_lower_bound(rng.normal(0, 1, n), rng.normal(mu, 1, n), 1e-5,
                                             claimed_epsilon=2.0).epsilon for _ in range(20)]
        assert np.mean(found) >= mean_at_least and max(found) <= 2.0


def test_planned_ranks_are_a_grid_whose_levels_sum_to_alpha():
    """The rank planned at the claim keeps half the level; the grid's other ranks (planned at claim / 2 .. / 16) share
    the rest; ranks whose expected bound is 0 and repeated ranks are dropped; an infinite claim plans rank 1 alone."""
    alpha = 0.0125
    assert bounds.planned_ranks(math.inf, 1000, 1000, 1e-2, alpha) == ((1, alpha),)
    plan = bounds.planned_ranks(2.0, 10_000, 10_000, 1e-5, alpha)
    ranks, levels = [k for k, _ in plan], [a for _, a in plan]
    assert sum(levels) == pytest.approx(alpha) and levels[0] == pytest.approx(alpha / 2)
    assert len(set(ranks)) == len(ranks) == 4 and ranks == sorted(ranks)  # claim / 16 is out of reach of 10^4 runs
    assert ranks[0] == bounds.planned_rank(bounds.claimed_mu(2.0, 1e-5), 10_000, 10_000, 1e-5, alpha / 2)


def test_the_grid_finds_a_loose_claims_mechanism_and_stays_honest():
    """A mechanism far more private than claimed: mu = 0.45 (true epsilon 0.80 at delta 1e-2, what dp-fedavg's two
    additive Dirac steps give the third party) under a claim of 4x the truth, 2000 runs. The single rank planned at
    the claim sits where the mechanism never passes it (measured mean 0.03 over 100 audits); the grid finds 0.39 on
    average (400 audits), and no audit exceeds the truth (at most 5% may)."""
    rng = np.random.default_rng(13)
    mu, delta = 0.45, 1e-2
    truth = gdp_epsilon(mu, delta)
    found = np.array([bounds.many_run_lower_bound(rng.normal(0, 1, 2000), rng.normal(mu, 1, 2000), delta,
                                                  claimed_epsilon=4 * truth).epsilon for _ in range(60)])
    assert (found > truth).sum() <= 3 and found.mean() > 0.25
    single = bounds.planned_rank(bounds.claimed_mu(4 * truth, delta), 2000, 2000, delta, 0.0125)
    alone = [bounds.many_run_lower_bound(rng.normal(0, 1, 2000), rng.normal(mu, 1, 2000), delta, rank=single).epsilon
             for _ in range(20)]
    assert np.mean(alone) < 0.15 < found.mean() - 0.1


@pytest.mark.parametrize("claim, ranks", [(2.0, 2), (8.0, 4)])
def test_the_grid_exceeds_a_null_mechanism_at_most_alpha_of_the_time(claim, ranks):
    """Identical worlds (true epsilon 0), 300 runs each, audited under claims that plan grids of 2 and 4 ranks: the
    union bound keeps the rate of bounds > 0 at most 5% (1000 audits; asserted below 5% + 3 standard deviations;
    measured over 2000: 0.05% and 0%)."""
    assert len(bounds.planned_ranks(claim, 300, 300, 1e-2, 0.0125)) == ranks
    rng = np.random.default_rng(17)
    above = sum(bounds.many_run_lower_bound(rng.normal(0, 1, 300), rng.normal(0, 1, 300), 1e-2,
                                            claimed_epsilon=claim).epsilon > 0 for _ in range(1000))
    assert above <= 0.05 * 1000 + 3 * (0.05 * 0.95 * 1000) ** 0.5


def test_the_grid_is_honest_and_strong_for_laplace_scores():
    """Lap(0, 1) against Lap(eps, 1): exactly eps-DP (pure), the likelihood ratio e^eps on a half line. Planned at
    the truth, no audit of 1000 runs exceeds it (measured over 400: none at eps = 0.5, 1, 2), and the bound reaches
    0.7x the truth at eps = 1 on average (measured 0.70)."""
    rng = np.random.default_rng(19)
    for eps in (1.0, 2.0):
        found = np.array([bounds.many_run_lower_bound(rng.laplace(0, 1, 1000), rng.laplace(eps, 1, 1000), 1e-2,
                                                      claimed_epsilon=eps).epsilon for _ in range(40)])
        assert (found > eps).sum() <= 2 and found.mean() > 0.6 * eps


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
