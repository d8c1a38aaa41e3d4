"""Secure aggregation of integer vectors mod 2^bits: Bonawitz et al. 2017 (CCS, "Practical Secure Aggregation for
Privacy-Preserving Machine Learning"), Sec. 4, Fig. 4: the honest-but-curious protocol, and (``active``) the actively
secure variant with its signatures and ConsistencyCheck round.

Each invited client u holds x_u in Z_(2^bits)^d. The server learns sum_{u in U3} x_u for the set U3 of clients whose
masked input arrived, and nothing else about any x_u, as long as at least ``threshold`` clients stay until the end:

0. **AdvertiseKeys.** u draws two X25519 key pairs, (c_u^PK, c_u^SK) to encrypt shares and (s_u^PK, s_u^SK) to derive
   masks, and sends both public keys, signed (below). The server broadcasts the list of the clients U1 that did
   (|U1| >= t); in the active variant each entry carries its owner's signature, which every client checks.
1. **ShareKeys.** u draws the self-mask seed b_u, Shamir-shares b_u and s_u^SK t-of-|U1| (share of v at x = v + 1)
   and sends each v in U1 its two shares (in the active variant each signed by u for v: ``messages.share_statement``),
   AES-GCM-encrypted under c_uv = HKDF(X25519(c_u^SK, c_v^PK)), with a commitment to b_u
   (``session.seed_commitment``). The server routes the ciphertexts; U2 is the set of clients whose shares arrived
   (|U2| >= t); v checks u's signatures when it decrypts its shares and refuses (naming u) a share without one.
2. **MaskedInputCollection.** u sends
       y_u = x_u + PRG(b_u) + sum_{v in U2, v > u} PRG(s_uv) - sum_{v in U2, v < u} PRG(s_uv)   (mod 2^bits),
   s_uv = HKDF(X25519(s_u^SK, s_v^PK)) = s_vu. U3 is the set of clients whose y_u arrived (|U3| >= t).
3. **ConsistencyCheck** (active variant only). The server sends U3; each u in U3 signs it; U4 is the set of clients
   whose signature arrived (|U4| >= t), and the server forwards their signatures with the unmasking request.
4. **Unmasking.** The server sends U3; each surviving u (in U4, active) returns, for every v in U2, its share of b_v
   if v is in U3 and of s_v^SK otherwise (never both: a client answers one request per round), with v's signature
   of it (active); in the active variant only once it has checked that at least t clients signed the U3 it signed.
   From t responders the server reconstructs b_v for v in U3 and s_v^SK for v in U2 \\ U3, checks each (b_v
   against its commitment, s_v^SK against s_v^PK) and computes
       sum_{u in U3} x_u = sum_{u in U3} y_u - sum_{u in U3} PRG(b_u)
                           - sum_{v in U2\\U3} sum_{u in U3} (+PRG(s_uv) if v > u else -PRG(s_uv)).

**Who sent what.** Every client message is signed (``dpfl.protocols.messages``): in the active variant by the
client's long-term key, registered in a PKI the server does not control (``dpfl.protocols.identity``), so that the
server can neither substitute a client's keys nor show clients different survivor sets; in the honest-but-curious
protocol by a fresh Ed25519 key of the round that the client advertises with its other keys, so that once a client
has advertised, no other party can send in its name (and two different advertisements in one name stop the round).

**What each variant protects against.** Honest-but-curious: a server that follows the protocol learns only the sum
(t > n/2: no two disjoint sets of t clients exist, so even a server that tells some clients that v dropped out and
others that it survived cannot collect t shares of both b_v and s_v^SK). It does not protect against a server that
deviates: one that answers client u's key list with keys of its own (sybils of the other clients) learns x_u. The
active variant: a server that deviates arbitrarily, colluding with c clients, learns nothing beyond a sum of at
least t - c honest inputs as long as 2t > n + c (each honest client signs one survivor list; two lists signed by t
clients each need 2t - c > n - c honest signers otherwise). A malicious client can always choose its own input; it
cannot send in another's name, and a corrupted share of a secret is detected (the round stops), never summed. Who
corrupted it (``SecAggError.culprits``): in the active variant, where every share carries its dealer's signature
for its holder, a holder that forwards a share without it (it altered the share) or else the dealer (every share
signed, so it dealt them wrong); without signatures, a share off the polynomial of the others may have been altered
by its holder or dealt so by its dealer, which cannot be told apart, and neither is named (only a dealer whose shares
all agree on another secret than it committed to is).

Up to n - t clients may drop out, at any stage; with fewer than t left a stage refuses to go on (``SecAggError``, no
partial sum). A party refuses malformed, unsigned, replayed, out-of-order and out-of-round messages. Keys are fresh
in every round.

The parties live in ``client.py`` (``SecAggClient``) and ``server.py`` (``SecAggServer``), what they share in
``session.py`` (``SecAggConfig``, ``Stage``, ``SecureSum``); this module is the front door and holds
``simulate_round``, which drives all parties in one process (the simulator's secure sum and the tests).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from dpfl.errors import ConfigError
from dpfl.protocols.client import SecAggClient
from dpfl.protocols.identity import ed25519_key
from dpfl.protocols.messages import SecAggError
from dpfl.protocols.primitives import KEY_BYTES, RandomBytes, SeededRandomBytes, os_random_bytes
from dpfl.protocols.server import SecAggServer
from dpfl.protocols.session import MAX_BITS, SecAggConfig, SecureSum, Stage


def simulate_round(inputs: torch.Tensor, threshold: int, dropouts: Mapping[int, Stage | str] | None = None,
                   bits: int = 32, seed: int | None = None, round_id: int = 0,
                   clients: Sequence[int] | None = None, active: bool = False) -> SecureSum:
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
      active: the actively secure variant, each client with a fresh Ed25519 identity, all of them in the registry.

    Returns the ``SecureSum`` over the clients whose masked input arrived; raises ``SecAggError`` if fewer than t
    clients remain at some stage.
    """
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2:
        raise ConfigError("inputs", type(inputs).__name__ if not isinstance(inputs, torch.Tensor)
                          else f"a tensor of shape {tuple(inputs.shape)}", "an integer tensor [clients, dimension]")
    ids = tuple(range(inputs.shape[0])) if clients is None else tuple(int(c) for c in clients)
    if len(ids) != inputs.shape[0]:
        raise ConfigError("clients", list(ids), f"{inputs.shape[0]} ids, one per row of inputs")
    config = SecAggConfig(round_id, ids, threshold, inputs.shape[1], bits, active=active)
    leaves = {int(c): _stage(c, s, config) for c, s in (dropouts or {}).items()}
    unknown = sorted(set(leaves) - set(ids))
    if unknown:
        raise ConfigError("dropouts", unknown, f"ids of the round's clients {list(ids)}")

    def randomness(c: int) -> RandomBytes:
        return os_random_bytes if seed is None else SeededRandomBytes(seed, round_id, c)

    streams = {c: randomness(c) for c in ids}
    identities = {c: ed25519_key(streams[c](KEY_BYTES)) for c in ids} if active else {}
    peers = {c: key.public_key() for c, key in identities.items()} if active else None
    parties = {c: SecAggClient(c, config, streams[c], identities.get(c), peers) for c in ids}
    return play_round(SecAggServer(config, peers), parties, dict(zip(ids, inputs)), leaves)


