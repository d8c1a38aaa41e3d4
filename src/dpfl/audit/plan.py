"""How many rounds to audit: the number R at which the audit's expected bound is the largest fraction of the claim.

Where an observer does not see one full-sensitivity release (the third party sees the cohort's sum, another silo the
sum less its own share, a sampled client takes part in a fraction of the rounds), one round is a release at a small
mu (mu = 1/sqrt(10) for the sum of ten Gaussian messages) whose epsilon lies in tails a few thousand runs resolve
poorly: at 2000 runs per world and delta 1e-2 the grid of rank tests (``dpfl.audit.bounds``) is expected to certify
0.37x a tight claim of 0.46 (mu 0.3), against 0.62x a claim of 3.1 (mu 1.25) (``bounds.expected_lower_bound``). An
accounting bug that scales such a claim (a sampling rate credited twice, a noise multiplier the ledger overstates,
a round left out of the composition) is then out of reach, whatever the distinguisher. The white-box score adds up
over rounds, and for Gaussian releases along the canary's coordinate that sum is the likelihood-ratio statistic of
the composed view (mu_R = sqrt(R) mu): auditing R rounds moves the claim to where the audit is strong.

``planned_rounds`` takes R in 1..``limit`` maximising expected_lower_bound(claim(R)) / claim(R), claim(R) the run's
own claim of R rounds towards the observer (``dpfl.audit.runs.claimed_epsilon``: its accounting, never the audited
runs, so the plan is fixed before them and the bound stays honest). claim(R) does not decrease with R and the ratio
is unimodal in the claim, so R is the first round count whose claim reaches the best ratio's claim (or the claim of
``limit`` rounds, when it stays below it), or the one before it, whichever is better; a claim that stops growing
(a one-pass algorithm, whose record takes part in one round) keeps R = 1, and an infinite claim R = 1.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from dpfl.accounting.exact import gdp_epsilon
from dpfl.audit import bounds

#: The most rounds ``planned_rounds`` audits by default.
ROUND_LIMIT = 32


def expected_ratio(claim: float, trials: int, delta: float, confidence: float = 0.95) -> float:
    """expected_lower_bound(claim) / claim for ``trials`` runs per world (0 for a claim of 0 or infinity)."""
    if not 0 < claim < math.inf:
        return 0.0
    return bounds.expected_lower_bound(claim, trials, trials, delta, confidence) / claim


@functools.lru_cache(maxsize=32)
def best_claim(trials: int, delta: float, confidence: float = 0.95) -> float:
    """The claim (on the mu-GDP curve at ``delta``, mu in [0.1, 10] in steps of 12%) whose ``expected_ratio`` is the
    largest."""
    claims = [gdp_epsilon(mu, delta) for mu in np.geomspace(0.1, 10.0, 41)]
    return max(claims, key=lambda c: expected_ratio(c, trials, delta, confidence))


def planned_rounds(sim, observer: str, trials: int, *, confidence: float = 0.95, limit: int = ROUND_LIMIT) -> int:
    """R in 1..``limit`` (module docstring) for ``trials`` runs per world towards ``observer``."""
    from dpfl.audit.runs import claimed_epsilon

    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit = {limit!r}: an integer >= 1")
    delta = sim.ledger.delta

    @functools.lru_cache(maxsize=None)
    def claim(rounds: int) -> float:
        return claimed_epsilon(sim, observer, rounds=rounds)

    if not math.isfinite(claim(1)):
        return 1
    goal = min(best_claim(trials, delta, confidence), claim(limit))
    low, high = 1, limit  # the first R with claim(R) >= goal lies in [low, high]
    while low < high:
        middle = (low + high) // 2
        if claim(middle) >= goal * (1 - 1e-9):
            high = middle
        else:
            low = middle + 1
    candidates = [r for r in (low - 1, low) if r >= 1]
    return max(candidates, key=lambda r: (expected_ratio(claim(r), trials, delta, confidence), -r))


__all__ = ["ROUND_LIMIT", "expected_ratio", "best_claim", "planned_rounds"]
