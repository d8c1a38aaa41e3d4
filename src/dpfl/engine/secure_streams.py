"""Cryptographically secure streams: ChaCha20 keystreams named by (noise key, round, client, purpose).

The default streams (``dpfl.engine.randomness``) hash the name to a 63-bit seed of torch's Mersenne twister
(Matsumoto, Nishimura 1998), whose output tempering is an invertible linear map, so its 624-word state follows from
624 consecutive outputs: they are statistically independent, not secret. Whoever could read enough of a stream's
outputs could predict the rest of it. A secure stream is unpredictable to anyone who
does not hold the noise key, under the standard assumption that ChaCha20 is a pseudorandom function (Bernstein 2008;
RFC 8439, Nir, Langley 2018):

* its 256-bit ChaCha20 key is ``dpfl.engine.keys.derived_key(noise key, "chacha20", round, client, purpose)``
  (SHA-256 over the key and the length-prefixed name), so distinct names give independent keys and no stream reveals
  the noise key or another stream;
* its 96-bit nonce is zero and its block counter starts at 0 (each key is used for one stream only, so a nonce never
  repeats under a key); a stream holds 2^32 blocks of 64 bytes (256 GiB) before the counter would wrap, which
  ``words`` refuses;
* the keystream (ChaCha20 applied to zero bytes, through the ``cryptography`` package's OpenSSL binding) is read as
  little-endian 64-bit words, each uniform on [0, 2^64).

A stream is drawn in whole ChaCha20 blocks, at least ``BUFFER_WORDS`` words per keystream call, not one call per
coordinate; what a sampler does not use stays in the buffer for its next request, so the words a stream yields do not
depend on how they are requested (a test checks it).
"""

from __future__ import annotations

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from dpfl.engine.keys import derived_key
from dpfl.engine.stream_names import check_purpose

#: Words drawn per keystream call at least (64 KiB of keystream).
BUFFER_WORDS = 8192
#: Bytes a stream can yield: 2^32 ChaCha20 blocks of 64 bytes (the 32-bit block counter of RFC 8439).
STREAM_BYTES = 64 * 2**32


def chacha20_keystream(key: bytes, nonce: bytes, counter: int, size: int) -> bytes:
    """``size`` bytes of the ChaCha20 keystream (RFC 8439, Sec. 2.4) of a 32-byte ``key`` and 12-byte ``nonce`` from
    block ``counter`` on: ChaCha20 applied to zero bytes. ``cryptography`` takes the 16-byte initial block of RFC 8439
    as the 4-byte little-endian counter followed by the nonce."""
    if len(key) != 32 or len(nonce) != 12 or not 0 <= counter < 2**32:
        raise ValueError(f"ChaCha20 takes a 32-byte key, a 12-byte nonce and a 32-bit counter: got {len(key)} bytes, "
                         f"{len(nonce)} bytes, {counter}")
    cipher = Cipher(algorithms.ChaCha20(key, counter.to_bytes(4, "little") + nonce), mode=None)
    return cipher.encryptor().update(bytes(size))


def stream_key(key: int, round_index: int, client: int, purpose: str) -> bytes:
    """The 256-bit ChaCha20 key of stream (noise key ``key``, round, client, purpose): ``derived_key`` over the
    name (the server is client -1, as in ``dpfl.engine.randomness``)."""
    check_purpose(purpose)
    return derived_key(int(key), "chacha20", str(int(round_index)), str(int(client)), purpose).to_bytes(32, "big")


class SecureStream:
    """The uniform 64-bit words of one ChaCha20 stream, in order."""

    def __init__(self, key: int, round_index: int, client: int, purpose: str):
        self._key = stream_key(key, round_index, client, purpose)
        self._buffer = np.empty(0, dtype=np.uint64)
        self._drawn = 0  # bytes of keystream drawn so far

    def words(self, count: int) -> np.ndarray:
        """The stream's next ``count`` words: uint64, each uniform on [0, 2^64) and independent of all others."""
        if count > len(self._buffer):
            size = -(-8 * max(count - len(self._buffer), BUFFER_WORDS) // 64) * 64  # whole blocks
            if self._drawn + size > STREAM_BYTES:
                raise ValueError(f"a secure stream yields at most {STREAM_BYTES} bytes; {self._drawn + size} asked")
            keystream = chacha20_keystream(self._key, bytes(12), self._drawn // 64, size)
            fresh = np.frombuffer(keystream, dtype="<u8").astype(np.uint64)
            self._drawn += size
            self._buffer = np.concatenate([self._buffer, fresh])
        taken, self._buffer = self._buffer[:count], self._buffer[count:]
        return taken


__all__ = ["BUFFER_WORDS", "STREAM_BYTES", "chacha20_keystream", "stream_key", "SecureStream"]
