"""Planning how many rounds to audit (dpfl.audit.plan): the claim moved to where the audit is strong."""

import json
import math

import pytest

from dpfl.audit import bounds, plan, runs
from dpfl.cli import main
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

DELTA = 1e-2


def test_the_expected_bound_is_the_largest_fraction_of_a_claim_of_a_few_units():
    """The claim's mu-GDP twin at 2000 runs per world: 0.37x a claim of 0.46 (mu 0.3), 0.62x at mu 1.25 (3.1), 0.46x
    at mu 3 (10.8); the best claim lies between 2 and 6."""
    ratio = {mu: plan.expected_ratio(bounds.gdp_epsilon(mu, DELTA), 2000, DELTA) for mu in (0.3, 1.25, 3.0)}
    assert ratio[0.3] == pytest.approx(0.37, abs=0.01) and ratio[1.25] == pytest.approx(0.62, abs=0.01)
    assert ratio[3.0] == pytest.approx(0.46, abs=0.01)
    assert 2 < plan.best_claim(2000, DELTA) < 6
    assert plan.expected_ratio(math.inf, 2000, DELTA) == plan.expected_ratio(0.0, 2000, DELTA) == 0


def test_rounds_are_planned_from_the_claim_towards_each_observer():
    """examples/audit_fedsgd.toml (10 clients, z = 1): the owner's message (plain server) is one release at mu = 1
    (2.32), so 2 rounds reach the best claim; the third party and another silo see the sum of 10 (mu 0.32) or of 9
    (mu 0.33): 15 and 14 rounds put their claims at 3.0 and 3.1. A one-pass algorithm's claim does not grow: 1."""
    sim = build_simulation(load_config("examples/audit_fedsgd.toml", ["run.noise_seed=0"]))
    planned = {o: plan.planned_rounds(sim, o, 2000) for o in ("server", "third_party", "other_silo")}
    assert planned == {"server": 2, "third_party": 15, "other_silo": 14}
    assert 2.9 < runs.claimed_epsilon(sim, "third_party", rounds=15) < 3.2
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