def play_round(server: SecAggServer, parties: dict, inputs: dict, leaves: dict | None = None) -> SecureSum:
    """Every stage of the server's round, in one process: each party (a ``SecAggClient``, by id) answers the messages
    the server has for it, with its row of ``inputs`` at the masked input, until the stage ``leaves`` names for it
    (default: it stays to the end). Returns the server's sum; a refusal raises ``SecAggError``."""
    answer = {Stage.ADVERTISE_KEYS: lambda c, message: parties[c].advertise_keys(),
              Stage.SHARE_KEYS: lambda c, message: parties[c].share_keys(message),
              Stage.MASKED_INPUT: lambda c, message: parties[c].masked_input(message, inputs[c]),
              Stage.CONSISTENCY_CHECK: lambda c, message: parties[c].consistency_check(message),
              Stage.UNMASKING: lambda c, message: parties[c].unmask(message)}
    leaves = leaves or {}
    outgoing = dict.fromkeys(parties, b"")
    for stage in server.config.stages:
        for c, message in outgoing.items():
            if leaves.get(c, Stage.DONE) > stage:
                server.receive(answer[stage](c, message))
        if stage != Stage.UNMASKING:
            outgoing = server.next_messages()
    return server.aggregate()


def _stage(client, stage, config: SecAggConfig) -> Stage:
    allowed = [s.name.lower() for s in config.stages]
    if isinstance(stage, Stage) and stage in config.stages:
        return stage
    if isinstance(stage, str) and stage.lower() in allowed:
        return Stage[stage.upper()]
    raise ConfigError(f"dropouts[{client}]", stage, f"a stage, one of {allowed}")


__all__ = ["MAX_BITS", "Stage", "SecAggConfig", "SecureSum", "SecAggClient", "SecAggServer", "SecAggError",
           "simulate_round", "play_round"]
