"""Runs that scripts can rely on, through `dpfl.cli.main`: results.json after every evaluated round, wall time across
resumes, one round numbering (from 1) everywhere, every check before any data is built, and an empty config naming
the defaults it runs."""

import json
import os
import re
import signal

import pytest
import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.cli import main
from dpfl.engine.simulator import Simulation
from dpfl.errors import DpflError
from dpfl.experiments import assembly, run_directory
from dpfl.experiments.config import load_config
from dpfl.results import Results

TINY = """
[data]
num_clients = 6
samples_per_client = 30

[algorithm]
name = "dp-fedavg"
rounds = 6
local_steps = 2
client_rate = 0.5
noise_multiplier = 2.0
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "tiny.toml"
    path.write_text(TINY)
    return path


def run(config, out, *args):
    return main(["run", str(config), "--out", str(out), *args])


def read(path):
    return json.loads(path.read_text())


class Killed(BaseException):
    """Stands for the process dying."""


# -- results.json after every evaluated round ----------------------------------------------------------------------
def test_results_json_holds_every_evaluated_round_as_soon_as_it_is_done(config, tmp_path, monkeypatch):
    out = tmp_path / "run"
    seen = {}  # rounds done -> the evaluated rounds results.json lists when the next round starts
    step = Simulation.step

    def watched(sim):
        path = out / "results.json"
        seen[sim.next_round] = [r["round"] for r in read(path)["rounds"]] if path.exists() else None
        step(sim)
        if sim.next_round == 5:
            raise Killed

    monkeypatch.setattr(Simulation, "step", watched)
    with pytest.raises(Killed):
        run(config, out, "--no-progress", "--set", "run.eval_every=2", "--set", "run.checkpoint_every=100")
    assert seen == {0: None, 1: None, 2: [2], 3: [2], 4: [2, 4]}
    left = read(out / "results.json")  # what the dead process left
    assert [r["round"] for r in left["rounds"]] == [2, 4] and left["final"]["round"] == 4
    assert left["status"] == "running" and left["stopped_by"] is None
    assert left["final"]["epsilon"] == left["rounds"][-1]["epsilon"]


def test_a_finished_run_says_so(config, tmp_path):
    assert run(config, tmp_path / "run", "--no-progress", "--set", "run.eval_every=4") == 0
    results = read(tmp_path / "run" / "results.json")
    assert [r["round"] for r in results["rounds"]] == [4, 6] and results["status"] == "finished"
    assert results["wall_seconds"] == results["session_seconds"] > 0


def test_the_events_reported_are_those_the_last_round_done_was_charged(tmp_path):
    """isrl-prox-sgd charges every record's one Gaussian in round 1 and nothing later: after one round,
    results.json shows round 1's events (it showed the next round's NoOp), and says which round they are of."""
    config = tmp_path / "prox.toml"
    config.write_text('[data]\nnum_clients = 4\nsamples_per_client = 20\n'
                      '[algorithm]\nname = "isrl-prox-sgd"\nclient_rate = 1.0\n[privacy]\nepsilon = 2.0\n')
    for rounds, charged in ((1, "GaussianDpEvent"), (2, "NoOpDpEvent")):
        out = tmp_path / f"run{rounds}"
        assert run(config, out, "--no-progress", "--set", f"algorithm.rounds={rounds}") == 0
        privacy = read(out / "results.json")["privacy"]
        assert set(privacy["events_per_round"]) == {"third_party", "server", "other_silo"}
        assert all(charged in e for e in privacy["events_per_round"].values()), privacy["events_per_round"]
        assert privacy["events_round"] == rounds
        ledger = PrivacyLedger.load(out / "ledger.json")
        assert privacy["events_per_round"] == {o: str(e) for o, e in ledger.charged(rounds).items()}


# -- wall time across resumes --------------------------------------------------------------------------------------
def test_wall_seconds_add_the_sessions_of_an_interrupted_and_resumed_run(config, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    step = Simulation.step

    def ctrl_c_in_round_2(sim):
        if sim.next_round == 1:
            os.kill(os.getpid(), signal.SIGINT)
        step(sim)

    monkeypatch.setattr(Simulation, "step", ctrl_c_in_round_2)
    assert run(config, out, "--no-progress") == 130
    monkeypatch.undo()
    first = read(out / "results.json")
    assert first["status"] == "stopped" and first["stopped_by"] == "interrupted"
    saved = torch.load(out / "checkpoint.pt", weights_only=True)
    assert saved["next_round"] == 2 and 0 < saved["wall_seconds"] <= first["wall_seconds"]
    capsys.readouterr()

    assert run(config, out, "--no-progress", "--resume") == 0
    assert f"resuming the run in {out} after round 2 of 6" in capsys.readouterr().err
    resumed = read(out / "results.json")
    assert resumed["status"] == "finished" and 0 < resumed["session_seconds"] < resumed["wall_seconds"]
    # the whole run's time: the first session's (up to its checkpoint) plus the resumed session's
    assert resumed["wall_seconds"] == pytest.approx(saved["wall_seconds"] + resumed["session_seconds"], rel=1e-12)


# -- one round numbering ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def epsilons(config, tmp_path_factory):
    """The third party's epsilon after each round of the unstopped run."""
    out = tmp_path_factory.mktemp("reference") / "run"
    assert run(config, out, "--no-progress") == 0
    curve = Results.load(out).epsilon_curve()  # every round's (the rows report those of run.epsilon_every's schedule)
    return [curve[r]["third_party"] for r in sorted(curve)]


