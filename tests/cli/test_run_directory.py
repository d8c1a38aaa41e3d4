"""Crash-safe run directories through `dpfl run`: privacy already spent is never lost, and a round's noise is never
replayed onto a different computation (run.json, --resume, --restart, Ctrl-C, damaged files, SIGKILL)."""

import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dpfl import durable
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.cli import main
from dpfl.engine.keys import KEY_FILE, load_key
from dpfl.engine.simulator import Simulation
from dpfl.experiments import run_directory
from dpfl.experiments.config import load_config
from dpfl.experiments.resolved import with_threads
from dpfl.experiments.run_directory import release_hash
from full_disk import FullDisk

SRC = Path(__file__).resolve().parents[2] / "src"
FIXED_KEY = 2**200 + 12345

CONFIG = """
[data]
num_clients = 10
samples_per_client = 50

[algorithm]
name = "dp-scaffold"
rounds = 6
local_steps = 2
client_rate = 0.5
clip = 1.0
noise_multiplier = 2.0

[run]
checkpoint_every = 1
"""


@pytest.fixture(autouse=True)
def fixed_fresh_key(monkeypatch):
    """New runs in this process draw the same secret key, so that runs can be compared bit for bit; a resume still
    reads the key from the run directory's noise.key (the path under test)."""
    monkeypatch.setattr(run_directory, "fresh_key", lambda: FIXED_KEY)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "small.toml"
    path.write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def finished(config, tmp_path_factory):
    """A finished 6-round run's directory (treat as read-only: copy it to change it)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(run_directory, "fresh_key", lambda: FIXED_KEY)
        assert run(config, out) == 0
    return out


def run(config, out, *args):
    return main(["run", str(config), "--out", str(out), "--no-progress", *args])


def files(out):
    return {name: (out / name).read_bytes() for name in ("ledger.json", "checkpoint.pt", "run.json", KEY_FILE)}


def copy_run(finished, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    return out


def final_model(out):
    return torch.load(out / "checkpoint.pt", weights_only=True)["state"]["server"]["x"]


# -- 1. the release config -----------------------------------------------------------------------------------------
def test_a_fresh_run_writes_run_json_before_its_first_round(config, tmp_path, monkeypatch):
    out = tmp_path / "run"
    seen = []
    step = Simulation.step

    def watched(sim):
        seen.append((out / "run.json").exists())
        step(sim)

    monkeypatch.setattr(Simulation, "step", watched)
    assert run(config, out) == 0
    assert seen == [True] * 6
    record = json.loads((out / "run.json").read_text())
    resolved = with_threads(load_config(config))  # run.threads resolved to this machine's default
    assert record["config"] == resolved and record["release_sha256"] == release_hash(resolved)
    # run-only keys are not part of the release; a float key given as an integer is the same release
    assert release_hash(with_threads(load_config(config, ["algorithm.rounds=99", "run.eval_every=3",
                                                          "privacy.budget=5.0", "run.checkpoint_every=7"]))) \
        == release_hash(resolved)
    assert release_hash(with_threads(load_config(config, ["algorithm.clip=1"]))) == release_hash(resolved)
    # the chunking (memory_mb) and the thread count change float rounding in batched matrix products: a replay under
    # another one would put the same noise on a (slightly) different computation, so both belong to the release
    assert release_hash(with_threads(load_config(config, ["run.memory_mb=1"]))) != release_hash(resolved)
    assert release_hash(load_config(config, [f"run.threads={torch.get_num_threads() + 1}"])) != release_hash(resolved)
    assert release_hash(with_threads(load_config(config, ["run.seed=1"]))) != release_hash(resolved)


@pytest.mark.parametrize("override, key, old, new", [
    ("algorithm.clip=3.0", "algorithm.clip", "1.0", "3.0"),
    ("data.seed=1", "data.seed", "0", "1"),
    ("algorithm.name='dp-fedavg'", "algorithm.name", "'dp-scaffold'", "'dp-fedavg'"),
    ("algorithm.noise_multiplier=5.0", "algorithm.noise_multiplier", "2.0", "5.0"),
    ("model.name='mlp'", "model.name", "'logreg'", "'mlp'"),
    ("data.num_clients=12", "data.num_clients", "10", "12"),
])
def test_resume_with_another_release_config_is_refused(config, finished, capsys, override, key, old, new):
    before = files(finished)
    assert run(config, finished, "--resume", "--set", override) == 2
    err = capsys.readouterr().err
    assert f"dpfl run: error: cannot resume: the run in {finished} was made with " in err
    assert f"{key} = {old}, this config has {new}" in err or f"{key} = {old} -> {new}" in err
    assert "Traceback" not in err and "start a new run directory" in err
    assert files(finished) == before


def test_a_refused_resume_names_every_key_that_differs(config, finished, capsys):
    before = files(finished)
    assert run(config, finished, "--resume", "--set", "algorithm.clip=3.0", "--set", "data.seed=1",
               "--set", "algorithm.lr=0.5") == 2
    err = capsys.readouterr().err
    assert "algorithm.clip = 1.0, this config has 3.0 (and algorithm.lr = 0.1 -> 0.5; data.seed = 0 -> 1)" in err
    assert files(finished) == before


def test_resume_may_change_run_only_keys(config, finished, tmp_path):
    out = copy_run(finished, tmp_path)
    assert run(config, out, "--resume", "--set", "algorithm.rounds=8", "--set", "run.eval_every=2",
               "--set", "run.checkpoint_every=3", "--set", "privacy.budget=100.0") == 0
    assert PrivacyLedger.load(out / "ledger.json").compositions == 8
    assert json.loads((out / "run.json").read_text())["config"]["algorithm"]["rounds"] == 8


def test_a_run_only_key_that_decides_the_release_is_part_of_the_release_hash(monkeypatch):
    """An algorithm that calibrates its noise to the number of rounds names algorithm.rounds in its spec's
    release_keys: then changing the rounds changes the release hash, so a resume with other rounds is refused."""
    import dataclasses

    from dpfl.algorithms import registry

    config = load_config(None, ["algorithm.name='dp-fedavg'"])
    longer = load_config(None, ["algorithm.name='dp-fedavg'", "algorithm.rounds=7"])
    assert release_hash(config) == release_hash(longer)
    spec = registry.spec_of("dp-fedavg")
    calibrated = dataclasses.replace(spec, release_keys=("algorithm.rounds",))
    monkeypatch.setattr(registry, "spec_of", lambda name: calibrated)
    assert release_hash(config) != release_hash(longer)


@pytest.fixture
def torch_threads():
    """Restores torch's thread count after a test that changes it."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_a_config_without_run_threads_runs_on_one_thread_whatever_the_machine(config, tmp_path, monkeypatch,
                                                                               torch_threads):
    """run.threads unset is one thread (the cohort is one batched call; two threads ran 10-30x slower on a busy
    machine), recorded in run.json, not the machine's cores."""
    torch.set_num_threads(2)
    seen = []
    step = Simulation.step
    monkeypatch.setattr(Simulation, "step", lambda sim: seen.append(torch.get_num_threads()) or step(sim))
    assert run(config, tmp_path / "run") == 0
    assert seen == [1] * 6
    assert json.loads((tmp_path / "run" / "run.json").read_text())["config"]["run"]["threads"] == 1


