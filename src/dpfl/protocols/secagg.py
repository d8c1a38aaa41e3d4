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

``simulate_round`` drives all parties in one process (the simulator's secure sum and the tests).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from cryptography.exceptions import InvalidTag

from dpfl.errors import ConfigError, check_range
from dpfl.protocols import shamir
from dpfl.protocols.messages import (
    CIPHERTEXT_BYTES,
    SERVER,
    MessageType,
    PayloadReader,
    SecAggError,
    ShareKind,
    decode,
    encode,
    pack_count,
    pack_vector,
    party_name,
    share_context,
    share_nonce,
    unpack_vector,
)
from dpfl.protocols.primitives import (
    KEY_BYTES,
    RandomBytes,
    SeededRandomBytes,
    agree,
    decrypt,
    encrypt,
    os_random_bytes,
    private_bytes,
    prg,
    private_key,
    public_bytes,
)

#: Largest ring Z_(2^bits) (sums are returned as int64).
MAX_BITS = 63


class Stage(enum.IntEnum):
    """The protocol's rounds, in order; a client that drops out "at" a stage sends nothing from that stage on."""

    ADVERTISE_KEYS = 0
    SHARE_KEYS = 1
    MASKED_INPUT = 2
    UNMASKING = 3
    DONE = 4
    ABORTED = 5


@dataclass(frozen=True)
class SecAggConfig:
    """What every party of one round agrees on beforehand.

    Attributes:
      round_id: the round's id (every message carries it); fresh keys are drawn for every round.
      clients: the invited client ids, distinct integers in [0, 2^32 - 2].
      threshold: t, the Shamir threshold and the fewest clients that may remain: t > n/2 (module docstring), t <= n.
      dimension: d, the length of every input vector.
      bits: the ring Z_(2^bits) the vectors and their sum live in, 1..63.
    """

    round_id: int
    clients: tuple[int, ...]
    threshold: int
    dimension: int
    bits: int

    def __post_init__(self):
        object.__setattr__(self, "clients", tuple(int(c) for c in self.clients))
        check_range("round_id", self.round_id, 0, 2**64 - 1, integer=True)
        n = len(self.clients)
        if n == 0 or len(set(self.clients)) != n or not all(0 <= c < SERVER for c in self.clients):
            raise ConfigError("clients", list(self.clients), "distinct client ids in [0, 2^32 - 2], at least one")
        check_range("threshold", self.threshold, n // 2 + 1, n, integer=True)
        check_range("dimension", self.dimension, 1, integer=True)
        check_range("bits", self.bits, 1, MAX_BITS, integer=True)

    @property
    def modulus_mask(self) -> np.uint64:
        return np.uint64((1 << self.bits) - 1)


@dataclass(frozen=True)
class SecureSum:
    """The outcome of a round: ``total`` = sum of the contributors' inputs mod 2^bits (int64, [dimension])."""

    total: torch.Tensor
    contributors: tuple[int, ...]


@dataclass(frozen=True)
class _PublicKeys:
    encryption: bytes  # c_u^PK
    mask: bytes  # s_u^PK


class SecAggClient:
    """One client's side of one round: call ``advertise_keys``, ``share_keys``, ``masked_input``, ``unmask`` in
    order, each with the server's message of the previous stage; each returns the bytes to send to the server."""

    def __init__(self, client_id: int, config: SecAggConfig, random_bytes: RandomBytes = os_random_bytes):
        if client_id not in config.clients:
            raise ConfigError("client_id", client_id, f"one of the round's clients {list(config.clients)}")
        self.id, self.config, self._random_bytes = int(client_id), config, random_bytes
        self._name = party_name(self.id)
        self._stage = Stage.ADVERTISE_KEYS
        self._keys: dict[int, _PublicKeys] = {}  # U1
        self._held: dict[int, tuple[int, int]] = {}  # owner v in U2 -> (share of b_v, share of s_v^SK) at x = id + 1

    @property
    def stage(self) -> Stage:
        return self._stage

    def advertise_keys(self) -> bytes:
        """AdvertiseKeys: the message c_u^PK | s_u^PK."""
        self._enter(Stage.ADVERTISE_KEYS, "advertise_keys")
        self._encryption_key = private_key(self._random_bytes(KEY_BYTES))
        self._mask_key = private_key(self._random_bytes(KEY_BYTES))
        payload = public_bytes(self._encryption_key) + public_bytes(self._mask_key)
        return self._send(MessageType.ADVERTISE_KEYS, payload, Stage.SHARE_KEYS)

    def share_keys(self, key_list: bytes) -> bytes:
        """ShareKeys: checks the server's key list (U1) and returns the encrypted shares of b_u and s_u^SK."""
        self._enter(Stage.SHARE_KEYS, "share_keys")
        reader = self._read(key_list, MessageType.KEY_LIST)
        entries = reader.ids(reader.count(4 + 2 * KEY_BYTES), 2 * KEY_BYTES)
        reader.done()
        keys = {v: _PublicKeys(rest[:KEY_BYTES], rest[KEY_BYTES:]) for v, rest in entries}
        strangers = sorted(set(keys) - set(self.config.clients))
        if strangers:
            self._fail(f"the key list names clients {strangers}, who are not invited to this round")
        own = _PublicKeys(public_bytes(self._encryption_key), public_bytes(self._mask_key))
        if keys.get(self.id) != own:
            self._fail("the key list does not carry this client's own public keys")
        self._require_threshold(len(keys), "clients in the key list")
        all_keys = [k for pair in keys.values() for k in (pair.encryption, pair.mask)]
        if len(set(all_keys)) != len(all_keys):
            self._fail("the key list repeats a public key")
        self._keys = keys
        self._self_mask_seed = self._random_bytes(KEY_BYTES)
        xs = [v + 1 for v in keys]
        t = self.config.threshold
        seed_shares = shamir.split(int.from_bytes(self._self_mask_seed, "big"), t, xs, self._random_bytes)
        key_shares = shamir.split(int.from_bytes(private_bytes(self._mask_key), "big"), t, xs, self._random_bytes)
        self._held[self.id] = (seed_shares[self.id + 1], key_shares[self.id + 1])
        payload = [pack_count(len(keys) - 1)]
        for v in keys:
            if v == self.id:
                continue
            plaintext = _element(seed_shares[v + 1]) + _element(key_shares[v + 1])
            ciphertext = encrypt(self._pair_key(v, b"encrypt"), share_nonce(self.id), plaintext,
                                 share_context(self.config.round_id, self.id, v))
            payload.append(v.to_bytes(4, "big") + ciphertext)
        return self._send(MessageType.ENCRYPTED_SHARES, b"".join(payload), Stage.MASKED_INPUT)

    def masked_input(self, routed_shares: bytes, x: torch.Tensor | np.ndarray) -> bytes:
        """MaskedInputCollection: decrypts the shares the server routed (U2) and returns y_u for the input ``x``
        (integers in [0, 2^bits), length ``dimension``)."""
        self._enter(Stage.MASKED_INPUT, "masked_input")
        reader = self._read(routed_shares, MessageType.ROUTED_SHARES)
        entries = reader.ids(reader.count(4 + CIPHERTEXT_BYTES), CIPHERTEXT_BYTES)
        reader.done()
        for u, ciphertext in entries:
            if u == self.id or u not in self._keys:
                self._fail(f"routed shares claim to come from client {u}, "
                           f"{'this client' if u == self.id else 'who is not in the key list'}")
            try:
                plaintext = decrypt(self._pair_key(u, b"encrypt"), share_nonce(u), ciphertext,
                                    share_context(self.config.round_id, u, self.id))
            except InvalidTag:
                self._fail(f"the shares from client {u} fail authentication (altered, or encrypted for another "
                           "round or recipient)")
            seed_share, key_share = (int.from_bytes(plaintext[i:i + shamir.ELEMENT_BYTES], "big")
                                     for i in (0, shamir.ELEMENT_BYTES))
            if max(seed_share, key_share) >= shamir.PRIME:
                self._fail(f"the shares from client {u} are not field elements")
            self._held[u] = (seed_share, key_share)
        self._require_threshold(len(self._held), "clients that shared keys (U2)")
        values = self._input_vector(x)
        masked = values + prg(self._self_mask_seed, self.config.dimension, self.config.bits)
        for v in self._held:
            if v != self.id:
                pair_mask = prg(self._pair_key(v, b"mask"), self.config.dimension, self.config.bits)
                masked = masked + pair_mask if v > self.id else masked - pair_mask
        return self._send(MessageType.MASKED_INPUT, pack_vector(masked & self.config.modulus_mask), Stage.UNMASKING)

    def unmask(self, request: bytes) -> bytes:
        """Unmasking: for each v in U2 the share of b_v if v is in the server's list U3, else the share of s_v^SK."""
        self._enter(Stage.UNMASKING, "unmask")
        reader = self._read(request, MessageType.UNMASK_REQUEST)
        survivors = {v for v, _ in reader.ids(reader.count(4))}
        reader.done()
        unknown = sorted(survivors - set(self._held))
        if unknown:
            self._fail(f"the unmasking request names clients {unknown}, who did not share keys with this client")
        self._require_threshold(len(survivors), "clients with masked inputs (U3)")
        payload = [pack_count(len(self._held))]
        for v in sorted(self._held):
            kind = ShareKind.SELF_MASK_SEED if v in survivors else ShareKind.MASK_KEY
            payload.append(v.to_bytes(4, "big") + bytes([kind]) + _element(self._held[v][kind]))
        return self._send(MessageType.UNMASK_SHARES, b"".join(payload), Stage.DONE)

    def _pair_key(self, v: int, purpose: bytes) -> bytes:
        own, theirs = ((self._encryption_key, self._keys[v].encryption) if purpose == b"encrypt"
                       else (self._mask_key, self._keys[v].mask))
        return agree(own, theirs, purpose, self.config.round_id)

    def _input_vector(self, x) -> np.ndarray:
        allowed = f"integers in [0, 2^{self.config.bits}) of shape ({self.config.dimension},)"
        array = x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        if array.shape != (self.config.dimension,) or array.dtype.kind not in "iu":
            raise ConfigError("x", f"{array.dtype} array of shape {array.shape}", allowed)
        if array.size and (int(array.min()) < 0 or int(array.max()) > int(self.config.modulus_mask)):
            raise ConfigError("x", f"values in [{int(array.min())}, {int(array.max())}]", allowed)
        return array.astype(np.uint64)

    def _enter(self, stage: Stage, action: str) -> None:
        if self._stage != stage:
            self._fail(f"{action}() called at stage {self._stage.name}, expected at {stage.name} (called twice, "
                       "out of order, or after the round ended)")

    def _read(self, message: bytes, kind: MessageType) -> PayloadReader:
        _, payload = decode(message, self.config.round_id, self._name, kind)
        return PayloadReader(payload, self.config.round_id, self._name, f"{kind.name} from the server")

    def _send(self, kind: MessageType, payload: bytes, next_stage: Stage) -> bytes:
        self._stage = next_stage
        return encode(kind, self.config.round_id, self.id, payload)

    def _require_threshold(self, count: int, what: str) -> None:
        if count < self.config.threshold:
            self._fail(f"only {count} {what}, fewer than the threshold {self.config.threshold}: the round stops")

    def _fail(self, problem: str):
        self._stage = Stage.ABORTED
        raise SecAggError(self.config.round_id, self._name, problem)


class SecAggServer:
    """The server's side of one round. ``receive`` takes any client message of the current stage (raising
    ``SecAggError`` for a bad one, which leaves the server's state unchanged: treat its sender as dropped out); the
    stage methods ``key_list``, ``routed_shares``, ``unmask_request``, ``aggregate`` close a stage with what has
    arrived and return what to send on."""

    _EXPECTED = {Stage.ADVERTISE_KEYS: MessageType.ADVERTISE_KEYS, Stage.SHARE_KEYS: MessageType.ENCRYPTED_SHARES,
                 Stage.MASKED_INPUT: MessageType.MASKED_INPUT, Stage.UNMASKING: MessageType.UNMASK_SHARES}

    def __init__(self, config: SecAggConfig):
        self.config = config
        self._stage = Stage.ADVERTISE_KEYS
        self._eligible = set(config.clients)
        self._keys: dict[int, _PublicKeys] = {}  # U1
        self._ciphertexts: dict[int, dict[int, bytes]] = {}  # U2: sender -> recipient -> ciphertext
        self._masked: dict[int, np.ndarray] = {}  # U3
        self._shares: dict[int, dict[int, tuple[ShareKind, int]]] = {}  # responders: owner -> (kind, share)

    @property
    def stage(self) -> Stage:
        return self._stage

    @property
    def advertised(self) -> tuple[int, ...]:
        """U1: the clients whose public keys arrived."""
        return tuple(sorted(self._keys))

    @property
    def shared(self) -> tuple[int, ...]:
        """U2: the clients whose encrypted shares arrived."""
        return tuple(sorted(self._ciphertexts))

    @property
    def masked(self) -> tuple[int, ...]:
        """U3: the clients whose masked input arrived (the sum's contributors)."""
        return tuple(sorted(self._masked))

    def receive(self, message: bytes) -> int:
        """Validates and stores one client message of the current stage; returns its sender."""
        if self._stage not in self._EXPECTED:
            self._fail(f"a message arrived after the round {'ended' if self._stage == Stage.DONE else 'stopped'}")
        kind = self._EXPECTED[self._stage]
        header, payload = decode(message, self.config.round_id, "server", kind)
        sender = header.sender
        if sender not in self._eligible:
            self._refuse(f"{kind.name} from client {sender}, who is "
                         f"{'not invited to this round' if sender not in self.config.clients else 'not in the previous stage'}")
        if sender in self._store():
            self._refuse(f"replayed {kind.name} from client {sender}: it already sent one in this round")
        reader = PayloadReader(payload, self.config.round_id, "server", f"{kind.name} from client {sender}")
        {Stage.ADVERTISE_KEYS: self._receive_keys, Stage.SHARE_KEYS: self._receive_shares,
         Stage.MASKED_INPUT: self._receive_masked_input, Stage.UNMASKING: self._receive_unmask_shares,
         }[self._stage](sender, reader)
        return sender

    def key_list(self) -> bytes:
        """Ends AdvertiseKeys: the list of U1's public keys, for every client in U1."""
        self._close(Stage.ADVERTISE_KEYS, self._keys, "clients advertised keys")
        payload = [pack_count(len(self._keys))]
        payload += [v.to_bytes(4, "big") + k.encryption + k.mask for v, k in sorted(self._keys.items())]
        self._advance(self._keys, Stage.SHARE_KEYS)
        return encode(MessageType.KEY_LIST, self.config.round_id, SERVER, b"".join(payload))

    def routed_shares(self) -> dict[int, bytes]:
        """Ends ShareKeys: for each v in U2 the message with the ciphertexts addressed to v."""
        self._close(Stage.SHARE_KEYS, self._ciphertexts, "clients sent their shares")
        messages = {}
        for v in sorted(self._ciphertexts):
            entries = [u.to_bytes(4, "big") + c[v] for u, c in sorted(self._ciphertexts.items()) if u != v]
            payload = pack_count(len(entries)) + b"".join(entries)
            messages[v] = encode(MessageType.ROUTED_SHARES, self.config.round_id, SERVER, payload)
        self._advance(self._ciphertexts, Stage.MASKED_INPUT)
        return messages

    def unmask_request(self) -> bytes:
        """Ends MaskedInputCollection: the list U3, for every client in U3."""
        self._close(Stage.MASKED_INPUT, self._masked, "masked inputs arrived")
        payload = pack_count(len(self._masked)) + b"".join(v.to_bytes(4, "big") for v in sorted(self._masked))
        self._advance(self._masked, Stage.UNMASKING)
        return encode(MessageType.UNMASK_REQUEST, self.config.round_id, SERVER, payload)

    def aggregate(self) -> SecureSum:
        """Ends Unmasking: reconstructs the secrets from any t responders and returns the sum over U3."""
        self._close(Stage.UNMASKING, self._shares, "clients sent unmasking shares")
        holders = sorted(self._shares)[: self.config.threshold]
        coefficients = shamir.lagrange_at_zero([w + 1 for w in holders])
        d, bits = self.config.dimension, self.config.bits
        total = np.zeros(d, dtype=np.uint64)
        for y in self._masked.values():
            total += y
        for v in sorted(self._ciphertexts):
            secret = self._secret(v, holders, coefficients)
            if v in self._masked:
                total -= prg(secret, d, bits)
                continue
            mask_key = _private_key_matching(secret, self._keys[v].mask)
            if mask_key is None:
                self._fail(f"the shares of client {v}'s mask key do not reconstruct the public key it advertised "
                           "(a share was altered)")
            for u in self._masked:
                pair_mask = prg(agree(mask_key, self._keys[u].mask, b"mask", self.config.round_id), d, bits)
                total = total - pair_mask if v > u else total + pair_mask  # undo u's term for its pair with v
        self._stage = Stage.DONE
        values = (total & self.config.modulus_mask).view(np.int64)
        return SecureSum(torch.from_numpy(values.copy()), tuple(sorted(self._masked)))

    def _receive_keys(self, sender: int, reader: PayloadReader) -> None:
        keys = _PublicKeys(reader.take(KEY_BYTES), reader.take(KEY_BYTES))
        reader.done()
        seen = {k for pair in self._keys.values() for k in (pair.encryption, pair.mask)}
        if keys.encryption == keys.mask or {keys.encryption, keys.mask} & seen:
            self._refuse(f"client {sender} advertised a public key already in use in this round")
        self._keys[sender] = keys

    def _receive_shares(self, sender: int, reader: PayloadReader) -> None:
        entries = dict(reader.ids(reader.count(4 + CIPHERTEXT_BYTES), CIPHERTEXT_BYTES))
        reader.done()
        expected = set(self._keys) - {sender}
        if set(entries) != expected:
            reader.fail(f"ciphertexts for clients {sorted(entries)}, expected one for each of {sorted(expected)}")
        self._ciphertexts[sender] = entries

    def _receive_masked_input(self, sender: int, reader: PayloadReader) -> None:
        y = unpack_vector(reader)
        reader.done()
        if y.size != self.config.dimension:
            reader.fail(f"{y.size} values, expected {self.config.dimension}")
        if y.size and int(y.max()) > int(self.config.modulus_mask):
            reader.fail(f"value {int(y.max())} outside Z_(2^{self.config.bits})")
        self._masked[sender] = y

    def _receive_unmask_shares(self, sender: int, reader: PayloadReader) -> None:
        entries = reader.ids(reader.count(4 + 1 + shamir.ELEMENT_BYTES), 1 + shamir.ELEMENT_BYTES)
        reader.done()
        expected = {v: ShareKind.SELF_MASK_SEED if v in self._masked else ShareKind.MASK_KEY
                    for v in self._ciphertexts}
        shares = {}
        for v, rest in entries:
            if rest[0] != expected.get(v):
                reader.fail(f"a share of kind {rest[0]} for client {v}, expected "
                            f"{'none' if v not in expected else int(expected[v])}")
            shares[v] = (ShareKind(rest[0]), int.from_bytes(rest[1:], "big"))
            if shares[v][1] >= shamir.PRIME:
                reader.fail(f"the share for client {v} is not a field element")
        if set(shares) != set(expected):
            reader.fail(f"shares for clients {sorted(shares)}, expected {sorted(expected)}")
        self._shares[sender] = shares

    def _secret(self, owner: int, holders: list[int], coefficients: dict[int, int]) -> bytes:
        value = shamir.combine({w + 1: self._shares[w][owner][1] for w in holders}, coefficients)
        if value >= 2 ** (8 * KEY_BYTES):
            self._fail(f"the shares of client {owner}'s secret reconstruct no 32-byte value (a share was altered)")
        return value.to_bytes(KEY_BYTES, "big")

    def _store(self) -> dict:
        return {Stage.ADVERTISE_KEYS: self._keys, Stage.SHARE_KEYS: self._ciphertexts,
                Stage.MASKED_INPUT: self._masked, Stage.UNMASKING: self._shares}[self._stage]

    def _close(self, stage: Stage, arrived: dict, what: str) -> None:
        if self._stage != stage:
            self._fail(f"stage {stage.name} cannot end now: the round is at {self._stage.name}")
        if len(arrived) < self.config.threshold:
            n, t = len(self.config.clients), self.config.threshold
            self._fail(f"only {len(arrived)} {what} at {stage.name}, fewer than the threshold {t}: the round is "
                       f"abandoned without a sum (it tolerates at most n - t = {n - t} dropouts of its {n} clients)")

    def _advance(self, next_eligible: dict, next_stage: Stage) -> None:
        self._eligible = set(next_eligible)
        self._stage = next_stage

    def _refuse(self, problem: str):
        raise SecAggError(self.config.round_id, "server", problem)

    def _fail(self, problem: str):
        self._stage = Stage.ABORTED
        raise SecAggError(self.config.round_id, "server", problem)


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


def _element(value: int) -> bytes:
    return value.to_bytes(shamir.ELEMENT_BYTES, "big")


def _private_key_matching(secret: bytes, public: bytes):
    """The X25519 private key with these 32 bytes if its public key is ``public``, else None."""
    key = private_key(secret)
    return key if public_bytes(key) == public else None


__all__ = ["MAX_BITS", "Stage", "SecAggConfig", "SecureSum", "SecAggClient", "SecAggServer", "SecAggError",
           "simulate_round"]
