"""Who sent a secure aggregation message: the parties' signing keys and the federation's registry of public keys.

Bonawitz et al. 2017 (Sec. 4, Fig. 4) make the protocol secure against an actively malicious server with a PKI: each
client u holds a long-term signing key d_u^SK whose public part d_u^PK every other client knows from a source the
server does not control, signs its advertised keys (sigma_u over c_u^PK || s_u^PK) and the survivor set of the
ConsistencyCheck round, and verifies the others' signatures. Here a signing key is either

* Ed25519 (Bernstein et al. 2012; 64-byte signatures, deterministic), or
* ECDSA on NIST P-256, P-384 or P-521 with the curve's SHA-2 (FIPS 186-4), so that the EC key pair a Flower
  SuperNode already authenticates itself with (``flower-supernode --auth-supernode-private-key``, made by
  ``ssh-keygen -t ecdsa``) can serve as its silo's secure aggregation identity.

Keys are read from files in OpenSSH format (what ``ssh-keygen`` writes) or PEM (PKCS#8 / SubjectPublicKeyInfo),
unencrypted. The registry of a federation is a folder holding one public key file per client, ``<client id>.pub``.

Every signature covers a statement that starts with ``STATEMENT_TAG`` (``dpfl.protocols.messages.statement``), so a
signature made for secure aggregation is never a valid signature of anything another protocol signs with the same
key (Flower's node authentication signs an ASCII timestamp). Nothing here implements a primitive: each function is
one call into the ``cryptography`` package.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    PublicFormat,
    load_pem_private_key,
    load_pem_public_key,
    load_ssh_private_key,
    load_ssh_public_key,
)

from dpfl.errors import ConfigError

SigningKey = Ed25519PrivateKey | ec.EllipticCurvePrivateKey
VerifyingKey = Ed25519PublicKey | ec.EllipticCurvePublicKey
#: The registry: client id -> that client's public signing key.
Registry = Mapping[int, VerifyingKey]
#: Bytes of an Ed25519 private or public key.
ED25519_BYTES = 32
#: The hash of ECDSA on each allowed curve.
_CURVE_HASH = {"secp256r1": hashes.SHA256, "secp384r1": hashes.SHA384, "secp521r1": hashes.SHA512}
_ALLOWED = "an unencrypted Ed25519 or ECDSA (P-256, P-384, P-521) key in OpenSSH or PEM format"


def sign(key: SigningKey, statement: bytes) -> bytes:
    """The signature of ``statement`` (Ed25519, or ECDSA with the curve's hash, DER-encoded)."""
    if isinstance(key, Ed25519PrivateKey):
        return key.sign(statement)
    return key.sign(statement, ec.ECDSA(_CURVE_HASH[key.curve.name]()))


def verifies(key: VerifyingKey, signature: bytes, statement: bytes) -> bool:
    """Whether ``signature`` is ``key``'s signature of ``statement``."""
    try:
        if isinstance(key, Ed25519PublicKey):
            key.verify(signature, statement)
        else:
            key.verify(signature, statement, ec.ECDSA(_CURVE_HASH[key.curve.name]()))
    except InvalidSignature:
        return False
    return True


def ed25519_key(raw: bytes) -> Ed25519PrivateKey:
    """The Ed25519 signing key with these 32 random bytes (a round's fresh key, or a simulated client's identity)."""
    return Ed25519PrivateKey.from_private_bytes(raw)


def ed25519_public(raw: bytes) -> Ed25519PublicKey:
    return Ed25519PublicKey.from_public_bytes(raw)


def raw_public(key: Ed25519PrivateKey) -> bytes:
    """The 32 bytes of an Ed25519 key's public part."""
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def public_text(key: SigningKey | VerifyingKey) -> str:
    """A public key as one OpenSSH line (what a ``.pub`` file of the registry holds)."""
    public = key.public_key() if isinstance(key, (Ed25519PrivateKey, ec.EllipticCurvePrivateKey)) else key
    return public.public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()


def same_key(a: VerifyingKey, b: VerifyingKey) -> bool:
    return public_text(a) == public_text(b)


def load_signing_key(path: str | Path, key: str) -> SigningKey:
    """The signing key in the file ``path``; ConfigError naming the config key ``key`` if it is none."""
    data = _read(path, key)
    return _allowed(_first_loaded(lambda: load_ssh_private_key(data, None), lambda: load_pem_private_key(data, None)),
                    path, key, "")


def load_verifying_key(path: str | Path, key: str) -> VerifyingKey:
    """The public key in the file ``path`` (an OpenSSH line or PEM); ConfigError naming ``key`` if it is none."""
    return parse_verifying_key(_read(path, key), str(path), key)


def parse_verifying_key(data: bytes, source: str, key: str) -> VerifyingKey:
    """The public key in ``data`` (an OpenSSH line or PEM) from ``source``; ConfigError naming ``key`` if it is
    none."""
    return _allowed(_first_loaded(lambda: load_ssh_public_key(data), lambda: load_pem_public_key(data)), source, key,
                    "a public key: ")


def load_registry(folder: str | Path, key: str) -> dict[int, VerifyingKey]:
    """The registry in ``folder``: {client id: public key} from its files ``<client id>.pub``; ConfigError naming
    ``key`` for a folder without any, or an unreadable key."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ConfigError(key, str(folder), "a folder of public keys, one file <client id>.pub per client")
    registry = {}
    for path in sorted(folder.glob("*.pub")):
        if not path.stem.isdigit():
            raise ConfigError(key, str(path), "files named <client id>.pub, the client id an integer")
        registry[int(path.stem)] = load_verifying_key(path, key)
    if not registry:
        raise ConfigError(key, str(folder), "a folder of public keys, one file <client id>.pub per client (none found)")
    return registry


def _read(path: str | Path, key: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes()
    except OSError as err:
        raise ConfigError(key, str(path), f"a readable key file ({err.strerror})") from None


def _first_loaded(*loaders):
    """What the first loader that understands the bytes returns (None if none does)."""
    for loader in loaders:
        try:
            return loader()
        except (ValueError, TypeError, UnsupportedAlgorithm):
            continue
    return None


def _allowed(loaded, path, key: str, what: str):
    if isinstance(loaded, (Ed25519PrivateKey, Ed25519PublicKey)):
        return loaded
    if isinstance(loaded, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) and loaded.curve.name in _CURVE_HASH:
        return loaded
    found = "" if loaded is None else f" (found {type(loaded).__name__})"
    raise ConfigError(key, str(path), f"{what}{_ALLOWED}{found}")


__all__ = ["SigningKey", "VerifyingKey", "Registry", "ED25519_BYTES", "sign", "verifies", "ed25519_key",
           "ed25519_public", "raw_public", "public_text", "same_key", "load_signing_key", "load_verifying_key",
           "parse_verifying_key", "load_registry"]
