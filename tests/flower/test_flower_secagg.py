"""Secure aggregation enforced on Flower (privacy.secure_aggregation = true): the ServerApp runs Bonawitz et al.
2017's stages with the ClientApps, holds only masked vectors and the sum, and gets the model and ledger of `dpfl run`.

The fast tests drive the real ServerApp code (``serve``) and the real ClientApp through ``InProcessGrid``: Flower's
Message and Context objects, one Context per node whose state persists between messages as on a SuperNode, every
message delivered in this process. The slow one runs Flower's simulation runtime (Ray)."""

import dataclasses
import hashlib
import json
import types

import numpy as np
import pytest
import torch

from dpfl.cli import main
from dpfl.engine.simulator import Simulation
from dpfl.errors import DpflError
from dpfl.experiments.config import load_config
from dpfl.experiments.assembly import build_data, build_simulation
from dpfl.flower.silo import write_silos
from flower_config import app_run_config, silo_pin, spent

flwr = pytest.importorskip("flwr")

from flwr.app import ArrayRecord  # noqa: E402

from dpfl.flower import secure_sum  # noqa: E402
from flower_grid import HONEST_BUT_CURIOUS, InProcessGrid, write_federation_keys  # noqa: E402
from dpfl.flower.client_app import client_app  # noqa: E402
from dpfl.flower.server_app import serve  # noqa: E402
from dpfl.protocols.messages import (  # noqa: E402
    MessageType,
    PayloadReader,
    SecAggError,
    decode,
    read_header,
    signed_parts,
    unpack_vector,
)
from dpfl.protocols.session import Stage  # noqa: E402

#: The stages of the honest-but-curious protocol (the nodes have no signing keys, and opt in to it).
STAGES = (Stage.ADVERTISE_KEYS, Stage.SHARE_KEYS, Stage.MASKED_INPUT, Stage.UNMASKING)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BITS = 32
JOINT = """
[data]
name = "synthetic"
num_clients = 3
samples_per_client = 40

[algorithm]
name = "dp-fedavg-joint"
rounds = 2
local_steps = 2
min_clients = 2

[privacy]
secure_aggregation = true

[run]
threads = 1
checkpoint_every = 1
noise_seed = 0  # research mode: every party draws from this seed, so Flower's model equals dpfl run's
"""


@pytest.fixture
def seeded_keys(monkeypatch):
    """The nodes' key seeds from a fixed hash chain instead of the operating system (reproducible tests)."""
    counter = iter(range(10**6))
    monkeypatch.setattr(secure_sum, "secrets", types.SimpleNamespace(
        token_bytes=lambda n: hashlib.sha256(str(next(counter)).encode()).digest()[:n]))


def write_config(folder, text: str = JOINT):
    path = folder / "joint.toml"
    path.write_text(text)
    config = load_config(path)
    write_silos(build_data(config["data"]), folder)
    return path, config


def flower_run(folder, config, lost=lambda message: False, node_config=lambda partition: HONEST_BUT_CURIOUS):
    """Runs ``config`` through ``serve`` over an ``InProcessGrid`` of silos pinned to its release (by default without
    signing keys, opting in to the honest-but-curious protocol); (the grid, the raised error or None)."""
    grid = InProcessGrid(client_app({"silo-path": str(folder / "silo-{partition-id}.npz")}, silo_pin(config)), 3,
                         node_config)
    grid.lost = lost
    try:
        serve(grid, app_run_config(config, folder / "flower", **{"round-timeout": 5.0}))
    except SecAggError as err:
        return grid, err
    return grid, None


def outputs(run_dir):
    return (json.loads((run_dir / "ledger.json").read_text()),
            torch.load(run_dir / "checkpoint.pt", weights_only=False))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """`dpfl run` of JOINT, one client at a time (as each Flower node works): its ledger and checkpoint."""
    folder = tmp_path_factory.mktemp("reference")
    path, _ = write_config(folder)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Simulation, "chunk_size", lambda self, cohort_size: 1)
        assert main(["run", str(path), "--out", str(folder / "run"), "--no-progress"]) == 0
    return outputs(folder / "run")


