"""`dpfl run --nproc N`: a run's cohort split across N local ranks (``dpfl.engine.ranks``, ``dpfl.engine.launch``), and
what the ranks' run directory must survive: a rank killed mid-run (SIGKILL) and Ctrl-C, each resumed with
`--resume --nproc 2`, give the uninterrupted run's ledger and model; refusals of a bad --nproc.

The ranks are processes of their own, so the tests give them the same secret noise key through a sitecustomize module
(``FIXED_KEY``, read from the environment) in place of the operating system's fresh one: the killed and the
uninterrupted runs can then be compared bit for bit, while a resume still reads the key from noise.key."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dpfl.cli import main
from dpfl.engine.ranks import Ranks
from dpfl.errors import ConfigError

SRC = Path(__file__).resolve().parents[2] / "src"
FIXED_KEY = 2**200 + 424242
CONFIG = """
[data]
num_clients = 10
samples_per_client = 50

[algorithm]
name = "dp-scaffold"
rounds = 12
local_steps = 10
client_rate = 0.5
clip = 1.0
noise_multiplier = 2.0

[run]
checkpoint_every = 4
"""
SITECUSTOMIZE = """
import os
if "DPFL_TEST_FRESH_KEY" in os.environ:
    from dpfl.experiments import run_directory
    run_directory.fresh_key = lambda: int(os.environ["DPFL_TEST_FRESH_KEY"])
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    """The run's config; its ranks (and this process's) draw ``FIXED_KEY`` as their fresh noise key."""
    folder = tmp_path_factory.mktemp("ranks")
    hooks = folder / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    path = folder / "ranks.toml"
    path.write_text(CONFIG)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join([str(SRC), str(hooks), os.environ.get("PYTHONPATH", "")]))
        patch.setenv("DPFL_TEST_FRESH_KEY", str(FIXED_KEY))
        yield path


def run(config, out, *args):
    return main(["run", str(config), "--out", str(out), "--no-progress", "--nproc", "2", *args])