def test_a_run_made_with_another_thread_count_resumes_with_it_when_the_config_sets_none(config, tmp_path, capsys,
                                                                                         torch_threads):
    """A run started under the earlier default (the machine's cores, recorded in run.json) resumes with its own count
    when the config leaves run.threads unset; a config that sets another count is refused."""
    out = tmp_path / "run"
    assert run(config, out, "--set", "run.threads=2", "--set", "algorithm.rounds=3") == 0
    torch.set_num_threads(1)
    assert run(config, out, "--resume", "--set", "run.threads=1") == 2
    assert "run.threads = 2, this config has 1" in capsys.readouterr().err
    assert run(config, out, "--resume") == 0
    assert json.loads((out / "run.json").read_text())["config"]["run"]["threads"] == 2
    assert PrivacyLedger.load(out / "ledger.json").compositions == 6


# -- 2. a new run never overwrites one -----------------------------------------------------------------------------
def test_a_new_run_into_a_run_directory_is_refused(config, finished, capsys):
    before = files(finished)
    assert run(config, finished) == 2
    err = capsys.readouterr().err
    assert (f"dpfl run: error: {finished} already holds a run's privacy ledger (6 rounds spent); continue it with "
            "--resume, or pass --restart to archive it and start over") in err
    assert files(finished) == before


def test_restart_archives_the_run_and_starts_over(config, finished, tmp_path, capsys):
    out = copy_run(finished, tmp_path)
    before = {**files(out), "results.json": (out / "results.json").read_bytes()}
    assert run(config, out, "--restart") == 0
    (archive,) = (out / "archive").iterdir()
    assert {p.name: p.read_bytes() for p in archive.iterdir()} == before
    assert f"archived the previous run in {out} to {archive}" in capsys.readouterr().err
    assert PrivacyLedger.load(out / "ledger.json").compositions == 6  # a fresh ledger, not 12 rounds
    assert torch.equal(final_model(out), final_model(finished))


