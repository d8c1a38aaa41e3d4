"""The server's side of one secure aggregation round (Bonawitz et al. 2017; ``dpfl.protocols.secagg``)."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import torch

from dpfl.errors import ConfigError
from dpfl.protocols import shamir
from dpfl.protocols.identity import Registry, VerifyingKey, ed25519_public, verifies
from dpfl.protocols.messages import (
    SERVER,
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
    share_statement,
    signed_parts,
    statement,
    unpack_vector,
)
from dpfl.protocols.primitives import KEY_BYTES, agree, prg, private_key, public_bytes
from dpfl.protocols.session import DealtShare, PublicKeys, SecAggConfig, SecureSum, Stage, seed_commitment

#: At most this many reconstructions from other subsets of the responders when one fails its check, looking for the
#: share that was altered (``SecAggServer.aggregate``).
LOCATE_TRIES = 256


class SecAggServer:
    """The server's side of one round. ``receive`` takes any client message of the current stage (raising
    ``SecAggError`` for a bad one, which leaves the server's state unchanged: treat its sender as dropped out); the
    stage methods ``key_list``, ``routed_shares``, ``consistency_request`` (active variant), ``unmask_request``,
    ``aggregate`` close a stage with what has arrived and return what to send on, to the clients ``eligible`` names
    (``next_messages`` closes whichever stage is current).

    Every client message must carry its sender's signature: by its registered key in ``peers`` (the active variant,
    ``config.active``), else by the round key the sender advertised in its first message, so that no client can send
    in another's name. Every secret the server reconstructs is checked (b_v against v's commitment, s_v^SK against
    v's advertised public key) before it enters the sum: a corrupted share stops the round, naming the client at
    fault where it can tell (``SecAggError.culprits``): in the active variant every share carries its dealer's
    signature, so a share that is off its dealer's polynomial but signed is its dealer's doing, an unsigned one its
    holder's; without signatures a share off the polynomial may be either's, and neither is named."""

    _EXPECTED = {Stage.ADVERTISE_KEYS: MessageType.ADVERTISE_KEYS, Stage.SHARE_KEYS: MessageType.ENCRYPTED_SHARES,
                 Stage.MASKED_INPUT: MessageType.MASKED_INPUT,
                 Stage.CONSISTENCY_CHECK: MessageType.CONSISTENCY_SIGNATURE, Stage.UNMASKING: MessageType.UNMASK_SHARES}

    def __init__(self, config: SecAggConfig, peers: Registry | None = None):
        if config.active and (peers is None or set(config.clients) - set(peers)):
            missing = sorted(set(config.clients) - set(peers or {}))
            raise ConfigError("peers", None if peers is None else f"keys of clients {sorted(peers)}",
                              f"the public key of every invited client in the actively secure variant (none for "
                              f"{missing})")
        self.config = config
        self._digest = config.digest
        self._stage = Stage.ADVERTISE_KEYS
        self._eligible = set(config.clients)
        self._verifying: dict[int, VerifyingKey] = dict(peers) if config.active else {}  # filled at AdvertiseKeys
        self._advertisements: dict[int, bytes] = {}  # U1: sender -> its message (to tell a replay from a forgery)
        self._keys: dict[int, PublicKeys] = {}  # U1
        self._key_signatures: dict[int, bytes] = {}  # U1: the AdvertiseKeys signatures (forwarded, active)
        self._commitments: dict[int, bytes] = {}  # U2: the commitments to b_v
        self._ciphertexts: dict[int, dict[int, bytes]] = {}  # U2: sender -> recipient -> ciphertext
        self._masked: dict[int, np.ndarray] = {}  # U3
        self._consistency: dict[int, bytes] = {}  # U4: the signatures of U3 (active)
        self._shares: dict[int, dict[int, tuple[ShareKind, DealtShare]]] = {}  # responders: owner -> (kind, share)

    @property
    def stage(self) -> Stage:
        return self._stage

    @property
    def eligible(self) -> tuple[int, ...]:
        """The clients whose message the current stage accepts: those the previous stage's message goes to."""
        return tuple(sorted(self._eligible))

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
        what = f"{kind.name} from client {sender}"
        signature, body = signed_parts(payload, self.config.round_id, "server", what)
        reader = PayloadReader(body, self.config.round_id, "server", what)
        key = self._verifying_key(sender, body, reader)
        if not verifies(key, signature, statement(self._digest, kind, sender, body)):
            self._refuse(f"{kind.name} in the name of client {sender} does not carry client {sender}'s signature: "
                         "another party sent it, or it was altered")
        if sender in self._store():
            if self._stage == Stage.ADVERTISE_KEYS and self._advertisements[sender] != message:
                self._fail(f"two different ADVERTISE_KEYS in the name of client {sender}: "
                           + (f"client {sender} signed both" if self.config.active else
                              "another party sends in its name, which without registered keys cannot be told from "
                              "the client"), (sender,) if self.config.active else ())
            self._refuse(f"replayed {kind.name} from client {sender}: it already sent one in this round")
        {Stage.ADVERTISE_KEYS: self._receive_keys, Stage.SHARE_KEYS: self._receive_shares,
         Stage.MASKED_INPUT: self._receive_masked_input, Stage.CONSISTENCY_CHECK: self._receive_consistency,
         Stage.UNMASKING: self._receive_unmask_shares}[self._stage](sender, reader, signature)
        if self._stage == Stage.ADVERTISE_KEYS:
            self._advertisements[sender] = bytes(message)
            self._verifying.setdefault(sender, key)
        return sender

    def next_messages(self) -> dict[int, bytes]:
        """Ends the current stage (before Unmasking, which ``aggregate`` ends): {client: its message of the next
        stage}, for every client the next stage accepts a message from (``eligible``)."""
        if self._stage == Stage.SHARE_KEYS:
            return self.routed_shares()
        end = {Stage.ADVERTISE_KEYS: self.key_list, Stage.CONSISTENCY_CHECK: self.unmask_request,
               Stage.MASKED_INPUT: self.consistency_request if self.config.active else self.unmask_request}
        if self._stage not in end:
            self._fail(f"no stage follows {self._stage.name}")
        message = end[self._stage]()
        return dict.fromkeys(self.eligible, message)

    def key_list(self) -> bytes:
        """Ends AdvertiseKeys: the list of U1's public keys (with their owners' signatures in the active variant),
        for every client in U1."""
        self._close(Stage.ADVERTISE_KEYS, self._keys, "clients advertised keys")
        payload = [pack_count(len(self._keys))]
        payload += [v.to_bytes(4, "big") + k.encryption + k.mask + pack_signature(self._key_signatures.get(v, b""))
                    for v, k in sorted(self._keys.items())]
        self._advance(self._keys, Stage.SHARE_KEYS)
        return encode(MessageType.KEY_LIST, self.config.round_id, SERVER, b"".join(payload))

    def routed_shares(self) -> dict[int, bytes]:
        """Ends ShareKeys: for each v in U2 the message with the ciphertexts addressed to v."""
        self._close(Stage.SHARE_KEYS, self._ciphertexts, "clients sent their shares")
        messages = {}
        for v in sorted(self._ciphertexts):
            entries = [u.to_bytes(4, "big") + pack_sized(c[v]) for u, c in sorted(self._ciphertexts.items()) if u != v]
            payload = pack_count(len(entries)) + b"".join(entries)
            messages[v] = encode(MessageType.ROUTED_SHARES, self.config.round_id, SERVER, payload)
        self._advance(self._ciphertexts, Stage.MASKED_INPUT)
        return messages

    def consistency_request(self) -> bytes:
        """Ends MaskedInputCollection in the active variant: the list U3, for every client in U3 to sign."""
        if not self.config.active:
            self._fail("the ConsistencyCheck round belongs to the actively secure variant; this round is set up "
                       "without it (call unmask_request)")
        self._close(Stage.MASKED_INPUT, self._masked, "masked inputs arrived")
        self._advance(self._masked, Stage.CONSISTENCY_CHECK)
        return encode(MessageType.CONSISTENCY_CHECK, self.config.round_id, SERVER, pack_ids(self._masked))

    def unmask_request(self) -> bytes:
        """Ends MaskedInputCollection (or, in the active variant, ConsistencyCheck): the list U3 (with the signatures
        of U3 by the clients U4 that signed it, active), for every client in U3 (U4)."""
        if self.config.active:
            self._close(Stage.CONSISTENCY_CHECK, self._consistency, "clients signed the survivor list")
            signed = self._consistency
        else:
            self._close(Stage.MASKED_INPUT, self._masked, "masked inputs arrived")
            signed = {}
        payload = pack_ids(self._masked) + pack_count(len(signed)) + b"".join(
            v.to_bytes(4, "big") + pack_signature(signature) for v, signature in sorted(signed.items()))
        self._advance(signed if self.config.active else self._masked, Stage.UNMASKING)
        return encode(MessageType.UNMASK_REQUEST, self.config.round_id, SERVER, payload)

    def aggregate(self) -> SecureSum:
        """Ends Unmasking: reconstructs the secrets from t responders, checks each, and returns the sum over U3."""
        self._close(Stage.UNMASKING, self._shares, "clients sent unmasking shares")
        holders = sorted(self._shares)[: self.config.threshold]
        coefficients = shamir.lagrange_at_zero([w + 1 for w in holders])
        d, bits = self.config.dimension, self.config.bits
        total = np.zeros(d, dtype=np.uint64)
        for y in self._masked.values():
            total += y
        for v in sorted(self._ciphertexts):
            if v in self._masked:
                seed = self._secret(v, holders, coefficients, self._seed_check(v), "commitment")
                total -= prg(seed, d, bits)
                continue
            secret = self._secret(v, holders, coefficients, self._key_check(v), "advertised public key")
            mask_key = private_key(secret)
            for u in self._masked:
                pair_mask = prg(agree(mask_key, self._keys[u].mask, b"mask", self.config.round_id), d, bits)
                total = total - pair_mask if v > u else total + pair_mask  # undo u's term for its pair with v
        self._stage = Stage.DONE
        values = (total & self.config.modulus_mask).view(np.int64)
        return SecureSum(torch.from_numpy(values.copy()), tuple(sorted(self._masked)))

    def _verifying_key(self, sender: int, body: bytes, reader: PayloadReader) -> VerifyingKey:
        """The key the sender's signature must verify under: its registered key (active), the round key its
        advertisement carries (AdvertiseKeys), or the one it advertised."""
        if self.config.active or self._stage != Stage.ADVERTISE_KEYS:
            return self._verifying[sender]
        if len(body) != 3 * KEY_BYTES:
            reader.fail(f"{len(body)} bytes of keys, expected {3 * KEY_BYTES}")
        try:
            return ed25519_public(body[2 * KEY_BYTES:])
        except ValueError:
            reader.fail("its round key is not an Ed25519 public key")

    def _receive_keys(self, sender: int, reader: PayloadReader, signature: bytes) -> None:
        keys = PublicKeys(reader.take(KEY_BYTES), reader.take(KEY_BYTES))
        if not self.config.active:
            reader.take(KEY_BYTES)  # a_u, already read by _verifying_key
        reader.done()
        seen = {k for pair in self._keys.values() for k in (pair.encryption, pair.mask)}
        if keys.encryption == keys.mask or {keys.encryption, keys.mask} & seen:
            self._refuse(f"client {sender} advertised a public key already in use in this round")
        self._keys[sender] = keys
        if self.config.active:
            self._key_signatures[sender] = signature

    def _receive_shares(self, sender: int, reader: PayloadReader, signature: bytes) -> None:
        commitment = reader.take(32)
        entries = dict(reader.ciphertexts(reader.count(4 + 2, exact=False)))
        reader.done()
        expected = set(self._keys) - {sender}
        if set(entries) != expected:
            reader.fail(f"ciphertexts for clients {sorted(entries)}, expected one for each of {sorted(expected)}")
        self._ciphertexts[sender] = entries
        self._commitments[sender] = commitment

    def _receive_masked_input(self, sender: int, reader: PayloadReader, signature: bytes) -> None:
        y = unpack_vector(reader)
        reader.done()
        if y.size != self.config.dimension:
            reader.fail(f"{y.size} values, expected {self.config.dimension}")
        if y.size and int(y.max()) > int(self.config.modulus_mask):
            reader.fail(f"value {int(y.max())} outside Z_(2^{self.config.bits})")
        self._masked[sender] = y

    def _receive_consistency(self, sender: int, reader: PayloadReader, signature: bytes) -> None:
        signed = {v for v, _ in reader.ids(reader.count(4))}
        reader.done()
        if signed != set(self._masked):
            reader.fail(f"a signature of the survivor list {sorted(signed)}, not of {sorted(self._masked)}")
        self._consistency[sender] = signature

    def _receive_unmask_shares(self, sender: int, reader: PayloadReader, signature: bytes) -> None:
        entries = reader.ids(reader.count(4 + 1 + shamir.ELEMENT_BYTES + 2, exact=False), 1 + shamir.ELEMENT_BYTES,
                             signed=True)
        reader.done()
        expected = {v: ShareKind.SELF_MASK_SEED if v in self._masked else ShareKind.MASK_KEY
                    for v in self._ciphertexts}
        shares = {}
        for v, rest, share_signature in entries:
            if rest[0] != expected.get(v):
                reader.fail(f"a share of kind {rest[0]} for client {v}, expected "
                            f"{'none' if v not in expected else int(expected[v])}")
            shares[v] = (ShareKind(rest[0]), DealtShare(int.from_bytes(rest[1:], "big"), share_signature))
            if shares[v][1].value >= shamir.PRIME:
                reader.fail(f"the share for client {v} is not a field element")
            if share_signature and not self.config.active:
                reader.fail(f"the share for client {v} carries a signature in a round set up without them")
        if set(shares) != set(expected):
            reader.fail(f"shares for clients {sorted(shares)}, expected {sorted(expected)}")
        self._shares[sender] = shares

    def _seed_check(self, owner: int) -> Callable[[bytes], bool]:
        return lambda seed: seed_commitment(self.config, owner, seed) == self._commitments[owner]

    def _key_check(self, owner: int) -> Callable[[bytes], bool]:
        return lambda secret: public_bytes(private_key(secret)) == self._keys[owner].mask

    def _secret(self, owner: int, holders: list[int], coefficients: dict[int, int], check: Callable[[bytes], bool],
                reference: str) -> bytes:
        """The owner's secret from the shares of ``holders``, if it passes ``check``; else the round stops, naming
        the clients at fault where the shares tell (``_blame``)."""
        shares = {w + 1: self._shares[w][owner][1].value for w in sorted(self._shares)}
        secret = _as_key(shamir.combine({w + 1: shares[w + 1] for w in holders}, coefficients))
        if secret is not None and check(secret):
            return secret
        kind = next(iter(self._shares.values()))[owner][0]
        self._blame(owner, f"the shares of client {owner}'s {kind.secret} from clients {holders} reconstruct a value "
                           f"that is not its {reference}", shares, check, reference)

    def _blame(self, owner: int, problem: str, shares: dict[int, int], check: Callable[[bytes], bool], reference: str):
        """Stops the round after a failed reconstruction of ``owner``'s secret from ``shares`` {x: share}, naming
        who is at fault where that can be told. In the active variant every responder forwarded the share with the
        signature its dealer, the owner, made for it (and that it checked on receipt): a responder whose share does
        not carry it altered the share; if every share does, the owner dealt them (its shares off one polynomial, or
        of another secret than its ``reference``), whoever else ``_locate`` points at. Without signatures, shares off
        the polynomial of t others (``_locate``) were altered by their holders or dealt so by the owner, which
        cannot be told apart: neither is named; only shares that all agree on a secret failing the check name the
        owner."""
        if self.config.active:
            altered = tuple(w for w in sorted(self._shares) if not self._dealt_by_owner(owner, w))
            if altered:
                self._fail(f"{problem}; the shares of clients {list(altered)} do not carry client {owner}'s signature "
                           f"of them: they altered the shares client {owner} dealt them", altered)
        off = self._locate(shares, check)
        if off == []:
            self._fail(f"{problem}; all {len(shares)} shares agree on that value: client {owner} shared another "
                       f"secret than its {reference} says", (owner,))
        suspects = [x - 1 for x in off or []]
        if self.config.active:
            located = f" (those it dealt to clients {suspects} are off the polynomial of t others)" if suspects else ""
            self._fail(f"{problem}; every share carries client {owner}'s signature: client {owner} dealt shares "
                       f"that do not lie on one polynomial of its secret{located}", (owner,))
        if suspects:
            self._fail(f"{problem}; the shares of clients {suspects} do not lie on the polynomial of t other shares "
                       f"that reconstruct it: they altered them, or client {owner} dealt them so, which without signed "
                       "shares (the honest-but-curious protocol) cannot be told apart: neither is named")
        self._fail(f"{problem} (a share was altered: with {len(shares)} responders for a threshold of "
                   f"{self.config.threshold} its sender cannot be located)")

    def _dealt_by_owner(self, owner: int, holder: int) -> bool:
        """Whether ``holder``'s share of ``owner``'s secret carries the owner's signature of it for ``holder``."""
        kind, share = self._shares[holder][owner]
        return verifies(self._verifying[owner], share.signature,
                        share_statement(self._digest, owner, holder, kind, share.value))

    def _locate(self, shares: dict[int, int], check: Callable[[bytes], bool]) -> list[int] | None:
        """The x-coordinates of the shares off a polynomial through t of ``shares`` whose secret passes ``check``
        (trying subsets that leave out 1, 2, ... responders, at most LOCATE_TRIES); [] if all shares lie on one
        polynomial (whose secret then failed the check); None if neither was found."""
        t, xs = self.config.threshold, sorted(shares)
        if len(xs) > t and all(shamir.interpolate({x: shares[x] for x in xs[:t]}, x) == shares[x] for x in xs[t:]):
            return []
        tried = {tuple(xs[:t])}
        for left_out in range(1, len(xs) - t + 1):
            for excluded in itertools.combinations(xs, left_out):
                subset = tuple(x for x in xs if x not in excluded)[:t]
                if subset in tried:
                    continue
                if len(tried) >= LOCATE_TRIES:
                    return None
                tried.add(subset)
                points = {x: shares[x] for x in subset}
                secret = _as_key(shamir.interpolate(points, 0))
                if secret is not None and check(secret):
                    return [x for x in xs if shamir.interpolate(points, x) != shares[x]]
        return None

    def _store(self) -> dict:
        return {Stage.ADVERTISE_KEYS: self._keys, Stage.SHARE_KEYS: self._ciphertexts,
                Stage.MASKED_INPUT: self._masked, Stage.CONSISTENCY_CHECK: self._consistency,
                Stage.UNMASKING: self._shares}[self._stage]

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

    def _fail(self, problem: str, culprits: tuple[int, ...] = ()):
        self._stage = Stage.ABORTED
        raise SecAggError(self.config.round_id, "server", problem, culprits)


def _as_key(value: int) -> bytes | None:
    """A reconstructed field element as the 32-byte secret it should be (None if it is larger)."""
    return value.to_bytes(KEY_BYTES, "big") if value < 2 ** (8 * KEY_BYTES) else None


__all__ = ["SecAggServer", "LOCATE_TRIES"]
