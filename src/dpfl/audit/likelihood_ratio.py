"""The rounds' likelihood-ratio factors of the many-run white-box score: how much each audited round's score counts
towards one observer.

Each round's white-box score s_t (``dpfl.audit.distinguisher``) is normalised by the canary's measured shift
(``dpfl.audit.response``): the canary moves it by exactly 1, whatever the round's learning rate or message. Where the
round's view is the canary's shift d_t plus Gaussian noise of std sigma_t along the canary's direction, s_t is
N(b, (sigma_t / d_t)^2) in world b in {0, 1} (up to a constant offset), independently across rounds, so the log
likelihood ratio of the R rounds (Neyman-Pearson) is, up to terms that do not depend on the view,

    sum_t (d_t / sigma_t)^2 s_t  =  sum_t (d_t / sigma_t^2) <y_t - mean_out_t, direction_t>,

the rounds weighted by the square of their shift-to-noise ratio, and its two worlds are N(0, mu^2) and N(mu^2, mu^2)
with mu = sqrt(sum_t d_t^2 / sigma_t^2): exactly the composed Gaussian-DP parameter (Dong, Roth, Su 2022). The plain
sum sum_t s_t (equal factors) is that test only when every round has the same d_t / sigma_t; otherwise its mu,
(sum_t 1) / sqrt(sum_t sigma_t^2 / d_t^2), is lower, and a round of little noise drowns in the others' (two rounds
at ratios 2 and 0.25: mu 0.50 against 2.02). Rounds whose ratios differ: any noise schedule, e.g. isrl-spider's
checkpoint rounds (z1) against its difference rounds (z2). A learning rate that decays with t does not make them
differ: it scales the shift and the noise alike.

**Where the ratios come from.** The declared event of each round towards the observer (``Simulation.round_privacy``):
for a composition of Gaussian events, mu_t (``dpfl.audit.gdp.event_mu``) is Delta_t / sigma_t, the sensitivity over
the noise, and the canary's shift d_t is its sensitivity times a factor that is the same in every round for a
canary at full strength (the Dirac canary's clipped gradient moves every round's message by Delta_t), so d_t / sigma_t
is proportional to mu_t and the factors are mu_t^2, scaled by the largest (equal rounds: exactly 1 each, today's
plain sum, bit for bit). Where some round's event is not a composition of Gaussian events (sampling, Laplace, a
mixture), declares nothing (mu_t = 0: a round the observer is not charged for, which a bug could still leak in) or
infinity (no noise), the factors are 1: the plain sum. The event's mu_t composes a round's local steps, which for an
observer of the last step alone overstates the round's ratio; with rounds of one configuration the factors are
equal regardless. A view whose noise varies across rounds that declare the same event (DP-FTRL's moves: differences
of tree-node sums) keeps equal factors.

**Correlated noise: a matrix-factorization release.** Where the rounds' noise is correlated (DP-FTRL's tree, BandMF:
``Algorithm.noise_encoder``), the model's moves are g + C^-1 nu with nu independent draws of equal std and C the
lower-triangular encoder, so the per-round scores s (each normalised as above: the canary moves s_t by h_t, 1 in a
round the canary's client takes part in, 0 otherwise) are h + C^-1 nu' up to the other clients' part, and
C s = C h + nu', with nu' independent of equal variance sigma^2. The Neyman-Pearson test of the R rounds is then

    (C h)^T (C s),    N(0, sigma^2 ||C h||^2) without the canary and N(||C h||^2, sigma^2 ||C h||^2) with it,

mu = ||C h|| / sigma: for DP-FTRL one participation in round tau reaches sqrt(D_tau) / z, the nodes holding tau,
which is the claimed tree (the sum of the moves, the last prefix sum, holds only the nodes of its decomposition: the
root alone when R is a power of 2, mu = 1 / z). An observer that knows the cohort (``Boundary.knows_cohort``) knows h
in each trial; one that does not is scored with h = 1 in every round (each round equally likely to hold the client:
the best linear test against the mean shift, ``encoded_scores``), a weaker test of a claim that does not credit the
cohort's secrecy.

**Honesty.** The factors are fixed from the run's declared release before any audited run (never from the audited
claim, ``claim_events``, which may be the bug under test), so the score stays a fixed function of the observer's view:
post-processing, and the bound is honest whatever the factors; only its strength depends on them.
"""

from __future__ import annotations

import math

import torch
from dp_accounting import dp_event

from dpfl.audit.gdp import event_mu


def round_factors(events: list[dp_event.DpEvent]) -> list[float]:
    """The factor of each round's white-box score towards one observer, from its declared ``events`` (one per
    round): mu_t^2 / max_s mu_s^2 where every round's event is a composition of Gaussian events with 0 < mu_t < inf,
    1 for every round otherwise (module docstring)."""
    mus = [event_mu(event) for event in events]
    if not mus or any(mu is None or not 0 < mu < math.inf for mu in mus):
        return [1.0] * len(events)
    largest = max(mu * mu for mu in mus)
    return [mu * mu / largest for mu in mus]


def encoded_scores(encoder: torch.Tensor, scores: torch.Tensor, presence: torch.Tensor | None = None) -> torch.Tensor:
    """[trials]: (C h)^T (C s) for each trial (module docstring, "Correlated noise"), ``scores`` s [trials, R] the
    rounds' normalised scores, ``encoder`` C [R, R], ``presence`` h [trials, R] whether the canary's client took part
    in each round (None: 1 in every round)."""
    scores = scores.double()
    shift = torch.ones_like(scores) if presence is None else presence.double()
    return ((scores @ encoder.T) * (shift @ encoder.T)).sum(1)


__all__ = ["encoded_scores", "round_factors"]