def test_progress_results_ledger_and_budget_stop_name_the_same_round(config, epsilons, tmp_path, capsys):
    budget = (epsilons[2] + epsilons[3]) / 2  # round 4 would exceed it: the run stops after round 3
    out = tmp_path / "run"
    assert run(config, out, "--set", f"privacy.budget={budget!r}") == 3  # progress on (plain lines: not a tty)
    err = capsys.readouterr().err
    progress = re.findall(r"^round (\d+)/6", err, flags=re.MULTILINE)
    assert progress[0] == "1" and progress[-1] == "3"  # the log ends with the round the run stopped after
    results = read(out / "results.json")
    assert results["final"]["round"] == results["rounds"][-1]["round"] == 3
    journal = [e["round"] for e in PrivacyLedger.load(out / "ledger.json").to_dict()["journal"]]
    assert journal == [1, 2, 3]
    assert "stopped by the privacy budget after round 3 of 6: round 4 would raise epsilon" in err
    assert results["stopped_reason"].startswith("round 4 would raise epsilon")


def test_a_divergence_names_the_round_that_diverged(config, tmp_path, capsys):
    assert run(config, tmp_path / "run", "--no-progress", "--set", "algorithm.lr=1e200") == 4
    results = read(tmp_path / "run" / "results.json")
    assert results["final"]["round"] == 1 and results["stopped_reason"].startswith("round 1: ")
    assert "the run diverged and stopped after round 1 of 6: round 1: " in capsys.readouterr().err
    assert PrivacyLedger.load(tmp_path / "run" / "ledger.json").to_dict()["journal"][0]["round"] == 1


def test_a_ledger_numbered_from_0_is_renumbered_on_resume_and_keeps_its_privacy(config, tmp_path, monkeypatch):
    out = tmp_path / "run"
    step = Simulation.step

    def dies_in_round_4(sim):
        step(sim)
        if sim.next_round == 4:
            raise Killed

    monkeypatch.setattr(Simulation, "step", dies_in_round_4)
    with pytest.raises(Killed):
        run(config, out, "--no-progress", "--set", "run.checkpoint_every=3")
    monkeypatch.undo()
    ledger = read(out / "ledger.json")
    for entry in ledger["journal"]:  # as an older dpfl wrote it
        entry["round"] -= 1
    (out / "ledger.json").write_text(json.dumps(ledger))
    assert run(config, out, "--no-progress", "--resume", "--set", "run.checkpoint_every=3") == 0
    resumed = PrivacyLedger.load(out / "ledger.json")
    assert [e["round"] for e in resumed.to_dict()["journal"]] == [1, 2, 3, 4, 5, 6]  # round 4 replayed: free


# -- every check before any data is built --------------------------------------------------------------------------
@pytest.fixture
def no_data(monkeypatch):
    def build_dataset(*args, **kwargs):
        pytest.fail("the data was built before the check")

    monkeypatch.setattr(assembly, "build_dataset", build_dataset)


