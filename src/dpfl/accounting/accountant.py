"""The front door of privacy accounting: ``account(event, delta)`` with PLD or RDP, and event builders.

* ``pld`` (default): the privacy loss distribution accountant (``dpfl.accounting.pld``, over dp_accounting's), tight
  up to a pessimistic discretisation. Supports dp_accounting's mechanisms, Poisson sampling and dpfl's
  ``ParticipationDpEvent``; not sampling without replacement nor Skellam. An unsupported event is an error that
  suggests ``accountant="rdp"``; ``account`` never switches accountant behind the caller's back
  (``dpfl.accounting.accountants.TightestAccountant`` makes that choice for callers that want it made).
* ``rdp``: the Renyi-DP curve of ``dpfl.accounting.rdp`` (Mironov 2017) over its ``DEFAULT_ORDERS``, converted to
  (epsilon, delta) with ``conversion`` = ``classic`` (Mironov 2017, Prop. 3) or ``modern`` (Canonne, Kamath, Steinke 2020; Balle et al. 2020), see
  ``dpfl.accounting.conversion``. Supports every event dpfl emits.

Neighbouring relation: ``add_remove`` (add or remove one record; dp_accounting's default), ``replace_one`` (replace
one record) or ``zero_out`` (replace one record by a null record that contributes nothing, so the dataset's size is
unchanged; dp_accounting's REPLACE_SPECIAL; Kairouz et al. 2021). Fixed-size sampling without replacement is only analysed under ``replace_one`` (Wang et al. 2019).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from dp_accounting import dp_event, privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

from dpfl.accounting import pld
from dpfl.accounting.conversion import CONVERSIONS, rdp_to_epsilon
from dpfl.accounting.rdp import DEFAULT_ORDERS, composition_error, rdp_curve, tail_delta
from dpfl.errors import ConfigError, check_range

ACCOUNTANTS = ("pld", "rdp")
NEIGHBORING = {
    "add_remove": privacy_accountant.NeighboringRelation.ADD_OR_REMOVE_ONE,
    "replace_one": privacy_accountant.NeighboringRelation.REPLACE_ONE,
    "zero_out": privacy_accountant.NeighboringRelation.REPLACE_SPECIAL,
}
SAMPLINGS = ("poisson", "fixed", "none")

#: Population assumed for ``sampling="fixed"`` when no ``dataset_size`` is given (see ``gaussian_event``).
DEFAULT_FIXED_DATASET_SIZE = 10**9


@dataclasses.dataclass(frozen=True)
class AccountingResult:
    """An (epsilon, delta)-DP guarantee and how it was obtained.

    ``conversion`` and ``order`` (the optimal RDP order) are None for PLD.
    """

    epsilon: float
    delta: float
    accountant: str
    conversion: str | None = None
    order: float | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def account(
    event: dp_event.DpEvent,
    delta: float,
    accountant: str = "pld",
    conversion: str = "classic",
    neighboring: str = "add_remove",
    *,
    orders=DEFAULT_ORDERS,
    value_discretization_interval: float = pld.VALUE_DISCRETIZATION_INTERVAL,
    subsampling_bound: str = "tight",
) -> AccountingResult:
    """Epsilon of ``event`` at ``delta``: the smallest epsilon (for RDP, the conversion's bound) with ``event``
    (epsilon, delta)-DP. Never NaN or negative; +inf when no finite epsilon holds.

    Args:
      event: a ``dp_accounting`` event (or one of ``dpfl.accounting.events``), e.g. from ``gaussian_event``.
      delta: in (0, 1).
      accountant: one of ``ACCOUNTANTS``.
      conversion: one of ``CONVERSIONS``, the RDP -> DP conversion (RDP only; ignored and reported as None for PLD).
      neighboring: one of ``NEIGHBORING``.
      orders: RDP orders (RDP only).
      value_discretization_interval: PLD grid step (PLD only; see ``dpfl.accounting.pld``).
      subsampling_bound: RDP bound for sampling records without replacement (``dpfl.accounting.rdp.rdp_curve``).

    Raises:
      ConfigError: a parameter is out of range, or ``accountant`` does not support ``event`` under ``neighboring``
        (for PLD also ``pld.PldTooLargeError``: a PLD too large to build in seconds; RDP answers it at once).
    """
    delta = check_range("delta", delta, 0, 1, low_open=True, high_open=True)
    relation = check_options(accountant, conversion, neighboring)
    if accountant == "pld":
        return AccountingResult(pld.pld_epsilon(event, delta, relation, value_discretization_interval), delta, "pld")
    curve = _rdp(event, relation, orders, subsampling_bound)
    tail = tail_delta(event)  # approximately RDP events (dpfl.accounting.rdp): their curve holds at delta - tail
    if tail >= delta:
        return AccountingResult(math.inf, delta, "rdp", conversion, float(np.asarray(orders, dtype=float)[0]))
    epsilon, order = rdp_to_epsilon(orders, curve, delta - tail, conversion)
    return AccountingResult(epsilon, delta, "rdp", conversion, order)



def delta_for_epsilon(
    event: dp_event.DpEvent,
    epsilon: float,
    accountant: str = "pld",
    conversion: str = "classic",
    neighboring: str = "add_remove",
) -> AccountingResult:
    """Smallest delta with ``event`` (epsilon, delta)-DP, in [0, 1]; the arguments are those of ``account``.

    RDP: ``classic`` inverts Mironov 2017, Prop. 3 (delta = min_a exp((a - 1)(eps(a) - epsilon))); ``modern`` is
    dp_accounting's ``compute_delta`` (Canonne et al. 2020, Prop. 12, with the KL bound), the inverse of the modern
    conversion.
    """
    epsilon = check_range("epsilon", epsilon, 0)
    relation = check_options(accountant, conversion, neighboring)
    if accountant == "pld":
        return AccountingResult(epsilon, pld.pld_delta(event, epsilon, relation), "pld")
    curve = _rdp(event, relation)
    if conversion == "classic":
        with np.errstate(invalid="ignore"):
            log_deltas = np.nan_to_num((DEFAULT_ORDERS - 1) * (np.maximum(curve, 0.0) - epsilon), nan=0.0)
        best = int(np.argmin(log_deltas))
        delta, order = math.exp(min(0.0, log_deltas[best])), DEFAULT_ORDERS[best]
    else:
        delta, order = rdp_privacy_accountant.compute_delta(DEFAULT_ORDERS, np.nan_to_num(curve, nan=np.inf), epsilon)
    delta = 1.0 if math.isnan(delta) else min(1.0, float(delta) + tail_delta(event))  # + approximate RDP's tails
    return AccountingResult(epsilon, delta, "rdp", conversion, float(order))


def pure_epsilon(event: dp_event.DpEvent) -> float:
    """Pure-DP (delta = 0) epsilon of ``event`` by basic composition (Dwork & Roth 2014, Thm 3.16).

    Supports Laplace (epsilon = 1 / noise multiplier = sensitivity / scale), no-op and compositions of those.
    """
    if isinstance(event, dp_event.LaplaceDpEvent):
        return math.inf if event.noise_multiplier == 0 else 1 / event.noise_multiplier
    if isinstance(event, dp_event.NoOpDpEvent):
        return 0.0
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return event.count * pure_epsilon(event.event) if event.count else 0.0
    if isinstance(event, dp_event.ComposedDpEvent):
        return sum((pure_epsilon(e) for e in event.events), 0.0)
    raise ConfigError("event", event, "Laplace events (or compositions of them) for a pure-DP epsilon")


def gaussian_event(
    noise_multiplier: float,
    steps: int,
    sampling: str = "poisson",
    sampling_rate: float | None = None,
    dataset_size: int | None = None,
) -> dp_event.DpEvent:
    """``steps`` compositions of the (sampled) Gaussian mechanism with noise std = ``noise_multiplier`` x sensitivity.

    Args:
      noise_multiplier: > 0.
      steps: integer >= 1.
      sampling: ``poisson`` (each record independently with probability ``sampling_rate``; add/remove neighbouring),
        ``fixed`` (a batch of exactly ``sampling_rate`` x ``dataset_size`` records drawn without replacement; this is
        analysed under REPLACE-ONE neighbouring only: PLD by its dominating Poisson pair, RDP by Wang et al. 2019), or
        ``none`` (every record).
      sampling_rate: in (0, 1]; required for ``poisson`` and ``fixed``, must be omitted (or 1) for ``none``.
      dataset_size: ``fixed`` only, integer >= 1. The batch is ceil(``sampling_rate`` x ``dataset_size``) (rounding
        up is conservative). Omitted, it is ``DEFAULT_FIXED_DATASET_SIZE`` (10^9): RDP bounds for sampling without
        replacement depend only on the ratio batch / dataset (Wang et al. 2019), which then matches the rate to 1e-9.
    """
    noise_multiplier = check_range("noise_multiplier", noise_multiplier, 0, low_open=True)
    steps = check_range("steps", steps, 1, integer=True)
    if sampling not in SAMPLINGS:
        raise ConfigError("sampling", sampling, f"one of {SAMPLINGS}")
    if dataset_size is not None and sampling != "fixed":
        raise ConfigError("dataset_size", dataset_size, "None unless sampling = 'fixed'")
    gaussian = dp_event.GaussianDpEvent(noise_multiplier)
    if sampling == "none":
        if sampling_rate not in (None, 1):
            raise ConfigError("sampling_rate", sampling_rate, "None (or 1) when sampling = 'none'")
        return dp_event.SelfComposedDpEvent(gaussian, steps)
    if sampling_rate is None:
        raise ConfigError("sampling_rate", sampling_rate, f"a number in (0, 1] when sampling = {sampling!r}")
    sampling_rate = check_range("sampling_rate", sampling_rate, 0, 1, low_open=True)
    if sampling == "poisson":
        return dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(sampling_rate, gaussian), steps)
    if dataset_size is None:
        dataset_size = DEFAULT_FIXED_DATASET_SIZE
    size = check_range("dataset_size", dataset_size, 1, integer=True)
    batch = max(1, math.ceil(round(sampling_rate * size, 6)))
    sampled = dp_event.SampledWithoutReplacementDpEvent(size, batch, gaussian)
    return dp_event.SelfComposedDpEvent(sampled, steps)


def laplace_event(scale: float, sensitivity: float, steps: int) -> dp_event.DpEvent:
    """``steps`` compositions of the Laplace mechanism with noise scale ``scale`` on a statistic of l1 sensitivity
    ``sensitivity`` (each (sensitivity / scale)-DP, add/remove neighbouring)."""
    scale = check_range("scale", scale, 0, low_open=True)
    sensitivity = check_range("sensitivity", sensitivity, 0, low_open=True)
    steps = check_range("steps", steps, 1, integer=True)
    return dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(scale / sensitivity), steps)


def check_options(accountant: str, conversion: str, neighboring: str) -> privacy_accountant.NeighboringRelation:
    """Validates the accounting options shared by every entry point; returns dp_accounting's neighbouring relation."""
    if accountant not in ACCOUNTANTS:
        raise ConfigError("accountant", accountant, f"one of {ACCOUNTANTS}")
    if conversion not in CONVERSIONS:
        raise ConfigError("conversion", conversion, f"one of {CONVERSIONS}")
    if neighboring not in NEIGHBORING:
        raise ConfigError("neighboring", neighboring, f"one of {tuple(NEIGHBORING)}")
    return NEIGHBORING[neighboring]


def _rdp(event: dp_event.DpEvent, relation, orders=DEFAULT_ORDERS, subsampling_bound: str = "tight") -> np.ndarray:
    error = composition_error(event, relation)
    if error is not None:
        raise ConfigError("event", type(event).__name__, f"an event the RDP accountant supports ({error})")
    return rdp_curve(event, orders, relation, subsampling_bound)


__all__ = [
    "ACCOUNTANTS",
    "NEIGHBORING",
    "SAMPLINGS",
    "AccountingResult",
    "account",
    "check_options",
    "delta_for_epsilon",
    "pure_epsilon",
    "gaussian_event",
    "laplace_event",
]
