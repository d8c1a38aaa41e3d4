"""The ServerApp reads no records: it builds the run from the federation's public metadata (the app's config) and the
record counts the nodes report, which the release config commits to; each silo refuses a run made with counts other
than its own; the model is evaluated on a set the server holds, on the silos (labelled NOT covered by epsilon), or
not at all. Through the real ``serve`` and ClientApp (``InProcessGrid``)."""

import json
import os
import re

import numpy as np
import pytest
import torch

from dpfl.cli import main
from dpfl.engine.simulator import Simulation
from dpfl.errors import DpflError, RunDirectoryError
from dpfl.experiments.config import load_config
from dpfl.experiments.assembly import build_data
from dpfl.experiments.run_lock import LOCK_FILE, run_lock
from flower_config import app_run_config, silo_pin, spent

pytest.importorskip("flwr")

from flower_grid import InProcessGrid  # noqa: E402

from dpfl.flower import records  # noqa: E402
from dpfl.flower.client_app import client_app  # noqa: E402
from dpfl.flower.server_app import serve  # noqa: E402
from dpfl.flower.silo import write_silos  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread", "flower_task")

CONFIG = """
[data]
name = "npz"
path = "private/pooled.npz"
num_clients = 3

[algorithm]
name = "dp-fedavg"
rounds = 2
local_steps = 2
client_rate = 1.0
sample_rate = 0.5
noise_multiplier = 1.0

[run]
threads = 1
noise_seed = 3  # research mode: the Flower run's model is `dpfl run`'s, bit for bit
"""


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    """A config whose data is a pooled file, `dpfl run` of it one client at a time (as each Flower node works), and
    the Flower App's run config written on the launching machine while the file was there (a rehearsal)."""
    folder = tmp_path_factory.mktemp("pooled")
    (folder / "private").mkdir()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(150, 5))
    np.savez(folder / "private" / "pooled.npz", x=x, y=np.argmax(x[:, :3], axis=1))
    (folder / "c.toml").write_text(CONFIG)
    config = load_config(folder / "c.toml")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Simulation, "chunk_size", lambda self, cohort_size: 1)
        assert main(["run", str(folder / "c.toml"), "--out", str(folder / "reference"), "--no-progress"]) == 0
    dataset = build_data(config["data"])
    write_silos(dataset, folder)
    test_x, test_y = dataset.test.flat()
    np.savez(folder / "holdout.npz", x=test_x.numpy(), y=test_y.numpy())  # the server's own evaluation set
    return folder, config, dataset


def outputs(run_dir):
    return (json.loads((run_dir / "ledger.json").read_text()), json.loads((run_dir / "results.json").read_text()),
            torch.load(run_dir / "checkpoint.pt", weights_only=False)["state"])


def grid_of(folder, config, node_config=lambda partition: {}):
    return InProcessGrid(client_app({"silo-path": str(folder / "silo-{partition-id}.npz")}, silo_pin(config)), 3, node_config)


def flower_run(folder, config, out, grid=None, **run_config):
    grid = grid or grid_of(folder, config)
    return serve(grid, app_run_config(config, folder / out, **{"round-timeout": 5.0, **run_config})), grid


def test_the_server_runs_without_the_pooled_data_and_gives_dpfl_runs_ledger_and_model(pooled, tmp_path, capsys):
    """Before, the ServerApp built the config's data (for the counts and evaluation): with the pooled file moved away
    from the coordinator the run failed. Now it reads no records: the same ledger (events and epsilons) and, bit for
    bit, the same model as `dpfl run`; the release config, run.json and the silos' noise keys commit to the counts
    the nodes reported, and a resume with other counts is refused."""
    folder, config, _ = pooled
    run_config = app_run_config(config, tmp_path / "flower", **{"round-timeout": 5.0})
    grid = grid_of(folder, config)  # the silos' pins: their operators know the release (dpfl write-silos)
    hidden = folder / "private"
    hidden.rename(folder / "elsewhere")  # the coordinator has no copy of the pooled data
    try:
        serve(grid, run_config)
    finally:
        (folder / "elsewhere").rename(hidden)
    ledger, results, state = outputs(tmp_path / "flower")
    ledger_1, results_1, state_1 = outputs(folder / "reference")
    assert results["status"] == "finished" and spent(ledger) == spent(ledger_1)
    assert [r["epsilon"] for r in results["rounds"]] == [r["epsilon"] for r in results_1["rounds"]]
    assert torch.equal(state["server"]["x"], state_1["server"]["x"])
    counts = [int(n) for n in build_data(config["data"]).train.counts]
    run = json.loads((tmp_path / "flower" / "run.json").read_text())
    assert run["config"]["data"]["train_counts"] == counts and "path" not in run["config"]["data"]
    assert results["data"]["train_counts"] == counts
    assert "dpfl: finished after round 2: no metrics (evaluation: none)" in capsys.readouterr().err

    grid = grid_of(folder, config)
    answer = grid.app

    def more_records(message, context):  # node 101 reports one more record than before
        reply = answer(message, context)
        if message.metadata.message_type == "query" and context.node_id == 101:
            reply.content[records.JOB]["records"] = int(reply.content[records.JOB]["records"]) + 1
        return reply

    grid.app = more_records
    with pytest.raises(RunDirectoryError, match=r"made with data.train_counts = \[\d+, \d+, \d+\], this config has"):
        serve(grid, {**run_config, "resume": True})


