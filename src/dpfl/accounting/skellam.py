"""RDP of the Skellam mechanism (Agarwal, Kairouz, Liu 2021) and of Poisson subsampling around any RDP curve
(Zhu, Wang 2019), so that Skellam noise with Poisson-sampled records or cohorts can be accounted.

**Skellam.** Agarwal et al. 2021 (NeurIPS, "The Skellam Mechanism for Differentially Private Federated Learning"),
Thm 3.5 and its scaled form (Sec. 4): the d-dimensional mechanism that adds Sk(mu'/2, mu'/2) noise (variance mu')
per coordinate to an integer vector with l2 and l1 sensitivities D2', D1' is (a, eps(a))-RDP at integer a > 1 with

    eps(a) = a D2'^2 / (2 mu') + min( ((2a - 1) D2'^2 + 6 D1') / (4 mu'^2),  3 D1' / (2 mu') ).

For a statistic scaled by s before rounding, D2' = s D2, D1' = s D1 and mu' = s^2 mu in terms of the statistic's own
units (``SkellamDpEvent``), which reads

    eps(a) = a D2^2 / (2 mu) + min( (2a - 1) D2^2 / (4 s^2 mu^2) + 3 D1 / (2 s^3 mu^2),  3 D1 / (2 s mu) ),

the form of Heikkilä's joint-noise accounting. As s -> inf or mu -> inf it tends to the Gaussian curve a D2^2/(2 mu).

**Poisson subsampling.** Zhu, Wang 2019 (ICML, "Poisson Subsampled Renyi Differential Privacy"), Thm 6, the general
upper bound for ANY mechanism with RDP eps(l) at integer orders l >= 2, each record included with probability q
(add/remove neighbouring):

    eps_q(a) <= 1/(a-1) log( (1-q)^(a-1) (1 + (a-1) q) + C(a,2) q^2 (1-q)^(a-2) e^{eps(2)}
                              + 3 sum_{l=3..a} C(a,l) q^l (1-q)^(a-l) e^{(l-1) eps(l)} ),

at integer a >= 2. Without the factor 3 it is the exact value for the Gaussian and Laplace mechanisms (their Thm 5,
Mironov, Talwar, Zhang 2019), so for a Gaussian curve it is above dp_accounting's exact Poisson-subsampled Gaussian by
at most log(3)/(a-1), and much less for small q (the l >= 3 terms are O(q^3)).
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import gammaln, logsumexp

from dpfl.accounting.events import SkellamDpEvent
from dpfl.errors import ConfigError, check_range


def skellam_rdp(event: SkellamDpEvent, orders) -> np.ndarray:
    """RDP of ``event`` at integer ``orders`` (> 1): Agarwal et al. 2021, Thm 3.5 scaled, as in the module docstring."""
    check_range("l2_sensitivity", event.l2_sensitivity, 0)
    check_range("l1_sensitivity", event.l1_sensitivity, 0)
    check_range("variance", event.variance, 0, low_open=True)
    check_range("scale", event.scale, 0, low_open=True)
    a = np.asarray(orders, dtype=float)
    d2, d1, mu, s = event.l2_sensitivity, event.l1_sensitivity, event.variance, event.scale
    gaussian = a * d2**2 / (2 * mu)
    discretisation = np.minimum(
        (2 * a - 1) * d2**2 / (4 * s**2 * mu**2) + 3 * d1 / (2 * s**3 * mu**2),
        3 * d1 / (2 * s * mu),
    )
    return gaussian + discretisation


def poisson_subsampled_rdp(q: float, inner: np.ndarray) -> np.ndarray:
    """Zhu, Wang 2019, Thm 6: RDP at orders 2..A of a mechanism with RDP ``inner`` at orders 2..A (in this order),
    run on a Poisson sample with inclusion probability ``q``. Computed in log space; +inf where ``inner`` is."""
    if not 0 <= q <= 1:
        raise ConfigError("sampling_probability", q, "a probability in [0, 1]")
    inner = np.asarray(inner, dtype=float)
    if q == 0:
        return np.zeros_like(inner)
    if q == 1:
        return inner.copy()
    a = np.arange(2, inner.size + 2, dtype=float)[:, None]
    ell = a.T
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_binom = gammaln(a + 1) - gammaln(ell + 1) - gammaln(a - ell + 1)
        factor = np.where(ell == 2, 0.0, math.log(3))
        terms = np.where(ell <= a, factor + log_binom + ell * math.log(q) + (a - ell) * math.log1p(-q)
                         + (ell - 1) * inner[None, :], -np.inf)
        first = (a[:, 0] - 1) * math.log1p(-q) + np.log1p((a[:, 0] - 1) * q)
        log_moment = np.logaddexp(first, logsumexp(terms, axis=1))
    return np.where(np.isnan(log_moment), np.inf, log_moment) / (a[:, 0] - 1)


__all__ = ["skellam_rdp", "poisson_subsampled_rdp"]
