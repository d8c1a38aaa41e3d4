"""The client's side of one secure aggregation round (Bonawitz et al. 2017; ``dpfl.protocols.secagg``)."""

from __future__ import annotations

import numpy as np
import torch
from cryptography.exceptions import InvalidTag

from dpfl.errors import ConfigError
from dpfl.protocols import shamir
from dpfl.protocols.identity import Registry, SigningKey, ed25519_key, raw_public, same_key, sign, verifies
from dpfl.protocols.messages import (
    MessageType,
    PayloadReader,
    SecAggError,
    ShareKind,
    decode,
    encode,
    pack_count,
    pack_ids,
    pack_signature,
    pack_sized,
    pack_vector,
    party_name,
    share_context,
    share_nonce,
    share_statement,
    statement,
)
from dpfl.protocols.primitives import (
    KEY_BYTES,
    RandomBytes,
    agree,
    decrypt,
    encrypt,
    os_random_bytes,
    prg,
    private_bytes,
    private_key,
    public_bytes,
)
from dpfl.protocols.session import DealtShare, PublicKeys, SecAggConfig, Stage, element_bytes, seed_commitment


class SecAggClient:
    """One client's side of one round: call ``advertise_keys``, ``share_keys``, ``masked_input``, (in the actively
    secure variant) ``consistency_check``, and ``unmask`` in order, each with the server's message of the previous
    stage; each returns the bytes to send to the server.

    ``identity`` is the client's long-term signing key and ``peers`` the registry of the cohort's public keys
    (``dpfl.protocols.identity``): both are needed in a round of the actively secure variant (``config.active``),
    and a client that holds an identity refuses a round set up without it (a server cannot downgrade it)."""

    def __init__(self, client_id: int, config: SecAggConfig, random_bytes: RandomBytes = os_random_bytes,
                 identity: SigningKey | None = None, peers: Registry | None = None):
        if client_id not in config.clients:
            raise ConfigError("client_id", client_id, f"one of the round's clients {list(config.clients)}")
        self.id, self.config, self._random_bytes = int(client_id), config, random_bytes
        self._name = party_name(self.id)
        self._stage = Stage.ADVERTISE_KEYS
        self._digest = config.digest
        self._keys: dict[int, PublicKeys] = {}  # U1
        self._held: dict[int, tuple[DealtShare, DealtShare]] = {}  # v in U2 -> its shares at x = id + 1, by ShareKind
        self._encryption_keys: dict[int, bytes] = {}  # v -> c_uv, agreed in ShareKeys, used again to decrypt
        self._signed_survivors: bytes | None = None  # U3 as this client signed it (ConsistencyCheck)
        self._signing_key, self._peers = identity, peers
        if config.active:
            if identity is None or peers is None:
                raise ConfigError("identity", identity, "this client's signing key and the registry of the cohort's "
                                                        "public keys (peers) in a round of the actively secure variant")
            unknown = sorted(set(config.clients) - set(peers))
            if unknown:
                self._fail(f"the registry holds no public key of the invited clients {unknown}: their signatures "
                           "could not be checked")
            if not same_key(peers[self.id], identity.public_key()):
                self._fail("this client's signing key is not the one the registry holds for it")
        elif identity is not None:
            self._fail("the round is set up without signatures (the honest-but-curious protocol), but this client has "
                       "a signing key: it takes part in the actively secure variant only, which a server cannot "
                       "turn off")

    @property
    def stage(self) -> Stage:
        return self._stage

    def advertise_keys(self) -> bytes:
        """AdvertiseKeys: the message c_u^PK | s_u^PK, signed with the client's identity; without one (the
        honest-but-curious protocol) with a fresh Ed25519 key of the round, a_u, whose public part it appends."""
        self._enter(Stage.ADVERTISE_KEYS, "advertise_keys")
        self._encryption_key = private_key(self._random_bytes(KEY_BYTES))
        self._mask_key = private_key(self._random_bytes(KEY_BYTES))
        payload = public_bytes(self._encryption_key) + public_bytes(self._mask_key)
        if not self.config.active:
            self._signing_key = ed25519_key(self._random_bytes(KEY_BYTES))
            payload += raw_public(self._signing_key)
        return self._send(MessageType.ADVERTISE_KEYS, payload, Stage.SHARE_KEYS)

    def share_keys(self, key_list: bytes) -> bytes:
        """ShareKeys: checks the server's key list (U1: in the active variant, every entry's signature by its owner's
        registered key) and returns the commitment to b_u and the encrypted shares of b_u and s_u^SK (each signed for
        its recipient in the active variant: ``_deal``)."""
        self._enter(Stage.SHARE_KEYS, "share_keys")
        reader = self._read(key_list, MessageType.KEY_LIST)
        entries = reader.ids(reader.count(4 + 2 * KEY_BYTES + 2, exact=False), 2 * KEY_BYTES, signed=True)
        reader.done()
        keys = {v: PublicKeys(rest[:KEY_BYTES], rest[KEY_BYTES:]) for v, rest, _ in entries}
        strangers = sorted(set(keys) - set(self.config.clients))
        if strangers:
            self._fail(f"the key list names clients {strangers}, who are not invited to this round")
        own = PublicKeys(public_bytes(self._encryption_key), public_bytes(self._mask_key))
        if keys.get(self.id) != own:
            self._fail("the key list does not carry this client's own public keys")
        self._require_threshold(len(keys), "clients in the key list")
        all_keys = [k for pair in keys.values() for k in (pair.encryption, pair.mask)]
        if len(set(all_keys)) != len(all_keys):
            self._fail("the key list repeats a public key")
        if self.config.active:
            forged = [v for v, rest, signature in entries if v != self.id and not verifies(
                self._peers[v], signature, statement(self._digest, MessageType.ADVERTISE_KEYS, v, rest))]
            if forged:
                self._fail(f"the key list's keys of clients {forged} are not signed by their registered keys for "
                           "this round: the server substituted them (or set the round up differently for them)")
        elif any(signature for _, _, signature in entries):
            self._fail("the key list carries signatures in a round set up without them")
        self._keys = keys
        self._self_mask_seed = self._random_bytes(KEY_BYTES)
        xs = [v + 1 for v in keys]
        t = self.config.threshold
        shares = {ShareKind.SELF_MASK_SEED: shamir.split(int.from_bytes(self._self_mask_seed, "big"), t, xs,
                                                         self._random_bytes),
                  ShareKind.MASK_KEY: shamir.split(int.from_bytes(private_bytes(self._mask_key), "big"), t, xs,
                                                   self._random_bytes)}
        payload = [seed_commitment(self.config, self.id, self._self_mask_seed), pack_count(len(keys) - 1)]
        for v in keys:
            dealt = tuple(self._deal(v, kind, shares[kind][v + 1]) for kind in ShareKind)
            if v == self.id:
                self._held[v] = dealt
                continue
            plaintext = b"".join(element_bytes(share.value) + pack_signature(share.signature) for share in dealt)
            ciphertext = encrypt(self._encryption_pair_key(v), share_nonce(self.id), plaintext,
                                 share_context(self.config.round_id, self.id, v))
            payload.append(v.to_bytes(4, "big") + pack_sized(ciphertext))
        return self._send(MessageType.ENCRYPTED_SHARES, b"".join(payload), Stage.MASKED_INPUT)

    def masked_input(self, routed_shares: bytes, x: torch.Tensor | np.ndarray) -> bytes:
        """MaskedInputCollection: decrypts the shares the server routed (U2), checks them (in the active variant, each
        dealer's signature: ``_opened``) and returns y_u for the input ``x`` (integers in [0, 2^bits), length
        ``dimension``)."""
        self._enter(Stage.MASKED_INPUT, "masked_input")
        reader = self._read(routed_shares, MessageType.ROUTED_SHARES)
        entries = reader.ciphertexts(reader.count(4 + 2, exact=False))
        reader.done()
        for u, ciphertext in entries:
            if u == self.id or u not in self._keys:
                self._fail(f"routed shares claim to come from client {u}, "
                           f"{'this client' if u == self.id else 'who is not in the key list'}")
            try:
                plaintext = decrypt(self._encryption_pair_key(u), share_nonce(u), ciphertext,
                                    share_context(self.config.round_id, u, self.id))
            except InvalidTag:
                self._fail(f"the shares from client {u} fail authentication (altered, or encrypted for another "
                           "round or recipient)")
            self._held[u] = self._opened(u, plaintext)
        self._require_threshold(len(self._held), "clients that shared keys (U2)")
        values = self._input_vector(x)
        masked = values + prg(self._self_mask_seed, self.config.dimension, self.config.bits)
        for v in self._held:
            if v != self.id:
                pair_mask = prg(self._mask_seed(v), self.config.dimension, self.config.bits)
                masked = masked + pair_mask if v > self.id else masked - pair_mask
        following = Stage.CONSISTENCY_CHECK if self.config.active else Stage.UNMASKING
        return self._send(MessageType.MASKED_INPUT, pack_vector(masked & self.config.modulus_mask), following)

    def consistency_check(self, request: bytes) -> bytes:
        """ConsistencyCheck (the active variant): checks the server's survivor list U3 and returns this client's
        signature of it, which every client checks before it unmasks anything (so the server cannot show different
        clients different survivor sets)."""
        self._enter(Stage.CONSISTENCY_CHECK, "consistency_check")
        reader = self._read(request, MessageType.CONSISTENCY_CHECK)
        survivors = self._survivors(reader, exact=True)
        reader.done()
        self._signed_survivors = pack_ids(survivors)
        return self._send(MessageType.CONSISTENCY_SIGNATURE, self._signed_survivors, Stage.UNMASKING)

    def unmask(self, request: bytes) -> bytes:
        """Unmasking: for each v in U2 the share of b_v if v is in the server's list U3, else the share of s_v^SK;
        in the active variant only after checking that at least t clients signed the U3 this client signed."""
        self._enter(Stage.UNMASKING, "unmask")
        reader = self._read(request, MessageType.UNMASK_REQUEST)
        survivors = self._survivors(reader, exact=False)
        signatures = reader.ids(reader.count(4 + 2, exact=False), signed=True)
        reader.done()
        if self.config.active:
            self._check_consistency(survivors, {v: signature for v, _, signature in signatures})
        elif signatures:
            self._fail("the unmasking request carries consistency signatures in a round set up without them")
        payload = [pack_count(len(self._held))]
        for v in sorted(self._held):
            kind = ShareKind.SELF_MASK_SEED if v in survivors else ShareKind.MASK_KEY
            share = self._held[v][kind]  # forwarded with its dealer's signature (active), which the server checks
            payload.append(v.to_bytes(4, "big") + bytes([kind]) + element_bytes(share.value)
                           + pack_signature(share.signature))
        return self._send(MessageType.UNMASK_SHARES, b"".join(payload), Stage.DONE)

    def _survivors(self, reader: PayloadReader, exact: bool) -> set[int]:
        """The server's list U3 (the clients whose masked input arrived), checked: only clients that shared keys
        with this one, this one among them, at least t."""
        survivors = {v for v, _ in reader.ids(reader.count(4, exact=exact))}
        unknown = sorted(survivors - set(self._held))
        if unknown:
            self._fail(f"the survivor list names clients {unknown}, who did not share keys with this client")
        if self.id not in survivors:
            self._fail("the survivor list leaves out this client, which sent its masked input")
        self._require_threshold(len(survivors), "clients with masked inputs (U3)")
        return survivors

    def _check_consistency(self, survivors: set[int], signatures: dict[int, bytes]) -> None:
        """U3 is the list this client signed, and at least t clients of it (U4) signed the same list."""
        if pack_ids(survivors) != self._signed_survivors:
            self._fail("the unmasking request's survivor list is not the one this client signed")
        strangers = sorted(set(signatures) - survivors)
        if strangers:
            self._fail(f"consistency signatures from clients {strangers}, who are not in the survivor list")
        self._require_threshold(len(signatures), "consistency signatures (U4)")
        forged = [v for v, signature in sorted(signatures.items()) if not verifies(
            self._peers[v], signature, statement(self._digest, MessageType.CONSISTENCY_SIGNATURE, v,
                                                 self._signed_survivors))]
        if forged:
            self._fail(f"the consistency signatures of clients {forged} are not their signatures of this survivor "
                       "list: the server showed clients different survivor sets (or altered the signatures)")

    def _deal(self, recipient: int, kind: ShareKind, value: int) -> DealtShare:
        """The share ``value`` of this client's secret ``kind`` for ``recipient``, with, in the active variant, this
        client's signature of it for that recipient in this round (``messages.share_statement``)."""
        if not self.config.active:
            return DealtShare(value, b"")
        return DealtShare(value, sign(self._signing_key, share_statement(self._digest, self.id, recipient, kind,
                                                                         value)))

    def _opened(self, dealer: int, plaintext: bytes) -> tuple[DealtShare, DealtShare]:
        """The two shares ``dealer`` dealt this client (the decrypted ``plaintext``), checked: field elements, and in
        the active variant each with the dealer's signature of it for this client. A bad one names the dealer
        (``SecAggError.culprits``) in the active variant, where only the dealer and this client hold the key the
        plaintext was encrypted under (its public half signed by the dealer's registered key); without signatures
        the server could have substituted that key, and no one is named."""
        culprits = (dealer,) if self.config.active else ()
        reader = PayloadReader(plaintext, self.config.round_id, self._name, f"shares from client {dealer}")
        try:
            dealt = tuple(DealtShare(int.from_bytes(reader.take(shamir.ELEMENT_BYTES), "big"), reader.signature())
                          for _ in ShareKind)
            reader.done()
        except SecAggError as err:
            self._fail(err.problem, culprits)
        for kind, share in zip(ShareKind, dealt):
            what = f"the share of client {dealer}'s {kind.secret}"
            if share.value >= shamir.PRIME:
                self._fail(f"{what} is not a field element", culprits)
            if not self.config.active and share.signature:
                self._fail(f"{what} carries a signature in a round set up without them")
            if self.config.active and not verifies(self._peers[dealer], share.signature, share_statement(
                    self._digest, dealer, self.id, kind, share.value)):
                self._fail(f"{what} does not carry client {dealer}'s signature of it for this client: client {dealer} "
                           "dealt it so (only it and this client hold the ciphertext's key), and this client refuses "
                           "it", culprits)
        return dealt

    def _encryption_pair_key(self, v: int) -> bytes:
        """c_uv (computed once: ShareKeys encrypts and MaskedInputCollection decrypts with it)."""
        if v not in self._encryption_keys:
            self._encryption_keys[v] = agree(self._encryption_key, self._keys[v].encryption, b"encrypt",
                                             self.config.round_id)
        return self._encryption_keys[v]

    def _mask_seed(self, v: int) -> bytes:
        """s_uv, the seed of the pair mask of u and v."""
        return agree(self._mask_key, self._keys[v].mask, b"mask", self.config.round_id)

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

    def _send(self, kind: MessageType, body: bytes, next_stage: Stage) -> bytes:
        """The message: this client's signature of the body, then the body (``dpfl.protocols.messages``)."""
        signature = sign(self._signing_key, statement(self._digest, kind, self.id, body))
        self._stage = next_stage
        return encode(kind, self.config.round_id, self.id, pack_signature(signature) + body)

    def _require_threshold(self, count: int, what: str) -> None:
        if count < self.config.threshold:
            self._fail(f"only {count} {what}, fewer than the threshold {self.config.threshold}: the round stops")

    def _fail(self, problem: str, culprits: tuple[int, ...] = ()):
        self._stage = Stage.ABORTED
        raise SecAggError(self.config.round_id, self._name, problem, culprits)


__all__ = ["SecAggClient"]
