"""Shamir secret sharing over GF(2^521 - 1) (dpfl.protocols.shamir)."""

import itertools

import pytest

from dpfl.protocols import shamir
from dpfl.protocols.primitives import SeededRandomBytes


def randomness(party=0):
    return SeededRandomBytes(7, 0, party)


def test_reference_polynomial():
    """f(x) = 5 + 3x + 2x^2: f(1) = 10, f(2) = 19, f(3) = 32 and f(0) = 5 from any three points."""
    assert shamir.reconstruct({1: 10, 2: 19, 3: 32}) == 5
    assert shamir.lagrange_at_zero([1, 2, 3]) == {1: 3, 2: shamir.PRIME - 3, 3: 1}
    assert shamir.reconstruct({2: 19, 3: 32, 7: 5 + 21 + 98}) == 5


def test_interpolation_gives_the_value_a_share_must_have():
    """f(x) = 5 + 3x + 2x^2 through (1, 10), (2, 19), (3, 32): f(7) = 124 and f(0) = 5; a share off the polynomial is
    told apart (the server's check of a responder's share)."""
    assert shamir.interpolate({1: 10, 2: 19, 3: 32}, 7) == 5 + 21 + 98
    assert shamir.interpolate({1: 10, 2: 19, 3: 32}, 0) == 5
    assert shamir.lagrange_at([1, 2, 3], 0) == shamir.lagrange_at_zero([1, 2, 3])
    assert shamir.interpolate({1: 10, 2: 19, 3: 33}, 7) != 124


def test_any_threshold_shares_reconstruct_and_fewer_do_not():
    secret = int.from_bytes(bytes(range(32)), "big")
    xs = [1, 5, 9, 12, 40]
    shares = shamir.split(secret, 3, xs, randomness())
    for subset in itertools.combinations(xs, 3):
        assert shamir.reconstruct({x: shares[x] for x in subset}) == secret
    for subset in itertools.combinations(xs, 4):
        assert shamir.reconstruct({x: shares[x] for x in subset}) == secret
    for subset in itertools.combinations(xs, 2):  # a degree-1 interpolation of a degree-2 polynomial
        assert shamir.reconstruct({x: shares[x] for x in subset}) != secret


def interpolate(points, x):
    """The polynomial through ``points`` {x_i: y_i}, evaluated at x (mod p)."""
    p = shamir.PRIME
    total = 0
    for xi, yi in points.items():
        term = yi
        for xj in points:
            if xj != xi:
                term = term * (x - xj) * pow(xi - xj, -1, p) % p
        total += term
    return total % p


def test_fewer_shares_are_consistent_with_every_secret():
    """Perfect secrecy, concretely: for t - 1 = 2 shares and ANY candidate secret c there is a degree-2 polynomial
    through (0, c) and both shares, so a third share exists that reconstructs c: the two shares rule nothing out."""
    shares = shamir.split(11, 3, [1, 2, 3], randomness(1))
    assert shamir.reconstruct(shares) == 11
    for candidate in (0, 12, 2**255):
        third = interpolate({0: candidate, 1: shares[1], 2: shares[2]}, 3)
        assert shamir.reconstruct({1: shares[1], 2: shares[2], 3: third}) == candidate
    same_coefficients = shamir.split(12, 3, [1, 2, 3], randomness(1))  # shares differ only by the constant term
    assert all(same_coefficients[x] - shares[x] == 1 for x in shares)


def test_threshold_one_is_the_secret_itself():
    assert shamir.split(42, 1, [3, 4], randomness()) == {3: 42, 4: 42}


def test_random_elements_lie_in_the_field():
    draws = [shamir.random_element(randomness(2)) for _ in range(50)]
    assert all(0 <= d < shamir.PRIME for d in draws) and max(draws) > 2**500


@pytest.mark.parametrize("secret, threshold, xs, match", [
    (-1, 2, [1, 2], "secret"),
    (shamir.PRIME, 2, [1, 2], "secret"),
    (1, 3, [1, 2], "threshold"),
    (1, 0, [1, 2], "threshold"),
    (1, 2, [1, 1], "repeat"),
    (1, 2, [0, 1], "x-coordinates"),
])
def test_bad_arguments_are_refused(secret, threshold, xs, match):
    with pytest.raises(ValueError, match=match):
        shamir.split(secret, threshold, xs, randomness())


def test_combine_needs_matching_coordinates():
    with pytest.raises(ValueError, match="Lagrange coefficients"):
        shamir.combine({1: 1, 2: 2}, shamir.lagrange_at_zero([1, 3]))
