"""ChaCha20 streams (dpfl.engine.secure_streams): the keystream is RFC 8439's, streams are named like the default
ones (same name, same words; another round, client, purpose or key, other words), and the words look uniform."""

import numpy as np
import pytest
from scipy import stats

from dpfl.engine.keys import derived_key
from dpfl.engine.secure_streams import BUFFER_WORDS, STREAM_BYTES, SecureStream, chacha20_keystream, stream_key

RFC_KEY = bytes(range(32))


def test_the_block_function_is_rfc_8439s():
    """RFC 8439, Sec. 2.3.2: the serialised block of key 00..1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00,
    counter 1."""
    block = chacha20_keystream(RFC_KEY, bytes.fromhex("000000090000004a00000000"), 1, 64)
    assert block.hex() == ("10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
                           "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e")


def test_the_encryption_is_rfc_8439s():
    """RFC 8439, Sec. 2.4.2: the sunscreen plaintext, nonce 00:00:00:00:00:00:00:4a:00:00:00:00, counter 1."""
    plaintext = (b"Ladies and Gentlemen of the class of '99: If I could offer you only one tip for the future, "
                 b"sunscreen would be it.")
    keystream = chacha20_keystream(RFC_KEY, bytes.fromhex("000000000000004a00000000"), 1, len(plaintext))
    ciphertext = bytes(a ^ b for a, b in zip(plaintext, keystream))
    assert ciphertext.hex() == (
        "6e2e359a2568f98041ba0728dd0d6981e97e7aec1d4360c20a27afccfd9fae0bf91b65c5524733ab8f593dabcd62b3571639d624e65152"
        "ab8f530c359f0861d807ca0dbf500d6a6156a38e088a22b65e52bc514d16ccf806818ce91ab77937365af90bbf74a35be6b40b8eedf2"
        "785e42874d")


def test_a_stream_is_the_keystream_of_its_derived_key():
    words = SecureStream(7, 3, 5, "noise").words(20)
    key = derived_key(7, "chacha20", "3", "5", "noise").to_bytes(32, "big")
    assert stream_key(7, 3, 5, "noise") == key
    assert words.dtype == np.uint64
    assert words.tolist() == np.frombuffer(chacha20_keystream(key, bytes(12), 0, 160), dtype="<u8").tolist()


def test_the_same_name_gives_the_same_words_however_they_are_asked_for():
    whole = SecureStream(2**200 + 1, 4, -1, "noise").words(3 * BUFFER_WORDS + 5)
    stream = SecureStream(2**200 + 1, 4, -1, "noise")
    pieces = [stream.words(n) for n in (1, 0, BUFFER_WORDS - 1, 7, 2 * BUFFER_WORDS - 3, 1)]
    assert np.array_equal(np.concatenate(pieces), whole)  # a request across a block boundary, one past several


@pytest.mark.parametrize("other", [(8, 3, 5, "noise"), (7, 4, 5, "noise"), (7, 3, 6, "noise"), (7, 3, -1, "noise"),
                                   (7, 3, 5, "rounding")])
def test_distinct_names_give_distinct_words(other):
    assert not np.array_equal(SecureStream(7, 3, 5, "noise").words(4), SecureStream(*other).words(4))


def test_an_unknown_purpose_is_refused():
    with pytest.raises(ValueError, match="purpose = 'nosie'"):
        SecureStream(7, 3, 5, "nosie")


def test_the_bytes_are_uniform():
    """Chi-square of the counts of the 256 byte values in 2^20 bytes of one fixed stream: 255 degrees of freedom;
    this stream's p-value is far from either tail (a biased or constant stream gives p ~ 0)."""
    counts = np.bincount(SecureStream(1, 0, 0, "noise").words(2**17).view(np.uint8), minlength=256)
    p_value = stats.chisquare(counts).pvalue
    assert 0.01 < p_value < 0.99
    # and each bit of the 64-bit word is set about half the time
    words = SecureStream(1, 0, 0, "noise").words(2**16)
    ones = [(int(np.count_nonzero(words & np.uint64(1 << b)))) for b in range(64)]
    assert all(abs(n - 2**15) < 5 * 128 for n in ones)  # 5 standard deviations of Bin(2^16, 1/2)


def test_a_stream_refuses_to_run_past_its_block_counter():
    """2^32 blocks of 64 bytes: past them ChaCha20's 32-bit counter would wrap and repeat the keystream."""
    stream = SecureStream(7, 3, 5, "noise")
    stream._drawn = STREAM_BYTES - 64 * 2  # as if all but two blocks had been read
    with pytest.raises(ValueError, match="at most 274877906944 bytes"):
        stream.words(1)
