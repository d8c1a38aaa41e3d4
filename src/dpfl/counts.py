"""How many items a sampling rate takes from a population: one rule for the samplers and the accountants.

floor(rate * n), with a tolerance for float rounding (0.29 * 100 is 28.999..., which must give 29): the count the
engine samples is the count the accountant charges (Noble et al. 2022, Alg. 1: |C_t| = floor(l M), |S| = floor(s R)).
"""

from __future__ import annotations

import math

#: Added before flooring so that a rate * n that is an integer in exact arithmetic floors to it.
TOLERANCE = 1e-9


def sampled_count(rate: float, population: int) -> int:
    """floor(rate * population + TOLERANCE)."""
    return math.floor(rate * population + TOLERANCE)


__all__ = ["TOLERANCE", "sampled_count"]
