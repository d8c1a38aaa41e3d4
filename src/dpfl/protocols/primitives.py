"""The cryptographic building blocks of secure aggregation, each one call into the ``cryptography`` package.

Bonawitz et al. 2017 (CCS, "Practical Secure Aggregation for Privacy-Preserving Machine Learning"), Sec. 3 and 4:

* key agreement: X25519 (Bernstein 2006), the shared secret run through HKDF-SHA256 (Krawczyk 2010) with a label
  that names the protocol version, the round and the key's purpose, so that the mask seed s_uv and the encryption
  key c_uv of one pair are independent 32-byte keys;
* authenticated encryption of the Shamir shares: AES-256-GCM, the message's header bytes as associated data;
* the PRG that expands a 32-byte seed into a mask vector: the ChaCha20 keystream (RFC 8439, zero nonce: each seed
  is used for one vector only), read as little-endian 64-bit words and reduced mod 2^bits;
* randomness: ``os.urandom`` by default, or, for reproducible simulations and tests only, a ChaCha20 keystream keyed
  by HKDF(run seed, party): anyone who knows the seed knows every key, so a seeded round is not private.

Nothing here implements a primitive; this module only fixes how the protocol uses them.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

#: Bytes of an X25519 key (private or public), a PRG seed and an AES-256 key.
KEY_BYTES = 32
#: Bytes an AES-GCM ciphertext adds to its plaintext (the tag).
TAG_BYTES = 16

#: A source of random bytes: ``random_bytes(n)`` returns n bytes.
RandomBytes = Callable[[int], bytes]


def os_random_bytes(n: int) -> bytes:
    """The operating system's cryptographically secure randomness."""
    return os.urandom(n)


class SeededRandomBytes:
    """Reproducible random bytes for one party of one round: the ChaCha20 keystream under the key
    HKDF-SHA256(seed, info = "dpfl-secagg seeded randomness" | round | party).

    For simulations and tests only: every party's keys follow from the seed, so whoever knows it learns everything."""

    def __init__(self, seed: int, round_id: int, party: int):
        key = _hkdf(int(seed).to_bytes(16, "big", signed=True), b"seeded randomness", round_id, party)
        self._stream = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()

    def __call__(self, n: int) -> bytes:
        return self._stream.update(bytes(n))


def private_key(raw: bytes) -> X25519PrivateKey:
    """The X25519 private key with these 32 bytes (RFC 7748 clamps them when the key is used): a fresh key from 32
    random bytes, or a key reconstructed from its Shamir shares."""
    return X25519PrivateKey.from_private_bytes(raw)


def private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def agree(private: X25519PrivateKey, peer_public: bytes, purpose: bytes, round_id: int) -> bytes:
    """The 32-byte key a pair shares for ``purpose`` (b"mask" for s_uv, b"encrypt" for c_uv) in round ``round_id``:
    HKDF-SHA256 of the X25519 shared secret. Symmetric: agree(a, B) == agree(b, A)."""
    shared = private.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return _hkdf(shared, purpose, round_id, 0)


def encrypt(key: bytes, nonce: bytes, plaintext: bytes, associated_data: bytes) -> bytes:
    """AES-256-GCM; the ciphertext carries its 16-byte tag."""
    return AESGCM(key).encrypt(nonce, plaintext, associated_data)


def decrypt(key: bytes, nonce: bytes, ciphertext: bytes, associated_data: bytes) -> bytes:
    """AES-256-GCM; raises ``cryptography.exceptions.InvalidTag`` if the ciphertext or its associated data changed."""
    return AESGCM(key).decrypt(nonce, ciphertext, associated_data)


def prg(seed: bytes, length: int, bits: int) -> np.ndarray:
    """PRG(seed): ``length`` integers uniform on Z_(2^bits), as uint64: the ChaCha20 keystream under ``seed``."""
    keystream = Cipher(algorithms.ChaCha20(seed, bytes(16)), mode=None).encryptor().update(bytes(8 * length))
    return np.frombuffer(keystream, dtype="<u8").astype(np.uint64) & np.uint64((1 << bits) - 1)


def _hkdf(material: bytes, purpose: bytes, round_id: int, party: int) -> bytes:
    info = b"dpfl-secagg/1/" + purpose + struct.pack(">Qq", round_id, party)
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=info).derive(material)


__all__ = ["KEY_BYTES", "TAG_BYTES", "RandomBytes", "os_random_bytes", "SeededRandomBytes", "private_key",
           "private_bytes", "public_bytes", "agree", "encrypt", "decrypt", "prg"]
