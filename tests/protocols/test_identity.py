"""Signing keys and the registry of public keys of secure aggregation's actively secure variant
(dpfl.protocols.identity): Ed25519 and ECDSA keys in the formats operators have (ssh-keygen's OpenSSH files, PEM),
signatures bound to their statement, and clear errors for anything else."""

import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    BestAvailableEncryption,
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from dpfl.errors import ConfigError
from dpfl.protocols.identity import (
    load_registry,
    load_signing_key,
    load_verifying_key,
    public_text,
    same_key,
    sign,
    verifies,
)

KEYS = {"ed25519": Ed25519PrivateKey.generate, "p256": lambda: ec.generate_private_key(ec.SECP256R1()),
        "p384": lambda: ec.generate_private_key(ec.SECP384R1())}
FORMATS = {"openssh": (PrivateFormat.OpenSSH, Encoding.OpenSSH, PublicFormat.OpenSSH),
           "pem": (PrivateFormat.PKCS8, Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)}


def write(folder, name, key, form):
    private, encoding, public = FORMATS[form]
    (folder / name).write_bytes(key.private_bytes(Encoding.PEM, private, NoEncryption()))
    (folder / f"{name}.pub").write_bytes(key.public_key().public_bytes(encoding, public))
    return folder / name, folder / f"{name}.pub"


@pytest.mark.parametrize("form", list(FORMATS))
@pytest.mark.parametrize("kind", list(KEYS))
def test_keys_load_sign_and_verify_only_their_statement(tmp_path, kind, form):
    private, public = write(tmp_path, "silo", KEYS[kind](), form)
    key, verifying = load_signing_key(private, "secagg-signing-key"), load_verifying_key(public, "secagg-peers")
    assert same_key(key.public_key(), verifying)
    signature = sign(key, b"DPSA/signed statement")
    assert verifies(verifying, signature, b"DPSA/signed statement")
    assert not verifies(verifying, signature, b"DPSA/signed statemenT")
    other = KEYS[kind]()
    assert not verifies(other.public_key(), signature, b"DPSA/signed statement")
    assert public_text(key) == public_text(verifying) and public_text(key).split()[0] in (
        "ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384")


def test_a_registry_is_a_folder_of_client_id_pub_files(tmp_path):
    keys = {c: KEYS["ed25519"]() for c in (0, 1, 7)}
    for c, key in keys.items():
        (tmp_path / f"{c}.pub").write_text(public_text(key))
    registry = load_registry(tmp_path, "secagg-peers")
    assert set(registry) == {0, 1, 7} and all(same_key(registry[c], keys[c].public_key()) for c in keys)
    (tmp_path / "site-a.pub").write_text(public_text(keys[0]))
    with pytest.raises(ConfigError, match=r"secagg-peers = '.*site-a.pub' is not allowed: expected files named "
                                          r"<client id>.pub"):
        load_registry(tmp_path, "secagg-peers")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="none found"):
        load_registry(tmp_path / "empty", "secagg-peers")
    with pytest.raises(ConfigError, match="a folder of public keys"):
        load_registry(tmp_path / "0.pub", "secagg-peers")


def test_unusable_key_files_are_refused_naming_the_config_key(tmp_path):
    with pytest.raises(ConfigError, match=r"secagg-signing-key = '.*missing' is not allowed: expected a readable key"):
        load_signing_key(tmp_path / "missing", "secagg-signing-key")
    (tmp_path / "garbage").write_text("not a key")
    with pytest.raises(ConfigError, match="expected an unencrypted Ed25519 or ECDSA"):
        load_signing_key(tmp_path / "garbage", "secagg-signing-key")
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (tmp_path / "rsa").write_bytes(rsa_key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    with pytest.raises(ConfigError, match=r"found RSAPrivateKey"):
        load_signing_key(tmp_path / "rsa", "secagg-signing-key")
    locked = KEYS["ed25519"]().private_bytes(Encoding.PEM, PrivateFormat.PKCS8, BestAvailableEncryption(b"pw"))
    (tmp_path / "locked").write_bytes(locked)
    with pytest.raises(ConfigError, match="unencrypted"):
        load_signing_key(tmp_path / "locked", "secagg-signing-key")
    secp256k1 = ec.generate_private_key(ec.SECP256K1())
    (tmp_path / "k1.pub").write_bytes(secp256k1.public_key().public_bytes(Encoding.PEM,
                                                                           PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(ConfigError, match=r"a public key: an unencrypted Ed25519 or ECDSA .* \(found ECPublicKey\)"):
        load_verifying_key(tmp_path / "k1.pub", "secagg-peers")
