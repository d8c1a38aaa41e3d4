"""A federation's secure aggregation identities, made in one place for a test bed or a rehearsal: each silo's signing
key and the registry of all their public keys (``dpfl.protocols.identity``), which make every silo take part in the
actively secure variant of Bonawitz et al. 2017 (Sec. 4) and no other (``dpfl.flower.secagg_policy``).

Each silo's key is a fresh Ed25519 key (Bernstein et al. 2012) in OpenSSH's private key format (what
``ssh-keygen -t ed25519`` writes), unencrypted and readable by its owner only (mode 0600), ``silo-{i}.key``; the
registry is the folder ``peers`` beside them, one ``{i}.pub`` per silo. Whoever runs this holds every silo's key,
which suits a test bed whose SuperNodes one operator runs. In a federation of separate operators each silo makes its
own key (``ssh-keygen -t ed25519 -f KEY``, or uses the one its SuperNode authenticates with) and the silos exchange
the public halves among themselves, not through the coordinator: a registry the server hands out is one it can fill
with its own keys (the PKI the protocol assumes).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from dpfl.flower.secagg_policy import PEERS, SIGNING_KEY
from dpfl.protocols.identity import ed25519_key, public_text
from dpfl.protocols.primitives import KEY_BYTES, os_random_bytes

#: The folder of the identities, under ``dpfl write-silos``'s ``--out``.
FOLDER = "secagg"


def enrol(folder: str | Path, clients: Iterable[int]) -> dict[int, dict[str, str]]:
    """Makes a signing key for each of ``clients`` (``folder/silo-{i}.key``, 0600) and the registry ``folder/peers``
    (``{i}.pub``), replacing the keys and public keys already there (a previous federation's would be read as
    clients); returns {client: its node config keys ``secagg-signing-key`` and ``secagg-peers``}, absolute paths."""
    folder = Path(folder).resolve()
    peers = folder / "peers"
    peers.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o700)
    for stale in [*folder.glob("silo-*.key"), *peers.glob("*.pub")]:
        stale.unlink()
    configs = {}
    for client in clients:
        key = ed25519_key(os_random_bytes(KEY_BYTES))
        path = folder / f"silo-{client}.key"
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others
        with os.fdopen(descriptor, "wb") as file:
            file.write(key.private_bytes(Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption()))
        (peers / f"{client}.pub").write_text(public_text(key) + "\n")
        configs[client] = {SIGNING_KEY: str(path), PEERS: str(peers)}
    return configs


def node_config_text(config: dict[str, str]) -> str:
    """A node config as ``flower-supernode --node-config`` takes it: ``key="value"`` pairs, space-separated."""
    return " ".join(f'{key}="{value}"' for key, value in config.items())


__all__ = ["FOLDER", "enrol", "node_config_text"]
