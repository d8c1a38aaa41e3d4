"""Statistically honest lower bounds on epsilon from a distinguisher's errors.

**Many runs** (Jagielski, Ullman, Oprea 2020, "Auditing differentially private machine learning: how private is
private SGD?"; Nasr, Song, Thakurta, Papernot, Carlini 2021, "Adversary instantiation"): an (eps, delta)-DP
mechanism forces every test of D against D' (Kairouz, Oh, Viswanath 2015) to satisfy

    FPR + e^eps FNR >= 1 - delta   and   FNR + e^eps FPR >= 1 - delta,

so eps >= log((1 - delta - FNR) / FPR) for any test (and with FPR, FNR swapped). From n0 scores under D' (the canary
absent or replaced) and n1 under D (present), ``many_run_lower_bound`` bounds FPR and FNR from above with one-sided
Clopper-Pearson intervals (each at level alpha / 2, so both hold together with probability >= 1 - alpha by the union
bound) and returns the eps they imply. The test (a threshold and a direction) is chosen on one half of the trials
and evaluated on the other half, so the bound is not inflated by picking the luckiest of many thresholds (the
choice may use any function of the selection half; by default normal laws fitted to it, see ``_choose_test``).

**One run** (Steinke, Nasr, Jagielski, NeurIPS 2023, "Privacy auditing with one (1) training run", Theorem 5.2 and
its p-value algorithm): m canaries, each included independently with probability 1/2; the auditor guesses r of them
(abstaining on the rest) and v guesses are right. Under (eps, delta)-DP,

    P[V >= v] <= P[Binomial(r, q) >= v] + 2 m delta max_{i=1..v} P[v - i <= Binomial(r, q) < v] / i,
    q = e^eps / (1 + e^eps),

and ``one_run_lower_bound`` is the largest eps whose p-value is below alpha. Implemented from the paper's statement
as recalled (the delta term as in its Algorithm 2); not cross-checked against the authors' code here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats


def clopper_pearson(successes: int, trials: int, alpha: float = 0.05) -> tuple[float, float]:
    """The two-sided (1 - alpha) Clopper-Pearson interval of a binomial proportion (exact, conservative)."""
    if trials <= 0:
        return 0.0, 1.0
    low = 0.0 if successes == 0 else float(stats.beta.ppf(alpha / 2, successes, trials - successes + 1))
    high = 1.0 if successes == trials else float(stats.beta.ppf(1 - alpha / 2, successes + 1, trials - successes))
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


def _bound(false_pos, false_neg, n0: int, n1: int, delta: float, alpha: float) -> np.ndarray:
    """The Clopper-Pearson epsilon of tests with these error counts (possibly fractional: predicted counts), both
    orders of the inequality, each error rate bounded at level alpha / 2."""
    fpr_ub = clopper_pearson_upper(false_pos, n0, alpha / 2)
    fnr_ub = clopper_pearson_upper(false_neg, n1, alpha / 2)
    return np.maximum(_epsilon(fpr_ub, fnr_ub, delta), _epsilon(fnr_ub, fpr_ub, delta))


def _choose_test(negatives, positives, n0: int, n1: int, delta: float, alpha: float, selection: str):
    """The threshold and direction, among the pooled selection scores in both directions, whose bound on an
    evaluation set of n0 / n1 scores is predicted largest: from the selection scores' empirical error rates
    (``"empirical"``), or from normal laws fitted to them (``"gaussian"``: smoother in the tails, where a few lucky
    selection scores otherwise pick a threshold that does badly on the evaluation half). Either choice is a function
    of the selection half alone, so the evaluation half's bound stays honest whatever the scores' law."""
    best = (-1.0, 0.0, 1.0)
    for direction in (1.0, -1.0):  # direction -1: "canary if score < t" is "canary if -score > -t"
        neg, pos = direction * negatives, direction * positives
        thresholds = np.unique(np.concatenate([neg, pos]))
        if selection == "gaussian":
            fp = n0 * stats.norm.sf(thresholds, neg.mean(), max(neg.std(), 1e-300))
            fn = n1 * stats.norm.cdf(thresholds, pos.mean(), max(pos.std(), 1e-300))
        else:
            fp, fn = _error_counts(neg, pos, thresholds)
            fp, fn = fp * n0 / neg.size, fn * n1 / pos.size
        eps = _bound(fp, fn, n0, n1, delta, alpha)
        i = int(np.argmax(eps))
        if eps[i] > best[0]:
            best = (float(eps[i]), direction * float(thresholds[i]), direction)
    return best[1], best[2]


@dataclass(frozen=True)
class LowerBound:
    """A lower bound on epsilon and the test that gives it (chosen on the selection half, counted on the other)."""

    epsilon: float
    confidence: float
    threshold: float
    direction: float  # +1: "canary if score > threshold", -1: "canary if score < threshold"
    false_positives: int
    false_negatives: int
    negatives: int
    positives: int

    def to_dict(self) -> dict:
        return {"lower_bound": self.epsilon, "confidence": self.confidence, "threshold": self.threshold,
                "direction": "above" if self.direction > 0 else "below", "false_positives": self.false_positives,
                "false_negatives": self.false_negatives, "evaluation_trials": [self.negatives, self.positives]}


SELECTIONS = ("gaussian", "empirical")


def many_run_lower_bound(negatives, positives, delta: float, confidence: float = 0.95,
                         rng: np.random.Generator | None = None, selection: str = "gaussian",
                         selection_fraction: float = 0.5) -> LowerBound:
    """A (``confidence``) lower bound on epsilon from scores of independent runs without (``negatives``) and with
    (``positives``) the canary (module docstring): the test chosen on a random ``selection_fraction`` of each
    (``_choose_test``), its errors counted on the rest."""
    negatives, positives = np.asarray(negatives, float).ravel(), np.asarray(positives, float).ravel()
    if not 0 < confidence < 1:
        raise ValueError(f"confidence = {confidence} is not in (0, 1)")
    if selection not in SELECTIONS:
        raise ValueError(f"selection = {selection!r}: expected one of {SELECTIONS}")
    if not 0 < selection_fraction < 1:
        raise ValueError(f"selection_fraction = {selection_fraction} is not in (0, 1)")
    if not (np.isfinite(negatives).all() and np.isfinite(positives).all()):
        raise ValueError("non-finite scores")
    alpha = 1 - confidence
    rng = np.random.default_rng(0) if rng is None else rng
    neg, pos = rng.permutation(negatives), rng.permutation(positives)
    k0, k1 = int(neg.size * selection_fraction), int(pos.size * selection_fraction)
    if min(k0, k1, neg.size - k0, pos.size - k1) < 2:
        raise ValueError("a lower bound needs at least 2 runs with and 2 without the canary on each side of the split "
                         "(one part chooses the test, the other counts its errors)")
    neg_eval, pos_eval = neg[k0:], pos[k1:]
    threshold, direction = _choose_test(neg[:k0], pos[:k1], neg_eval.size, pos_eval.size, delta, alpha, selection)
    fp, fn = _error_counts(direction * neg_eval, direction * pos_eval, np.array([direction * threshold]))
    value = float(_bound(fp, fn, neg_eval.size, pos_eval.size, delta, alpha)[0])
    return LowerBound(value, confidence, threshold, direction, int(fp[0]), int(fn[0]), neg_eval.size, pos_eval.size)


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


__all__ = ["SELECTIONS", "clopper_pearson", "clopper_pearson_upper", "LowerBound", "many_run_lower_bound", "roc_curve",
           "one_run_p_value", "one_run_lower_bound"]