def stage_of(message) -> str | None:
    content = message.content
    return str(content[secure_sum.SECAGG]["stage"]) if secure_sum.SECAGG in content else None


@pytest.mark.parametrize("signing_keys", [False, True], ids=["honest-but-curious", "active"])
def test_flower_secure_aggregation_gives_dpfl_runs_model_and_ledger(tmp_path, flower_task, seeded_keys, reference,
                                                                    signing_keys):
    """2 rounds of DP-FedAvg with joint noise, its sums by the protocol across the nodes: the same ledger and, bit for
    bit, the same model as `dpfl run` with privacy.secure_aggregation = true (the same rounding draws, and the masks
    cancel exactly mod 2^32). With signing keys in the nodes' configs (one of them the ECDSA P-384 key of a SuperNode's
    authentication) the round is the actively secure variant, with its ConsistencyCheck stage."""
    _, config = write_config(tmp_path)
    keys = write_federation_keys(tmp_path / "keys", 3) if signing_keys else {}
    grid, error = flower_run(tmp_path, config, node_config=lambda partition: keys.get(partition, HONEST_BUT_CURIOUS))
    assert error is None
    ledger, checkpoint = outputs(tmp_path / "flower")
    ledger_ref, checkpoint_ref = reference
    assert spent(ledger) == spent(ledger_ref)
    assert checkpoint["next_round"] == 2
    assert torch.equal(checkpoint["state"]["server"]["x"], checkpoint_ref["state"]["server"]["x"])
    stages = [stage_of(m) for m, _ in grid.received if m.metadata.message_type != "query"]
    expected = (*STAGES[:3], Stage.CONSISTENCY_CHECK, STAGES[3]) if signing_keys else STAGES
    per_round = [None] * 3 + [s.name for s in expected for _ in range(3)]
    assert stages == per_round * 2  # train, then the stages, with each of the 3 nodes, in every round


def test_the_server_receives_only_masked_vectors_independent_of_the_updates(tmp_path, flower_task, seeded_keys):
    """Every value the ServerApp receives from a client: no update in a train reply (its layout only, and the empty
    client state of this algorithm), keys, ciphertexts and shares of the protocol, and one masked vector y_u in
    Z_(2^32)^d per round, uncorrelated with the client's encoded update x_u (|r| < 4 / sqrt(d), fixed seeds) and
    uniform (a chi-square test of its top 4 bits) although x_u is concentrated near 0 mod 2^32."""
    _, config = write_config(tmp_path)
    grid = InProcessGrid(client_app({"silo-path": str(tmp_path / "silo-{partition-id}.npz")}, silo_pin(config)), 3,
                         lambda partition: HONEST_BUT_CURIOUS)
    kept = {}

    def read_kept(message):  # the input a node keeps, read on the node once it has masked it (the server cannot)
        if stage_of(message) == "MASKED_INPUT":
            round_id = json.loads(str(message.content[secure_sum.SECAGG]["config"]))["round_id"]
            state = grid.contexts[message.metadata.dst_node_id].state
            kept[message.metadata.dst_node_id, round_id] = state[secure_sum.KEPT_INPUT]["x"].numpy()
        return False

    grid.lost = read_kept
    serve(grid, app_run_config(config, tmp_path / "flower"))
    masked = {}
    for message, reply in grid.received:
        for name, record in reply.content.items():
            if isinstance(record, ArrayRecord):
                assert name == "client" and len(record) == 0, name  # no tensor of the client's
        if message.metadata.message_type == "train":
            assert set(reply.content) == {secure_sum.LAYOUT, "client", "drawn"}
        if stage_of(message) in ("ADVERTISE_KEYS", "SHARE_KEYS", "UNMASKING"):
            assert len(reply.content[secure_sum.SECAGG]["message"]) < 1000  # keys, 2 ciphertexts, 3 shares
        if stage_of(message) == "MASKED_INPUT":
            sent = bytes(reply.content[secure_sum.SECAGG]["message"])
            round_id = read_header(sent, 0, "server").round_id
            _, payload = decode(sent, round_id, "server", MessageType.MASKED_INPUT)
            body = signed_parts(payload, round_id, "", "")[1]
            masked[message.metadata.dst_node_id, round_id] = unpack_vector(PayloadReader(body, round_id, "", ""))
    assert set(masked) == set(kept) and len(masked) == 6
    for key, y in masked.items():
        x = kept[key].astype(np.int64)
        signed = np.where(x >= 2**31, x - 2**32, x).astype(np.float64)
        d = y.size
        assert int(y.max()) < 2**BITS and float(np.abs(signed).max()) < 2**28  # x_u near 0: |x_u| < 2^28 of 2^32
        r = np.corrcoef(signed, y.astype(np.float64))[0, 1]
        assert abs(r) < 4 / np.sqrt(d), (key, r)
        counts = np.bincount((y >> np.uint64(BITS - 4)).astype(np.int64), minlength=16)  # y_u's top 4 bits
        chi2 = float(((counts - d / 16) ** 2 / (d / 16)).sum())
        assert chi2 < 45.0, (key, counts)  # uniform on Z_(2^32): P(chi2_15 > 45) < 1e-4 (x_u fills 2 of the bins)


