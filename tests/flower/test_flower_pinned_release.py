"""A silo believes nothing the server sends about what it computes (``dpfl.flower.pin``): a malicious ServerApp
(``MaliciousServer`` over an ``InProcessGrid`` of dpfl's real ClientApps) re-sends an honest run's train messages with
its job changed. On the main of 2026-12-06 each attack below got an answer: the doubled noise level gave the same
draws (2 r1 - r2 is the unnoised update), a forged setting or public noise seed was used as sent, and a new run id
with a cohort of one got its own "first" policy. Now each is refused before anything is drawn, and the silo's own
epsilon, which it records and prints, is the honest server's."""

import json

import pytest
import torch

from dpfl.experiments.config import load_config
from dpfl.experiments.run_directory import release_hash
from flower_config import app_run_config, silo_pin

pytest.importorskip("flwr")

from flower_grid import InProcessGrid, MaliciousServer  # noqa: E402

from dpfl.flower import records  # noqa: E402
from dpfl.flower.client_app import client_app  # noqa: E402
from dpfl.flower.pin import PIN, RESEARCH_SEED  # noqa: E402
from dpfl.flower.server_app import serve  # noqa: E402
from dpfl.flower.silo import write_silos  # noqa: E402
from dpfl.flower.silo_state import SiloState  # noqa: E402
from dpfl.experiments.assembly import build_data  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread", "flower_task")

CONFIG = """
[data]
name = "synthetic"
num_clients = 3
samples_per_client = 30

[algorithm]
name = "dp-fedavg-joint"
rounds = 2
local_steps = 1
min_clients = 2

[privacy]
epsilon = 20.0

[run]
threads = 1
"""


def honest_run(folder, text=CONFIG, **node):
    """An honest run of ``text`` on 3 pinned silos; (its config, the grid, the train messages and replies)."""
    path = folder / "c.toml"
    path.write_text(text)
    config = load_config(path)
    write_silos(build_data(config["data"]), folder)
    grid = InProcessGrid(client_app({"silo-path": str(folder / "silo-{partition-id}.npz")}), 3,
                         lambda partition: {**silo_pin(config), **node})
    serve(grid, app_run_config(config, folder / "flower", **{"round-timeout": 5.0}))
    trains = [(m, r) for m, r in grid.received if m.metadata.message_type == "train"]
    return config, grid, trains


def job(message) -> dict:
    return dict(message.content[records.JOB])


def test_a_doubled_noise_level_is_refused_so_two_replies_cannot_cancel_the_noise(tmp_path):
    """The server re-sends round 1 with the setting's solved noise level doubled: with the same draws, 2 r1 - r2 would
    be client 0's unnoised update (found on dp-fedavg-user's client noise; the setting is every family's). The silo
    recomputes the setting from its pinned release and refuses."""
    _, grid, trains = honest_run(tmp_path)
    message, _ = trains[0]
    setting = json.loads(str(job(message)["setting"]))
    assert setting["noise"] is not None  # solved for privacy.epsilon
    forged = json.dumps({**setting, "noise": 2 * setting["noise"]})
    reply = MaliciousServer(grid).resend(message, setting=forged)
    assert reply.has_error() and "the job's setting differs from the one this silo computes from the pinned release " \
                                 "config in ['noise']" in reply.error.reason


@pytest.mark.parametrize("change", ["noise_multiplier", "min_clients", "boundary", "noise_seed"])
def test_a_release_config_other_than_the_pinned_one_is_refused_also_under_a_new_run_id(tmp_path, change):
    """A new run id with min_clients = 1, a trusted boundary, a tiny noise multiplier or a public noise seed is another
    release config: refused, whatever run id comes with it (the policy's defaults are the pinned config's)."""
    _, grid, trains = honest_run(tmp_path)
    message, _ = trains[0]
    config = json.loads(str(job(message)["config"]))
    section, key, value = {"noise_multiplier": ("algorithm", "noise_multiplier", 0.001),
                           "min_clients": ("algorithm", "min_clients", 1),
                           "boundary": ("privacy", "boundary", "trusted"),
                           "noise_seed": ("run", "noise_seed", 0)}[change]
    config[section][key] = value
    reply = MaliciousServer(grid).resend(message, config=json.dumps(config), run="a-new-run")
    assert reply.has_error() and "is not the one this silo is enrolled in (release-sha256" in reply.error.reason


def test_a_silo_without_a_pin_answers_nothing(tmp_path):
    _, grid, trains = honest_run(tmp_path)
    del grid.contexts[101].node_config[PIN]
    reply = MaliciousServer(grid).resend(trains[0][0])
    assert reply.has_error() and "enrolled in no release: its node config has no release-sha256" in \
        reply.error.reason


def test_a_public_noise_seed_is_the_silos_own_choice(tmp_path):
    """A pinned release in the research mode (run.noise_seed) is still refused unless the silo opts in."""
    with pytest.raises(Exception, match="unless its node config sets research-noise-seed = true"):
        honest_run(tmp_path, CONFIG + "noise_seed = 3\n", **{RESEARCH_SEED: False})


def test_messages_in_the_clear_are_refused_where_the_release_sums_them_securely(tmp_path):
    text = CONFIG.replace("epsilon = 20.0\n", "epsilon = 20.0\nsecure_aggregation = true\n")
    _, grid, trains = honest_run(tmp_path, text, **{"secagg-honest-but-curious": True})
    reply = MaliciousServer(grid).resend(trains[0][0], secure=False)
    assert reply.has_error() and "asks for messages in the clear where the release config sets " \
                                 "privacy.secure_aggregation = True" in reply.error.reason


def test_noise_is_bound_to_the_input_even_if_the_journal_did_not_refuse(tmp_path, monkeypatch):
    """Defence in depth: with the journal's refusal switched off (as if it had been lost unnoticed), a round re-sent
    with another model draws other noise, so the two replies' difference is not the difference of the updates."""
    _, grid, trains = honest_run(tmp_path)
    message, reply = trains[0]
    monkeypatch.setattr(SiloState, "admit", lambda self, *args, **kwargs: None)
    server = records.tensors_of(message.content[records.SERVER])
    shifted = {k: v + 1e-3 for k, v in server.items()}
    content = dict(message.content)
    content[records.SERVER] = records.tensors_record(shifted)
    from flwr.app import Message, RecordDict
    again = grid.send_and_receive([Message(RecordDict(content), dst_node_id=message.metadata.dst_node_id,
                                           message_type="train")])[0]
    first = records.tensors_of(reply.content[records.MESSAGES])
    second = records.tensors_of(again.content[records.MESSAGES])
    assert all((first[k] - second[k]).abs().max() > 0.1 for k in first)  # fresh noise: not a 1e-3 model shift


def test_the_silo_records_and_prints_the_honest_servers_epsilon(tmp_path, capsys):
    config, grid, _ = honest_run(tmp_path)
    results = json.loads((tmp_path / "flower" / "results.json").read_text())
    for partition in range(3):
        rounds = SiloState.beside(tmp_path / f"silo-{partition}.npz").rounds()
        assert [r["round"] for r in rounds] == [0, 1]
        for mine, servers in zip(rounds, results["rounds"]):
            assert mine["epsilon"] == pytest.approx(servers["epsilon"], rel=1e-12)
        assert rounds[0]["run"].split("/")[0] == release_hash(json.loads((tmp_path / "flower" / "run.json")
                                                                         .read_text())["config"])
    err = capsys.readouterr().err
    assert err.count("dpfl silo (client 0): round 2 of run") == 1
