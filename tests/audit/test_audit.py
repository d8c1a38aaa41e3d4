"""The many-run audit (dpfl.audit.runs) through the real LocalSGD client_round: strength on a single Gaussian
release, planted bugs caught, correct configurations at or below their claims, and the `dpfl audit` command."""

import json

import pytest
import torch

import dpfl.noise as noise
from dpfl.audit import runs
from dpfl.cli import main
from dpfl.errors import ConfigError
from shared_noise import share_noise_streams

from .conftest import noise_for

STRENGTH_DELTA = 1e-5
#: The planted bugs are audited at delta = 1e-2, where epsilon describes the bulk of the privacy-loss law that a few
#: thousand runs can see (at delta = 1e-5 a claim is decided by events of probability ~1e-5, out of reach of 10^4 runs).
BUG_DELTA = 1e-2
BUG_NOISE = 1.0  # one Gaussian release at mu = 1: epsilon 2.32 at delta 1e-2


def _strength_sim(make_sim, seed: int = 0):
    """One client, one step, full batch, z chosen so the PLD claim of the single release is 2 at delta 1e-5."""
    return make_sim(noise_for(2.0, STRENGTH_DELTA), STRENGTH_DELTA, 1, f"run.seed={seed}")


def test_strength_single_gaussian_release_1000_trials(make_sim):
    """The grid of rank tests planned at the claim and its fractions (``dpfl.audit.bounds``), every trial counting.
    Measured (run seeds 0..5): 0.40, 0.37, 0.57, 0.37, 0.46, 0.30 for a claim of 2 (mean 0.41 = 0.21x; the single
    rank planned at the claim: mean 0.47; the split-half test: 0.28)."""
    result = runs.audit(_strength_sim(make_sim), "third_party", 1000)
    assert result.claimed_epsilon == pytest.approx(2.0, abs=1e-3)
    assert 0.15 * result.claimed_epsilon <= result.bound.epsilon <= result.claimed_epsilon


@pytest.mark.slow
def test_strength_single_gaussian_release_10000_trials(make_sim):
    """Measured (run seeds 0..5, 10^4 runs per world, every run counted, the grid of planned ranks): 0.93, 0.86,
    0.92, 0.85, 0.82, 0.75 for a claim of 2: mean 0.85 = 0.43x the claim, min 0.75 = 0.38x (the single rank planned
    at the claim: mean 0.89, min 0.79; the split-half test: mean 0.76, min 0.59). Asserted on seeds 0..4: every bound
    in [0.35x, 1x] the claim, their mean >= 0.4x."""
    found = []
    for seed in range(5):
        result = runs.audit(_strength_sim(make_sim, seed), "third_party", 10_000)
        assert 0.35 * result.claimed_epsilon <= result.bound.epsilon <= result.claimed_epsilon
        found.append(result.bound.epsilon)
    assert sum(found) / len(found) >= 0.4 * 2.0


@pytest.mark.slow
def test_correct_code_stays_below_its_tight_claim_over_many_seeds(make_sim):
    """The claim of one Gaussian release (1 client, z = 1, delta 1e-2: 2.32) is tight, and each audit is planned at
    it (the strongest plan): over 40 run seeds, at most 5% of the 95% bounds may exceed it; none does (measured:
    bounds 0.98-1.63)."""
    found = [runs.audit(make_sim(BUG_NOISE, BUG_DELTA, 1, f"run.seed={seed}"), "server", 1000)
             for seed in range(40)]
    assert sum(r.bound.epsilon > r.claimed_epsilon for r in found) <= 2
    assert min(r.bound.epsilon for r in found) > 0.4 * found[0].claimed_epsilon


def test_planted_bug_noise_halved_is_caught(make_sim, monkeypatch):
    """The mechanism draws half the noise its event declares (the event, hence the ledger, is unchanged)."""
    sim = make_sim(BUG_NOISE, BUG_DELTA)
    honest = runs.audit(sim, "third_party", 2000)
    original = noise.gaussian_noise
    monkeypatch.setattr(noise, "gaussian_noise", lambda *args, **kwargs: 0.5 * original(*args, **kwargs))
    buggy = runs.audit(sim, "third_party", 2000)
    assert honest.bound.epsilon <= honest.claimed_epsilon == buggy.claimed_epsilon
    assert buggy.bound.epsilon > buggy.claimed_epsilon


def test_planted_bug_clipping_skipped_is_caught(make_sim):
    """The canary's gradient reaches the sum with norm 10 C (its clipping skipped)."""
    sim = make_sim(BUG_NOISE, BUG_DELTA)
    result = runs.audit(sim, "third_party", 1000, scale=10.0)
    assert result.bound.epsilon > result.claimed_epsilon