@pytest.mark.parametrize("override, named", [
    ("algorithm.rounds=0", "algorithm.rounds = 0"),
    ("algorithm.client_rate=0", "algorithm.client_rate = 0.0"),
    ("algorithm.client_rate=1.5", "algorithm.client_rate = 1.5"),
    ("algorithm.client_rate=0.1", "algorithm.client_rate = 0.1"),  # floor(0.1 * 6) = 0 clients a round
    ("algorithm.local_steps=0", "algorithm.local_steps = 0"),
    ("algorithm.lr=0", "algorithm.lr = 0.0"),
    ("algorithm.clip=-1", "algorithm.clip = -1.0"),
    ("algorithm.noise_multiplier=0", "algorithm.noise_multiplier = 0.0"),
    ("algorithm.sample_rate=0", "algorithm.sample_rate = 0.0"),
    ("algorithm.weight_decay=-1", "algorithm.weight_decay = -1.0"),
    ("run.eval_every=0", "run.eval_every = 0"),
    ("run.checkpoint_every=0", "run.checkpoint_every = 0"),
    ("run.memory_mb=0", "run.memory_mb = 0"),
    ("run.threads=0", "run.threads = 0"),
    ("privacy.delta=1", "privacy.delta = 1.0"),
    ("privacy.budget=-1", "privacy.budget.third_party = -1.0"),
    ("privacy.budget={nobody=1}", "privacy.budget = {'nobody': 1}"),
    ("data.num_clients=0", "data.num_clients = 0"),
])
def test_every_range_check_comes_before_the_data(config, tmp_path, no_data, capsys, override, named):
    assert run(config, tmp_path / "run", "--no-progress", "--set", override) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dpfl run: error: {named} is not allowed") and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_warm_rounds_and_model_keys_are_checked_before_the_data(config, tmp_path, no_data, capsys):
    warm = ["--set", "algorithm.name='dp-scaffold-warm'", "--set", "algorithm.client_rate=1.0"]
    assert run(config, tmp_path / "run", "--no-progress", *warm, "--set", "algorithm.rounds=4") == 2
    assert "algorithm.rounds = 4 is not allowed: expected more than the 4 warm-start rounds" in capsys.readouterr().err
    mlp = ["--set", "model.name='mlp'", "--set", "model.hidden=[8, 0]"]
    assert run(config, tmp_path / "run", "--no-progress", *mlp) == 2
    assert "model.hidden = [8, 0] is not allowed" in capsys.readouterr().err


def test_an_out_that_is_a_file_is_refused_before_the_data(config, tmp_path, no_data, capsys):
    file = tmp_path / "results"
    file.write_text("not a directory")
    assert run(config, file) == 2
    assert f"dpfl run: error: --out {file} is a file, not a directory" in capsys.readouterr().err
    assert run(config, file / "run") == 2
    assert f"--out {file / 'run'} cannot be created: {file} is a file" in capsys.readouterr().err
    assert file.read_text() == "not a directory"


def test_an_unwritable_out_is_refused_before_the_data(config, tmp_path, no_data, monkeypatch, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o555)
    if os.access(locked, os.W_OK):  # root may write anywhere: let access() answer as it would for a user
        real = os.access
        monkeypatch.setattr(run_directory.os, "access", lambda p, mode: real(p, mode) and not (
            os.fspath(p) == os.fspath(locked) and mode & os.W_OK))
    try:
        for out in (locked, locked / "new" / "run"):
            assert run(config, out) == 2
            err = capsys.readouterr().err
            assert f"--out {out}: {locked} is not writable (permission denied)" in err and "Traceback" not in err
    finally:
        locked.chmod(0o755)


# -- an empty config -----------------------------------------------------------------------------------------------
def test_an_empty_config_names_the_defaults_it_runs_before_it_runs(tmp_path, monkeypatch, capsys):
    def build_dataset(*args, **kwargs):
        raise DpflError("stopped here")

    monkeypatch.setattr(assembly, "build_dataset", build_dataset)
    empty = tmp_path / "empty.toml"
    empty.write_text("# nothing set\n")
    assert run(empty, tmp_path / "run", "--no-progress") == 2
    first, *rest = capsys.readouterr().err.splitlines()
    resolved = load_config(None)  # the defaults as a run resolves them (data.num_clients 100 for synthetic data)
    algorithm, data = resolved["algorithm"], resolved["data"]
    assert first == (f"dpfl run: {empty} sets no keys, so this runs the defaults: {algorithm['name']} for "
                     f"{algorithm['rounds']} rounds (noise_multiplier {algorithm['noise_multiplier']}, clip "
                     f"{algorithm['clip']}, client_rate {algorithm['client_rate']}) on {data['name']} data "
                     f"({data['num_clients']} clients), model logreg; `dpfl run --help` lists the keys")
    assert rest == ["dpfl run: error: stopped here"]
    assert run(empty, tmp_path / "run2", "--no-progress", "--set", "algorithm.rounds=7") == 2
    assert "runs the defaults with the --set keys: dp-scaffold-warm for 7 rounds" in capsys.readouterr().err


def test_a_config_that_sets_keys_gets_no_note(config, tmp_path, no_data, capsys):
    assert run(config, tmp_path / "run", "--set", "run.eval_every=0") == 2
    assert "defaults" not in capsys.readouterr().err