def test_resume_and_restart_together_is_an_error(config, finished, capsys):
    before = files(finished)
    assert run(config, finished, "--resume", "--restart") == 2
    assert "--resume and --restart cannot be combined" in capsys.readouterr().err
    assert files(finished) == before


# -- 3. killed before the first checkpoint -------------------------------------------------------------------------
class Killed(Exception):
    """Stands for the process dying."""


def test_a_run_killed_before_its_first_checkpoint_resumes_from_its_first_round(config, finished, tmp_path,
                                                                               monkeypatch, capsys):
    out = tmp_path / "run"
    step = Simulation.step

    def dies_in_round_3(sim):
        step(sim)
        if sim.next_round == 4:  # round 4 drew its noise (and is in the ledger), then the process died
            raise Killed

    monkeypatch.setattr(Simulation, "step", dies_in_round_3)
    with pytest.raises(Killed):
        run(config, out, "--set", "run.checkpoint_every=100")
    monkeypatch.undo()
    assert not (out / "checkpoint.pt").exists() and PrivacyLedger.load(out / "ledger.json").compositions == 4

    assert run(config, out, "--resume", "--set", "run.checkpoint_every=100") == 0
    resumed, reference = PrivacyLedger.load(out / "ledger.json"), PrivacyLedger.load(finished / "ledger.json")
    assert resumed.compositions == 6  # rounds 1-4 replayed with the fingerprints on record: not charged twice
    assert resumed.epsilon() == reference.epsilon()
    assert torch.equal(final_model(out), final_model(finished))


def test_resume_needs_a_run_and_its_run_json(config, finished, tmp_path, capsys):
    assert run(config, tmp_path / "empty", "--resume") == 2
    assert (f"cannot resume: {tmp_path / 'empty'} holds no ledger.json or checkpoint.pt (no round of a run was "
            "started there); drop --resume to start a new run") in capsys.readouterr().err
    out = copy_run(finished, tmp_path)
    (out / "run.json").unlink()
    assert run(config, out, "--resume") == 2
    assert f"cannot resume: {out} has no run.json" in capsys.readouterr().err


