"""On Flower each silo draws its noise from its own secret (``dpfl.flower.silo_state``): the ServerApp, holding
everything it sent and received, its run directory and even its own noise key, cannot regenerate a silo's reply
(with run.noise_seed it can, and the run says so); a re-sent round with another input, changed silo data and a lost
silo key are refused before any noise is drawn. Through the real ``serve`` and ClientApp (``InProcessGrid``)."""

import json

import numpy as np
import pytest
import torch

from dpfl.engine.keys import KEY_FILE, load_key
from dpfl.engine.protocol import ClientContext, ClientData
from dpfl.experiments.config import load_config
from dpfl.experiments.assembly import build_data
from flower_config import app_run_config, silo_pin

pytest.importorskip("flwr")

from flwr.app import ConfigRecord, Message, RecordDict  # noqa: E402
from flower_grid import InProcessGrid  # noqa: E402

from dpfl.flower import records  # noqa: E402
from dpfl.flower.client_app import algorithm_of, client_app  # noqa: E402
from dpfl.flower.server_app import serve  # noqa: E402
from dpfl.flower.silo import write_silos  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread", "flower_task")

CONFIG = """
[data]
name = "synthetic"
num_clients = 3
samples_per_client = 30

[algorithm]
name = "dp-fedavg"
rounds = 2
local_steps = 2
client_rate = 1.0
sample_rate = 0.5
noise_multiplier = 1.0

[run]
threads = 1
"""


def setup(folder, text=CONFIG):
    """The config and its training data, written as one silo file per client (``dpfl.flower.silo.write_silos``)."""
    path = folder / "c.toml"
    path.write_text(text)
    config = load_config(path)
    dataset = build_data(config["data"])
    write_silos(dataset, folder)
    return config, dataset.train


def flower_run(folder, config):
    grid = InProcessGrid(client_app({"silo-path": str(folder / "silo-{partition-id}.npz")}, silo_pin(config)), 3)
    serve(grid, app_run_config(config, folder / "flower", **{"round-timeout": 5.0}))
    return grid


def train_exchanges(grid):
    """(train message, reply) pairs the server sent and received, in order."""
    return [(m, r) for m, r in grid.received if m.metadata.message_type == "train"]


def resimulated(message, train, key):
    """The reply the message's client would send with noise key ``key`` (what a server knowing the key computes)."""
    job = message.content[records.JOB]
    client, t = int(job["client"]), int(job["round"])
    algorithm, grads = algorithm_of(str(job["config"]), str(job["setting"]), train.x[0, 0].numel())
    n = int(train.counts[client])
    data = ClientData(train.x[client, :n].unsqueeze(0), train.y[client, :n].unsqueeze(0), torch.tensor([n]))
    out = algorithm.client_round(t, records.tensors_of(message.content[records.SERVER]),
                                 records.tensors_of(message.content[records.CLIENT]), data,
                                 ClientContext(grads, key, t, torch.tensor([client])))
    return out.messages


def keys_the_server_holds(folder, config):
    run = json.loads((folder / "flower" / "run.json").read_text())
    keys = {config["run"]["seed"], 0, int(run["run_id"], 16)}
    if (folder / "flower" / KEY_FILE).exists():
        keys.add(load_key(folder / "flower" / KEY_FILE))  # the server's own secret (its cohorts)
    if config["run"]["noise_seed"] is not None:
        keys.add(config["run"]["noise_seed"])
    return keys


def matches(grid, train, keys) -> int:
    """How many received replies some key the server holds regenerates exactly."""
    found = 0
    for message, reply in train_exchanges(grid):
        received = records.tensors_of(reply.content[records.MESSAGES])
        found += any(all(torch.equal(resimulated(message, train, key)[k], received[k]) for k in received)
                     for key in keys)
    return found


def test_the_server_cannot_regenerate_a_silos_noise_by_default(tmp_path):
    config, train = setup(tmp_path)
    grid = flower_run(tmp_path, config)
    assert len(train_exchanges(grid)) == 6
    assert matches(grid, train, keys_the_server_holds(tmp_path, config)) == 0
    for i in range(3):  # each silo created its own key beside its data, and sent nothing of it
        secret = load_key(tmp_path / f"silo-{i}.npz.dpfl-state" / KEY_FILE)
        assert all(str(secret) not in str(message.content) for message, _ in grid.received)
    assert "secret" in json.loads((tmp_path / "flower" / "results.json").read_text())["privacy"]["noise"]


