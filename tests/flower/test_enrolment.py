"""Secure aggregation on Flower is actively secure by default: `dpfl write-silos` gives every silo a signing key and
the federation's registry of public keys (``dpfl.flower.enrolment``), and a silo without a key refuses secure
aggregation unless its node config opts in to the honest-but-curious protocol (``secagg_policy.check_variant``).
The deployment tests drive the real ServerApp code (``serve``) and ClientApps over an ``InProcessGrid``."""

import re
import stat

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import load_ssh_private_key

from dpfl.cli import main
from dpfl.errors import DpflError
from dpfl.experiments.config import load_config
from dpfl.protocols.identity import load_registry, public_text
from flower_config import app_run_config, silo_pin

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


def test_enrol_makes_owner_only_openssh_ed25519_keys_and_their_registry_replacing_a_previous_federations(tmp_path):
    from dpfl.flower.enrolment import enrol

    first = enrol(tmp_path / "secagg", [0, 1, 2])
    assert first == {i: {"secagg-signing-key": str(tmp_path / "secagg" / f"silo-{i}.key"),
                         "secagg-peers": str(tmp_path / "secagg" / "peers")} for i in range(3)}
    registry = load_registry(tmp_path / "secagg" / "peers", "secagg-peers")
    assert sorted(registry) == [0, 1, 2]
    for i, node in first.items():
        data = (tmp_path / "secagg" / f"silo-{i}.key").read_bytes()
        assert data.startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----")
        assert stat.S_IMODE((tmp_path / "secagg" / f"silo-{i}.key").stat().st_mode) == 0o600
        key = load_ssh_private_key(data, None)
        assert isinstance(key, Ed25519PrivateKey) and public_text(key) == public_text(registry[i])
    assert stat.S_IMODE((tmp_path / "secagg").stat().st_mode) == 0o700
    assert len({public_text(key) for key in registry.values()}) == 3
    enrol(tmp_path / "secagg", [0, 1])  # a smaller federation: fresh keys, client 2's gone (it would be read as one)
    again = load_registry(tmp_path / "secagg" / "peers", "secagg-peers")
    assert sorted(again) == [0, 1] and not (tmp_path / "secagg" / "silo-2.key").exists()
    assert public_text(again[0]) != public_text(registry[0])


flwr = pytest.importorskip("flwr")

from flwr.common.config import parse_config_args  # noqa: E402
from flower_grid import HONEST_BUT_CURIOUS, InProcessGrid  # noqa: E402

from dpfl.flower import secure_sum  # noqa: E402
from dpfl.flower.client_app import client_app  # noqa: E402
from dpfl.flower.server_app import serve  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def stages(grid) -> list[str]:
    """The secure aggregation stages the server sent, in order (one entry per stage and node)."""
    return [str(m.content[secure_sum.SECAGG]["stage"]) for m, _ in grid.received if secure_sum.SECAGG in m.content]


def test_dpfl_write_silos_gives_every_silo_a_signing_key_and_its_node_config_runs_the_active_variant(
        tmp_path, capsys, flower_task):
    """`dpfl write-silos` prints each silo's node config: its data, its signing key (OpenSSH, owner-only) and the
    registry, and the release it pins (the one `dpfl flower-app` carries for the same config). SuperNodes started with
    exactly those (parsed by Flower's own --node-config parser) run the round in
    the actively secure variant: every node signs the survivor set (ConsistencyCheck), and the run completes."""
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    out = tmp_path / "silos"
    assert main(["write-silos", str(path), "--out", str(out)]) == 0
    printed = re.findall(r"client (\d+): '(.*)'", capsys.readouterr().err)
    configs = {int(i): parse_config_args([text]) for i, text in printed}
    secagg = out.resolve() / "secagg"
    assert configs == {i: {"data-path": str(out.resolve() / f"silo-{i}.npz"), **silo_pin(load_config(path)),
                           "secagg-signing-key": str(secagg / f"silo-{i}.key"),
                           "secagg-peers": str(secagg / "peers")} for i in range(3)}
    assert all(stat.S_IMODE((secagg / f"silo-{i}.key").stat().st_mode) == 0o600 for i in range(3))
    assert main(["write-silos", str(path), "--out", str(out)]) == 0  # its own keys folder is not a foreign file
    configs = {int(i): parse_config_args([text]) for i, text in re.findall(r"client (\d+): '(.*)'",
                                                                          capsys.readouterr().err)}
    grid = InProcessGrid(client_app(), 3, lambda partition: configs[partition])
    serve(grid, app_run_config(load_config(path), tmp_path / "flower", **{"round-timeout": 5.0}))
    assert stages(grid).count("CONSISTENCY_CHECK") == 3 and stages(grid)[-3:] == ["UNMASKING"] * 3
    assert all(not reply.has_error() for _, reply in grid.received)


@pytest.mark.parametrize("opted_in", [False, True], ids=["no keys", "opted in"])
def test_a_silo_without_a_signing_key_refuses_secure_aggregation_unless_it_opts_in(tmp_path, write_silos,
                                                                                  flower_task, opted_in):
    """Silos with neither signing keys nor the opt-in refuse the round at its first stage, each naming the node config
    keys that would let it take part; the round stops (no key was advertised). With
    secagg-honest-but-curious = true they run the honest-but-curious protocol (no ConsistencyCheck)."""
    path = tmp_path / "c.toml"
    path.write_text(CONFIG)
    write_silos(load_config(path), tmp_path)
    grid = InProcessGrid(client_app({"silo-path": str(tmp_path / "silo-{partition-id}.npz")}, silo_pin(load_config(path))),
                         3, lambda partition: HONEST_BUT_CURIOUS if opted_in else {})
    run = app_run_config(load_config(path), tmp_path / "flower", **{"round-timeout": 5.0})
    if opted_in:
        serve(grid, run)
        assert "CONSISTENCY_CHECK" not in stages(grid) and stages(grid)[-3:] == ["UNMASKING"] * 3
        return
    with pytest.raises(DpflError, match="only 0 clients advertised keys") as err:
        serve(grid, run)
    assert stages(grid) == ["ADVERTISE_KEYS"] * 3
    refusals = [reply.error.reason for m, reply in grid.received if secure_sum.SECAGG in m.content]
    assert len(refusals) == 3 and all(
        "this silo has no signing key: it takes part in secure aggregation in the actively secure variant, with the "
        "node config keys secagg-signing-key and secagg-peers (dpfl write-silos makes them for a test bed), or, if its "
        "operator accepts a server that could read its input by substituting keys, in the honest-but-curious protocol "
        "with secagg-honest-but-curious = true" in reason for reason in refusals), refusals
    assert "client 0 at ADVERTISE_KEYS" in str(err.value) and "secagg-honest-but-curious = true" in str(err.value)
