"""Statistically honest lower bounds on epsilon from a distinguisher's errors.

**Many runs** (Jagielski, Ullman, Oprea 2020, "Auditing differentially private machine learning: how private is
private SGD?"; Nasr, Song, Thakurta, Papernot, Carlini 2021, "Adversary instantiation"): an (eps, delta)-DP
mechanism forces every test of D against D' (Kairouz, Oh, Viswanath 2015) to satisfy

    FPR + e^eps FNR >= 1 - delta   and   FNR + e^eps FPR >= 1 - delta,

so eps >= log((1 - delta - FNR) / FPR) for any test (and with FPR, FNR swapped). From n0 scores under D' (the canary
absent or replaced) and n1 under D (present), oriented so that the canary raises the score, ``many_run_lower_bound``
bounds both error rates of a **rank test** from above and returns the eps they imply:

* test A, "canary if score > T" with T the k-th largest of the n0 negatives: whatever the scores' law, its false
  positive rate is stochastically at most the k-th largest of n0 uniforms, Beta(k, n0 - k + 1) (David and Nagaraja
  2003, "Order statistics", Sec. 2.5; equality for continuous scores, ties only lower it), so its (1 - a) quantile
  bounds the FPR from above: the one-sided Clopper-Pearson bound of k - 1 errors in n0. T depends on the negatives
  alone, so the positives below T are Binomial(n1, FNR(T)) given T: Clopper-Pearson bounds its FNR;
* test B, the mirror image: "canary if score >= T'" with T' the k-th smallest positive (FNR by the order statistic,
  FPR by Clopper-Pearson on the negatives at or above T').

Every trial counts towards both rates: no part of the trials is spent on choosing the test. The ranks are fixed
before the scores are seen (``planned_ranks``): a small grid, each the rank that maximises the expected bound if the
scores followed the mu-GDP pair of an epsilon eps_j (Dong, Roth, Su 2022, "Gaussian differential privacy": N(0, 1)
against N(mu_j, 1) with (eps_j, delta) on its curve, exact for a single Gaussian release), for eps_j = claim / d,
d in ``CLAIM_DIVISORS`` = 1, 2, 4, 8, 16. The rank planned at the claim is the strongest where the claim is tight; a
claim far above the truth plans it deep in the tail, where a mechanism far more private than claimed never passes
it, and the ranks planned at its fractions see that mechanism's bulk. A claim of 0 (the ledger says nothing leaks)
has no mu to plan from, and any bound above 0 violates it: its grid is planned as that of one release at mu =
``ZERO_CLAIM_MU`` = 1 (2.32 at delta 1e-2, down to its sixteenth), where a leak of that order or a fraction of it
shows. A grid rank whose expected bound under its own
plan is 0 (too few trials for that epsilon) and a repeated rank are dropped. Each rate of every kept test (two
tests, A and B, per rank, two rates each) is bounded at its own level, the levels summing to alpha (Bonferroni: all
hold together with probability >= 1 - alpha): the rank planned at the claim gets ``CLAIM_SHARE`` = 1/2 of alpha (all
of it when it is the only one), the others share the rest equally. The largest bound of every kept test is
returned. Any fixed ranks give an honest bound; the plan only decides where it is strong.

**One run** (Steinke, Nasr, Jagielski, NeurIPS 2023, "Privacy auditing with one (1) training run", Theorem 5.2 and
its p-value algorithm): m canaries, each included independently with probability 1/2; the auditor guesses r of them
(abstaining on the rest) and v guesses are right. Under (eps, delta)-DP,

    P[V >= v] <= P[Binomial(r, q) >= v] + 2 m delta max_{i=1..v} P[v - i <= Binomial(r, q) < v] / i,
    q = e^eps / (1 + e^eps),

and ``one_run_lower_bound`` is the largest eps whose p-value is below alpha. Implemented from the paper's statement
as recalled (the delta term as in its Algorithm 2); not cross-checked against the authors' code here.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

from dpfl.accounting.theory import gdp_epsilon


def clopper_pearson(successes, trials: int, alpha: float = 0.05):
    """The two-sided (1 - alpha) Clopper-Pearson interval (low, high) of a binomial proportion (exact, conservative):
    floats for one count, arrays for an array of counts. Each end is a one-sided bound at level alpha / 2
    (``clopper_pearson_upper``); the low end of k successes is 1 minus the high end of the n - k failures (a
    Beta(a, b) variable is 1 minus a Beta(b, a) one)."""
    k = np.asarray(successes, dtype=float)
    if trials <= 0:  # no trial: every proportion
        low, high = np.zeros_like(k), np.ones_like(k)
    else:
        low = 1.0 - clopper_pearson_upper(trials - k, trials, alpha / 2)
        high = clopper_pearson_upper(k, trials, alpha / 2)
    if k.ndim == 0:
        return float(low), float(high)
    return low, high


def clopper_pearson_upper(successes, trials: int, alpha: float) -> np.ndarray:
    """One-sided (1 - alpha) Clopper-Pearson upper bounds, vectorised over ``successes``."""
    k = np.asarray(successes, dtype=float)
    with np.errstate(invalid="ignore"):
        upper = stats.beta.ppf(1 - alpha, k + 1, trials - k)
    return np.where(k >= trials, 1.0, upper)


def _epsilon(fpr_ub, fnr_ub, delta: float) -> np.ndarray:
    """log((1 - delta - FNR) / FPR), clipped at 0 (0 where the numerator is not positive)."""
    numerator = 1.0 - delta - np.asarray(fnr_ub)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.where(numerator > 0, np.log(np.maximum(numerator, 1e-300) / np.asarray(fpr_ub)), 0.0)
    return np.maximum(eps, 0.0)


def _error_counts(negatives: np.ndarray, positives: np.ndarray, thresholds: np.ndarray):
    """For the test "canary if score > t": false positives (negatives above t) and false negatives (positives at or
    below t), per threshold."""
    neg, pos = np.sort(negatives), np.sort(positives)
    false_pos = neg.size - np.searchsorted(neg, thresholds, side="right")
    false_neg = np.searchsorted(pos, thresholds, side="right")
    return false_pos, false_neg


#: mu of the planning law is kept in [MU_RANGE[0], MU_RANGE[1]] (a claim of 0 or infinity has no useful mu-GDP twin).
MU_RANGE = (1e-3, 40.0)


def claimed_mu(epsilon: float, delta: float) -> float:
    """The mu of the mu-GDP mechanism whose (eps, delta) curve passes through the claim (Dong, Roth, Su 2022, Cor. 1:
    delta(eps) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)), clamped to ``MU_RANGE``."""
    low, high = MU_RANGE
    if not np.isfinite(epsilon) or gdp_epsilon(high, delta) <= epsilon:
        return high
    if gdp_epsilon(low, delta) >= epsilon:
        return low
    return float(optimize.brentq(lambda mu: gdp_epsilon(mu, delta) - epsilon, low, high, xtol=1e-6))


def _expected_bounds(mu: float, n0: int, n1: int, delta: float, alpha: float) -> np.ndarray:
    """Test A's bound at every rank k = 1..n0 at the expected error counts of N(0, 1) negatives against N(mu, 1)
    positives, each rate bounded at level ``alpha``: the threshold's expected quantile is k / (n0 + 1), its expected
    false negatives n1 Phi(T - mu)."""
    return _epsilon(*expected_rates(mu, n0, n1, alpha), delta)


def expected_rates(mu: float, n0: int, n1: int, alpha: float, ranks=None) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, FNR) upper bounds of test A at ``ranks`` (default every rank k = 1..n0), each at level ``alpha``, at the
    expected error counts of N(0, 1) negatives against N(mu, 1) positives: the threshold's expected quantile is
    k / (n0 + 1), its expected false negatives n1 Phi(T - mu)."""
    k = np.arange(1, n0 + 1) if ranks is None else np.asarray(ranks)
    false_neg = n1 * stats.norm.cdf(stats.norm.isf(k / (n0 + 1)) - mu)
    return clopper_pearson_upper(k - 1, n0, alpha), clopper_pearson_upper(false_neg, n1, alpha)