# -- 4. Ctrl-C -----------------------------------------------------------------------------------------------------
def test_ctrl_c_finishes_the_round_checkpoints_and_exits_130(config, finished, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    handler = signal.getsignal(signal.SIGINT)
    step = Simulation.step

    def ctrl_c_in_round_1(sim):
        if sim.next_round == 1:
            os.kill(os.getpid(), signal.SIGINT)
        step(sim)

    monkeypatch.setattr(Simulation, "step", ctrl_c_in_round_1)
    assert run(config, out, "--set", "run.checkpoint_every=100") == 130
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert (f"interrupted after round 2; results so far: {out / 'results.json'}; resume with: dpfl run {config} "
            f"--set run.checkpoint_every=100 --out {out} --resume") in err
    assert "Traceback" not in err
    assert signal.getsignal(signal.SIGINT) is handler  # restored
    assert torch.load(out / "checkpoint.pt", weights_only=True)["next_round"] == 2  # checkpointed on the way out
    results = json.loads((out / "results.json").read_text())
    assert [r["round"] for r in results["rounds"]] == [1, 2] and "interrupted" in results["stopped_reason"]

    assert run(config, out, "--set", "run.checkpoint_every=100", "--resume") == 0
    assert PrivacyLedger.load(out / "ledger.json").epsilon() == PrivacyLedger.load(finished / "ledger.json").epsilon()
    assert torch.equal(final_model(out), final_model(finished))


def test_a_second_ctrl_c_aborts_at_once(config, tmp_path, monkeypatch, capsys):
    out = tmp_path / "run"
    handler = signal.getsignal(signal.SIGINT)
    step = Simulation.step

    def ctrl_c_twice_in_round_2(sim):
        step(sim)
        if sim.next_round == 3:
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            pytest.fail("the second Ctrl-C did not abort")

    monkeypatch.setattr(Simulation, "step", ctrl_c_twice_in_round_2)
    assert run(config, out) == 130
    err = capsys.readouterr().err
    assert f"aborted; the privacy ledger in {out} is up to date; resume with:" in err and "Traceback" not in err
    assert signal.getsignal(signal.SIGINT) is handler
    assert PrivacyLedger.load(out / "ledger.json").compositions == 3  # every round started is on disk


# -- 5. damaged files ----------------------------------------------------------------------------------------------
def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def edit_run_json(path):
    record = json.loads(path.read_text())
    record["config"]["algorithm"]["clip"] = 3.0
    path.write_text(json.dumps(record))


@pytest.mark.parametrize("name, damage, message", [
    ("ledger.json", truncate, "ledger.json is not a valid privacy ledger (truncated JSON at line"),
    ("ledger.json", lambda p: p.write_text("[]"), "ledger.json is not a valid privacy ledger (TypeError"),
    ("checkpoint.pt", truncate, "checkpoint.pt is not a valid checkpoint of this run (truncated, or not written by"),
    ("checkpoint.pt", lambda p: p.write_bytes(b""), "checkpoint.pt is not a valid checkpoint of this run (empty file)"),
    ("run.json", truncate, "run.json is not a valid run record (truncated JSON at line"),
    ("run.json", edit_run_json, "run.json is not a valid run record (its release_sha256 does not match its config)"),
])
def test_a_damaged_run_file_is_named_and_nothing_starts_over(config, finished, tmp_path, capsys, name, damage,
                                                             message):
    out = copy_run(finished, tmp_path)
    damage(out / name)
    before = files(out)
    assert run(config, out, "--resume") == 2
    err = capsys.readouterr().err
    assert f"dpfl run: error: {out / name}" in err and message in err and "Traceback" not in err
    assert run(config, out) == 2  # a new run does not overwrite it either
    assert files(out) == before


# -- 6. results after a resume -------------------------------------------------------------------------------------
@pytest.mark.parametrize("checkpoint_every, dies_after", [(3, 5), (100, 4)])
def test_replayed_rounds_report_their_own_epsilon(config, finished, tmp_path, monkeypatch, checkpoint_every,
                                                  dies_after):
    """The run dies after round 5 (4) with its checkpoint after round 3 (none): the resume replays rounds 4 and 5 (1
    to 4), free, and results.json reports for each the epsilon it had the first time, as the uninterrupted run's
    results.json does (before, each replayed round reported the ledger's latest: round 4's epsilon was round 5's)."""
    out = tmp_path / "run"
    every = ("--set", f"run.checkpoint_every={checkpoint_every}", "--set", "run.epsilon_every=1")  # every row's
    step = Simulation.step

    def dies(sim):
        step(sim)
        if sim.next_round == dies_after:
            raise Killed

    monkeypatch.setattr(Simulation, "step", dies)
    with pytest.raises(Killed):
        run(config, out, *every)
    monkeypatch.undo()
    assert run(config, out, "--resume", *every) == 0
    resumed, reference = (json.loads((d / "results.json").read_text()) for d in (out, finished))
    assert [r["round"] for r in resumed["rounds"]] == [1, 2, 3, 4, 5, 6]
    assert [r["epsilon"] for r in resumed["rounds"]] == [r["epsilon"] for r in reference["rounds"]]
    assert resumed["rounds"] == reference["rounds"] and resumed["final"] == reference["final"]
    epsilons = [r["epsilon"]["server"] for r in resumed["rounds"]]
    assert epsilons == sorted(epsilons) and len(set(epsilons)) == 6


def test_a_run_stopped_mid_replay_reports_all_the_privacy_spent_as_final(config, finished, tmp_path, monkeypatch):
    """Resumed after dying in round 5 with its checkpoint after round 3, and stopped again after replaying round 4:
    round 4 reports its own epsilon, "final" the ledger's five rounds (round 5 may have been released)."""
    out = tmp_path / "run"
    step = Simulation.step

    def dies_after(rounds):
        def dies(sim):
            step(sim)
            if sim.next_round == rounds:
                raise Killed
        return dies

    monkeypatch.setattr(Simulation, "step", dies_after(5))
    with pytest.raises(Killed):
        run(config, out, "--set", "run.checkpoint_every=3")
    assert run(config, out, "--resume", "--set", "run.checkpoint_every=3", "--set", "algorithm.rounds=4") == 0
    resumed, reference = (json.loads((d / "results.json").read_text()) for d in (out, finished))
    assert resumed["rounds"] == reference["rounds"][:4]
    assert resumed["final"]["epsilon"] == reference["rounds"][4]["epsilon"] != reference["rounds"][3]["epsilon"]


# -- 7. SIGKILL at a random moment ---------------------------------------------------------------------------------
SLOW = ["--set", "algorithm.rounds=30", "--set", "algorithm.local_steps=30", "--set", "run.checkpoint_every=4"]


def test_a_run_killed_at_a_random_moment_resumes_to_the_uninterrupted_result(config, tmp_path):
    out, straight = tmp_path / "killed", tmp_path / "straight"
    target = random.randint(2, 12)  # rounds on the ledger when the kill comes
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-m", "dpfl.cli", "run", str(config), "--out", str(out),
                              "--no-progress", *SLOW], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while _rounds_on_ledger(out) < target:
            assert child.poll() is None, child.stderr.read().decode()
            time.sleep(0.005)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
        child.wait()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL, f"the child finished before the kill (target {target})"

    assert run(config, out, "--resume", *SLOW) == 0
    with pytest.MonkeyPatch.context() as patch:  # the uninterrupted run with the killed child's secret key
        patch.setattr(run_directory, "fresh_key", lambda: load_key(out / KEY_FILE))
        assert run(config, straight, *SLOW) == 0
    resumed, reference = (json.loads((d / "ledger.json").read_text()) for d in (out, straight))
    assert len(resumed["journal"]) == len(reference["journal"]) == 30, f"killed at {target} rounds"
    assert resumed["epsilon"] == reference["epsilon"]
    assert torch.equal(final_model(out), final_model(straight)), f"killed at {target} rounds"


