"""Shamir t-of-n secret sharing over the prime field GF(2^521 - 1) (Shamir 1979).

A secret s in [0, p) is the constant term of a random polynomial f of degree t - 1; the share of the party with
x-coordinate x (an integer in [1, p)) is (x, f(x)). Any t shares give s back by Lagrange interpolation at 0,

    s = f(0) = sum_{i in S} f(x_i) prod_{j in S, j != i} x_j / (x_j - x_i)   (mod p),

and any t - 1 shares are independent of s (they are uniform on GF(p)^(t-1) whatever s is). The field is the
Mersenne prime p = 2^521 - 1, large enough to hold a 32-byte secret (an X25519 private key, a 32-byte PRG seed) as
one field element. The arithmetic is Python's exact integers; the coefficients' randomness is the caller's (a
``dpfl.protocols.entropy`` source), so this module draws nothing itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

#: The field's prime: the Mersenne prime 2^521 - 1.
PRIME = 2**521 - 1
#: Bytes of a field element (ceil(521 / 8)).
ELEMENT_BYTES = 66


def random_element(random_bytes: Callable[[int], bytes]) -> int:
    """A uniform element of GF(p) by rejection sampling: 521 random bits, redrawn if >= p (probability 2^-521)."""
    while True:
        value = int.from_bytes(random_bytes(ELEMENT_BYTES), "big") & PRIME  # PRIME is 521 one-bits
        if value < PRIME:
            return value


def split(secret: int, threshold: int, xs: Sequence[int], random_bytes: Callable[[int], bytes]) -> dict[int, int]:
    """Shares {x: f(x)} of ``secret`` for the x-coordinates ``xs``, any ``threshold`` of which reconstruct it.

    f(z) = secret + a_1 z + ... + a_{t-1} z^(t-1) with a_k uniform on GF(p), evaluated by Horner's rule."""
    if not 0 <= secret < PRIME:
        raise ValueError(f"secret = {secret} is not a field element: expected an integer in [0, 2^521 - 1)")
    if not 1 <= threshold <= len(xs):
        raise ValueError(f"threshold = {threshold} is not allowed: expected an integer in [1, {len(xs)}] (the shares)")
    _check_coordinates(xs)
    coefficients = [random_element(random_bytes) for _ in range(threshold - 1)]
    shares = {}
    for x in xs:
        value = 0
        for a in reversed(coefficients):
            value = (value + a) * x % PRIME
        shares[x] = (value + secret) % PRIME
    return shares


def lagrange_at_zero(xs: Sequence[int]) -> dict[int, int]:
    """The Lagrange coefficients lambda_i = prod_{j != i} x_j / (x_j - x_i) mod p of interpolation at 0.

    They depend only on the set of x-coordinates, so one set of shareholders reconstructs many secrets with them."""
    return lagrange_at(xs, 0)


def lagrange_at(xs: Sequence[int], point: int) -> dict[int, int]:
    """The Lagrange coefficients prod_{j != i} (point - x_j) / (x_i - x_j) mod p of interpolation at ``point``
    (at 0: ``lagrange_at_zero``)."""
    _check_coordinates(xs)
    coefficients = {}
    for xi in xs:
        numerator, denominator = 1, 1
        for xj in xs:
            if xj != xi:
                numerator = numerator * (point - xj) % PRIME
                denominator = denominator * (xi - xj) % PRIME
        coefficients[xi] = numerator * pow(denominator, -1, PRIME) % PRIME
    return coefficients


def combine(shares: Mapping[int, int], coefficients: Mapping[int, int]) -> int:
    """f(0) = sum_i lambda_i f(x_i) mod p, for shares {x_i: f(x_i)} and ``lagrange_at_zero`` of the same x_i."""
    if set(shares) != set(coefficients):
        raise ValueError(f"shares at {sorted(shares)} but Lagrange coefficients for {sorted(coefficients)}")
    return sum(coefficients[x] * y for x, y in shares.items()) % PRIME


def reconstruct(shares: Mapping[int, int]) -> int:
    """The secret from shares {x: f(x)}: exact when at least ``threshold`` shares of one sharing are given."""
    return interpolate(shares, 0)


def interpolate(shares: Mapping[int, int], point: int) -> int:
    """f(point) for the polynomial of degree len(shares) - 1 through the shares {x: f(x)}: with ``threshold`` shares
    of one sharing, the value a share at x = point must have (at 0, the secret)."""
    return combine(shares, lagrange_at(list(shares), point))


def _check_coordinates(xs: Sequence[int]) -> None:
    if len(set(xs)) != len(xs):
        raise ValueError(f"x-coordinates {list(xs)} repeat: each shareholder needs its own")
    bad = [x for x in xs if not 0 < x < PRIME]
    if bad:
        raise ValueError(f"x-coordinates {bad} are not allowed: expected integers in [1, 2^521 - 1)")


__all__ = ["PRIME", "ELEMENT_BYTES", "random_element", "split", "lagrange_at_zero", "lagrange_at", "combine",
           "reconstruct", "interpolate"]
