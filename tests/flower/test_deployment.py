"""A real Flower deployment on localhost: one SuperLink and three SuperNodes, each a separate process on its own free
port (``--insecure``), each SuperNode with its own silo file (``--node-config``); the app written by `dpfl flower-app`
and started by `flwr run APP FEDERATION`. It reproduces `dpfl run` (ledger and model), and a silo that dies in a round
aborts that round (nothing applied, the charge kept) until its SuperNode is restarted and the run resumed.

Slow (a minute or more: every SuperNode runs its ClientApp in a fresh Python process per run); run it with the venv
that has flwr: ``PYTHONPATH=src /work/venv-flower/bin/python -m pytest -m slow tests/flower/test_deployment.py``.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dpfl.cli import main
from dpfl.engine.launch import free_port
from dpfl.engine.simulator import Simulation
from dpfl.experiments.config import load_config
from flower_config import silo_pin, spent
from states import dense

pytest.importorskip("flwr", reason="a Flower deployment needs flwr: pip install 'dpfl[flower]' (docs/flower.md)")
BIN = Path(sys.executable).parent  # flower-superlink, flower-supernode and flwr come with flwr, beside its Python
if not (BIN / "flower-superlink").exists():
    pytest.skip(f"flwr is importable but its commands are not in {BIN} (run pytest with the Python of the venv "
                "that has flwr)", allow_module_level=True)
SRC = Path(__file__).resolve().parents[2] / "src"

DATA = '[data]\nname = "synthetic"\nnum_clients = 3\nsamples_per_client = 40\n\n[run]\nthreads = 1\nnoise_seed = 0\n'
#: SCAFFOLD's runs state run.secure_noise (the default of a Flower App where the algorithm takes it), so that `dpfl run`
#: draws the same exact discrete Gaussian noise; fedsgd-dpc does not take it (the app leaves it false).
SECURE = "secure_noise = true\n"
SCAFFOLD = ('[algorithm]\nname = "dp-scaffold"\nrounds = 3\nlocal_steps = 2\nclient_rate = 0.67\n'
            'client_sampling = "fixed"\nsample_rate = 0.25\nlr = 0.5\nclip = 1.0\nnoise_multiplier = 1.5\n')
DPC = '[algorithm]\nname = "fedsgd-dpc"\nrounds = 3\nclients_per_round = 2\nlr = 0.5\n\n[privacy]\nepsilon = 3.0\n'

# A test-only ClientApp for the generated app: dpfl's, except that the node whose node config names a stall-round
# announces that round's train message (in the file stall-marker) and never answers it.
STALLING_CLIENT_APP = '''import time
from pathlib import Path

from flwr.clientapp import ClientApp

from dpfl.flower.client_app import identify, train

app = ClientApp()
app.query()(identify)


@app.train()
def stalling_train(msg, context):
    stall = context.node_config.get("stall-round")
    if stall is not None and int(msg.content["job"]["round"]) == int(stall):
        Path(str(context.node_config["stall-marker"])).write_text("training")
        time.sleep(3600)
    return train(msg, context)
'''


# -- processes ---------------------------------------------------------------------------------------------------
def parents() -> dict[int, int]:
    """{pid: parent pid} of every live (not zombie) process, from /proc."""
    table = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] not in "ZX":
                table[int(entry.name)] = int(fields[1])
    return table


def tree(root: int) -> set[int]:
    """``root`` and its live descendants."""
    table, found = parents(), {root}
    while True:
        more = {pid for pid, parent in table.items() if parent in found} - found
        if not more:
            return found & (set(table) | {root})
        found |= more


def alive(pid: int) -> bool:
    return pid in parents()


class Localhost:
    """A SuperLink and SuperNodes on localhost, each started in its own session; ``stop`` ends every process any of
    them started, by PID (frozen first, so that none escapes by being re-parented while its tree is killed)."""

    def __init__(self, folder: Path):
        self.folder, self.processes, self.started = folder, {}, set()
        self.env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
                    "FLWR_HOME": str(folder / "flwr-home"),
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")]))}
        self.address = f"127.0.0.1:{free_port()}"
        self.start("superlink", "flower-superlink", "--insecure", "--host", "127.0.0.1", "--port",
                   self.address.split(":")[1], "--disable-runtime-dependency-installation")
        (folder / "flwr-home").mkdir()  # flwr's SuperLink connection (Flower >= 1.41: flwr's config, not the app's)
        (folder / "flwr-home" / "config.toml").write_text(f'[superlink]\ndefault = "localhost"\n\n'
                                                          f'[superlink.localhost]\naddress = "{self.address}"\n'
                                                          'insecure = true\n')
        self.wait("SuperLink listening on " + self.address, lambda: _listening(self.address), timeout=60)

    def start(self, name: str, command: str, *args: str) -> None:
        log = open(self.folder / f"{name}.log", "ab")
        self.processes[name] = subprocess.Popen([str(BIN / command), *args], stdout=log, stderr=subprocess.STDOUT,
                                                env=self.env, cwd=self.folder, start_new_session=True)
        log.close()
        self.started.add(self.processes[name].pid)

    def supernode(self, client: int, silo: Path, **extra: str) -> None:
        config = " ".join([f'data-path="{silo}"', f"client-id={client}", *(f'{k}="{v}"' for k, v in extra.items())])
        self.start(f"node-{client}", "flower-supernode", "--insecure", "--superlink", self.address,
                   "--port", str(free_port()), "--node-config", config)

    def flwr(self, *args: str) -> str:
        """`flwr ARGS` against this SuperLink; its output."""
        done = subprocess.run([str(BIN / "flwr"), *args], env=self.env, cwd=self.folder, capture_output=True,
                              text=True, timeout=120)
        return done.stdout + done.stderr

    def run(self, app: Path, *overrides: str) -> str:
        """`flwr run APP localhost` (it submits the run to the SuperLink and returns); the run's id."""
        out = self.flwr("run", str(app), "localhost", *(a for o in overrides for a in ("--run-config", o)))
        assert "Successfully started run" in out, out
        return out.split("Successfully started run", 1)[1].split()[0]

    def log(self, name: str) -> str:
        return (self.folder / f"{name}.log").read_text(errors="replace")

    def wait(self, what: str, condition, timeout: float = 240.0, every: float = 0.5) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} after {timeout} s; the SuperLink's log ends:\n"
                                     + self.log("superlink")[-3000:])
            time.sleep(every)

    def kill(self, name: str) -> set[int]:
        """Ends the process ``name`` and every process it started (SIGSTOP the tree until it stops growing, then
        SIGKILL it: each process group, then each PID); the PIDs it ended."""
        root = self.processes.pop(name).pid
        frozen: set[int] = set()
        while (grown := tree(root) - frozen) or not frozen:
            for pid in grown:
                _signal(pid, signal.SIGSTOP)
            frozen |= grown | {root}
        for group in {_group(pid) for pid in frozen} - {None, os.getpgrp()}:
            _signal(group, signal.SIGKILL, os.killpg)
        for pid in frozen:
            _signal(pid, signal.SIGKILL)
        self.started |= frozen
        return frozen

    def stop(self) -> list[int]:
        """Kills every process started here (their trees), reaps them; the PIDs still alive (none, if it worked)."""
        children = dict(self.processes)
        for name in list(self.processes):
            self.kill(name)
        for process in children.values():
            process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in self.started) and time.monotonic() < deadline:
            time.sleep(0.2)
        return sorted(pid for pid in self.started if alive(pid))