def test_a_node_that_drops_after_masking_is_unmasked_by_the_survivors(tmp_path, flower_task, seeded_keys, reference):
    """Client 2's node sends its masked input in round 2 and then no unmasking shares: t = 2 survivors reconstruct its
    self-mask seed, its input stays in the sum, and the model is `dpfl run`'s without dropouts, bit for bit."""
    _, config = write_config(tmp_path)
    grid, error = flower_run(tmp_path, config, lost=lambda m: stage_of(m) == "UNMASKING"
                             and m.metadata.dst_node_id == 103 and json.loads(m.content["secagg"]["config"])["round_id"] == 1)
    assert error is None
    ledger, checkpoint = outputs(tmp_path / "flower")
    assert spent(ledger) == spent(reference[0])
    assert torch.equal(checkpoint["state"]["server"]["x"], reference[1]["state"]["server"]["x"])


def test_a_node_that_drops_before_masking_is_left_out_as_in_dpfl_runs_simulated_dropout(tmp_path, flower_task,
                                                                                       seeded_keys, reference):
    """Client 2's masked input is lost in both rounds: the sum and the mean are over clients 0 and 1, and the model is
    that of `dpfl run`'s secure aggregation with client 2 dropping out at MASKED_INPUT (one client at a time)."""
    _, config = write_config(tmp_path)
    _, error = flower_run(tmp_path, config, lost=lambda m: stage_of(m) == "MASKED_INPUT"
                          and m.metadata.dst_node_id == 103)
    assert error is None
    simulated = build_simulation(config)
    simulated.boundary.secure = dataclasses.replace(simulated.boundary.secure, dropouts={2: "masked_input"})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Simulation, "chunk_size", lambda self, cohort_size: 1)
        simulated.run(2)
    _, checkpoint = outputs(tmp_path / "flower")
    assert torch.equal(checkpoint["state"]["server"]["x"], simulated.model)
    assert not torch.equal(simulated.model, reference[1]["state"]["server"]["x"])  # without client 2's updates


def test_too_few_survivors_stop_the_round_with_its_privacy_charged_and_no_update(tmp_path, flower_task, seeded_keys,
                                                                                 reference):
    """Clients 1 and 2 drop out after masking in round 2: 1 survivor < t = 2, so the round stops with an error that
    names them; ledger.json keeps round 2's charge, the checkpoint stays at round 1's model."""
    _, config = write_config(tmp_path)
    _, error = flower_run(tmp_path, config, lost=lambda m: stage_of(m) == "UNMASKING" and m.metadata.dst_node_id
                          in (102, 103) and json.loads(m.content["secagg"]["config"])["round_id"] == 1)
    assert error is not None and "round 1" in str(error) and "fewer than the threshold 2" in str(error)
    assert "client 1 at UNMASKING" in str(error) and "client 2 at UNMASKING" in str(error)
    ledger, checkpoint = outputs(tmp_path / "flower")
    assert [e["round"] for e in ledger["journal"]] == [1, 2]
    assert spent(ledger)["journal"] == spent(reference[0])["journal"]
    assert checkpoint["next_round"] == 1