def test_serve_is_refused_while_another_run_holds_its_run_directory(pooled, tmp_path):
    """The ServerApp runs through the same run machinery as `dpfl run`, lock included: while another process (here
    this one) holds the run directory, ``serve`` is refused naming the holder, before any round; once released it
    runs."""
    folder, config, _ = pooled
    out = tmp_path / "flower"
    refusal = re.escape(f"another dpfl run holds {out} (pid {os.getpid()})")
    with run_lock(out):
        with pytest.raises(RunDirectoryError, match=refusal):
            flower_run(folder, config, out)
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing read or written
    results, _ = flower_run(folder, config, out)
    assert results["status"] == "finished" and (out / "ledger.json").exists() and not (out / LOCK_FILE).exists()


def test_a_node_reporting_counts_other_than_its_silo_files_is_refused_by_every_silo(pooled, tmp_path):
    """Node 102's reply to the query says one record more than its silo file holds (a server or a node that lies):
    the run's release config carries that count, so it is not the release every silo pinned (whose [data] holds the
    true counts), and every silo refuses its train message before drawing any noise."""
    folder, config, _ = pooled
    grid = grid_of(tmp_path, config)
    write_silos(build_data(config["data"]), tmp_path)
    answer = grid.app

    def more_records(message, context):
        reply = answer(message, context)
        if message.metadata.message_type == "query" and context.node_id == 102:
            reply.content[records.JOB]["records"] = int(reply.content[records.JOB]["records"]) + 1
        return reply

    grid.app = more_records
    with pytest.raises(DpflError, match=r"round 1: node 101 \(client 0\), node 102 \(client 1\), node 103 \(client 2\) "
                                        r"replied with an error \(the job's release config \(sha256 \w+\.\.\.\) is not "
                                        r"the one this silo is enrolled in"):
        flower_run(tmp_path, config, "flower", grid)
    assert not any((tmp_path / f"silo-{i}.npz.dpfl-state").exists() for i in range(3))  # nothing drawn or journalled


def test_each_evaluation_mode_is_labelled_and_federated_metrics_are_marked_not_covered(pooled, tmp_path, capsys):
    """"none": null metrics, and `dpfl plot` draws the run; a set the server holds (here the pooled test records):
    `dpfl run`'s test accuracy, no train loss; "federated": `dpfl run`'s train loss and test accuracy, from the silos'
    own records, marked NOT covered by epsilon in results.json and the log; a silo may refuse to send them."""
    folder, config, _ = pooled
    reference = json.loads((folder / "reference" / "results.json").read_text())["rounds"]

    results, grid = flower_run(folder, config, tmp_path / "none")
    assert [(r["train_loss"], r["test_accuracy"]) for r in results["rounds"]] == [(None, None)] * 2
    assert results["evaluation"]["mode"] == "none" and results["evaluation"]["covered_by_epsilon"]
    assert not any(m.metadata.message_type == "query.evaluate" for m, _ in grid.received)
    assert main(["plot", str(tmp_path / "none"), "--out", str(tmp_path / "none.png")]) == 0

    results, _ = flower_run(folder, config, tmp_path / "server", evaluation=str(folder / "holdout.npz"))
    assert [r["test_accuracy"] for r in results["rounds"]] == [r["test_accuracy"] for r in reference]
    assert [r["train_loss"] for r in results["rounds"]] == [None, None]
    assert results["evaluation"]["mode"] == "server" and results["evaluation"]["covered_by_epsilon"]
    assert "dpfl: finished after round 2: test accuracy" in capsys.readouterr().err

    results, grid = flower_run(folder, config, tmp_path / "federated", evaluation="federated")
    assert [r["train_loss"] for r in results["rounds"]] == pytest.approx([r["train_loss"] for r in reference],
                                                                        rel=1e-6)
    assert [r["test_accuracy"] for r in results["rounds"]] == pytest.approx([r["test_accuracy"] for r in reference],
                                                                           rel=1e-12)
    assert results["evaluation"]["mode"] == "federated" and results["evaluation"]["covered_by_epsilon"] is False
    assert results["privacy"]["not_covered"].startswith("NOT COVERED BY EPSILON")
    assert "(evaluation: federated) [NOT COVERED BY EPSILON" in capsys.readouterr().err
    assert sum(m.metadata.message_type == "query.evaluate" for m, _ in grid.received) == 2 * 3  # each node, each round

    refusing = grid_of(folder, config, lambda partition: {"federated-evaluation": partition != 2})
    with pytest.raises(DpflError, match=r"node 103 \(client 2\) replied with an error \(this silo sends no metrics"):
        flower_run(folder, config, tmp_path / "refused", refusing, evaluation="federated")
