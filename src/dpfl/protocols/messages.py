"""The wire format of secure aggregation (version 3): every message is plain bytes, a fixed header then a payload.

Header (22 bytes, big-endian)::

    magic  b"DPSA"  4 bytes
    version         1 byte    (VERSION = 3)
    type            1 byte    (MessageType)
    round id        8 bytes   (unsigned)
    sender          4 bytes   (client id in [0, 2^32 - 2]; SERVER = 2^32 - 1)
    payload length  4 bytes

Every client message is signed: its payload is ``signature`` (2-byte length, then the signature) followed by its
body, and the signature is the sender's signature of ``statement(round digest, type, sender, body)``
(``dpfl.protocols.identity``). The key is the sender's registered long-term key in the actively secure variant, and
in the honest-but-curious one the key of the round the sender advertised in its first message (which authenticates
its later messages to the server: no other party can send in its name once it has advertised).

Bodies (ids are 4-byte unsigned, counts 4-byte unsigned, a signature or a ciphertext is its 2-byte length then its
bytes):

======================  ======  ===================================================================================
type                    from    body
======================  ======  ===================================================================================
ADVERTISE_KEYS          client  c_u^PK (32) | s_u^PK (32) [| a_u^PK (32): its round's Ed25519 key, not active]
KEY_LIST                server  count | count x (id | c^PK (32) | s^PK (32) | signature), ids increasing; the
                                signature is the owner's ADVERTISE_KEYS signature (active), empty otherwise
ENCRYPTED_SHARES        client  commitment to b_u (32) | count | count x (recipient id | ciphertext)
ROUTED_SHARES           server  count | count x (sender id | ciphertext), ids increasing
MASKED_INPUT            client  count | count x little-endian uint64 (y_u mod 2^bits)
CONSISTENCY_CHECK       server  count | count x id (U3), increasing (active only)
CONSISTENCY_SIGNATURE   client  the same list U3: its signature is u's signature of U3 (active only)
UNMASK_REQUEST          server  count | count x id (U3) | count | count x (id | signature): the consistency
                                signatures of U4 (active), none otherwise
UNMASK_SHARES           client  count | count x (owner id | kind (0: b, 1: s^SK) | share (66, big-endian) |
                                signature): the share's signature by its owner, who dealt it (active), empty
                                otherwise
======================  ======  ===================================================================================

A ciphertext from u to v is AES-GCM under c_uv with nonce (u as 12 bytes) and associated data
``share_context(round, u, v)``; its plaintext is u's two Shamir shares at x = v + 1, of b_u and of s_u^SK, each
66 bytes followed by a signature: in the actively secure variant u's signature of ``share_statement(round digest,
u, v, kind, share)``, empty otherwise. A dealt share is thus signed by its dealer for one recipient, one secret and
one round: v checks the signature when it decrypts the share and forwards it with the share at Unmasking, so that a
server whose reconstruction fails can tell a share its dealer dealt wrong (validly signed) from one its holder
altered (not). The signature is inside the encryption: only the share's recipient, and at Unmasking the server
(which then holds the share), ever sees it. ``decode`` checks the header against what the receiver expects (round,
type, sender) and the payload's layout, and raises ``SecAggError`` naming the round, the party and what was wrong.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

import numpy as np

from dpfl.errors import DpflError
from dpfl.protocols.primitives import TAG_BYTES
from dpfl.protocols.shamir import ELEMENT_BYTES

MAGIC = b"DPSA"
VERSION = 3
#: The sender id of the server.
SERVER = 2**32 - 1

_HEADER = struct.Struct(">4sBBQII")
_COUNT = struct.Struct(">I")


#: What every signed statement starts with (``statement``).
STATEMENT_TAG = b"DPSA/signed"
#: The largest signature a message may carry (an ECDSA P-521 signature in DER is at most 139 bytes).
MAX_SIGNATURE_BYTES = 256
#: The largest ciphertext of a pair of dealt shares: two shares, each with its signature, and the AES-GCM tag.
MAX_CIPHERTEXT_BYTES = 2 * (ELEMENT_BYTES + 2 + MAX_SIGNATURE_BYTES) + TAG_BYTES
#: The type byte of a dealt share's statement (``share_statement``): no message's (``MessageType`` starts at 1).
SHARE_STATEMENT = 0


class SecAggError(DpflError):
    """A secure aggregation round refused a message or could not go on: says which round, which party, what, and the
    clients it found at fault (``culprits``) where it could tell."""

    def __init__(self, round_id: int, party: str, problem: str, culprits: tuple[int, ...] = ()):
        self.round_id, self.party, self.problem, self.culprits = round_id, party, problem, tuple(culprits)
        super().__init__(f"secure aggregation round {round_id}, {party}: {problem}")


class MessageType(enum.IntEnum):
    ADVERTISE_KEYS = 1
    KEY_LIST = 2
    ENCRYPTED_SHARES = 3
    ROUTED_SHARES = 4
    MASKED_INPUT = 5
    UNMASK_REQUEST = 6
    UNMASK_SHARES = 7
    CONSISTENCY_CHECK = 8
    CONSISTENCY_SIGNATURE = 9


class ShareKind(enum.IntEnum):
    """Which secret of its owner a share in UNMASK_SHARES belongs to."""

    SELF_MASK_SEED = 0  # b_u: the owner's masked input arrived
    MASK_KEY = 1  # s_u^SK: the owner dropped out after sharing its keys

    @property
    def secret(self) -> str:
        return "self-mask seed" if self == ShareKind.SELF_MASK_SEED else "mask key"


@dataclass(frozen=True)
class Header:
    version: int
    type: MessageType
    round_id: int
    sender: int
    length: int


def party_name(party_id: int) -> str:
    return "server" if party_id == SERVER else f"client {party_id}"


def encode(kind: MessageType, round_id: int, sender: int, payload: bytes) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, int(kind), round_id, sender, len(payload)) + payload


def read_header(message: bytes, round_id: int, receiver: str) -> Header:
    """The header of ``message``, checked for magic, version, type and length (not yet for round or sender)."""
    if not isinstance(message, (bytes, bytearray)):
        raise SecAggError(round_id, receiver, f"received a {type(message).__name__}, expected bytes")
    if len(message) < _HEADER.size:
        raise SecAggError(round_id, receiver, f"malformed message: {len(message)} bytes, shorter than the "
                                              f"{_HEADER.size}-byte header")
    magic, version, kind, message_round, sender, length = _HEADER.unpack_from(message)
    origin = f"malformed message from {party_name(sender)}"
    if magic != MAGIC:
        raise SecAggError(round_id, receiver, f"malformed message: magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise SecAggError(round_id, receiver, f"{origin}: protocol version {version}, this party speaks {VERSION}")
    if kind not in MessageType._value2member_map_:
        raise SecAggError(round_id, receiver, f"{origin}: unknown message type {kind}")
    if length != len(message) - _HEADER.size:
        raise SecAggError(round_id, receiver, f"{origin}: header says {length} payload bytes, "
                                              f"{len(message) - _HEADER.size} arrived")
    return Header(version, MessageType(kind), message_round, sender, length)


def decode(message: bytes, round_id: int, receiver: str, expected: MessageType) -> tuple[Header, bytes]:
    """(header, payload) of a message that must be of type ``expected`` and belong to round ``round_id``."""
    header = read_header(message, round_id, receiver)
    origin = party_name(header.sender)
    if header.round_id != round_id:
        raise SecAggError(round_id, receiver, f"out-of-round message from {origin}: it belongs to round "
                                              f"{header.round_id}")
    if header.type != expected:
        raise SecAggError(round_id, receiver, f"out-of-order message from {origin}: {header.type.name} while "
                                              f"waiting for {expected.name}")
    if (header.sender == SERVER) != (expected in _FROM_SERVER):
        raise SecAggError(round_id, receiver, f"{expected.name} from {origin}: only "
                                              f"{'the server' if expected in _FROM_SERVER else 'a client'} sends it")
    return header, bytes(message[_HEADER.size:])


_FROM_SERVER = {MessageType.KEY_LIST, MessageType.ROUTED_SHARES, MessageType.UNMASK_REQUEST,
                MessageType.CONSISTENCY_CHECK}


class PayloadReader:
    """Reads a payload's fields in order; any shortfall or leftover is a ``SecAggError`` naming the message."""

    def __init__(self, payload: bytes, round_id: int, receiver: str, what: str):
        self.payload, self.offset = payload, 0
        self.round_id, self.receiver, self.what = round_id, receiver, what

    def fail(self, problem: str):
        raise SecAggError(self.round_id, self.receiver, f"malformed {self.what}: {problem}")

    def take(self, n: int) -> bytes:
        if self.offset + n > len(self.payload):
            self.fail(f"truncated at byte {self.offset} of {len(self.payload)} (needed {n} more)")
        chunk = self.payload[self.offset:self.offset + n]
        self.offset += n
        return chunk

    def uint32(self) -> int:
        return _COUNT.unpack(self.take(4))[0]

    def count(self, item_bytes: int, exact: bool = True) -> int:
        """A count, checked against the bytes left (so a forged count cannot make the reader allocate): exactly
        ``item_bytes`` per item to the end, or (``exact`` False, items of varying size) at least that many."""
        n = self.uint32()
        left = len(self.payload) - self.offset
        if (n * item_bytes != left) if exact else (n * item_bytes > left):
            self.fail(f"count {n} of {item_bytes}-byte items, but {left} bytes follow")
        return n

    def sized(self, limit: int, what: str) -> bytes:
        """A field of varying size: its 2-byte length (at most ``limit``), then its bytes."""
        n = int.from_bytes(self.take(2), "big")
        if n > limit:
            self.fail(f"a {what} of {n} bytes (at most {limit})")
        return self.take(n)

    def signature(self) -> bytes:
        return self.sized(MAX_SIGNATURE_BYTES, "signature")

    def ids(self, n: int, item_rest: int = 0, signed: bool = False) -> list[tuple[int, bytes]]:
        """n items (id, rest) with ids strictly increasing (no repeats); ``signed``: each item ends with a signature,
        returned as a third element."""
        return self._increasing([(self.uint32(), self.take(item_rest), *([self.signature()] if signed else []))
                                 for _ in range(n)])

    def ciphertexts(self, n: int) -> list[tuple[int, bytes]]:
        """n items (id, ciphertext of dealt shares) with ids strictly increasing."""
        return self._increasing([(self.uint32(), self.sized(MAX_CIPHERTEXT_BYTES, "ciphertext")) for _ in range(n)])

    def _increasing(self, items: list[tuple]) -> list[tuple]:
        ids = [item[0] for item in items]
        if any(a >= b for a, b in zip(ids, ids[1:])):
            self.fail(f"ids {ids} are not strictly increasing (a repeated or unsorted entry)")
        return items

    def done(self) -> None:
        if self.offset != len(self.payload):
            self.fail(f"{len(self.payload) - self.offset} bytes left over")