def test_dp_accountings_log_lines_are_summarised_once_on_stderr(tmp_path, capsys):
    """The joint-noise family's RDP accountant makes dp_accounting log one line per fractional order whose series
    does not converge; `dpfl run` prints one note with the count instead of a line each."""
    config = tmp_path / "joint.toml"
    config.write_text("[data]\nname = 'digits'\nnum_clients = 10\n[algorithm]\nname = 'dp-fedavg-joint'\n"
                      "local_steps = 2\nrounds = 1\n")
    assert run(config, tmp_path / "run", "--no-progress") == 0
    err = capsys.readouterr().err
    notes = [line for line in err.splitlines() if line.startswith("dpfl run: note: dp_accounting:")]
    assert len(notes) == 1 and "more like it)" in notes[0], err
    assert "WARNING:absl" not in err and "failed to converge" not in err.replace(notes[0], "")


# -- what the summary says about privacy ---------------------------------------------------------------------------
def test_the_default_delta_is_a_power_of_ten_well_below_one_over_n(config, tmp_path, capsys):
    """delta unset: the largest power of ten at most 1/(10 N) (N = 6 x 24 = 144 training records: 1e-4, not 1/144)."""
    assert [assembly.default_delta(n) for n in (1, 10, 11, 144, 1592, 32_000, 400_000)] == \
        [0.1, 0.01, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7]
    assert run(config, tmp_path / "run", "--no-progress") == 0
    assert read(tmp_path / "run" / "results.json")["final"]["delta"] == 1e-4
    assert "at delta 0.0001\n" in capsys.readouterr().out


def test_a_delta_above_one_over_n_is_warned_about_on_one_line(config, tmp_path, capsys):
    assert run(config, tmp_path / "run", "--no-progress", "--set", "privacy.delta=0.01") == 0
    err = capsys.readouterr().err
    assert ("dpfl run: warning: privacy.delta = 0.01 is above 1 / N = 0.00694 (N = 144 training records): a "
            "mechanism that publishes one random record in full is (0, 1/N)-DP, so this delta allows leaking whole "
            "records; choose delta well below 1 / N, or leave privacy.delta to its default (0.0001: the largest "
            "power of ten at most 1/(10 N), N the training records)\n") in err
    assert "UserWarning" not in err and err.count("privacy.delta = 0.01 is above") == 1


def test_a_bare_budget_says_which_observers_it_leaves_unlimited(config, tmp_path, capsys):
    assert run(config, tmp_path / "run", "--no-progress", "--set", "privacy.budget=50.0") == 0
    out = capsys.readouterr().out
    eps = read(tmp_path / "run" / "results.json")["final"]["epsilon"]
    assert (f"budget: third_party <= 50 only; not limited: server {eps['server']:.3f}, other_silo "
            f"{eps['other_silo']:.3f} (privacy.budget = {{observer = epsilon, ...}} limits others too)") in out
    assert run(config, tmp_path / "all", "--no-progress", "--set",
               "privacy.budget={third_party = 50.0, server = 50.0, other_silo = 50.0}") == 0
    assert "budget:" not in capsys.readouterr().out


def test_a_restart_keeps_the_archived_runs_spend_in_the_report(config, tmp_path, capsys):
    """--restart on the same data archives the run; its privacy is still reported, with the total by basic
    composition (epsilons and deltas add), in the summary and results.json."""
    out = tmp_path / "run"
    assert run(config, out, "--no-progress") == 0
    first = read(out / "results.json")["final"]
    assert run(config, out, "--no-progress", "--restart", "--set", "algorithm.rounds=2") == 0
    printed = capsys.readouterr().out
    results = read(out / "results.json")
    (archived,) = results["archived"]["runs"]
    assert archived["rounds"] == 6 and archived["epsilon"] == first["epsilon"] and archived["delta"] == 1e-4
    total = results["archived"]["with_this_run"]
    assert total["epsilon"] == {o: e + first["epsilon"][o] for o, e in results["final"]["epsilon"].items()}
    assert total["delta"] == 2e-4
    assert ("archived: 1 earlier run(s) in this directory spent privacy too (--restart does not give it back); with "
            "this run, by basic composition: epsilon (third_party=" f"{total['epsilon']['third_party']:.3f}") in printed


def test_non_private_preprocessing_is_printed_beside_the_epsilon(config, tmp_path, capsys):
    assert run(config, tmp_path / "run", "--no-progress", "--set", "data.standardize='client'", "--json") == 0
    assert json.loads(capsys.readouterr().out)["not_covered"] == [
        "data.standardize = 'client' (mean and std of the client's own training split)"]
    assert run(config, tmp_path / "run2", "--no-progress", "--set", "data.standardize='pooled'") == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("round 6: ") and line.endswith(
        "; NOT covered by epsilon: data.standardize = 'pooled' (mean and std of all clients' training splits "
        "together (crosses silos))")
