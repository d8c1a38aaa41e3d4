"""What the actively secure variant of secure aggregation costs a client (Bonawitz et al. 2017, Sec. 4: signed keys and
the ConsistencyCheck round; ``dpfl.protocols.secagg``), against the honest-but-curious protocol.

    python benchmarks/secagg_active.py                  # 3, 10 and 50 clients x 10,000 parameters, 3 repeats
    python benchmarks/secagg_active.py 3,10 1000 5      # clients, parameters, repeats

One round per case, every party in this process (no network), each message as the bytes that would be sent, keys from
os.urandom, a 32-bit ring, the threshold a bare majority, no dropouts. Per client: the seconds spent in its own stage
calls (the CPU time of its computation for the round, which other processes on a shared machine do not inflate as
they do wall-clock time; the server's is reported apart) and the bytes it sends and receives (every
protocol message, headers included; Flower's own framing not included). Variants: the honest-but-curious protocol;
the active variant with Ed25519 identities; the active variant with ECDSA P-384 identities (the key a Flower SuperNode
authenticates with). Prints the medians over the repeats, and each active variant's ratio to the honest-but-curious
one.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
from cryptography.hazmat.primitives.asymmetric import ec

from dpfl.protocols.identity import ed25519_key
from dpfl.protocols.primitives import os_random_bytes
from dpfl.protocols.secagg import SecAggClient, SecAggConfig, SecAggServer, Stage

VARIANTS = {"honest-but-curious": None, "active, Ed25519": lambda: ed25519_key(os_random_bytes(32)),
            "active, ECDSA P-384": lambda: ec.generate_private_key(ec.SECP384R1())}


def answer(party: SecAggClient, stage: Stage, message: bytes, x: np.ndarray) -> bytes:
    if stage == Stage.ADVERTISE_KEYS:
        return party.advertise_keys()
    if stage == Stage.MASKED_INPUT:
        return party.masked_input(message, x)
    return {Stage.SHARE_KEYS: party.share_keys, Stage.CONSISTENCY_CHECK: party.consistency_check,
            Stage.UNMASKING: party.unmask}[stage](message)


def one_round(n: int, d: int, identity) -> dict[str, float]:
    """Mean client CPU seconds, server CPU seconds, mean bytes a client sends and receives, for one round."""
    config = SecAggConfig(0, tuple(range(n)), n // 2 + 1, d, 32, active=identity is not None)
    keys = {c: identity() for c in range(n)} if identity else {}
    peers = {c: key.public_key() for c, key in keys.items()} if identity else None
    clients = {c: SecAggClient(c, config, os_random_bytes, keys.get(c), peers) for c in range(n)}
    inputs = np.random.default_rng(0).integers(0, 2**32, (n, d), dtype=np.uint64)
    server = SecAggServer(config, peers)
    seconds, sent, received, server_seconds = np.zeros(n), np.zeros(n), np.zeros(n), 0.0
    outgoing = dict.fromkeys(range(n), b"")
    for stage in config.stages:
        for c, message in outgoing.items():
            received[c] += len(message)
            start = time.process_time()
            reply = answer(clients[c], stage, message, inputs[c])
            seconds[c] += time.process_time() - start
            sent[c] += len(reply)
            start = time.process_time()
            server.receive(reply)
            server_seconds += time.process_time() - start
        start = time.process_time()
        if stage == Stage.UNMASKING:
            total = server.aggregate().total.numpy().view(np.uint64)
        else:
            outgoing = server.next_messages()
        server_seconds += time.process_time() - start
    assert np.array_equal(total, inputs.sum(0) & np.uint64(2**32 - 1))
    return {"client s": seconds.mean(), "server s": server_seconds, "sent B": sent.mean(),
            "received B": received.mean()}


def main(argv: list[str]) -> None:
    sizes, parameters, repeats = argv[0] if argv else "3,10,50", *(int(a) for a in (argv[1:] + ["10000", "3"])[:2])
    print(f"one round, {parameters} parameters, 32-bit ring, threshold n // 2 + 1, no dropouts; CPU time; medians of "
          f"{repeats}")
    for identity in VARIANTS.values():  # warm-up: imports, first-call costs
        one_round(3, 10, identity)
    print(f"{'n':>3} {'variant':<20} {'client ms':>10} {'x':>6} {'server ms':>10} {'x':>6} {'sent B':>9} {'x':>6} "
          f"{'received B':>11} {'x':>6}")
    for n in (int(s) for s in sizes.split(",")):
        base = None
        for name, identity in VARIANTS.items():
            runs = [one_round(n, parameters, identity) for _ in range(repeats)]
            row = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            base = base or row
            ratio = {k: row[k] / base[k] for k in row}
            print(f"{n:>3} {name:<20} {1e3 * row['client s']:>10.1f} {ratio['client s']:>6.2f} "
                  f"{1e3 * row['server s']:>10.1f} {ratio['server s']:>6.2f} {row['sent B']:>9.0f} "
                  f"{ratio['sent B']:>6.3f} {row['received B']:>11.0f} {ratio['received B']:>6.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
