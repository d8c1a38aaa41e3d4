"""A silo's own secure aggregation policy on Flower (dpfl.flower.secagg_policy): defaults from the run's release
config, overridden by its node config; its signing key and registry; the setup checked against the round it trained.
These need no flwr."""

import dataclasses

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from dpfl.engine.secure_sum import SecureAggregation
from dpfl.errors import ConfigError
from dpfl.flower.secagg_policy import SecAggPolicy, check_setup, node_identity
from dpfl.protocols.identity import public_text
from dpfl.protocols.messages import SecAggError
from dpfl.protocols.session import SecAggConfig

SETTING = {"num_clients": 10, "client_rate": 0.5, "client_sampling": "fixed"}


@pytest.mark.parametrize("min_clients, threshold", [(None, 5), (3, 3), (1, 3)])
def test_the_default_policy_is_the_cohort_and_threshold_of_the_release_config(min_clients, threshold):
    """A cohort of floor(0.5 x 10) = 5; t = min_clients, at least a majority (3), by default the whole cohort."""
    policy = SecAggPolicy.of_release(SecureAggregation({"x": 1.0}, min_clients=min_clients), SETTING)
    assert policy == SecAggPolicy(5, threshold)


def test_the_node_config_sets_its_own_policy():
    policy = SecAggPolicy(5, 3).under({"secagg-min-cohort": 8, "secagg-min-threshold": 6, "data-path": "x"})
    assert policy == SecAggPolicy(8, 6)
    assert SecAggPolicy(5, 3).under({}) == SecAggPolicy(5, 3)
    with pytest.raises(ConfigError, match="secagg-min-threshold = 'two' is not allowed"):
        SecAggPolicy(5, 3).under({"secagg-min-threshold": "two"})
    config = SecAggConfig(4, (0, 1, 2, 3, 4, 5, 6, 7), 5, 10, 32)
    policy.check(dataclasses.replace(config, threshold=6), 0)
    with pytest.raises(SecAggError, match="round 4, client 0: a round of 8 clients with threshold 5: this silo takes "
                                          "part only in rounds of at least 8 clients with threshold at least 6"):
        policy.check(config, 0)


def test_a_setup_other_than_the_trained_round_is_refused():
    trained = {"round": 2, "session": "abc/run", "cohort": 3, "dimension": 10, "bits": 32}
    good = SecAggConfig(2, (0, 1, 2), 2, 10, 32, "abc/run")
    check_setup(good, 1, trained)
    for change, name in [({"round_id": 3}, "round_id"), ({"session": "abc/other"}, "session"),
                         ({"dimension": 11}, "dimension"), ({"bits": 16}, "bits"),
                         ({"clients": (0, 2, 3)}, "clients"), ({"clients": (0, 1, 2, 3), "threshold": 3}, "cohort")]:
        with pytest.raises(SecAggError, match=f"client 1: a round set up as {{'{name}'"):
            check_setup(dataclasses.replace(good, **change), 1, trained)


def test_a_silos_identity_needs_its_key_and_the_registry_with_its_own_public_key(tmp_path):
    key, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    (tmp_path / "key").write_bytes(key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()))
    (tmp_path / "peers").mkdir()
    (tmp_path / "peers" / "0.pub").write_text(public_text(key))
    (tmp_path / "peers" / "1.pub").write_text(public_text(other))
    assert node_identity({}, 0) is None
    identity = node_identity({"secagg-signing-key": str(tmp_path / "key"), "secagg-peers": str(tmp_path / "peers")}, 0)
    assert identity.public == public_text(key) and set(identity.peers) == {0, 1}
    with pytest.raises(ConfigError, match="secagg-peers = None is not allowed: expected set together with "
                                          "secagg-signing-key"):
        node_identity({"secagg-signing-key": str(tmp_path / "key")}, 0)
    with pytest.raises(ConfigError, match="secagg-signing-key = None is not allowed"):
        node_identity({"secagg-peers": str(tmp_path / "peers")}, 0)
    with pytest.raises(ConfigError, match=r"the public key of this silo's secagg-signing-key as 1.pub \(this silo is "
                                          r"client 1\)"):
        node_identity({"secagg-signing-key": str(tmp_path / "key"), "secagg-peers": str(tmp_path / "peers")}, 1)


def test_without_a_signing_key_a_silo_takes_part_only_in_the_honest_but_curious_protocol_it_opted_in_to(tmp_path):
    """Actively secure by default: without keys a silo refuses every round unless secagg-honest-but-curious = true
    (a boolean, and never beside a signing key, which makes the silo insist on the active variant)."""
    from dpfl.flower.enrolment import enrol
    from dpfl.flower.secagg_policy import check_variant

    config = SecAggConfig(4, (0, 1, 2), 2, 10, 32)
    with pytest.raises(SecAggError, match="round 4, client 0: this silo has no signing key: .* node config keys "
                                          "secagg-signing-key and secagg-peers .* secagg-honest-but-curious = true"):
        check_variant(config, {}, 0)
    assert check_variant(config, {"secagg-honest-but-curious": True}, 0) is None
    with pytest.raises(SecAggError, match="round 4, client 0: this silo has no signing key"):
        check_variant(config, {"secagg-honest-but-curious": False}, 0)
    with pytest.raises(SecAggError, match="a round of the actively secure variant, but this silo has no signing key"):
        check_variant(dataclasses.replace(config, active=True), {"secagg-honest-but-curious": True}, 0)
    with pytest.raises(ConfigError, match="secagg-honest-but-curious = 'yes' is not allowed: expected true or false"):
        check_variant(config, {"secagg-honest-but-curious": "yes"}, 0)
    keys = enrol(tmp_path, [0, 1, 2])
    assert set(check_variant(dataclasses.replace(config, active=True), keys[1], 1).peers) == {0, 1, 2}
    with pytest.raises(SecAggError, match="a round set up without signatures: this silo has a signing key"):
        check_variant(config, keys[1], 1)
    with pytest.raises(ConfigError, match=r"secagg-honest-but-curious = True is not allowed: expected false \(or "
                                          r"unset\) with secagg-signing-key"):
        check_variant(dataclasses.replace(config, active=True), {**keys[1], "secagg-honest-but-curious": True}, 1)
