"""A deployment whose server is the adversary: a malicious ServerApp (``MaliciousServer``) against dpfl's real
ClientApps over an ``InProcessGrid``, in the middle of (or after) an honest ``serve`` run.

Each attack would read one silo's encoded update exactly; each is refused by the silos themselves (their policy, their
journal of secure aggregations, their signing keys), and the honest run then completes. The one attack that the
honest-but-curious protocol cannot stop (key substitution) is shown to succeed without signing keys."""

import dataclasses
import json

import pytest
import torch

from dpfl.errors import DpflError
from dpfl.experiments.config import load_config
from flower_config import app_run_config, silo_pin

pytest.importorskip("flwr")

from flower_grid import HONEST_BUT_CURIOUS, InProcessGrid, MaliciousServer, write_federation_keys  # noqa: E402

from dpfl.flower import secure_sum  # noqa: E402
from dpfl.flower.client_app import client_app  # noqa: E402
from dpfl.flower.server_app import serve  # noqa: E402
from dpfl.protocols.identity import ed25519_key, load_verifying_key  # noqa: E402
from dpfl.protocols.primitives import SeededRandomBytes  # noqa: E402
from dpfl.protocols.secagg import SecAggClient, SecAggConfig  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread", "flower_task")

CONFIG = """
[data]
name = "synthetic"
num_clients = 3
samples_per_client = 30

[algorithm]
name = "dp-fedavg-joint"
rounds = 1
local_steps = 1
min_clients = 2

[privacy]
secure_aggregation = true

[run]
threads = 1
"""


def federation(folder, write_silos, keys=False):
    """The config, and a grid of the 3 silos' ClientApps (with signing keys in their node configs if ``keys``, else
    opting in to the honest-but-curious protocol)."""
    path = folder / "c.toml"
    path.write_text(CONFIG)
    config = load_config(path)
    write_silos(config, folder)
    node_keys = write_federation_keys(folder / "keys", 3) if keys else {}
    grid = InProcessGrid(client_app({"silo-path": str(folder / "silo-{partition-id}.npz")}, silo_pin(config)), 3,
                         lambda partition: node_keys.get(partition, HONEST_BUT_CURIOUS))
    return config, grid


def serve_with(grid, folder, config, attack):
    """``serve`` over ``grid``, calling ``attack(honest setup, train messages by node)`` once, when the honest round's
    first secure aggregation stage is about to go out; the run's error (None if it completed)."""
    trains, done = {}, []

    def before(messages):
        for message in messages:
            if message.metadata.message_type == "train":
                trains[message.metadata.dst_node_id] = message
        if not done and any(secure_sum.SECAGG in m.content for m in messages):
            done.append(True)
            fields = json.loads(str(messages[0].content[secure_sum.SECAGG]["config"]))
            attack(SecAggConfig(**{**fields, "clients": tuple(fields["clients"])}), trains)

    grid.before = before
    try:
        serve(grid, app_run_config(config, folder / "flower", **{"round-timeout": 5.0}))
    except DpflError as err:
        return err
    return None


def kept_input(grid, node):
    """The encoded update a node keeps for the round (read on the node: the server never sees it)."""
    return grid.contexts[node].state[secure_sum.KEPT_INPUT]["x"].numpy()


def test_a_silo_refuses_a_cohort_of_itself_and_the_honest_round_goes_on(tmp_path, write_silos):
    """The server re-sends client 0 its train message for a cohort of 1, runs a "secure aggregation" with
    client 0 alone and threshold 1 (whose sum is its input), then re-sends the original train message (which
    re-creates the same input) so that the honest round completes and the ledger looks normal. Client 0's node
    refuses the setup: its policy (by default the run's release config: cohort 3, threshold 2) is not met."""
    config, grid = federation(tmp_path, write_silos)
    adversary, attacks = MaliciousServer(grid), []

    def attack(honest, trains):
        assert not adversary.resend(trains[101], cohort=1).has_error()  # the same computation, encoded for 1 client
        attacks.append(adversary.run(dataclasses.replace(honest, clients=(0,), threshold=1), {0: 101}))
        assert not adversary.resend(trains[101]).has_error()

    assert serve_with(grid, tmp_path, config, attack) is None
    assert attacks == [{0: attacks[0].get(0)}], attacks  # refused, not a sum
    assert "a round of 1 clients with threshold 1: this silo takes part only in rounds of at least 3 clients with " \
           "threshold at least 2" in attacks[0][0]
    assert json.loads((tmp_path / "flower" / "ledger.json").read_text())["journal"][0]["round"] == 1