def test_a_canary_above_the_clip_catches_a_clip_rule_that_lets_it_through(make_sim, monkeypatch):
    """``canary_norm = 10``: the canary's gradient is 10 C before the engine's clip rule weighs it. On correct code
    it shifts the sum by C' = C (1 - 2^-20), as the stated Dirac canary does (the same scores to float rounding,
    the same bound); with the clip rule planted to keep every weight at 1 (clipping skipped, in the engine's
    ``clip_weights``, which the real records' sums use too) it shifts the sum by 10 C and the bound exceeds the
    claim, while the stated canary (clipped by construction) does not see the bug. Measured (one client, z = 1, 500
    runs per world, claim 2.32): correct 1.14 with either canary; clip skipped 15.77 (raw canary), 1.14 (stated)."""
    from dpfl.audit import canary
    from dpfl.engine import clipping, grads

    sim = make_sim(BUG_NOISE, BUG_DELTA)
    stated, raw = (runs.audit(sim, "third_party", 500, canary_norm=norm) for norm in (None, 10.0))
    assert raw.claimed_epsilon == stated.claimed_epsilon and raw.bound.epsilon <= raw.claimed_epsilon
    assert raw.to_dict()["canary_norm"] == 10.0 and raw.canary_norm_clipped and "canary_norm" not in stated.to_dict()
    assert abs(raw.lower_bound - stated.lower_bound) < 0.05

    def skipped(clip, norms, mask, nonfinite=True):
        return mask * torch.ones_like(norms)

    for module in (clipping, grads):
        monkeypatch.setattr(module, "clip_weights", skipped)
    assert canary.clipping.clip_weights is skipped  # the canary looks the rule up when it clips
    buggy_raw, buggy_stated = (runs.audit(sim, "third_party", 500, canary_norm=norm) for norm in (10.0, None))
    assert buggy_raw.lower_bound > 3 * buggy_raw.claimed_epsilon
    assert buggy_stated.lower_bound <= buggy_stated.claimed_epsilon


def test_planted_bug_server_charged_the_third_partys_event_is_caught(make_sim):
    """Ten clients, plain boundary: the server sees the canary client's own message, but is charged the third
    party's event (nine other clients' noise credited)."""
    sim = make_sim(BUG_NOISE, BUG_DELTA, 10)
    events = sim.round_privacy(0)
    wrong = {**events, "server": events["third_party"]}
    result = runs.audit(sim, "server", 1000, claim_events=wrong)
    assert result.claimed_epsilon < 0.6
    assert result.bound.epsilon > result.claimed_epsilon


@pytest.mark.parametrize("boundary", ["plain", "secagg"])
def test_correct_algorithm_stays_at_or_below_its_claim(make_sim, boundary):
    sim = make_sim(BUG_NOISE, BUG_DELTA, 10, f"privacy.boundary='{boundary}'")
    results = runs.audit_all(sim, ("server", "third_party", "other_silo"), 1000)
    for result in results.values():
        assert result.bound.epsilon <= result.claimed_epsilon
    # the plain server sees the owner's message alone: the audit finds far more than the credited claims allow
    if boundary == "plain":
        assert results["server"].bound.epsilon > results["third_party"].claimed_epsilon


def test_correct_poisson_sampling_stays_below_its_claim(make_sim):
    """Poisson records (zero-out: the canary's neighbour is a null record with a zero gradient) and Poisson cohorts."""
    sim = make_sim(BUG_NOISE, BUG_DELTA, 4, "algorithm.record_sampling='poisson'", "algorithm.sample_rate=0.5",
                   "algorithm.client_sampling='poisson'", "algorithm.client_rate=0.5")
    assert sim.algorithm.neighboring == "zero_out"
    for result in runs.audit_all(sim, ("server", "third_party", "other_silo"), 500).values():
        assert result.bound.epsilon <= result.claimed_epsilon


def test_errors_for_no_view_and_too_few_trials(make_sim):
    sim = make_sim(BUG_NOISE, BUG_DELTA, 1, "privacy.boundary='trusted'")
    with pytest.raises(ConfigError, match="no observer"):
        runs.audit(sim, "server", 100)
    with pytest.raises(ConfigError, match="num_clients >= 2"):
        runs.audit(sim, "other_silo", 100)
    with pytest.raises(ConfigError, match="at least"):
        runs.audit(sim, "third_party", 5)