def test_with_a_noise_seed_the_server_regenerates_every_reply(tmp_path):
    config, train = setup(tmp_path, CONFIG + "noise_seed = 4\n")
    grid = flower_run(tmp_path, config)
    assert matches(grid, train, keys_the_server_holds(tmp_path, config)) == 6
    assert "research mode" in json.loads((tmp_path / "flower" / "results.json").read_text())["privacy"]["noise"]


def resend(grid, message, server):
    """The message re-sent to its node with another server state (a malicious or confused server)."""
    content = RecordDict({records.JOB: ConfigRecord(dict(message.content[records.JOB])),
                          records.SERVER: records.tensors_record(server),
                          records.CLIENT: message.content[records.CLIENT]})
    node = message.metadata.dst_node_id
    return grid.send_and_receive([Message(content, dst_node_id=node, message_type="train")])[0]


def test_a_round_re_sent_with_another_model_is_refused_and_with_the_same_gets_the_same_reply(tmp_path):
    config, _ = setup(tmp_path)
    grid = flower_run(tmp_path, config)
    message, reply = train_exchanges(grid)[0]
    server = records.tensors_of(message.content[records.SERVER])
    again = resend(grid, message, server)
    assert not again.has_error()
    assert all(torch.equal(records.tensors_of(again.content[records.MESSAGES])[k], v)
               for k, v in records.tensors_of(reply.content[records.MESSAGES]).items())
    shifted = resend(grid, message, {k: v + 0.5 for k, v in server.items()})
    assert shifted.has_error() and "already answered on another input" in shifted.error.reason


def test_a_silo_whose_data_changed_or_whose_key_is_lost_refuses_the_next_round(tmp_path):
    config, train = setup(tmp_path)
    grid = flower_run(tmp_path, config)
    message, _ = train_exchanges(grid)[0]
    silo = tmp_path / f"silo-{int(message.content[records.JOB]['client'])}.npz"
    from dpfl.flower import client_app as module
    arrays = dict(np.load(silo))
    np.savez(silo, **{**arrays, "x": arrays["x"] + 1.0})
    module.silo_of.cache_clear(), module.fingerprint_of.cache_clear()
    refused = resend(grid, message, records.tensors_of(message.content[records.SERVER]))
    assert refused.has_error() and "data changed since its first round" in refused.error.reason
    np.savez(silo, **arrays)  # the data restored...
    module.silo_of.cache_clear(), module.fingerprint_of.cache_clear()
    (tmp_path / (silo.name + ".dpfl-state") / KEY_FILE).unlink()  # ...but the key is gone
    refused = resend(grid, message, records.tensors_of(message.content[records.SERVER]))
    assert refused.has_error() and "its noise key" in refused.error.reason and "is gone" in refused.error.reason


@pytest.mark.parametrize("loss", ["journal", "head", "both", "truncated", "rolled back"])
def test_a_silo_whose_journal_is_lost_or_rolled_back_refuses_every_round(tmp_path, loss):
    """The journal holds what the silo answered; a server that could make it forget would get a round answered twice.
    Its journal deleted (with or without its head), cut short or replaced by an older copy: the silo refuses the
    re-sent round (which, with the journal, it would answer identically) and every other, naming the journal."""
    config, _ = setup(tmp_path)
    state = tmp_path / "silo-0.npz.dpfl-state"
    grid = flower_run(tmp_path, config)
    message = next(m for m, _ in train_exchanges(grid) if int(m.content[records.JOB]["client"]) == 0)
    journal, head = state / "journal.jsonl", state / "journal.head"
    lines = journal.read_bytes().splitlines(keepends=True)
    if loss in ("journal", "both"):
        journal.unlink()
    if loss in ("head", "both"):
        head.unlink()
    if loss == "truncated":
        journal.write_bytes(b"".join(lines[:-1]))
    if loss == "rolled back":  # an older copy of the journal restored beside the current head
        journal.write_bytes(b"".join(lines[:2]))
    refused = resend(grid, message, records.tensors_of(message.content[records.SERVER]))
    assert refused.has_error() and "journal cannot be trusted" in refused.error.reason, refused.error.reason