def test_a_second_aggregation_of_a_round_is_refused_even_after_its_train_message_is_re_sent(tmp_path, write_silos):
    """After the honest round (sum S1 = x0 + x1 + x2), the server re-sends clients 1 and 2 their train
    messages, which re-create their identical inputs in their nodes' ``context.state``, and runs the same setup again
    with client 0 "dropped out" (sum S2 = x1 + x2): S1 - S2 would be x0. Their journals (on disk, beside their data)
    say they sent their masked inputs in that round already, and they refuse."""
    config, grid = federation(tmp_path, write_silos)
    setups = []
    assert serve_with(grid, tmp_path, config, lambda honest, trains: setups.append(honest)) is None
    adversary = MaliciousServer(grid)
    trains = {m.metadata.dst_node_id: m for m, _ in grid.received if m.metadata.message_type == "train"}
    for node in (102, 103):
        assert not adversary.resend(trains[node]).has_error()  # the same input again: the same reply
    second = adversary.run(setups[0], {1: 102, 2: 103})
    assert set(second) == {1, 2}, second
    assert all("already sent its masked input in round 1 of this run" in why for why in second.values())


@pytest.mark.parametrize("keys", [False, True], ids=["honest-but-curious", "signing keys"])
def test_key_substitution_reads_an_input_unless_the_silos_sign_their_keys(tmp_path, write_silos, keys):
    """Before the honest round, the server runs the round's own setup with client 0's node and two sybils it plays
    itself as clients 1 and 2 (its own keys, inputs zero): the sum is client 0's encoded update. Without signing keys
    (the honest-but-curious protocol) it is read exactly (and client 0, having sent its masked input, then takes part
    in no other aggregation of the round: the honest one finishes with clients 1 and 2). With them, the sybils cannot
    sign as clients 1 and 2 (the silo checks the signatures against its own registry) and client 0's node refuses the
    key list, before anything that depends on its input is sent; the honest round then completes."""
    config, grid = federation(tmp_path, write_silos, keys)
    adversary, attacks = MaliciousServer(grid), []

    def attack(honest, trains):
        peers = {c: ed25519_key(SeededRandomBytes(9, 0, c)(32)) for c in (1, 2)}
        registry = {c: key.public_key() for c, key in peers.items()}
        if honest.active:
            registry[0] = load_verifying_key(tmp_path / "keys" / "peers" / "0.pub", "test")
        sybils = {c: SecAggClient(c, honest, SeededRandomBytes(9, 1, c), peers[c] if honest.active else None,
                                  registry if honest.active else None) for c in (1, 2)}
        x0 = kept_input(grid, 101)
        attacks.append((adversary.run(honest, {0: 101}, sybils, registry if honest.active else None), x0))

    assert serve_with(grid, tmp_path, config, attack) is None
    [(result, x0)] = attacks
    if not keys:
        assert torch.equal(result.total, torch.from_numpy(x0)) and result.contributors == (0, 1, 2)
        return
    assert set(result) == {0} and "keys of clients [1, 2] are not signed by their registered keys" in result[0]


def test_a_silo_with_a_signing_key_refuses_a_round_without_signatures(tmp_path, write_silos):
    """No downgrade: the server sets the round up as the honest-but-curious protocol; every silo that has a
    signing key refuses it, and the honest (actively secure) round then completes."""
    config, grid = federation(tmp_path, write_silos, keys=True)
    adversary, attacks = MaliciousServer(grid), []

    def attack(honest, trains):
        assert honest.active
        attacks.append(adversary.run(dataclasses.replace(honest, active=False), {0: 101, 1: 102, 2: 103}))

    assert serve_with(grid, tmp_path, config, attack) is None
    assert set(attacks[0]) == {0, 1, 2}
    assert all("takes part in the actively secure variant only" in why for why in attacks[0].values())


def test_a_federation_in_which_only_some_silos_have_signing_keys_is_refused_before_round_1(tmp_path, write_silos):
    config, grid = federation(tmp_path, write_silos, keys=True)
    for key in ("secagg-signing-key", "secagg-peers"):
        del grid.contexts[103].node_config[key]
    error = serve_with(grid, tmp_path, config, lambda honest, trains: None)
    assert isinstance(error, DpflError) and "the nodes of clients [2] have no secure aggregation signing key" in \
        str(error)