def planned_rank(mu: float, n0: int, n1: int, delta: float, alpha: float) -> int:
    """The rank k of test A (module docstring) with the largest expected bound (``_expected_bounds``)."""
    return int(np.argmax(_expected_bounds(mu, n0, n1, delta, alpha))) + 1


#: The grid of planned ranks: ranks planned at claim / d for these d (module docstring).
CLAIM_DIVISORS = (1, 2, 4, 8, 16)
#: A claim of 0 plans its grid as the claim of this mu would (one Gaussian release at noise multiplier 1).
ZERO_CLAIM_MU = 1.0
#: The share of the level spent on the rank planned at the claim itself (the rest is split over the others).
CLAIM_SHARE = 0.5


def _levels(count: int, alpha: float) -> list[float]:
    """The levels of ``count`` planned ranks, the first planned at the claim (module docstring): they sum to alpha."""
    if count == 1:
        return [alpha]
    return [CLAIM_SHARE * alpha] + [(1 - CLAIM_SHARE) * alpha / (count - 1)] * (count - 1)


@functools.lru_cache(maxsize=64)
def planned_ranks(claimed_epsilon: float, n0: int, n1: int, delta: float,
                  alpha: float) -> tuple[tuple[int, float], ...]:
    """(rank, level) of every test planned for ``claimed_epsilon`` (module docstring), the levels summing to
    ``alpha``; a function of the claim, the numbers of runs, delta and alpha alone (never of the scores)."""
    nominal = _levels(len(CLAIM_DIVISORS), alpha)
    if not claimed_epsilon > 0:  # a claim of 0: any leak is a violation; plan the grid at one release's claim
        claimed_epsilon = gdp_epsilon(ZERO_CLAIM_MU, delta)
    kept: list[int] = []
    for j, divisor in enumerate(CLAIM_DIVISORS):
        expected = _expected_bounds(claimed_mu(claimed_epsilon / divisor, delta), n0, n1, delta, nominal[j])
        rank = int(np.argmax(expected)) + 1
        if (j == 0 or expected[rank - 1] > 0) and rank not in kept:
            kept.append(rank)
    return tuple(zip(kept, _levels(len(kept), alpha)))


