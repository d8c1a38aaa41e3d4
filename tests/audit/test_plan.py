"""Planning how many rounds to audit (dpfl.audit.plan): the claim moved to where the audit is strong."""

import json
import math

import pytest

from dpfl.accounting.theory import gdp_epsilon
from dpfl.audit import bounds, plan, runs
from dpfl.cli import main
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

DELTA = 1e-2


def test_the_plan_aims_where_a_claim_understating_mu_by_half_is_exceeded_by_the_widest_margin():
    """The claim's mu-GDP twin at 2000 runs per world: a tight claim's expected fraction is 0.37x at mu 0.3, 0.62x at
    mu 1.25 (its best), 0.46x at mu 3; a claim understating mu by 1.5x is exceeded by the widest margin (0.99x) at
    mu 0.9 (claim 2.0), which the planner aims at (2.3 for 1000 runs)."""
    def tight(mu):
        return plan.expected_margin(gdp_epsilon(mu, DELTA), 2000, DELTA, understatement=1.0)

    assert tight(0.3) == pytest.approx(0.37, abs=0.01) and tight(1.25) == pytest.approx(0.62, abs=0.01)
    assert tight(3.0) == pytest.approx(0.46, abs=0.01)
    assert plan.best_claim(2000, DELTA) == pytest.approx(gdp_epsilon(0.9, DELTA), rel=0.1)
    assert plan.expected_margin(plan.best_claim(2000, DELTA), 2000, DELTA) == pytest.approx(0.99, abs=0.02)
    assert 1.5 < plan.best_claim(2000, DELTA) < plan.best_claim(1000, DELTA) < 3
    assert plan.expected_margin(math.inf, 2000, DELTA) == plan.expected_margin(0.0, 2000, DELTA) == 0


def test_rounds_are_planned_from_each_rounds_own_claim_towards_each_observer():
    """examples/audit_fedsgd.toml (10 clients, z = 1) at 2000 runs: every round's event is Gaussian, so the plan aims
    at the GDP fit's best margin (mu about 2.5, ``plan.best_claim`` with gaussian): the owner's message (plain server)
    is one release at mu = 1 (2.32) a round: 7 rounds (mu 2.65; 2 under a limit of 2); the third party and another
    silo see the sum of 10 (mu 0.32) or of 9 (mu 0.33): the limit of 32 rounds. A one-pass algorithm's later rounds
    release nothing: 1, floor or not."""
    sim = build_simulation(load_config("examples/audit_fedsgd.toml", ["run.noise_seed=0"]))
    planned = {o: plan.planned_rounds(sim, o, 2000) for o in ("server", "third_party", "other_silo")}
    assert planned == {"server": 7, "third_party": plan.ROUND_LIMIT, "other_silo": plan.ROUND_LIMIT}
    assert plan.best_claim(2000, DELTA, gaussian=True) == pytest.approx(gdp_epsilon(2.5, DELTA), rel=0.1)
    assert plan.planned_rounds(sim, "server", 2000, limit=2) == 2
    assert 1.7 < runs.claimed_epsilon(sim, "third_party", rounds=7) < 2.0
    assert plan.planned_rounds(sim, "third_party", 2000, limit=4) == 4  # the limit binds
    one_pass = build_simulation(load_config(None, [
        "algorithm.name='isrl-prox-sgd'", "data.num_clients=3", "data.samples_per_client=10", "algorithm.rounds=5",
        "algorithm.client_rate=1.0", "privacy.epsilon=0.5", f"privacy.delta={DELTA!r}"]))
    assert runs.claimed_epsilon(one_pass, "server", rounds=5) == runs.claimed_epsilon(one_pass, "server")
    assert plan.planned_rounds(one_pass, "server", 2000) == 1


def test_a_non_private_run_is_audited_for_one_round():
    sim = build_simulation(load_config(None, ["algorithm.name='fedsgd'", "data.num_clients=2",
                                              "algorithm.client_rate=1.0", f"privacy.delta={DELTA!r}"]))
    assert plan.planned_rounds(sim, "third_party", 1000) == 1


def test_cli_plans_the_rounds(tmp_path, capsys):
    """Behind secure aggregation the server of 4 clients at z = 2 sees one release at mu = 0.25 a round: planned
    rounds, at most --max-rounds."""
    path = tmp_path / "audited.toml"
    path.write_text("[data]\nnum_clients = 4\nsamples_per_client = 20\n[algorithm]\nname = 'dp-fedsgd'\nrounds = 1\n"
                    "local_steps = 1\nsample_rate = 1.0\nclient_rate = 1.0\nnoise_multiplier = 2.0\n"
                    "weight_decay = 0.0\n[privacy]\ndelta = 0.01\nboundary = 'secagg'\n")
    assert main(["audit", str(path), "--observer", "server", "--trials", "40", "--rounds", "auto",
                 "--max-rounds", "6", "--json", "--out", str(tmp_path / "out")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert 1 < printed["rounds"] <= 6 and printed["lower_bound"] <= printed["claimed_epsilon"]
    assert main(["audit", str(path), "--observer", "server", "--rounds", "many", "--out", str(tmp_path / "x")]) == 2
    assert "not an integer >= 1 or 'auto'" in capsys.readouterr().err


def test_the_planned_audit_catches_a_ledger_that_composes_the_rounds_as_one(make_sim):
    """A composition bug (R rounds charged as one) is invisible in one round, which is where the margin alone plans
    the owner's server by the (eps, delta) margin alone (one release at mu = 1, claim 2.32, past its best claim); the
    GDP fit's margin (Gaussian rounds) plans 6 rounds at 1000 runs (mu 2.45, above the floor of 4), a 2.45x
    understatement of mu. One client, z = 1, 1000 runs per world: the bound is above the one round's 2.32 and below
    the 6 rounds' true claim (at R = 1 no bound can exceed 2.32)."""
    sim = make_sim(1.0, DELTA, 1)
    rounds = plan.planned_rounds(sim, "server", 1000)
    assert rounds == 6
    negatives, positives = runs.run_trials(sim, "server", 1000, rounds=rounds)
    one_round, composed = runs.claimed_epsilon(sim, "server"), runs.claimed_epsilon(sim, "server", rounds=rounds)
    found = {claim: bounds.many_run_lower_bound(negatives, positives, DELTA, claimed_epsilon=claim).epsilon
             for claim in (one_round, composed)}
    assert found[one_round] > one_round  # the bug is caught
    assert found[composed] <= composed  # the correct claim is not exceeded


def test_rounds_are_planned_for_composed_events_and_end_where_the_accounting_cannot_charge_a_round():
    """dp-fedavg with K = 2 local steps declares a composed event a round (it holds a list: the plan keyed its cache
    by the event and raised TypeError); a round whose event the accountant refuses (sdp-spider past its data raised
    a ConfigError from the binomial accountant) ends the plan's horizon instead of the audit."""
    fedavg = build_simulation(load_config("examples/audit_fedsgd.toml", ["run.noise_seed=0", "algorithm.name='dp-fedavg'",
                                                                         "algorithm.local_steps=2"]))
    assert plan.planned_rounds(fedavg, "server", 2000) == plan.MIN_ROUNDS

    def refused_after_two(t: int) -> dict:
        if t >= 2:
            raise ConfigError("trials", 0, "an integer in [1, inf)")
        return fedavg.round_privacy(t)

    assert plan.planned_rounds(fedavg, "third_party", 2000, round_events=refused_after_two) == 2