def _listening(address: str) -> bool:
    host, port = address.split(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) == 0


def _signal(target: int, number: int, send=os.kill) -> None:
    try:
        send(target, number)
    except ProcessLookupError:
        pass


def _group(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


@pytest.fixture
def localhost(tmp_path):
    deployment = Localhost(tmp_path)
    yield deployment
    survivors = deployment.stop()  # also when the test failed
    assert not survivors, f"processes of the deployment still alive: {survivors}"


# -- the runs ----------------------------------------------------------------------------------------------------
def write_config(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return path


def dpfl_run_one_by_one(config: Path, out: Path, monkeypatch) -> None:
    """`dpfl run` working one client at a time, as a silo does (a chunk of one client: the same float rounding)."""
    with monkeypatch.context() as patch:
        patch.setattr(Simulation, "chunk_size", lambda self, cohort_size: 1)
        assert main(["run", str(config), "--out", str(out), "--no-progress"]) == 0


def results(run_dir: Path) -> dict:
    path = run_dir / "results.json"
    return json.loads(path.read_text()) if path.exists() else {}


@pytest.mark.slow
@pytest.mark.parametrize("family", [SCAFFOLD, DPC], ids=["dp-scaffold", "fedsgd-dpc"])
def test_deployment_reproduces_dpfl_run(localhost, tmp_path, monkeypatch, write_silos, run_outputs, family):
    """3 rounds on a SuperLink and 3 SuperNodes (separate processes): the same ledger (events, epsilons,
    not the fingerprints, which commit to the release config) as `dpfl run`, exactly, and the same model, noise
    included."""
    config = write_config(tmp_path, "experiment", DATA + (SECURE if family == SCAFFOLD else "") + family)
    pins = silo_pin(load_config(config))  # each silo enrolled in the release (and the research mode's seed)
    for client, silo in enumerate(write_silos(load_config(config), tmp_path)):
        localhost.supernode(client, silo, **pins)
    assert main(["flower-app", str(config), "--out", str(tmp_path / "app"), "--run-out", str(tmp_path / "run")]) == 0
    started = time.monotonic()
    localhost.run(tmp_path / "app")
    localhost.wait("finished run", lambda: results(tmp_path / "run").get("status") == "finished")
    print(f"flwr run to finished: {time.monotonic() - started:.1f} s")
    dpfl_run_one_by_one(config, tmp_path / "in-process", monkeypatch)

    ledger, result, state = run_outputs(tmp_path / "run")
    ledger_1, result_1, state_1 = run_outputs(tmp_path / "in-process")
    assert [r["round"] for r in result["rounds"]] == [1, 2, 3]
    assert spent(ledger) == spent(ledger_1)
    assert [r["epsilon"] for r in result["rounds"]] == [r["epsilon"] for r in result_1["rounds"]]
    for part in ("server", "clients"):
        for name, value in state_1[part].items():
            assert torch.allclose(dense(state[part][name]), dense(value), rtol=0, atol=1e-6), (part, name)
    assert not torch.equal(state_1["server"]["x"], torch.zeros_like(state_1["server"]["x"]))


@pytest.mark.slow
def test_a_silo_that_dies_mid_round_aborts_it_and_the_resumed_run_keeps_its_charge(localhost, tmp_path,
                                                                                      monkeypatch, write_silos,
                                                                                      run_outputs):
    """Client 1's SuperNode is killed while round 2 waits on it: the round ends with an error naming the round, the
    node and client and the remedy; the checkpoint holds round 1's model (nothing of round 2 applied) and the ledger
    round 2's charge. Restarted, and the run resumed in the same run directory, the run finishes with the ledger and
    the model of an uninterrupted `dpfl run`: round 2's charge is neither lost nor charged twice (its replay has the
    recorded fingerprint)."""
    config = write_config(tmp_path, "experiment", DATA.replace("threads = 1", "threads = 1\ncheckpoint_every = 1")
                          + SECURE + SCAFFOLD.replace("client_rate = 0.67", "client_rate = 1.0"))
    silos, pins = write_silos(load_config(config), tmp_path), silo_pin(load_config(config))
    marker = tmp_path / "stalled"
    for client, silo in enumerate(silos):
        localhost.supernode(client, silo, **pins,
                            **({"stall-round": "1", "stall-marker": str(marker)} if client == 1 else {}))
    app, run_dir = tmp_path / "app", tmp_path / "run"
    assert main(["flower-app", str(config), "--out", str(app), "--run-out", str(run_dir)]) == 0
    (app / "dpfl_app" / "client_app.py").write_text(STALLING_CLIENT_APP)
    run_id = localhost.run(app)
    localhost.wait("train message of round 2 on client 1", marker.exists)
    localhost.kill("node-1")
    killed = time.monotonic()
    # Flower answers for a node that missed its heartbeats (2 x 30 s) with an error: the round ends then.
    localhost.wait("error of round 2", lambda: "DpflError: round 2: node" in localhost.flwr("log", run_id, "localhost"),
                   timeout=180, every=5)
    error = localhost.flwr("log", run_id, "localhost").split("DpflError: ", 1)[1].split("\n")[0]
    print(f"round 2 aborted {time.monotonic() - killed:.0f} s after the kill: {error}")
    assert "(client 1)" in error and "Node Unavailable" in error and "resume=true" in error and "ledger.json" in error
    ledger, result, state = run_outputs(run_dir)
    assert [entry["round"] for entry in ledger["journal"]] == [1, 2]  # round 2 charged
    assert [r["round"] for r in result["rounds"]] == [1]
    assert torch.load(run_dir / "checkpoint.pt", weights_only=False)["next_round"] == 1  # round 2 not applied

    localhost.supernode(1, silos[1], **pins)
    localhost.run(app, "resume=true")
    localhost.wait("resumed run's end", lambda: results(run_dir).get("status") == "finished")
    dpfl_run_one_by_one(config, tmp_path / "in-process", monkeypatch)
    ledger, result, state = run_outputs(run_dir)
    ledger_1, result_1, state_1 = run_outputs(tmp_path / "in-process")
    assert spent(ledger) == spent(ledger_1)
    assert [r["epsilon"] for r in result["rounds"]] == [r["epsilon"] for r in result_1["rounds"]]
    assert torch.allclose(state["server"]["x"], state_1["server"]["x"], rtol=0, atol=1e-6)