def expected_lower_bound(claimed_epsilon: float, n0: int, n1: int, delta: float, confidence: float = 0.95,
                         mu: float | None = None) -> float:
    """The bound ``many_run_lower_bound`` planned for ``claimed_epsilon`` gives at the expected error counts of test
    A if the scores were N(0, 1) against N(``mu``, 1) (default: the claim's own mu-GDP twin, i.e. the claim tight;
    the exact law of one Gaussian release): the largest over the planned ranks, each at its level. A function of
    the claim, mu and the numbers of runs alone."""
    alpha = (1 - confidence) / 4
    mu = claimed_mu(claimed_epsilon, delta) if mu is None else mu
    return float(max(_expected_bounds(mu, n0, n1, delta, level)[k - 1]
                     for k, level in planned_ranks(float(claimed_epsilon), n0, n1, delta, alpha)))


def rank_rates(negatives: np.ndarray, positives: np.ndarray, rank: int, alpha: float):
    """Test A of the module docstring at rank ``rank``: (threshold, false positives, false negatives, FPR upper
    bound, FNR upper bound), each bound at level ``alpha``."""
    threshold = float(np.sort(negatives)[negatives.size - rank])
    false_pos, false_neg = _error_counts(negatives, positives, np.array([threshold]))
    fpr_ub = float(clopper_pearson_upper(rank - 1, negatives.size, alpha))  # the order statistic's law
    fnr_ub = float(clopper_pearson_upper(false_neg, positives.size, alpha)[0])
    return threshold, int(false_pos[0]), int(false_neg[0]), fpr_ub, fnr_ub


def _rank_test(negatives: np.ndarray, positives: np.ndarray, rank: int, delta: float, alpha: float):
    """Test A of the module docstring at rank ``rank``: (eps, threshold, false positives, false negatives)."""
    threshold, false_pos, false_neg, fpr_ub, fnr_ub = rank_rates(negatives, positives, rank, alpha)
    eps = max(float(_epsilon(fpr_ub, fnr_ub, delta)), float(_epsilon(fnr_ub, fpr_ub, delta)))
    return eps, threshold, false_pos, false_neg


def fewest_runs(delta: float, confidence: float) -> int:
    """The fewest runs per world with which a perfect distinguisher (no errors at rank 1) certifies an epsilon > 0
    at ``confidence``: below it, every audit returns 0 whatever the mechanism."""
    alpha = (1 - confidence) / 4
    n = 1
    while _epsilon(clopper_pearson_upper(0, n, alpha), clopper_pearson_upper(0, n, alpha), delta) <= 0:
        n += 1
    return n


@dataclass(frozen=True)
class LowerBound:
    """A lower bound on epsilon and the rank test that gives it (module docstring)."""

    epsilon: float
    confidence: float
    test: str  # "A": canary if score > threshold (the rank-th largest negative); "B": if score >= threshold (the
    rank: int  # rank-th smallest positive)
    threshold: float
    false_positives: int
    false_negatives: int
    negatives: int
    positives: int
    ranks: tuple[int, ...] = ()  # every planned rank, each tested (A and B) under the union bound

    def to_dict(self) -> dict:
        rule = "score > threshold" if self.test == "A" else "score >= threshold"
        return {"lower_bound": self.epsilon, "confidence": self.confidence, "rule": f"canary if {rule}",
                "rank": self.rank, "threshold": self.threshold, "false_positives": self.false_positives,
                "false_negatives": self.false_negatives, "trials": [self.negatives, self.positives],
                "planned_ranks": list(self.ranks)}


