"""The ServerApp's side of the exchange with the nodes, over a stand-in grid: connecting, and the error of a round a
node did not complete (it names the round, the node, the client and what to do)."""

from types import SimpleNamespace

import pytest
import torch

from dpfl.errors import DpflError
from dpfl.experiments.config import load_config
from dpfl.experiments.assembly import build_data
from dpfl.experiments.resolved import RunConfig
from flower_config import app_run_config

pytest.importorskip("flwr")
from flwr.app import ConfigRecord, RecordDict  # noqa: E402

from dpfl.flower import records  # noqa: E402
from dpfl.flower.server_app import FlowerCohort  # noqa: E402

CLIENTS = 12


class Grid:
    """Nodes 1000 + i hold client i; ``silent`` nodes never answer, ``failing`` ones answer with Flower's error."""

    def __init__(self, counts, silent=(), failing=()):
        self.counts, self.silent, self.failing = counts, set(silent), set(failing)

    def get_node_ids(self):
        return [1000 + i for i in range(len(self.counts))]

    def send_and_receive(self, messages, timeout=None):
        for message in messages:
            node = message.metadata.dst_node_id
            if node in self.failing:
                yield SimpleNamespace(has_error=lambda: True, error=SimpleNamespace(reason="Node Unavailable"),
                                      metadata=SimpleNamespace(src_node_id=1))  # Flower's: from the SuperLink
            elif node not in self.silent:
                content = RecordDict({records.JOB: ConfigRecord({"client": node - 1000,
                                                                 "records": self.counts[node - 1000]})})
                yield SimpleNamespace(has_error=lambda: False, content=content,
                                      metadata=SimpleNamespace(src_node_id=node))


@pytest.fixture(autouse=True)
def in_a_run(monkeypatch):
    """Flower's Message needs the task, run and node it comes from (set in the ServerApp's process)."""
    from flwr.supercore.task_identity import TaskIdentity

    for attribute in ("_task_id", "_run_id", "_node_id"):
        monkeypatch.setattr(TaskIdentity, attribute, 1)


@pytest.fixture(scope="module")
def federation(tmp_path_factory):
    path = tmp_path_factory.mktemp("c") / "c.toml"
    path.write_text(f'[data]\nname = "synthetic"\nnum_clients = {CLIENTS}\nsamples_per_client = 10\n\n'
                    '[algorithm]\nname = "dp-fedavg"\nrounds = 2\nclient_rate = 0.25\n\n[run]\nthreads = 1\n')
    config = load_config(path)
    dataset = build_data(config["data"])
    return config, dataset, [int(c) for c in dataset.train.counts]


def test_connect_maps_every_client_to_its_node_and_names_a_node_that_does_not_answer(federation):
    config, dataset, counts = federation
    grid = Grid(counts)
    cohort = FlowerCohort(grid, CLIENTS, timeout=1.0)
    assert cohort.connect() == counts and cohort.node_of == {i: 1000 + i for i in range(CLIENTS)}
    grid.silent = {1004}
    with pytest.raises(DpflError, match=r"^node 1004 did not reply within 1.0 seconds; check that SuperNode"):
        FlowerCohort(grid, CLIENTS, timeout=1.0).connect()


@pytest.mark.parametrize("kind, what", [("silent", "did not reply within 1.0 seconds"),
                                        ("failing", "replied with an error (Node Unavailable)")])
def test_a_round_a_node_did_not_complete_names_round_node_client_and_remedy(federation, kind, what):
    config, dataset, counts = federation
    grid = Grid(counts)
    cohort = FlowerCohort(grid, CLIENTS, timeout=1.0)
    cohort.connect()
    cohort.bind(RunConfig.of(config), dataset, 1e-3)
    setattr(grid, kind, {1007})
    sim = SimpleNamespace(run_id="r", state=SimpleNamespace(server={"x": torch.zeros(3)}, rows=lambda ids: {}),
                          boundary=SimpleNamespace(secure=None))  # the plain sum
    with pytest.raises(DpflError) as err:
        list(cohort(sim, 1, torch.tensor([3, 7, 9])))
    message = str(err.value)
    assert message.startswith(f"round 2: node 1007 (client 7) {what}. The round is aborted")
    assert "ledger.json" in message and "--run-config 'resume=true'" in message


def test_serve_refuses_a_boundary_the_deployment_does_not_enforce(federation, tmp_path):
    """Before any round or file: the ServerApp would receive each silo's update with its node id."""
    from dpfl.errors import ConfigError
    from dpfl.flower.server_app import serve

    config, _, counts = federation
    unenforced = {**config, "privacy": {**config["privacy"], "boundary": "secagg"}}
    with pytest.raises(ConfigError, match="privacy.boundary = 'secagg'.*only with privacy.secure_aggregation"):
        serve(Grid(counts), app_run_config(unenforced, tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_serve_refuses_a_config_that_names_data_the_server_would_read(federation, tmp_path):
    """A config whose [data] is not the federation's metadata (`dpfl run`'s, or an app written before) is refused
    before any node is asked or file written: the ServerApp reads no records."""
    import json

    from dpfl.errors import ConfigError
    from dpfl.flower.server_app import serve

    config, _, counts = federation
    grid = Grid(counts)
    grid.send_and_receive = None  # asking a node would fail
    with pytest.raises(ConfigError, match=r"data.name = 'synthetic'.*'silos' in the config a Flower App carries"):
        serve(grid, {"dpfl-config": json.dumps(config), "out": str(tmp_path / "run")})
    assert not (tmp_path / "run").exists()


def test_the_server_app_refuses_a_cohort_said_to_be_secret_from_the_silos(tmp_path):
    """Each job states the cohort's size, so a Flower config must say privacy.cohort = 'members' (what app_config
    writes) or 'published': 'secret' is refused before any node is asked, naming the key."""
    import json

    from dpfl.errors import ConfigError
    from dpfl.flower.app_dir import app_config
    from dpfl.flower.federation import Federation
    from dpfl.flower.server_app import serve

    config = load_config({"data": {"name": "synthetic", "num_clients": 3, "samples_per_client": 10}})
    carried = app_config(config, Federation.of_dataset(build_data(config["data"])))
    assert carried["privacy"]["cohort"] == "members"
    secret = {**carried, "privacy": {**carried["privacy"], "cohort": "secret"}}
    with pytest.raises(ConfigError, match="privacy.cohort = 'secret'.*'members' or 'published' on Flower"):
        serve(None, {"dpfl-config": json.dumps(secret), "out": str(tmp_path)})
