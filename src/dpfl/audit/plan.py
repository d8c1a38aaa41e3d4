"""How many rounds to audit: the number R at which the audit is expected to exceed a claim that is wrong by the
smallest factor it can hope to catch by the widest margin.

Where an observer does not see one full-sensitivity release (the third party sees the cohort's sum, another silo the
sum less its own share, a sampled client takes part in a fraction of the rounds), one round is a release at a small
mu (mu = 1/sqrt(10) for the sum of ten Gaussian messages) whose epsilon lies in tails a few thousand runs resolve
poorly: at 2000 runs per world and delta 1e-2 the grid of rank tests (``dpfl.audit.bounds``) is expected to certify
0.37x a tight claim of 0.46 (mu 0.3), against 0.62x a claim of 3.1 (mu 1.25) (``bounds.expected_lower_bound``). An
accounting bug that lowers such a claim (a sampling rate credited twice, a noise multiplier the ledger overstates,
a round left out of the composition) is then out of reach, whatever the distinguisher. The white-box score adds up
over rounds, and for Gaussian releases along the canary's coordinate that sum is the likelihood-ratio statistic of
the composed view (mu_R = sqrt(R) mu): auditing R rounds moves the claim to where the audit is strong.

**The objective.** A claim that is wrong understates the mechanism's mu by some factor k > 1, and is caught when the
bound, which follows the true mu, exceeds it. ``planned_rounds`` takes R in 1..``limit`` maximising the expected
margin m(c) = expected_lower_bound(c, at mu = k mu(c)) / c at the predicted claim c = c(R), mu(c) its mu-GDP twin,
with k = ``UNDERSTATEMENT`` = 1.5: a tight claim is caught by no audit, and at a few thousand runs per world a bound
reaches 0.55-0.6x a tight claim at best, so a factor of about 1.5 in mu (1.6-1.8 in epsilon) is the smallest error
within reach. m peaks at a smaller claim than the tight ratio does (the true mu is larger): at delta 1e-2, claim 2.0
(mu 0.9) for 2000 runs, 2.3 (mu 1) for 1000, and it is flat around it: at 2000 runs m = 0.99 there, while a tight
claim still gets 0.60x (0.62x at best) and k = 2 gets 1.27 (1.30 at best). Fewer rounds than the tight optimum also
cost less.

**The predicted claim** c(R) comes from each round's own claim alone: round t's events towards the observer
(``Simulation.round_privacy``), each charged by a fresh ledger as if it were the only round (eps_t), taken as mu-GDP
(mu_t on the curve through (eps_t, delta), ``bounds.claimed_mu``) and composed as Gaussian releases compose,
c(R) = eps of mu = sqrt(mu_0^2 + ... + mu_{R-1}^2). It reads the run's accounting and never the audited runs, so the
plan is fixed before them and the bound stays honest. It does not read the ledger's composition of the rounds: an
accounting bug there (a round left out, one round charged however many) would otherwise plan the one round in
which it is invisible; the audit's claim is still the ledger's composition of the R rounds. A round whose own event
releases nothing about the record (a one-pass algorithm's later rounds) adds nothing, so R stays where the record is
used; a round the run's accounting cannot charge at all (sdp-spider past its data) ends the horizon. c(R) does not
decrease with R and m is unimodal in the claim, so R is the first round count whose c(R) reaches the best margin's
claim (``best_claim``; or c(limit), when it stays below it), or the one before it, whichever has
the larger margin; an infinite claim gives R = 1. ``limit`` is also capped at the rounds the run's accounting composes
(``composable_rounds``: projected noisy SGD's last-iterate accountant charges at most its horizon,
algorithm.rounds). A claim of 0 in every round (the ledger says nothing leaks) has no mu to plan from: any bound
above 0 is a violation, and rounds only amplify a leak, so R = ``MIN_ROUNDS`` (within the limit).

**Gaussian rounds.** Where every round's event towards the observer is a composition of Gaussian events
(``gdp.event_mu``), the audit also fits GDP (``dpfl.audit.gdp``) and reports the larger bound, so m(c) is that of the
larger expected bound. Its margin at k = 1.5 peaks later: at delta 1e-2, 1.50 at mu 2-2.5 (claim 6.0-8.2) for 1000
runs, 1.59 at mu 2.5 for 2000, where a tight claim gets 0.81-0.83x (1000) and 0.86-0.88x (2000) (against 0.71x and
0.78x at mu 1).

**At least ``MIN_ROUNDS`` = 4 rounds** where the record is used in them (each of those rounds' own claim > 0): a
composition bug (a round left out, the rounds charged as one) is invisible in one round, and the margin above aims
at the claim of one observer's rounds, which for the owner's message (one release at mu = 1, claim 2.32 at delta
1e-2, already past ``best_claim``) is a single round. Four equal rounds compose to twice one round's mu, so a ledger
that charges them as one understates mu by 2 > k: at 2000 runs per world its expected margin is 1.25 (1.12 at 3
rounds, 0.93 at 2), while a 1.5x understated noise is still met at 0.94 of its claim (0.98 at R = 1). Any R fixed
before the runs is honest; the floor only moves where the audit looks.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import numpy as np

from dpfl.accounting.theory import gdp_epsilon
from dpfl.audit import bounds, gdp
from dpfl.errors import ConfigError

#: The most rounds ``planned_rounds`` audits by default.
ROUND_LIMIT = 32
#: The fewest rounds planned where every one of them releases something about the record (module docstring).
MIN_ROUNDS = 4
#: k: the factor by which the planned-for wrong claim understates the mechanism's mu (module docstring).
UNDERSTATEMENT = 1.5


def expected_margin(claim: float, trials: int, delta: float, confidence: float = 0.95,
                    understatement: float = UNDERSTATEMENT, gaussian: bool = False) -> float:
    """m(claim) (module docstring): the expected bound for ``trials`` runs per world of a mechanism at
    ``understatement`` x the claim's mu, over the claim (0 for a claim of 0 or infinity); ``understatement`` = 1:
    the expected fraction of a tight claim. ``gaussian``: the audit also fits GDP (``dpfl.audit.gdp``), and the
    bound is the larger of the two."""
    if not 0 < claim < math.inf:
        return 0.0
    mu = understatement * bounds.claimed_mu(claim, delta)
    found = bounds.expected_lower_bound(claim, trials, trials, delta, confidence, mu)
    if gaussian:
        found = max(found, gdp.expected_gdp_bound(claim, trials, trials, delta, confidence, mu))
    return found / claim


@functools.lru_cache(maxsize=32)
def best_claim(trials: int, delta: float, confidence: float = 0.95, gaussian: bool = False) -> float:
    """The claim (on the mu-GDP curve at ``delta``, mu in [0.1, 10] in steps of 12%) with the largest
    ``expected_margin``."""
    claims = [gdp_epsilon(mu, delta) for mu in np.geomspace(0.1, 10.0, 41)]
    return max(claims, key=lambda c: expected_margin(c, trials, delta, confidence, gaussian=gaussian))


def composable_rounds(sim, limit: int) -> int:
    """The most rounds R <= ``limit`` whose composition the run's accounting charges (``runs.claims`` of R rounds
    raises no ConfigError), found by bisection (charging is monotone: R rounds compose R - 1 and one more): an
    accountant with a horizon (projected noisy SGD's last iterate: at most algorithm.rounds steps) refuses more
    rounds than it, though each round alone is charged; an error at one round is the caller's."""
    from dpfl.audit.runs import claims

    def charged(rounds: int) -> bool:
        try:
            claims(sim, rounds=rounds)
        except ConfigError:
            return False
        return True

    if charged(limit):
        return limit
    low, high = 1, limit - 1  # the largest charged count lies in [low, high]
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if charged(middle) else (low, middle - 1)
    return low


def planned_rounds(sim, observer: str, trials: int, *, confidence: float = 0.95, limit: int = ROUND_LIMIT,
                   round_events: Callable[[int], dict] | None = None) -> int:
    """R in 1..``limit`` (module docstring: the best margin's R, at least ``MIN_ROUNDS``) for ``trials`` runs per world towards ``observer``; ``round_events(t)``:
    round t's events per observer (default ``sim.round_privacy(t)``)."""
    from dpfl.audit.runs import claimed_epsilon

    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"limit = {limit!r}: an integer >= 1")
    delta = sim.ledger.delta
    events_of = sim.round_privacy if round_events is None else round_events
    charged: dict = {}  # a round's event -> its epsilon as the only round (rounds often repeat one event)

    def alone(t: int) -> float:
        events = events_of(t)
        key = repr(events[observer])  # an event holding a list (a composed event) is not hashable
        if key not in charged:
            charged[key] = claimed_epsilon(sim, observer, events)
        return charged[key]

    epsilons = [alone(0)]
    for t in range(1, limit):
        try:
            epsilons.append(alone(t))
        except ConfigError:  # the run's accounting cannot charge round t (e.g. past a one-pass run's data): stop
            break
    limit = composable_rounds(sim, len(epsilons))
    epsilons = epsilons[:limit]
    if not math.isfinite(epsilons[0]):
        return 1
    if not any(epsilons):  # a claim of 0: any leak the audit finds is a violation; rounds amplify it
        return min(MIN_ROUNDS, limit)
    gaussian = all(gdp.event_mu(events_of(t)[observer]) is not None for t in range(limit))
    squares = np.cumsum([bounds.claimed_mu(eps, delta) ** 2 if eps > 0 else 0.0 for eps in epsilons])

    def claim(rounds: int) -> float:
        return gdp_epsilon(math.sqrt(squares[rounds - 1]), delta) if squares[rounds - 1] > 0 else 0.0

    goal = min(best_claim(trials, delta, confidence, gaussian), claim(limit))
    low, high = 1, limit  # the first R with claim(R) >= goal lies in [low, high]
    while low < high:
        middle = (low + high) // 2
        if claim(middle) >= goal * (1 - 1e-9):
            high = middle
        else:
            low = middle + 1
    candidates = [r for r in (low - 1, low) if r >= 1]
    best = max(candidates, key=lambda r: (expected_margin(claim(r), trials, delta, confidence, gaussian=gaussian),
                                          -r))
    floor = min(MIN_ROUNDS, limit)
    while floor > 1 and squares[floor - 1] == squares[floor - 2]:  # a round that adds nothing is not audited
        floor -= 1
    return max(best, floor)


__all__ = ["ROUND_LIMIT", "MIN_ROUNDS", "UNDERSTATEMENT", "expected_margin", "best_claim", "composable_rounds",
           "planned_rounds"]
