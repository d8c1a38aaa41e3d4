"""The auditor's views of the shuffle layers: the server behind a shuffler (the real shuffler's labelled-bit counts,
the simulated shuffler's unlabelled multiset, scored by its likelihood ratio) and the local randomiser's input (the
vectors the shuffle-DP families encode, which must lie in the clip's ball)."""

import itertools
import json
import math

import pytest
import torch

from dpfl.audit import distinguisher, runs
from dpfl.audit.trials import RoundView
from dpfl.cli import main
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

import survivors

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DELTA = 1e-2
SDP = ["algorithm.name='sdp-prox-sgd'", "data.num_clients=3", "data.samples_per_client=10", "algorithm.rounds=1",
       "algorithm.client_rate=1.0", "privacy.epsilon=1.0", f"privacy.delta={DELTA!r}", "run.noise_seed=0"]


def shuffled_view(rows: torch.Tensor, owner_position: torch.Tensor) -> RoundView:
    """A round of ``rows.shape[0]`` trials, each of n one-coordinate messages; the owner (client 0) at
    ``owner_position`` in each trial's rows, the other clients 1..n-1 in the remaining positions."""
    trials, n = rows.shape
    clients = torch.stack([torch.cat([torch.arange(1, n)[:p], torch.tensor([0]), torch.arange(1, n)[p:]])
                           for p in owner_position.tolist()])
    return RoundView(0, {}, {}, {"dy": rows.reshape(-1, 1)}, torch.arange(trials).repeat_interleave(n),
                     clients.reshape(-1), torch.full((trials,), n), trials)


@pytest.mark.parametrize("offset", [-0.5, 0.0])
def test_the_multiset_score_is_the_exact_likelihood_ratio_of_gaussian_rows(offset):
    """Rows N(a_i, sigma^2), a_i = 0 but the owner's (mu_b): the score equals log p_1(multiset) / p_0(multiset), each
    density the average over the owner's n positions (computed here by brute force over all n! orders, which gives
    the same average); it does not depend on where the owner's row is; and as sigma grows it becomes the sum's
    statistic (mu_1 - mu_0) sum_i s_i / (n sigma^2) up to a constant."""
    n, sigma = 4, 0.7
    rows = torch.randn(5, n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    g = torch.ones(5, 1, dtype=torch.float64)
    law = (offset, sigma)  # the owner's mean in the neighbour's world (m = 0) and the rows' spread

    def log_density(mu: float, s: torch.Tensor) -> float:  # the multiset's density, up to prod_j phi(s_j)
        terms = [(mu * float(s[order[0]]) - mu * mu / 2) / sigma**2 for order in itertools.permutations(range(n))]
        return math.log(sum(math.exp(t) for t in terms) / len(terms))

    expected = torch.tensor([log_density(offset + 1, s) - log_density(offset, s) for s in rows], dtype=torch.float64)
    for position in ([0] * 5, [3, 1, 2, 0, 3]):
        score = distinguisher.multiset_score(shuffled_view(rows, torch.tensor(position)), 0, g, {"dy": 1.0}, law,
                                             offset)
        torch.testing.assert_close(score, expected)
    wide = distinguisher.multiset_score(shuffled_view(rows, torch.zeros(5, dtype=torch.long)), 0, g, {"dy": 1.0},
                                        (offset, 1e3), offset)
    linear = rows.sum(1) / (n * 1e6)
    torch.testing.assert_close(wide - wide.mean(), linear - linear.mean(), rtol=1e-3, atol=1e-12)


def test_a_trial_whose_cohort_lacks_the_owner_scores_zero():
    view = shuffled_view(torch.randn(3, 4, dtype=torch.float64), torch.zeros(3, dtype=torch.long))
    view.client_of_row = torch.where(view.client_of_row == 0, 9, view.client_of_row)
    score = distinguisher.multiset_score(view, 0, torch.ones(3, 1, dtype=torch.float64), {"dy": 1.0}, (-0.5, 0.5),
                                         -0.5)
    assert torch.equal(score, torch.zeros(3, dtype=torch.float64))


@pytest.mark.parametrize("shuffler", ["real", "simulated"])
def test_the_server_behind_a_shuffler_is_audited_and_stays_below_its_claim(shuffler):
    """sdp-prox-sgd behind each shuffler: the server's view is the labelled-bit counts (real: its claim is the
    aggregate's, the third party's) or the multiset of the silos' counts (simulated: charged the owner's own bits).
    Every vector the randomiser received lay in the clip's ball."""
    sim = build_simulation(load_config(None, [*SDP, f"privacy.shuffler='{shuffler}'"]))
    seen = distinguisher.server_view(sim.boundary)
    assert seen == (distinguisher.SUM if shuffler == "real" else distinguisher.MULTISET)
    results = runs.audit_all(sim, ("server", "third_party"), 40)
    server, third_party = results["server"], results["third_party"]
    assert (server.claimed_epsilon == third_party.claimed_epsilon) == (shuffler == "real")
    for result in results.values():
        assert 0 <= result.bound.epsilon <= result.claimed_epsilon and not result.violated
        assert 0.99 < result.randomiser_input <= 1 + 1e-5  # the clip bites, and holds
        assert result.to_dict()["randomiser_input"] == {"largest_norm_over_clip": result.randomiser_input,
                                                        "within_clip": True}


def test_a_skipped_clip_is_visible_to_the_audit(monkeypatch):
    """The shuffle-layer survivor ``clipped_examples`` without its clip: the canary's own vector is C e by
    construction, so no score moves; the randomiser-input view sees the other records' vectors leave the C-ball
    (norms up to 1.38 C here) and the audit reports a violation."""
    survivors.unclipped_examples(monkeypatch)
    sim = build_simulation(load_config(None, SDP))
    result = runs.audit(sim, "third_party", 40)
    assert result.randomiser_input > 1.3 and result.violated
    assert result.to_dict()["violated"] and not result.to_dict()["randomiser_input"]["within_clip"]


def test_an_algorithm_without_a_local_randomiser_reports_no_randomiser_input(make_sim):
    result = runs.audit(make_sim(1.0, DELTA), "server", 40)
    assert result.randomiser_input is None and "randomiser_input" not in result.to_dict()


def test_cli_audits_the_server_behind_the_real_shuffler(tmp_path, capsys):
    path = tmp_path / "sdp.toml"
    path.write_text("[data]\nnum_clients = 3\nsamples_per_client = 10\n[algorithm]\nname = 'sdp-prox-sgd'\n"
                    "rounds = 1\nclient_rate = 1.0\n[privacy]\nepsilon = 1.0\ndelta = 0.01\n")
    assert main(["audit", str(path), "--observer", "server", "--trials", "40", "--json",
                 "--out", str(tmp_path / "out")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["observer"] == "server" and printed["violated"] is False
    assert printed["randomiser_input"]["within_clip"] is True
