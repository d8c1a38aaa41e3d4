"""Secure aggregation of integer vectors mod 2^bits: Bonawitz et al. 2017 (CCS, "Practical Secure Aggregation for
Privacy-Preserving Machine Learning"), the honest-but-curious protocol (Sec. 4, Fig. 4 without the ConsistencyCheck
round and the signatures, which only the actively secure variant needs).

Each invited client u holds x_u in Z_(2^bits)^d. The server learns sum_{u in U3} x_u for the set U3 of clients whose
masked input arrived, and nothing else about any x_u, as long as at least ``threshold`` clients stay until the end:

0. **AdvertiseKeys.** u draws two X25519 key pairs, (c_u^SK, c_u^PK) to encrypt shares and (s_u^SK, s_u^PK) to derive
   masks, and sends both public keys. The server broadcasts the list of the clients U1 that did (|U1| >= t).
1. **ShareKeys.** u draws the self-mask seed b_u, Shamir-shares b_u and s_u^SK t-of-|U1| (share of v at x = v + 1)
   and sends each v in U1 its two shares, AES-GCM-encrypted under c_uv = HKDF(X25519(c_u^SK, c_v^PK)). The server
   routes the ciphertexts; U2 is the set of clients whose shares arrived (|U2| >= t).
2. **MaskedInputCollection.** u sends
       y_u = x_u + PRG(b_u) + sum_{v in U2, v > u} PRG(s_uv) - sum_{v in U2, v < u} PRG(s_uv)   (mod 2^bits),
   s_uv = HKDF(X25519(s_u^SK, s_v^PK)) = s_vu. U3 is the set of clients whose y_u arrived (|U3| >= t).
3. **Unmasking.** The server sends U3; each surviving u returns, for every v in U2, its share of b_v if v is in U3
   and of s_v^SK otherwise (never both: a client answers one request per round). From any t responders the server
   reconstructs b_v for v in U3 and s_v^SK for v in U2 \\ U3 and computes
       sum_{u in U3} x_u = sum_{u in U3} y_u - sum_{u in U3} PRG(b_u)
                           - sum_{v in U2\\U3} sum_{u in U3} (+PRG(s_uv) if v > u else -PRG(s_uv)).

Up to n - t clients may drop out, at any stage; with fewer than t left a stage refuses to go on (``SecAggError``, no
partial sum). The threshold must be a majority (t > n/2): then no two disjoint sets of t clients exist, so a server
that tells some clients that v dropped out and others that it survived still cannot collect t shares of both b_v
and s_v^SK. Every message is bytes in the versioned format of ``dpfl.protocols.messages``; a party refuses
malformed, replayed, out-of-order and out-of-round messages. Keys are fresh in every round.

The parties live in ``client.py`` (``SecAggClient``) and ``server.py`` (``SecAggServer``), what they share in
``session.py`` (``SecAggConfig``, ``Stage``, ``SecureSum``); this module is the front door and holds
``simulate_round``, which drives all parties in one process (the simulator's secure sum and the tests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from dpfl.errors import ConfigError
from dpfl.protocols.client import SecAggClient
from dpfl.protocols.messages import SecAggError
from dpfl.protocols.primitives import RandomBytes, SeededRandomBytes, os_random_bytes
from dpfl.protocols.server import SecAggServer
from dpfl.protocols.session import MAX_BITS, SecAggConfig, SecureSum, Stage


def simulate_round(inputs: torch.Tensor, threshold: int, dropouts: Mapping[int, Stage | str] | None = None,
                   bits: int = 32, seed: int | None = None, round_id: int = 0,
                   clients: Sequence[int] | None = None) -> SecureSum:
    """One round with every party in this process and every message passed as bytes.

    Args:
      inputs: [n, d] integers in [0, 2^bits), row i the input of client ``clients[i]``.
      threshold: t (> n/2).
      dropouts: client id -> the stage (``Stage`` or its name) from which the client sends nothing.
      bits: the ring Z_(2^bits).
      seed: None draws keys from the operating system; an integer makes the round reproducible (and not private:
        ``primitives.SeededRandomBytes``).
      round_id: the round's id.
      clients: the clients' ids (default 0..n-1).

    Returns the ``SecureSum`` over the clients whose masked input arrived; raises ``SecAggError`` if fewer than t
    clients remain at some stage.
    """
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2:
        raise ConfigError("inputs", type(inputs).__name__ if not isinstance(inputs, torch.Tensor)
                          else f"a tensor of shape {tuple(inputs.shape)}", "an integer tensor [clients, dimension]")
    ids = tuple(range(inputs.shape[0])) if clients is None else tuple(int(c) for c in clients)
    if len(ids) != inputs.shape[0]:
        raise ConfigError("clients", list(ids), f"{inputs.shape[0]} ids, one per row of inputs")
    config = SecAggConfig(round_id, ids, threshold, inputs.shape[1], bits)
    leaves = {int(c): _stage(c, s) for c, s in (dropouts or {}).items()}
    unknown = sorted(set(leaves) - set(ids))
    if unknown:
        raise ConfigError("dropouts", unknown, f"ids of the round's clients {list(ids)}")

    def randomness(c: int) -> RandomBytes:
        return os_random_bytes if seed is None else SeededRandomBytes(seed, round_id, c)

    parties = {c: SecAggClient(c, config, randomness(c)) for c in ids}
    rows = dict(zip(ids, inputs))
    server = SecAggServer(config)

    def active(stage: Stage, among) -> list[int]:
        return [c for c in among if leaves.get(c, Stage.DONE) > stage]

    for c in active(Stage.ADVERTISE_KEYS, ids):
        server.receive(parties[c].advertise_keys())
    key_list = server.key_list()
    for c in active(Stage.SHARE_KEYS, server.advertised):
        server.receive(parties[c].share_keys(key_list))
    routed = server.routed_shares()
    for c in active(Stage.MASKED_INPUT, routed):
        server.receive(parties[c].masked_input(routed[c], rows[c]))
    request = server.unmask_request()
    for c in active(Stage.UNMASKING, server.masked):
        server.receive(parties[c].unmask(request))
    return server.aggregate()


def _stage(client, stage) -> Stage:
    allowed = [s.name.lower() for s in Stage if s < Stage.DONE]
    if isinstance(stage, Stage) and stage < Stage.DONE:
        return stage
    if isinstance(stage, str) and stage.lower() in allowed:
        return Stage[stage.upper()]
    raise ConfigError(f"dropouts[{client}]", stage, f"a stage, one of {allowed}")


__all__ = ["MAX_BITS", "Stage", "SecAggConfig", "SecureSum", "SecAggClient", "SecAggServer", "SecAggError",
           "simulate_round"]