def start(config, out) -> subprocess.Popen:
    """`dpfl run --nproc 2` in a process of its own (the launcher; its ranks are its children)."""
    return subprocess.Popen([sys.executable, "-m", "dpfl.cli", "run", str(config), "--out", str(out), "--no-progress",
                             "--nproc", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def rounds_on_ledger(out) -> int:
    try:  # the ledger is replaced atomically: it is absent or complete
        return len(json.loads((out / "ledger.json").read_text())["journal"])
    except FileNotFoundError:
        return 0


def rank_of(launcher: subprocess.Popen, rank: int) -> int:
    """The pid of the launcher's child that runs ``rank`` (its RANK variable)."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == launcher.pid \
                    and f"RANK={rank}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                return int(entry.name)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
    raise AssertionError(f"no rank {rank} under pid {launcher.pid}")


def stopped_at(launcher: subprocess.Popen, out, target: int, stop) -> int:
    """Runs ``stop`` once ``target`` rounds are on the ledger; the launcher's exit status."""
    try:
        while rounds_on_ledger(out) < target:
            assert launcher.poll() is None, launcher.stderr.read().decode()
            time.sleep(0.005)
        stop()
        launcher.wait(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        launcher.stderr.close()
    return launcher.returncode


def ledger_and_model(out) -> tuple[dict, torch.Tensor]:
    ledger = json.loads((out / "ledger.json").read_text())
    return ledger, torch.load(out / "checkpoint.pt", weights_only=True)["state"]["server"]["x"]


@pytest.fixture(scope="module")
def uninterrupted(config, tmp_path_factory):
    out = tmp_path_factory.mktemp("straight") / "run"
    assert run(config, out) == 0
    return ledger_and_model(out)


@pytest.mark.slow  # ~25 s of CPU (three launches of two ranks); the contract test over ranks stays in the default run
def test_a_rank_killed_mid_run_resumes_to_the_uninterrupted_result(config, uninterrupted, tmp_path):
    """Rank 1 killed (SIGKILL) at a random round: the launcher ends rank 0 too and exits 137; `--resume --nproc 2`
    replays from rank 0's last checkpoint, charging no round twice, to the uninterrupted run's ledger (fingerprints
    included) and model, bit for bit."""
    out = tmp_path / "killed"
    target = random.randint(2, 7)  # rounds on the ledger when the kill comes
    launcher = start(config, out)
    status = stopped_at(launcher, out, target, lambda: os.kill(rank_of(launcher, 1), signal.SIGKILL))
    assert status == 128 + signal.SIGKILL and rounds_on_ledger(out) < 12, f"killed at {target} rounds"
    assert run(config, out, "--resume") == 0
    (resumed, model), (reference, straight) = ledger_and_model(out), uninterrupted
    assert len(resumed["journal"]) == 12 and resumed["journal"] == reference["journal"], f"killed at {target}"
    assert resumed["epsilon"] == reference["epsilon"]
    assert torch.equal(model, straight), f"killed at {target} rounds"


@pytest.mark.slow  # ~25 s of CPU: two launches of two ranks
def test_ctrl_c_stops_every_rank_after_the_same_round_and_the_run_resumes(config, uninterrupted, tmp_path):
    """SIGINT to the launcher (what Ctrl-C sends it): it forwards it to its ranks, which agree to stop after the same
    round, checkpoint and exit 130; the resume gives the uninterrupted result."""
    out = tmp_path / "interrupted"
    launcher = start(config, out)
    assert stopped_at(launcher, out, 3, lambda: launcher.send_signal(signal.SIGINT)) == 130
    done = json.loads((out / "results.json").read_text())
    assert done["stopped_reason"].startswith("interrupted (Ctrl-C) after round") and rounds_on_ledger(out) < 12
    assert run(config, out, "--resume") == 0
    (resumed, model), (reference, straight) = ledger_and_model(out), uninterrupted
    assert resumed["journal"] == reference["journal"] and torch.equal(model, straight)


@pytest.mark.parametrize("nproc", ["0", "-2"])
def test_a_bad_nproc_is_refused_naming_it(nproc, config, tmp_path, capsys):
    assert main(["run", str(config), "--out", str(tmp_path / "run"), "--nproc", nproc]) == 2
    assert f"--nproc = {nproc}" in capsys.readouterr().err and not (tmp_path / "run").exists()


def test_nproc_under_torchrun_is_refused(config, tmp_path, monkeypatch, capsys):
    for name, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(name, value)
    assert main(["run", str(config), "--out", str(tmp_path / "run"), "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert "--nproc = 2" in err and "torchrun" in err and not (tmp_path / "run").exists()


def test_the_ranks_place_is_read_from_torchruns_variables():
    assert Ranks.from_environment({}) is None
    place = Ranks.from_environment({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "MASTER_ADDR": "node0",
                                    "MASTER_PORT": "29500"})
    assert (place.rank, place.world_size, place.local_rank, place.is_first) == (3, 4, 1, False)
    clients = torch.arange(7)
    assert [clients[Ranks(r, 3).owns(clients)].tolist() for r in range(3)] == [[0, 3, 6], [1, 4], [2, 5]]
    with pytest.raises(ConfigError, match="RANK"):
        Ranks.from_environment({"RANK": "4", "WORLD_SIZE": "4", "MASTER_ADDR": "a", "MASTER_PORT": "1"})
    with pytest.raises(ConfigError, match="MASTER_PORT"):
        Ranks.from_environment({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "a"})


def test_a_run_rank_0_refuses_stops_every_rank_with_one_error(config, tmp_path, capfd):
    """A new run into a directory that holds one: rank 0 refuses it before any data is built and tells the other
    rank, which exits quietly; the launcher exits 2 and the error is printed once."""
    out = tmp_path / "taken"
    out.mkdir()
    (out / "run.json").write_text("{}")
    assert run(config, out) == 2
    err = capfd.readouterr().err
    assert err.count("holds a run's run.json") == 1 and "Traceback" not in err


def test_ranks_with_a_flower_deployment_are_refused_naming_nproc(tmp_path):
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import build_simulation

    with pytest.raises(ConfigError, match="--nproc = 2"):
        build_simulation(load_config(None, ["data.num_clients=6", "data.samples_per_client=30"]),
                         workers=lambda *args: None, ranks=Ranks(0, 2))


def test_dpfl_run_with_nproc_is_the_command_lines_run(config, uninterrupted, tmp_path):
    """``dpfl.run(config, out=..., nproc=2)`` launches the same two ranks as `dpfl run --nproc 2` (the config dict
    written as TOML for them) and returns the results rank 0 wrote: the same ledger and model, bit for bit."""
    import tomllib

    import dpfl

    results = dpfl.run(tomllib.loads(CONFIG), out=tmp_path / "api", nproc=2)
    ledger, model = ledger_and_model(tmp_path / "api")
    assert ledger == uninterrupted[0] and torch.equal(model, uninterrupted[1])
    assert results.final["round"] == 12 and results.epsilon == dpfl.Results.load(tmp_path / "api").epsilon


def test_dpfl_run_with_nproc_refuses_what_cannot_reach_the_ranks(tmp_path):
    import numpy as np

    import dpfl

    with pytest.raises(ConfigError, match="nproc = 0 is not allowed"):
        dpfl.run({}, out=tmp_path / "a", nproc=0)
    with pytest.raises(ConfigError, match="out = None is not allowed: expected a run directory when nproc = 2"):
        dpfl.run({}, nproc=2)
    arrays = (np.zeros((20, 3), np.float32), np.zeros(20, np.int64))
    with pytest.raises(ConfigError, match="nproc = 2 is not allowed: expected 1 when dpfl.run is given model=, "
                                          "loss= or data="):
        dpfl.run({}, data=arrays, out=tmp_path / "b", nproc=2)


@pytest.mark.slow  # ~15 s: two torchrun agents rendezvous and start a rank each
def test_two_torchrun_nodes_on_one_machine_give_the_nproc_run(config, uninterrupted, tmp_path):
    """The README's several-node command, run as two torchrun agents (--nnodes 2, node ranks 0 and 1, one process a
    node) on 127.0.0.1: torchrun's variables alone place the ranks; only node 0's rank 0 writes --out; the ledger and
    model are those of `dpfl run --nproc 2`, bit for bit."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not beside this Python")
    port = str(29400 + random.randint(0, 500))

    def node(rank: int) -> subprocess.Popen:
        return subprocess.Popen([str(torchrun), "--nnodes", "2", "--node-rank", str(rank), "--nproc-per-node", "1",
                                 "--master-addr", "127.0.0.1", "--master-port", port, "-m", "dpfl.cli", "run",
                                 str(config), "--out", str(tmp_path / f"node{rank}"), "--no-progress"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    nodes = [node(0), node(1)]
    assert [n.wait(timeout=300) for n in nodes] == [0, 0], nodes[0].stderr.read().decode()[-2000:]
    assert not (tmp_path / "node1").exists()
    ledger, model = ledger_and_model(tmp_path / "node0")
    assert ledger == uninterrupted[0] and torch.equal(model, uninterrupted[1])


def test_free_port_is_below_the_ephemeral_range_and_bindable(monkeypatch, tmp_path):
    """The store's port is drawn below the system's ephemeral range (from which outgoing connections take their
    source ports, so a port chosen there can be taken before rank 0 binds it), free when chosen; where the range is
    unknown, or nothing below it is free, the system's own choice."""
    import socket

    from dpfl.engine import launch

    ranges = tmp_path / "range"
    ranges.write_text("40000\t60999\n")
    monkeypatch.setattr(launch, "_EPHEMERAL_RANGE", ranges)
    ports = {launch.free_port() for _ in range(20)}
    assert all(launch.LOWEST_PORT <= port < 40000 for port in ports) and len(ports) > 1
    for port in ports:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))
    monkeypatch.setattr(launch, "_EPHEMERAL_RANGE", tmp_path / "missing")
    assert 0 < launch.free_port() < 65536
    ranges.write_text(f"{launch.LOWEST_PORT}\t60999\n")  # nothing below the range: the system's choice
    monkeypatch.setattr(launch, "_EPHEMERAL_RANGE", ranges)
    assert launch.free_port() >= launch.LOWEST_PORT