def test_a_node_answers_each_stage_once_and_forgets_the_round_after_unmasking(tmp_path, flower_task, seeded_keys):
    """Replaying the protocol from the node's state must not let a server ask twice: a repeated stage (which could
    collect both shares of a client's secrets) is refused, and after Unmasking the round's secrets are gone."""
    _, config = write_config(tmp_path)
    config = {**config, "algorithm": {**config["algorithm"], "rounds": 1}}  # the rounds are this family's release key
    grid = InProcessGrid(client_app({"silo-path": str(tmp_path / "silo-{partition-id}.npz")}, silo_pin(config)), 3,
                         lambda partition: HONEST_BUT_CURIOUS)
    refused = []

    def ask_again(message):  # the same stage's message a second time, once the node has answered it
        if stage_of(message) in ("SHARE_KEYS", "UNMASKING") and message.metadata.dst_node_id == 101:
            with pytest.raises(DpflError) as caught:
                grid.app(message, grid.contexts[101])
            refused.append(str(caught.value))
        return False

    grid.lost = ask_again
    serve(grid, app_run_config(config, tmp_path / "flower"))
    assert len(refused) == 2 and "stage 1 of round 1's secure aggregation out of order" in refused[0]
    assert "did not train" in refused[1]
    assert secure_sum.KEPT not in grid.contexts[101].state and secure_sum.KEPT_INPUT not in grid.contexts[101].state


def test_at_10000_parameters_a_client_sends_8_bytes_a_parameter_and_a_kilobyte_more(tmp_path, flower_task, seeded_keys):
    """The per-round cost at 3 nodes x 10^4 parameters (an MLP with 200 hidden units): the bytes each client sends in
    the protocol, which are 8 d for its masked vector plus O(n) for keys and shares: 4 headers (4 x 22), 4 Ed25519
    signatures (4 x 66), its 3 public keys (96), the commitment and 2 ciphertexts (32 + 4 + 2 x (4 + 2 + 152): each of
    two shares with an empty signature, 2 x (66 + 2), and the tag, 16), the vector's count (4) and 3 unmasking shares
    (4 + 3 x 73: id, kind, share and an empty signature): 1,027 bytes."""
    _, config = write_config(tmp_path, JOINT.replace("[run]", '[model]\nname = "mlp"\nhidden = [200]\n\n[run]')
                             .replace("rounds = 2", "rounds = 1"))
    grid, error = flower_run(tmp_path, config)
    assert error is None
    sent = {}
    for message, reply in grid.received:
        if stage_of(message) is not None:
            node = message.metadata.dst_node_id
            sent[node] = sent.get(node, 0) + len(reply.content[secure_sum.SECAGG]["message"])
    d = 40 * 200 + 200 + 200 * 10 + 10
    assert sent == dict.fromkeys((101, 102, 103), 8 * d + 4 * 22 + 4 * 66 + 96 + 352 + 4 + 223), (d, sent)


@pytest.mark.slow
def test_flower_simulation_runtime_with_secure_aggregation_gives_dpfl_runs_model(tmp_path, reference):
    """The same on Flower's simulation runtime (Ray; each node's context.state kept by the runtime between the
    round's messages): the ledger and the model of `dpfl run` with privacy.secure_aggregation = true."""
    pytest.importorskip("ray")
    from flwr.simulation import run_simulation

    from dpfl.flower.server_app import server_app

    _, config = write_config(tmp_path)
    run_config = app_run_config(config, tmp_path / "flower", **{"round-timeout": 120.0})
    silos = client_app({"silo-path": str(tmp_path / "silo-{partition-id}.npz")}, {**silo_pin(config), **HONEST_BUT_CURIOUS})
    run_simulation(server_app(run_config), silos, num_supernodes=3, backend_config={"client_resources": {"num_cpus": 1}})
    ledger, checkpoint = outputs(tmp_path / "flower")
    assert spent(ledger) == spent(reference[0]) and checkpoint["next_round"] == 2
    assert torch.equal(checkpoint["state"]["server"]["x"], reference[1]["state"]["server"]["x"])
