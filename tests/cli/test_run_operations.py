"""Operating a run: one run at a time in a run directory (its lock, DIR/.lock), and SIGTERM stopping a run as Ctrl-C
does (after its round, results.json "stopped", exit 143, resumable). Through `dpfl run` (in this process and as a
separate process), ``dpfl.run`` and the lock itself."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dpfl
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.cli import main
from dpfl.cli.run import TERMINATED
from dpfl.engine.simulator import Simulation
from dpfl.errors import RunDirectoryError
from dpfl.experiments import run_lock as run_lock_module
from dpfl.experiments.run_lock import LOCK_FILE, run_lock

SRC = Path(__file__).resolve().parents[2] / "src"
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")])}

CONFIG = """
[data]
num_clients = 10
samples_per_client = 50

[algorithm]
name = "dp-fedavg"
rounds = 4
local_steps = 2
client_rate = 0.5
clip = 1.0
noise_multiplier = 2.0

[run]
threads = 1
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "small.toml"
    path.write_text(CONFIG)
    return path


@pytest.fixture(scope="module")
def finished(config, tmp_path_factory):
    """A finished 4-round run's directory (copy it to change it)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    assert run(config, out) == 0
    return out


def run(config, out, *args):
    return main(["run", str(config), "--out", str(out), "--no-progress", *args])


def dpfl_run_process(config, out, *args, **popen):
    return subprocess.Popen([sys.executable, "-m", "dpfl.cli", "run", str(config), "--out", str(out), "--no-progress",
                             *args], env=ENV, text=True, **popen)


def contents(out):
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


# -- the lock --------------------------------------------------------------------------------------------------------
def test_a_second_run_is_refused_while_the_first_holds_the_directory(config, finished, tmp_path, capsys):
    """While this process holds the directory's lock: `dpfl run` in another process exits 2 naming the holder's pid;
    a new run, --resume, --restart (which would otherwise run) and ``dpfl.run`` are refused alike, before they read or
    write anything. Once the lock is released, --resume runs, and no lock file is left behind."""
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    before = contents(out)
    refusal = f"another dpfl run holds {out} (pid {os.getpid()})"
    with run_lock(out):
        assert (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"
        second = dpfl_run_process(config, out, "--resume", "--set", "algorithm.rounds=5", stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE)
        stdout, stderr = second.communicate(timeout=300)
        assert second.returncode == 2 and f"dpfl run: error: {refusal}; wait for it to end" in stderr, stderr
        assert "Traceback" not in stderr and stdout == ""
        for args in ((), ("--resume", "--set", "algorithm.rounds=5"), ("--restart",)):
            assert run(config, out, *args) == 2
            assert f"dpfl run: error: {refusal}" in capsys.readouterr().err
        with pytest.raises(RunDirectoryError, match=r"another dpfl run holds .* \(pid \d+\)"):
            dpfl.run(str(config), out=out, resume=True)
        assert {k: v for k, v in contents(out).items() if k != LOCK_FILE} == before
    assert not (out / LOCK_FILE).exists()
    assert run(config, out, "--resume", "--set", "algorithm.rounds=5") == 0
    assert PrivacyLedger.load(out / "ledger.json").compositions == 5
    assert not (out / LOCK_FILE).exists()


HOLD = """
import sys
from pathlib import Path
from dpfl.experiments.run_lock import run_lock
with run_lock(Path(sys.argv[1])):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_a_lock_left_by_a_killed_process_blocks_nothing(config, tmp_path, capsys):
    """A process holding the lock refuses a run, naming its pid; killed (SIGKILL: no clean-up), it leaves its lock
    file behind, and the next run takes the lock on it (the kernel released it with the process)."""
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], env=ENV, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "locked\n"
        assert run(config, out) == 2
        assert f"dpfl run: error: another dpfl run holds {out} (pid {holder.pid})" in capsys.readouterr().err
    finally:
        holder.kill()
        holder.wait()
        holder.stdin.close()
        holder.stdout.close()
    assert (out / LOCK_FILE).read_text() == f"{holder.pid}\n"  # left behind by the killed holder
    assert run(config, out) == 0
    assert json.loads((out / "results.json").read_text())["status"] == "finished"
    assert not (out / LOCK_FILE).exists()