def many_run_lower_bound(negatives, positives, delta: float, confidence: float = 0.95, *,
                         claimed_epsilon: float = math.inf, rank: int | None = None) -> LowerBound:
    """A (``confidence``) lower bound on epsilon from scores of independent runs without (``negatives``) and with
    (``positives``) the canary, oriented so that the canary raises the score: the best of the rank tests A and B
    (module docstring) at the ranks ``planned_ranks`` for ``claimed_epsilon``, or at ``rank`` alone."""
    negatives, positives = np.asarray(negatives, float).ravel(), np.asarray(positives, float).ravel()
    if not 0 < confidence < 1:
        raise ValueError(f"confidence = {confidence} is not in (0, 1)")
    if min(negatives.size, positives.size) < 1:
        raise ValueError("a lower bound needs at least 1 run with and 1 without the canary")
    if not (np.isfinite(negatives).all() and np.isfinite(positives).all()):
        raise ValueError("non-finite scores")
    alpha = (1 - confidence) / 4  # four rates per rank, bounded together by the union bound
    n0, n1 = negatives.size, positives.size
    plan = planned_ranks(float(claimed_epsilon), n0, n1, delta, alpha) if rank is None else ((rank, alpha),)
    for k, _ in plan:
        if not 1 <= k <= min(n0, n1):
            raise ValueError(f"rank = {k} is not in [1, {min(n0, n1)}]")
    ranks = tuple(k for k, _ in plan)
    best = None
    for k, level in plan:
        a = _rank_test(negatives, positives, k, delta, level)
        b = _rank_test(-positives, -negatives, k, delta, level)  # test B: test A with the worlds' roles swapped
        found = LowerBound(a[0], confidence, "A", k, a[1], a[2], a[3], n0, n1, ranks) if a[0] >= b[0] else \
            LowerBound(b[0], confidence, "B", k, -b[1], b[3], b[2], n0, n1, ranks)
        if best is None or found.epsilon > best.epsilon:
            best = found
    return best


def roc_curve(negatives, positives) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) of "canary if score > t" over every threshold, from (1, 1) down to (0, 0)."""
    negatives, positives = np.asarray(negatives, float), np.asarray(positives, float)
    thresholds = np.concatenate([[-np.inf], np.unique(np.concatenate([negatives, positives]))])
    fp, fn = _error_counts(negatives, positives, thresholds)
    return fp / max(negatives.size, 1), 1 - fn / max(positives.size, 1)


# -- one run (Steinke, Nasr, Jagielski 2023) ---------------------------------------------------------------------
def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float = 0.0) -> float:
    """P[at least v of r guesses right] under (epsilon, delta)-DP with m canaries (module docstring)."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"epsilon = {epsilon}, delta = {delta} out of range")
    q = 1.0 / (1.0 + math.exp(-epsilon))
    beta = float(stats.binom.sf(v - 1, r, q))
    if delta == 0 or v == 0:
        return min(beta, 1.0)
    # P[v - i <= B < v] / i for i = 1..v
    below = np.cumsum(stats.binom.pmf(np.arange(v - 1, -1, -1), r, q))
    alpha_term = float(np.max(below / np.arange(1, v + 1)))
    return min(beta + 2 * m * delta * alpha_term, 1.0)


def one_run_lower_bound(m: int, r: int, v: int, delta: float = 0.0, confidence: float = 0.95,
                        tolerance: float = 1e-6) -> float:
    """The largest epsilon rejected at level 1 - ``confidence`` (bisection on the p-value, which grows with eps)."""
    alpha = 1 - confidence
    if one_run_p_value(m, r, v, 0.0, delta) >= alpha:
        return 0.0
    low, high = 0.0, 1.0
    while one_run_p_value(m, r, v, high, delta) < alpha:
        low, high = high, 2 * high
        if high > 1e4:
            return math.inf
    while high - low > tolerance:
        mid = (low + high) / 2
        if one_run_p_value(m, r, v, mid, delta) < alpha:
            low = mid
        else:
            high = mid
    return low


__all__ = ["clopper_pearson", "clopper_pearson_upper", "claimed_mu", "expected_rates", "rank_rates", "planned_rank", "planned_ranks", "CLAIM_DIVISORS",
           "ZERO_CLAIM_MU", "CLAIM_SHARE", "fewest_runs", "expected_lower_bound", "LowerBound",
           "many_run_lower_bound", "roc_curve",
           "one_run_p_value", "one_run_lower_bound"]
