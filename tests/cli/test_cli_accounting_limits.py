"""The accounting CLI never hangs or surprises: PLDs too large to build switch to RDP (saying so) or are refused with
what to use instead; --sampling fixed answers by PLD as a run's ledger does; dp_accounting's warnings are summarised
once; `account dp-scaffold` validates its rounds like the others."""

import json

import pytest

from dpfl.accounting import pld
from dpfl.accounting.accountant import gaussian_event
from dpfl.cli import main

EXTREME = ["account", "gaussian", "--noise-multiplier", "0.01", "--sampling", "none", "--steps", "100000",
           "--delta", "1e-5"]


@pytest.fixture
def built_plds(monkeypatch):
    """The events whose PLD gets built (an answer "at once" builds none too large: the guard refuses it first)."""
    built = []
    build = pld._build
    monkeypatch.setattr(pld, "_build", lambda event, *rest: built.append(event) or build(event, *rest))
    return built


def run_json(capsys, argv):
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_extreme_gaussian_answers_at_once_by_rdp_and_says_so(capsys, built_plds):
    """sigma = 0.01 over 10^5 steps: the PLD would span ~5e12 grid points (it ran out of time and memory before);
    none is built."""
    out, _ = run_json(capsys, EXTREME)
    assert built_plds == []
    rdp, _ = run_json(capsys, [*EXTREME, "--accountant", "rdp"])
    assert out["accountant"] == "rdp" and out["epsilon"] == rdp["epsilon"] and "note" not in rdp
    assert "not the default pld" in out["note"] and "grid points" in out["note"]
    # mu = sqrt(T) / sigma: epsilon ~ mu^2 / 2 = 5e8 (RDP, classic conversion, order 1.1)
    assert out["epsilon"] == pytest.approx(5.5e8, rel=1e-3)


def test_extreme_gaussian_with_pld_named_is_refused_with_the_alternative(capsys, built_plds):
    assert main([*EXTREME, "--accountant", "pld"]) == 2
    err = capsys.readouterr().err
    assert built_plds == []
    assert "accountant = 'pld' is not allowed: expected 'rdp'" in err and "pld.MAX_POINTS" in err


def test_calibrating_to_a_huge_epsilon_finishes_by_rdp(capsys, built_plds):
    argv = ["calibrate", "gaussian", "--target-epsilon", "1000", "--sampling", "poisson", "--sampling-rate", "0.01",
            "--steps", "100", "--delta", "1e-5"]
    out, _ = run_json(capsys, argv)
    assert built_plds == []
    assert out["accountant"] == "rdp" and "not the default pld" in out["note"] and out["epsilon"] <= 1000
    rdp, _ = run_json(capsys, [*argv, "--accountant", "rdp"])
    assert out["noise_multiplier"] == rdp["noise_multiplier"]


def test_fixed_sampling_with_the_default_accountant_is_the_runs_pld(capsys):
    """--sampling fixed defaults to PLD (the dominating Poisson pair of Balle, Barthe, Gaboardi 2018, Thm 10), the
    number a run's ledger reports on the same setting: dp-fedavg, every client in each of T = 2 rounds of K = 2 steps,
    batches of 8 of 40 records, z = 1.5; the server sees each client's update, so the owner's 4 noisy steps alone.
    RDP (Wang et al. 2019) on request, and larger."""
    import dpfl

    config = {"data": {"name": "synthetic", "num_clients": 2, "samples_per_client": 50, "seed": 0},
              "model": {"name": "logreg"},
              "algorithm": {"name": "dp-fedavg", "rounds": 2, "local_steps": 2, "client_rate": 1.0,
                            "sample_rate": 0.2, "noise_multiplier": 1.5},
              "privacy": {"delta": 1e-5, "boundary": "plain"}, "run": {"seed": 0}}
    simulation = dpfl.build(config)
    simulation.run(2)
    argv = ["account", "gaussian", "--noise-multiplier", "1.5", "--sampling", "fixed", "--sampling-rate", "0.2",
            "--dataset-size", "40", "--steps", "4", "--delta", "1e-5"]
    out, _ = run_json(capsys, argv)
    rdp, _ = run_json(capsys, [*argv, "--accountant", "rdp"])
    assert (out["accountant"], out["neighboring"], "note" in out) == ("pld", "replace_one", False)
    assert out["epsilon"] == pytest.approx(simulation.ledger.epsilon()["server"], rel=1e-9)
    assert out["epsilon"] == pytest.approx(1.7704, abs=1e-4)
    assert rdp["accountant"] == "rdp" and rdp["epsilon"] > 1.5 * out["epsilon"]


def test_dp_accounting_warnings_are_summarised_once(capsys):
    """q = 0.5, sigma = 0.3: dp_accounting's series for fractional RDP orders does not converge at some orders and
    logs one line per order; the CLI reports one line with the count, and nothing on stderr."""
    argv = ["account", "gaussian", "--noise-multiplier", "0.3", "--sampling-rate", "0.5", "--steps", "10",
            "--delta", "1e-5", "--accountant", "rdp"]
    out, err = run_json(capsys, argv)
    assert err == ""
    assert len(out["warnings"]) == 1
    assert out["warnings"][0].startswith("dp_accounting: _compute_log_a_frac failed to converge")
    assert "more like it)" in out["warnings"][0]


def test_dp_scaffold_rounds_are_validated_and_every_observer_reported(capsys):
    argv = ["account", "dp-scaffold", "--num-clients", "10", "--records-per-client", "100", "--client-rate", "0.2",
            "--sample-rate", "0.2", "--local-steps", "2", "--noise-multiplier", "1"]
    assert main([*argv, "--rounds", "0"]) == 2
    assert "rounds = 0 is not allowed: expected an integer in [1, inf)" in capsys.readouterr().err
    out, _ = run_json(capsys, [*argv, "--rounds", "1"])
    assert set(out["epsilon"]) == {"third_party", "server", "other_silo"}


@pytest.mark.parametrize("sigma, steps, sampling, rate", [(0.5, 1, "none", None), (1.0, 50, "poisson", 0.05)])
def test_pld_size_estimate_is_within_a_factor_of_three(sigma, steps, sampling, rate):
    """The guard's estimate (the RDP curve's Chernoff tail) against the PLD's real number of grid points."""
    event = gaussian_event(sigma, steps, sampling, rate)
    built = pld.pld_of(event)
    points = max(len(built._pmf_remove._probs), len(built._pmf_add._probs))
    assert points / 3 <= pld.estimated_points(event) <= 3 * points


def test_a_run_whose_pld_is_too_large_is_accounted_by_rdp(tmp_path, capsys, built_plds):
    """The ledger's tightest accountant takes PLD only while the PLD is tractable: a run with almost no noise (Poisson
    records, so PLD supports it) answers at once by RDP and says so in results.json."""
    config = tmp_path / "loud.toml"
    config.write_text('[data]\nname = "synthetic"\nnum_clients = 4\nsamples_per_client = 50\n\n[algorithm]\n'
                      'name = "dp-fedavg"\nrounds = 1\nlocal_steps = 1\nclient_rate = 1.0\nrecord_sampling = "poisson"\n'
                      'noise_multiplier = 0.02\n')
    assert main(["run", str(config), "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert built_plds == []
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert set(results["privacy"]["accountant"].values()) == {"rdp"} and results["final"]["epsilon"]["server"] > 200