def _config(tmp_path, *extra):
    lines = ["[data]", "num_clients = 1", "samples_per_client = 20", "[algorithm]", "name = 'dp-fedsgd'",
             "rounds = 1", "local_steps = 1", "sample_rate = 1.0", "client_rate = 1.0", "noise_multiplier = 1.0",
             "weight_decay = 0.0", "[privacy]", "delta = 0.01", *extra]
    path = tmp_path / "audited.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_cli_audit_json_and_roc(tmp_path, capsys):
    out = tmp_path / "audit"
    argv = ["audit", _config(tmp_path), "--observer", "third_party", "--method", "runs", "--canary", "dirac",
            "--trials", "200", "--json", "--out", str(out)]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert {"observer", "claimed_epsilon", "delta", "lower_bound", "confidence", "trials", "method"} <= set(printed)
    assert printed["observer"] == "third_party" and printed["trials"] == 200 and printed["method"] == "runs"
    assert printed["confidence"] == 0.95 and printed["delta"] == 0.01
    assert 0 <= printed["lower_bound"] <= printed["claimed_epsilon"]
    assert printed["roc"] == str(out / "roc.png") and (out / "roc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((out / "audit.json").read_text())["lower_bound"] == printed["lower_bound"]


@pytest.mark.parametrize("argv, message", [
    (["--observer", "server", "--set", "privacy.boundary='trusted'"], "no observer"),
    (["--observer", "third_party", "--trials", "3"], "at least 7 runs per world"),
    (["--observer", "server", "--canary", "input", "--score", "loss"], "--observer third_party"),
    (["--observer", "third_party", "--score", "loss"], "needs --canary input"),
    (["--observer", "third_party", "--rounds", "0"], "--rounds = 0"),
    (["--observer", "third_party", "--method", "one-run", "--rounds", "2"], "'runs' for"),
    (["--observer", "third_party", "--method", "one-run", "--canary-norm", "10"], "--canary-norm (the one-run"),
    (["--observer", "third_party", "--canary", "input", "--canary-norm", "10"], "--canary-norm = 10"),
    (["--observer", "third_party", "--canary-norm", "0.5"], "a number >= 1"),
])
def test_cli_audit_errors(tmp_path, capsys, argv, message):
    assert main(["audit", _config(tmp_path), *argv, "--out", str(tmp_path / "x")]) == 2
    assert message in capsys.readouterr().err


def test_example_audit_config_catches_nothing_on_the_correct_algorithm(capsys, tmp_path):
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "audit_fedsgd.toml"
    assert main(["audit", str(example), "--observer", "server", "--trials", "300", "--json",
                 "--out", str(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["claimed_epsilon"] == pytest.approx(2.3178, abs=1e-3)
    assert printed["lower_bound"] <= printed["claimed_epsilon"]


def test_planted_bug_one_noise_draw_reused_by_every_client_is_caught(make_sim, monkeypatch):
    """Every client of a cohort draws the SAME standard-normal noise (the noise stream named without the client id,
    here: each audited trial's clients read the stream of the trial's first client). The other silo's claim credits
    the other clients' independent noise shares; a silo that knows its own draw knows everyone's, subtracts M copies
    (``silo_weight`` = M) and sees the canary noise-free. The correct code stays at or below the same claim.
    Measured (500 runs per world, claim 0.534): correct 0.00; bug 4.20 (the largest a 250-run evaluation half
    allows); the default weight 1 does NOT see the bug (0.00: reused noise makes sum - own noisier, not cleaner)."""
    clients = 10
    sim = make_sim(BUG_NOISE, BUG_DELTA, clients)
    honest = runs.audit(sim, "other_silo", 500, silo_weight=clients)
    share_noise_streams(monkeypatch, clients)
    buggy = runs.audit(sim, "other_silo", 500, silo_weight=clients)
    assert honest.claimed_epsilon == buggy.claimed_epsilon < 1.0
    assert honest.bound.epsilon <= honest.claimed_epsilon
    assert buggy.bound.epsilon > 3 * buggy.claimed_epsilon


# -- one run ------------------------------------------------------------------------------------------------------
ONE_RUN_DELTA = 1e-5  # the one-run bound pays 2 m delta: with m = 1000 canaries, delta 1e-2 leaves it at 0


@pytest.mark.parametrize("clients", [1, 10])
def test_one_run_stays_below_the_claim_on_the_correct_algorithm(make_sim, clients):
    """1000 canaries (1300 samples for one client, 150 per client for ten: 1040 and 1200 training records, so that
    every canary replaces a record), 100 guesses. Measured (seed 0):
    1 client: 1.54 (third party, server) for a claim of 4.38; 10 clients: third party 0.09 (claim 1.20), server 1.32
    (claim 4.38), other silo 0.21 (claim 1.27)."""
    sim = make_sim(BUG_NOISE, ONE_RUN_DELTA, clients, f"data.samples_per_client={1300 if clients == 1 else 150}")
    for observer in ("third_party", "server", "other_silo")[:2 if clients == 1 else 3]:
        for seed in range(3):
            result = runs.one_run_audit(sim, observer, 1000, seed=seed)
            assert (result.canaries, result.guesses) == (1000, 100)
            assert result.lower_bound <= result.claimed_epsilon


def test_one_run_catches_clipping_skipped_but_not_noise_halved(make_sim, monkeypatch):
    """Clipping skipped (the canaries' gradients of norm 10 C): all 100 guesses right, bound 3.47 > 1.20 claimed
    towards the third party (10 clients). The noise-halved bug (mu = 2 per canary instead of 1, towards a single
    client's owner: true epsilon 10.0 against a claim of 4.38 at delta 1e-5) is NOT caught by one run of 1000
    canaries: simulated Gaussian scores give bounds of 3.4-3.5 at r = 100..200 (4.8 at m = 10^4, r = 500, not
    robustly); what is asserted is that the bound grows."""
    sim = make_sim(BUG_NOISE, ONE_RUN_DELTA, 10, "data.samples_per_client=150")
    loud = runs.one_run_audit(sim, "third_party", 1000, scale=10.0)
    assert loud.correct == loud.guesses and loud.lower_bound > loud.claimed_epsilon
    single = make_sim(BUG_NOISE, ONE_RUN_DELTA, 1, "data.samples_per_client=1300")
    honest = runs.one_run_audit(single, "third_party", 1000)
    original = noise.gaussian_noise
    monkeypatch.setattr(noise, "gaussian_noise", lambda *args, **kwargs: 0.5 * original(*args, **kwargs))
    halved = runs.one_run_audit(single, "third_party", 1000)
    assert honest.lower_bound < halved.lower_bound <= halved.claimed_epsilon


def test_cli_audit_one_run(tmp_path, capsys):
    out = tmp_path / "one"
    argv = ["audit", _config(tmp_path), "--observer", "third_party", "--method", "one-run", "--canaries",
            "10", "--json", "--out", str(out)]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert {"observer", "claimed_epsilon", "delta", "lower_bound", "confidence", "trials", "method", "canaries",
            "guesses"} <= set(printed)
    assert printed["method"] == "one-run" and (printed["canaries"], printed["guesses"]) == (10, 2)
    assert json.loads((out / "audit.json").read_text())["lower_bound"] == printed["lower_bound"]
    assert printed["roc"] == str(out / "roc.png") and (out / "roc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["audit", _config(tmp_path), "--observer", "third_party", "--method", "one-run", "--canaries",
                 "5000", "--out", str(out)]) == 2
    assert "records the canaries can replace" in capsys.readouterr().err


@pytest.mark.slow
def test_audit_table_script_runs(capsys):
    """benchmarks/audit_table.py (the table of docs/audit.md) on four names at 20 trials (fedsgd-dpc: one row per
    mechanism; projected-noisy-sgd: one pass, no server view) at R = 1 and planned: it stays runnable."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "audit_table.py"
    spec = importlib.util.spec_from_file_location("audit_table", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--trials", "20", "dp-fedsgd", "dp-scaffold-warm", "fedsgd-dpc", "projected-noisy-sgd"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + 4 * 3 + 2 * 2 and all(line.count("|") == 15 for line in lines)
    assert sum("fedsgd-dpc (laplace)" in line for line in lines) == 3
    assert "**above**" not in "\n".join(lines)


@pytest.mark.slow
def test_audit_mutants_script_runs_on_a_family(capsys):
    """benchmarks/audit_mutants.py --families on dp-fedsgd at 50 trials: a row per (observer, mutant that applies),
    the correct claim's rows first, the tally's columns; the halved noise raises the bound towards the server above
    the correct code's (the same planned R)."""
    import importlib
    import sys
    from pathlib import Path

    benchmarks = Path(__file__).resolve().parents[2] / "benchmarks"
    sys.path.insert(0, str(benchmarks))  # audit_mutants imports audit_table beside it
    try:
        importlib.import_module("audit_mutants").main(["--trials", "50", "--families", "dp-fedsgd"])
    finally:
        sys.path.remove(str(benchmarks))
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines() if line.startswith("| dp-fedsgd |")]
    server = {row[2]: row for row in rows if row[1] == "server"}
    assert {"correct", "noise halved (event unchanged)", "rounds composed once"} <= set(server)
    silo = {row[2]: row for row in rows if row[1] == "other_silo"}
    assert silo["noise shared by a trial's clients"][8] == "infx"  # another silo sees the canary noise-free
    assert float(server["noise halved (event unchanged)"][7]) > float(server["correct"][7])
    assert rows[-1][1].isdigit() and len(rows[-1]) == 6  # the tally: mutants, caught at R = 1 and planned, 2x ones