def _rounds_on_ledger(out):
    try:  # the ledger is replaced atomically: it is absent or complete
        return len(json.loads((out / "ledger.json").read_text())["journal"])
    except FileNotFoundError:
        return 0


# -- 8. a full disk ------------------------------------------------------------------------------------------------
def test_a_full_disk_at_a_checkpoint_is_a_clear_error_and_the_run_resumes(config, finished, tmp_path, monkeypatch,
                                                                          capsys):
    """The disk fills while round 3's checkpoint is written (inside torch.save's archive): `dpfl run` says so and
    exits 2 (before: a RuntimeError traceback from torch's zip writer, and checkpoint.pt.tmp left behind); round 2's
    checkpoint is intact, and once there is room again the run resumes to the uninterrupted result."""
    out = tmp_path / "run"
    opened = []

    def full_at_round_3(path, mode):
        opened.append(Path(path).name)
        room = 2000 if opened.count("checkpoint.pt.tmp") == 3 else 2**40
        return io.BufferedWriter(FullDisk(path, mode, room))

    monkeypatch.setattr(durable, "open", full_at_round_3, raising=False)
    assert run(config, out) == 2
    err = capsys.readouterr().err
    assert f"dpfl run: error: cannot write the checkpoint {out / 'checkpoint.pt'}: No space left on device" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "ledger.json", "noise.key", "results.json",
                                                     "run.json"]
    assert torch.load(out / "checkpoint.pt", weights_only=True)["next_round"] == 2
    monkeypatch.undo()
    assert run(config, out, "--resume") == 0
    assert torch.equal(final_model(out), final_model(finished))
    assert json.loads((out / "ledger.json").read_text())["epsilon"] == \
        json.loads((finished / "ledger.json").read_text())["epsilon"]


# -- 9. a run's record without its ledger and checkpoint -----------------------------------------------------------
@pytest.mark.parametrize("left", [("run.json", "results.json"), ("results.json",), ("run.json",)])
def test_a_run_directory_that_lost_its_ledger_and_checkpoint_is_refused(config, finished, tmp_path, capsys, left):
    """Only the run's record is left (ledger.json and checkpoint.pt moved or deleted): the privacy that run spent is
    no longer on record, so a new run is refused like in any directory that held a run (before: it silently started
    over), and so is --resume; --restart archives what is left and starts over."""
    out = copy_run(finished, tmp_path)
    for name in ("ledger.json", "checkpoint.pt", *({"run.json", "results.json"} - set(left))):
        (out / name).unlink()
    before = {name: (out / name).read_bytes() for name in left}
    assert run(config, out) == 2
    err = capsys.readouterr().err
    assert (f"dpfl run: error: {out} holds a run's {' and '.join(left)} but neither its ledger.json nor its "
            "checkpoint.pt, so the privacy that run spent is not on record") in err
    assert run(config, out, "--resume") == 2
    assert f"cannot resume: {out} holds a run's {' and '.join(left)} but neither" in capsys.readouterr().err
    assert {name: (out / name).read_bytes() for name in left} == before and not (out / "ledger.json").exists()
    assert run(config, out, "--restart") == 0
    (archive,) = (out / "archive").iterdir()
    key = {KEY_FILE: (finished / KEY_FILE).read_bytes()}  # the old run's noise key is archived with its record
    assert {p.name: p.read_bytes() for p in archive.iterdir()} == {**before, **key}
    assert torch.equal(final_model(out), final_model(finished))
