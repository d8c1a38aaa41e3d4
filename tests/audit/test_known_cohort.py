"""The server behind secure aggregation knows the cohort: it scores the cohort's sums only in the rounds that hold
the canary's owner (dpfl.audit.distinguisher.observed_updates); a sum without the owner does not depend on the
record, and its noise only diluted the score."""

import pytest
import torch

from dpfl.accounting.observers import scale_noise
from dpfl.audit import bounds, distinguisher, runs
from dpfl.audit.trials import RoundView

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DELTA = 1e-2


def test_the_secure_aggregation_server_scores_only_the_rounds_that_hold_the_owner():
    """Three trials; the owner (client 0) is in the cohorts of trials 0 and 2: their sums are seen, trial 1's is 0.
    The plain server reads the owner's own message; another silo, which does not know the cohort, the sum less its
    own message in every trial."""
    dy = torch.tensor([[1.0], [2.0], [4.0], [8.0], [16.0], [32.0]])
    view = RoundView(0, {}, {}, {"dy": dy}, torch.tensor([0, 0, 1, 1, 2, 2]), torch.tensor([0, 1, 1, 2, 3, 0]),
                     torch.full((3,), 2), 3)
    assert view.holds(0).tolist() == [True, False, True]
    seen = distinguisher.observed_updates("server", distinguisher.SUM, view, 0, 1, True)
    assert seen["dy"].flatten().tolist() == [3.0, 0.0, 48.0]
    assert distinguisher.observed_updates("server", distinguisher.MESSAGES, view, 0, 1, True)["dy"].flatten().tolist() \
        == [1.0, 0.0, 32.0]
    silo = distinguisher.observed_updates("other_silo", distinguisher.SUM, view, 0, 1, True)
    assert silo["dy"].flatten().tolist() == [1.0, 8.0, 48.0]


def test_a_sampled_cohort_behind_secure_aggregation_is_audited_from_the_owners_rounds(make_sim):
    """4 clients, 2 a round (p = 1/2), z = 1, secure aggregation, 4 rounds, 1000 runs per world (fixed seed): the
    server's bound is 1.24 of the claim 2.66 (scoring every round's sum: 0.49), so a ledger that overstates the noise
    2.5x (claim 0.74) is caught (it was not: 0.48)."""
    sim = make_sim(1.0, DELTA, 4, "algorithm.client_rate=0.5", "privacy.boundary='secagg'")
    negatives, positives = runs.run_trials(sim, "server", 1000, rounds=4)
    events = sim.round_privacy(0)
    correct = runs.claimed_epsilon(sim, "server", rounds=4)
    understated = runs.claimed_epsilon(sim, "server", {o: scale_noise(e, 2.5) for o, e in events.items()}, 4)
    assert understated == pytest.approx(0.74, abs=0.01) and correct == pytest.approx(2.66, abs=0.01)
    found = {claim: bounds.many_run_lower_bound(negatives, positives, DELTA, claimed_epsilon=claim).epsilon
             for claim in (correct, understated)}
    assert 1.0 < found[correct] <= correct
    assert found[understated] > understated