def test_a_lock_file_removed_before_it_is_locked_is_opened_again(tmp_path, monkeypatch):
    """The holder removes the lock file on release, while still holding it: a process that opened the file just
    before finds, once it holds the lock, that the path names another file (or none), and locks the one there, so
    two processes never hold locks on two files of the same name."""
    out = tmp_path / "run"
    flock, opened = run_lock_module.fcntl.flock, []

    def released_meanwhile(descriptor, operation):
        opened.append(os.fstat(descriptor).st_ino)
        if len(opened) == 1:
            os.unlink(out / LOCK_FILE)  # what a releasing holder does between this process's open and flock
        flock(descriptor, operation)

    monkeypatch.setattr(run_lock_module.fcntl, "flock", released_meanwhile)
    with run_lock(out):
        assert len(opened) == 2 and os.stat(out / LOCK_FILE).st_ino == opened[1]
        assert (out / LOCK_FILE).read_text() == f"{os.getpid()}\n"
    assert sorted(os.listdir(tmp_path)) == []  # the folder it created, empty again, is removed


# -- SIGTERM ---------------------------------------------------------------------------------------------------------
def test_sigterm_stops_after_the_round_exits_143_and_the_run_resumes_to_its_end(config, tmp_path):
    """A `dpfl run` process of 2,000 rounds gets SIGTERM once results.json shows a round done: it finishes its round,
    checkpoints, writes results.json (status "stopped", the reason naming SIGTERM), prints the resume command and
    exits 143; --resume continues it to its end (a few rounds later) with every round on the ledger once."""
    out = tmp_path / "run"
    child = dpfl_run_process(config, out, "--set", "algorithm.rounds=2000", stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
    try:
        while not _rounds_in_results(out):
            assert child.poll() is None, child.stderr.read()
            time.sleep(0.01)
        child.send_signal(signal.SIGTERM)
        _, stderr = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == TERMINATED == 143, stderr
    assert "SIGTERM: stopping after this round" in stderr and "Traceback" not in stderr
    results = json.loads((out / "results.json").read_text())
    done = results["final"]["round"]
    assert 1 <= done < 2000 and [r["round"] for r in results["rounds"]] == list(range(1, done + 1))
    assert results["status"] == "stopped" and results["stopped_by"] == "interrupted"
    assert results["stopped_reason"] == f"interrupted (SIGTERM) after round {done} of 2000"
    assert (f"interrupted after round {done}; results so far: {out / 'results.json'}; resume with: dpfl run {config} "
            f"--set algorithm.rounds=2000 --out {out} --resume") in stderr
    assert PrivacyLedger.load(out / "ledger.json").compositions == done

    assert run(config, out, "--resume", "--set", f"algorithm.rounds={done + 2}") == 0
    results = json.loads((out / "results.json").read_text())
    assert results["status"] == "finished" and results["final"]["round"] == done + 2
    assert PrivacyLedger.load(out / "ledger.json").compositions == done + 2


def _rounds_in_results(out):
    try:  # written atomically: absent or complete
        return len(json.loads((out / "results.json").read_text())["rounds"])
    except FileNotFoundError:
        return 0


def test_sigterm_in_this_process_restores_the_handler_and_a_second_one_aborts(config, tmp_path, monkeypatch, capsys):
    """In `dpfl run` (main thread): SIGTERM in round 2 stops the run after it (exit 143) and the default SIGTERM
    action is back afterwards; two in a row abort at once (exit 143, the ledger holding round 2's charge)."""
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    step = Simulation.step

    def sigterm_in_round_2(times):
        def stepped(sim):
            step(sim)
            if sim.next_round == 2:
                for _ in range(times):
                    os.kill(os.getpid(), signal.SIGTERM)
        return stepped

    monkeypatch.setattr(Simulation, "step", sigterm_in_round_2(1))
    assert run(config, tmp_path / "once") == 143
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    results = json.loads((tmp_path / "once" / "results.json").read_text())
    assert results["stopped_reason"] == "interrupted (SIGTERM) after round 2 of 4"
    monkeypatch.setattr(Simulation, "step", sigterm_in_round_2(2))
    assert run(config, tmp_path / "twice") == 143
    err = capsys.readouterr().err
    assert f"aborted; the privacy ledger in {tmp_path / 'twice'} is up to date; resume with:" in err
    assert PrivacyLedger.load(tmp_path / "twice" / "ledger.json").compositions == 2
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


def test_a_sigterm_handler_of_the_host_process_is_kept(config, tmp_path, monkeypatch):
    """A process that installed its own SIGTERM handler (Flower's ServerApp process does) keeps it: the run does not
    take SIGTERM over, and runs all its rounds."""
    heard = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: heard.append(signum))
    step = Simulation.step

    def sigterm_in_round_2(sim):
        if sim.next_round == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        step(sim)

    monkeypatch.setattr(Simulation, "step", sigterm_in_round_2)
    try:
        assert run(config, tmp_path / "run") == 0
        assert heard == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert json.loads((tmp_path / "run" / "results.json").read_text())["status"] == "finished"