def signed_parts(payload: bytes, round_id: int, receiver: str, what: str) -> tuple[bytes, bytes]:
    """(signature, body) of a client message's payload."""
    reader = PayloadReader(payload, round_id, receiver, what)
    return reader.signature(), payload[reader.offset:]


def pack_count(n: int) -> bytes:
    return _COUNT.pack(n)


def pack_sized(field: bytes) -> bytes:
    """A field of varying size (a signature, a ciphertext): its 2-byte length, then its bytes."""
    return len(field).to_bytes(2, "big") + field


def pack_signature(signature: bytes) -> bytes:
    return pack_sized(signature)


def pack_ids(ids) -> bytes:
    """count | ids, increasing."""
    ids = sorted(ids)
    return pack_count(len(ids)) + b"".join(v.to_bytes(4, "big") for v in ids)


def statement(digest: bytes, kind: int, sender: int, body: bytes) -> bytes:
    """What a client signs when it sends ``body`` as a message of type ``kind``: the tag, the version, the type, the
    sender and the round's ``SecAggConfig.digest`` (which names the round, its cohort, threshold and session), then
    the body. A signature is therefore valid for one message of one party in one round set up one way."""
    return STATEMENT_TAG + struct.pack(">BBI", VERSION, int(kind), sender) + digest + body


