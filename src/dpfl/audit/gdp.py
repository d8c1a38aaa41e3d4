"""The audit's second bound for Gaussian mechanisms: a lower bound on mu in the Gaussian-DP sense, read off the same
rank tests as the (eps, delta) bound (``dpfl.audit.bounds``) and converted to epsilon at the claim's delta.

**Why.** A Gaussian mechanism's trade-off curve (Dong, Roth, Su 2022, "Gaussian differential privacy") is fixed by
one number: mu-GDP means every test of D against D' has TPR <= Phi(Phi^{-1}(FPR) + mu), and R Gaussian releases of
sensitivity-to-noise ratios mu_t compose to mu = sqrt(sum mu_t^2) exactly. The (eps, delta) bound asks a single
test point to clear the line TPR = e^eps FPR + delta, which for a Gaussian curve is loose everywhere but at one
point; the curve itself is cleared by the whole bulk of the ROC. Following Nasr, Hayes, Steinke, Balle, Tramer,
Jagielski, Carlini, Terzis 2023 ("Tight auditing of differentially private machine learning"), each test point with
FPR <= FPR_ub and TPR >= TPR_lb (both with confidence) rules out every mu-GDP mechanism with

    mu < mu_lb = Phi^{-1}(TPR_lb) - Phi^{-1}(FPR_ub)

(solve TPR_lb <= Phi(Phi^{-1}(FPR_ub) + mu) for mu; the curve rises with FPR, so any FPR below FPR_ub only raises
the required mu). The curve is symmetric (its mirror image swaps the rates), so the same holds with the rates
swapped: test B of ``dpfl.audit.bounds`` gives its own point.

**Which points, at what level.** The tests are exactly those of ``bounds.many_run_lower_bound``: the planned ranks
(``bounds.planned_ranks``, fixed by the claim and the run counts before any score is seen), each rate bounded at the
same level as there. Both bounds read the same events (every FPR_ub and FNR_ub holding at once, probability >= the
confidence by the union bound), so reporting both, and their larger, costs no confidence. At 2000 runs per world
the planned ranks give a mu_lb of 0.83-0.92 of the true mu for mu in 1..3 (eps 0.78-0.88 of a tight claim, against
0.51-0.61 for the (eps, delta) bound); at mu 0.3, 0.53 (``expected_gdp_bound``).

**To epsilon.** mu_lb converts to the epsilon of the mu_lb-GDP curve at the claim's delta, delta(eps) = Phi(-eps/mu
+ mu/2) - e^eps Phi(-eps/mu - mu/2) (Dong, Roth, Su 2022, Cor. 1; ``dpfl.accounting.theory.gdp_epsilon``), increasing
in mu. **The premise**: this epsilon bounds the mechanism's epsilon at delta only if the mechanism is mu-GDP for some
mu, which is what its claim says when each audited round's event towards the observer is a composition of Gaussian
events (``event_mu`` not None: no sampling, no Laplace, no mixture; the audit applies it only there). On correct
code the premise holds (the release is the canary's shift plus Gaussian noise). On buggy code it may not, and then
mu_lb > the claim's mu still refutes the claimed event (its curve is G_mu), though perhaps not the claim's single
(eps, delta) pair: a Gaussian claim is a claim about the whole curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from dp_accounting import dp_event
from scipy import stats

from dpfl.accounting import pld
from dpfl.accounting.theory import gdp_epsilon
from dpfl.audit import bounds


def event_mu(event: dp_event.DpEvent) -> float | None:
    """mu of ``event`` as a Gaussian-DP mechanism where it is a composition of Gaussian events (a
    ``GaussianDpEvent(z)``: mu = 1/z, in dpfl's meaning of a noise multiplier, ``dpfl.accounting.events``; a restarted
    tree's epoch, the Gaussian it is, ``pld.tree_as_gaussian``; R of them compose to sqrt(sum mu_t^2)); None for any
    other event (sampled, Laplace, a mixture, ...)."""
    if isinstance(event, dp_event.NoOpDpEvent):
        return 0.0
    if isinstance(event, dp_event.GaussianDpEvent):
        return math.inf if event.noise_multiplier == 0 else 1.0 / event.noise_multiplier
    if isinstance(event, dp_event.SingleEpochTreeAggregationDpEvent):  # a restarted tree: sqrt(D) / z
        return event_mu(pld.tree_as_gaussian(event))
    if isinstance(event, dp_event.SelfComposedDpEvent):
        inner = event_mu(event.event)
        return None if inner is None else math.sqrt(event.count) * inner
    if isinstance(event, dp_event.ComposedDpEvent):
        parts = [event_mu(e) for e in event.events]
        return None if any(p is None for p in parts) else math.sqrt(sum(p * p for p in parts))
    return None


def claimed_gdp_mu(round_events: list[dp_event.DpEvent]) -> float | None:
    """mu of the audited rounds' events towards one observer composed (``event_mu``), None unless every one is
    Gaussian."""
    return event_mu(dp_event.ComposedDpEvent(list(round_events)))


def mu_lower(fpr_upper, fnr_upper):
    """mu_lb = Phi^{-1}(1 - FNR_ub) - Phi^{-1}(FPR_ub), at least 0 (module docstring); vectorised."""
    with np.errstate(divide="ignore", invalid="ignore"):
        mu = stats.norm.isf(np.asarray(fnr_upper, float)) + stats.norm.isf(np.asarray(fpr_upper, float))
    return np.maximum(np.nan_to_num(mu, nan=0.0, neginf=0.0), 0.0)


@dataclass(frozen=True)
class GdpBound:
    """A (``confidence``) lower bound ``mu`` on the mechanism's GDP parameter and its ``epsilon`` at ``delta``, from
    test ``test`` ("A" or "B") at ``rank`` with the rate bounds ``fpr_upper`` and ``fnr_upper``."""

    mu: float
    epsilon: float
    delta: float
    confidence: float
    test: str
    rank: int
    fpr_upper: float
    fnr_upper: float

    def to_dict(self) -> dict:
        return {"mu_lower_bound": self.mu, "lower_bound": self.epsilon, "confidence": self.confidence,
                "rule": "canary if score > threshold" if self.test == "A" else "canary if score >= threshold",
                "rank": self.rank, "fpr_upper": self.fpr_upper, "tpr_lower": 1.0 - self.fnr_upper}


def gdp_lower_bound(negatives, positives, delta: float, confidence: float = 0.95, *,
                    claimed_epsilon: float = math.inf) -> GdpBound:
    """The largest mu_lb over the rank tests ``bounds.many_run_lower_bound`` plans for ``claimed_epsilon`` (the
    same ranks and levels), and its epsilon at ``delta`` (module docstring); scores oriented as there."""
    negatives, positives = np.asarray(negatives, float).ravel(), np.asarray(positives, float).ravel()
    alpha = (1 - confidence) / 4
    best = GdpBound(0.0, 0.0, delta, confidence, "A", 1, 1.0, 1.0)
    for rank, level in bounds.planned_ranks(float(claimed_epsilon), negatives.size, positives.size, delta, alpha):
        for test, (without, with_canary) in (("A", (negatives, positives)), ("B", (-positives, -negatives))):
            *_, first, second = bounds.rank_rates(without, with_canary, rank, level)
            fpr_ub, fnr_ub = (first, second) if test == "A" else (second, first)
            mu = float(mu_lower(fpr_ub, fnr_ub))
            if mu > best.mu:
                best = GdpBound(mu, _epsilon(mu, delta), delta, confidence, test, rank, fpr_ub, fnr_ub)
    return best


def expected_gdp_bound(claimed_epsilon: float, n0: int, n1: int, delta: float, confidence: float = 0.95,
                       mu: float | None = None) -> float:
    """The epsilon of the mu_lb ``gdp_lower_bound`` gives at the expected error counts of test A if the scores were
    N(0, 1) against N(``mu``, 1) (default: the claim's own mu-GDP twin): the largest over the planned ranks."""
    alpha = (1 - confidence) / 4
    mu = bounds.claimed_mu(claimed_epsilon, delta) if mu is None else mu
    best = max(float(mu_lower(*bounds.expected_rates(mu, n0, n1, level, [k]))[0])
               for k, level in bounds.planned_ranks(float(claimed_epsilon), n0, n1, delta, alpha))
    return _epsilon(best, delta)


def _epsilon(mu: float, delta: float) -> float:
    """The epsilon of mu-GDP at ``delta`` (0 for mu = 0)."""
    return float(gdp_epsilon(mu, delta)) if mu > 0 else 0.0


__all__ = ["event_mu", "claimed_gdp_mu", "mu_lower", "GdpBound", "gdp_lower_bound", "expected_gdp_bound"]
