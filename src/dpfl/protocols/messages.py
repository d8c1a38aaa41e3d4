"""The wire format of secure aggregation (version 1): every message is plain bytes, a fixed header then a payload.

Header (22 bytes, big-endian)::

    magic  b"DPSA"  4 bytes
    version         1 byte    (VERSION = 1)
    type            1 byte    (MessageType)
    round id        8 bytes   (unsigned)
    sender          4 bytes   (client id in [0, 2^32 - 2]; SERVER = 2^32 - 1)
    payload length  4 bytes

Payloads (ids are 4-byte unsigned, counts 4-byte unsigned):

=================  =======  =======================================================================================
type               from     payload
=================  =======  =======================================================================================
ADVERTISE_KEYS     client   c_u^PK (32) | s_u^PK (32)
KEY_LIST           server   count | count x (id | c^PK (32) | s^PK (32)), ids increasing
ENCRYPTED_SHARES   client   count | count x (recipient id | AES-GCM ciphertext (148))
ROUTED_SHARES      server   count | count x (sender id | ciphertext (148)), ids increasing
MASKED_INPUT       client   count | count x little-endian uint64 (y_u mod 2^bits)
UNMASK_REQUEST     server   count | count x id (U3, the clients whose masked input arrived), increasing
UNMASK_SHARES      client   count | count x (owner id | kind (0: b, 1: s^SK) | share (66, big-endian))
=================  =======  =======================================================================================

A ciphertext from u to v is AES-GCM under c_uv with nonce (u as 12 bytes) and associated data
``share_context(round, u, v)``; its plaintext is the two Shamir shares (of b_u and of s_u^SK) at x = v + 1,
66 bytes each. ``decode`` checks the header against what the receiver expects (round, type, sender) and the
payload's layout, and raises ``SecAggError`` naming the round, the party and what was wrong.
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
VERSION = 1
#: The sender id of the server.
SERVER = 2**32 - 1
#: Bytes of an encrypted pair of shares.
CIPHERTEXT_BYTES = 2 * ELEMENT_BYTES + TAG_BYTES

_HEADER = struct.Struct(">4sBBQII")
_COUNT = struct.Struct(">I")


class SecAggError(DpflError):
    """A secure aggregation round refused a message or could not go on: says which round, which party, what."""

    def __init__(self, round_id: int, party: str, problem: str):
        self.round_id, self.party, self.problem = round_id, party, problem
        super().__init__(f"secure aggregation round {round_id}, {party}: {problem}")


class MessageType(enum.IntEnum):
    ADVERTISE_KEYS = 1
    KEY_LIST = 2
    ENCRYPTED_SHARES = 3
    ROUTED_SHARES = 4
    MASKED_INPUT = 5
    UNMASK_REQUEST = 6
    UNMASK_SHARES = 7


class ShareKind(enum.IntEnum):
    """Which secret of its owner a share in UNMASK_SHARES belongs to."""

    SELF_MASK_SEED = 0  # b_u: the owner's masked input arrived
    MASK_KEY = 1  # s_u^SK: the owner dropped out after sharing its keys


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


_FROM_SERVER = {MessageType.KEY_LIST, MessageType.ROUTED_SHARES, MessageType.UNMASK_REQUEST}


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

    def count(self, item_bytes: int) -> int:
        """A count, checked against the bytes left (so a forged count cannot make the reader allocate)."""
        n = self.uint32()
        if n * item_bytes != len(self.payload) - self.offset:
            self.fail(f"count {n} of {item_bytes}-byte items, but {len(self.payload) - self.offset} bytes follow")
        return n

    def ids(self, n: int, item_rest: int = 0) -> list[tuple[int, bytes]]:
        """n items (id, rest) with ids strictly increasing (no repeats)."""
        items = [(self.uint32(), self.take(item_rest)) for _ in range(n)]
        ids = [i for i, _ in items]
        if any(a >= b for a, b in zip(ids, ids[1:])):
            self.fail(f"ids {ids} are not strictly increasing (a repeated or unsorted entry)")
        return items

    def done(self) -> None:
        if self.offset != len(self.payload):
            self.fail(f"{len(self.payload) - self.offset} bytes left over")


def pack_count(n: int) -> bytes:
    return _COUNT.pack(n)


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


__all__ = ["MAGIC", "VERSION", "SERVER", "CIPHERTEXT_BYTES", "SecAggError", "MessageType", "ShareKind",
           "Header", "party_name", "encode", "read_header", "decode", "PayloadReader", "pack_count", "pack_vector",
           "unpack_vector", "share_context", "share_nonce"]