def share_statement(digest: bytes, dealer: int, recipient: int, kind: ShareKind, share: int) -> bytes:
    """What a dealer signs when it deals ``share`` (of its secret ``kind``) to ``recipient`` in the round of
    ``digest`` (the actively secure variant): a ``statement`` of the type SHARE_STATEMENT, which no message has, so a
    share's signature is never one of a message, nor one of another share, secret, recipient or round."""
    body = struct.pack(">IB", recipient, int(kind)) + share.to_bytes(ELEMENT_BYTES, "big")
    return statement(digest, SHARE_STATEMENT, dealer, body)


def pack_vector(values: np.ndarray) -> bytes:
    return pack_count(values.size) + values.astype("<u8").tobytes()


def unpack_vector(reader: PayloadReader) -> np.ndarray:
    n = reader.count(8)
    return np.frombuffer(reader.take(8 * n), dtype="<u8").astype(np.uint64)


def share_context(round_id: int, sender: int, recipient: int) -> bytes:
    """The associated data of the ciphertext of shares from ``sender`` to ``recipient``: binds it to both and the
    round, so that a ciphertext replayed from another round or pair fails authentication."""
    return MAGIC + struct.pack(">BQII", VERSION, round_id, sender, recipient)


def share_nonce(sender: int) -> bytes:
    """The AES-GCM nonce of ``sender``'s ciphertext under c_uv: unique, as the key serves one pair in one round and
    each of the two sends one ciphertext under it."""
    return struct.pack(">4xQ", sender)


__all__ = ["MAGIC", "VERSION", "SERVER", "STATEMENT_TAG", "MAX_SIGNATURE_BYTES", "MAX_CIPHERTEXT_BYTES",
           "SHARE_STATEMENT", "SecAggError", "MessageType", "ShareKind", "Header", "party_name", "encode",
           "read_header", "decode", "PayloadReader", "signed_parts", "pack_count", "pack_sized", "pack_signature",
           "pack_ids", "statement", "share_statement", "pack_vector", "unpack_vector", "share_context", "share_nonce"]
