"""The server's side of one secure aggregation round (Bonawitz et al. 2017; ``dpfl.protocols.secagg``)."""

from __future__ import annotations

import numpy as np
import torch

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
    unpack_vector,
)
from dpfl.protocols.primitives import KEY_BYTES, agree, prg, private_key, public_bytes
from dpfl.protocols.session import PublicKeys, SecAggConfig, SecureSum, Stage


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
        self._keys: dict[int, PublicKeys] = {}  # U1
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
            why = "not invited to this round" if sender not in self.config.clients else "not in the previous stage"
            self._refuse(f"{kind.name} from client {sender}, who is {why}")
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
            mask_key = private_key_matching(secret, self._keys[v].mask)
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
        keys = PublicKeys(reader.take(KEY_BYTES), reader.take(KEY_BYTES))
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


def private_key_matching(secret: bytes, public: bytes):
    """The X25519 private key with these 32 bytes if its public key is ``public``, else None."""
    key = private_key(secret)
    return key if public_bytes(key) == public else None


__all__ = ["SecAggServer"]
