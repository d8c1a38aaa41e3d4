"""RDP -> (epsilon, delta)-DP conversion.

Two conversions of an RDP curve eps(a) (Mironov 2017) into an (epsilon, delta)-DP guarantee:

* ``classic``: Mironov 2017, Prop. 3:  epsilon = min_a  eps(a) + log(1/delta) / (a - 1).
  The DP-SCAFFOLD paper (Noble et al. 2022, App. B) and the joint-noise paper (Heikkilä 2024, Table 1) report
  numbers with it.
* ``modern``: Canonne, Kamath, Steinke 2020 (arXiv:2004.00010, Prop. 12; cf. Balle et al. 2020,
  arXiv:1905.09982) / Asoodeh et al. 2021 (Eq. 20),
  epsilon = min_a  eps(a) + log(1 - 1/a) - (log delta + log a) / (a - 1), as computed by
  ``dp_accounting.rdp.rdp_privacy_accountant.compute_epsilon``. Tighter, so it does not reproduce those papers.

Both never return NaN or a negative epsilon: RDP values are clamped at 0 and NaN read as +inf (no guarantee), and
epsilon is +inf when every order has an infinite RDP.
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from dpfl.errors import ConfigError, check_range

CONVERSIONS = ("classic", "modern")


def rdp_to_epsilon(orders, rdp, delta: float, conversion: str = "classic") -> tuple[float, float]:
    """Returns (epsilon, optimal order) of an RDP curve ``rdp`` at ``orders`` for the target ``delta``.

    Args:
      orders: RDP orders a > 1.
      rdp: RDP values eps(a) at ``orders`` (same length).
      delta: target delta in (0, 1).
      conversion: one of ``CONVERSIONS`` (see the module docstring).

    The returned order is the minimiser; when epsilon is +inf it is the first order (any order is as bad).
    """
    check_range("delta", delta, 0, 1, low_open=True, high_open=True)
    if conversion not in CONVERSIONS:
        raise ConfigError("conversion", conversion, f"one of {CONVERSIONS}")
    orders = np.asarray(orders, dtype=float)
    rdp = np.asarray(rdp, dtype=float)
    if orders.ndim != 1 or orders.size == 0 or rdp.shape != orders.shape:
        raise ConfigError("rdp", rdp.shape, f"a 1-D array of the same non-zero length as orders {orders.shape}")
    if not np.all(orders > 1):
        raise ConfigError("orders", orders.tolist(), "RDP orders > 1")
    rdp = np.where(np.isnan(rdp), np.inf, np.maximum(rdp, 0.0))

    if conversion == "classic":
        epsilons = rdp + math.log(1 / delta) / (orders - 1)
        best = int(np.argmin(epsilons))
        epsilon = float(epsilons[best])
        order = float(orders[best])
    else:
        epsilon, order = rdp_privacy_accountant.compute_epsilon(orders, rdp, delta)
        epsilon, order = float(epsilon), float(order)
    return max(0.0, epsilon), order


__all__ = ["CONVERSIONS", "rdp_to_epsilon"]
