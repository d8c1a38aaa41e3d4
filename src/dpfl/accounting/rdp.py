"""RDP curves of privacy events, including subsampling without replacement around any mechanism.

``rdp_curve(event, orders)`` returns the Renyi-DP curve eps(a) (Mironov 2017) of a ``dp_accounting`` event or of one
of dpfl's events (``dpfl.accounting.events``):

* composition (``ComposedDpEvent``, ``SelfComposedDpEvent``) adds curves (Mironov 2017, Prop. 1);
* ``SampledWithoutReplacementDpEvent`` around ANY inner event uses the general bound of Wang, Balle, Kasiviswanathan
  2019 (AISTATS, Thm 9), in the form of Noble et al. 2022, App. B (replace-one neighbouring, q = sample / population).
  Thm 9 needs the inner curve to bound the replacement of one ELEMENT of the sampled population: records sampled
  from a client's records, yes; clients sampled from the population around a record-level curve, no (a client is
  not a record: use ``ParticipationDpEvent``, see ``dpfl.accounting.observers``):

      eps_sub(a) = 1/(a-1) log(1 + q^2 C(a,2) min{4(e^{eps(2)} - 1), 2 e^{eps(2)}}
                                 + sum_{j=3..a} 2 q^j C(a,j) e^{(j-1) eps(j)})

  at integer a >= 2 (evaluated in log space), and at non-integer a the convexity of the cumulant (a-1) eps(a)
  (Wang et al. 2019, Cor. 10; Noble et al. 2022 App. B):
      eps(a) <= [(1-t)(floor a - 1) eps(floor a) + t (ceil a - 1) eps(ceil a)] / (a - 1),  t = a - floor a.
  A Gaussian inner event goes through this general bound too, not through dp_accounting's Gaussian-specific
  Thm 27 bound: the DP-SCAFFOLD reference numbers (Noble et al. 2022: 12.91, 8.1937, its Table 1 rounds) are computed with
  the general bound at both sampling levels; Thm 27 at the step level is much tighter and does not reproduce them
  (9.64 instead of 12.91 for M=100, R=4000, l=s=0.2, sigma_g=60, K=50, T=400). Unlike Thm 27, the general bound
  does not vanish as the noise grows (its j >= 3 terms tend to 2 q^j C(a,j)): Noble et al.'s "saturation".
  Nesting works (the DP-SCAFFOLD third-party round: WOR(M, lM, SelfComposed(WOR(R, sR, Gaussian(z)), K))).
* ``ParticipationDpEvent`` (the owner takes part with probability p) is the mixture bound
  log(1 + p (exp((a - 1) eps_in(a)) - 1)) / (a - 1) of its inner curve, under the inner event's own relation, and
  ``LabelledMixtureDpEvent`` the same over several events, log(sum_k w_k exp((a - 1) eps_k(a))) / (a - 1);
* ``DisjointUnionDpEvent`` (parallel composition over disjoint data) takes the pointwise maximum of its parts;
* ``WorstOwnerDpEvent`` outside a ledger (which accounts each owner: ``dpfl.accounting.owners``) is its ``bound``;
* ``SkellamDpEvent``: Agarwal et al. 2021 at integer orders, interpolated as above at non-integer ones;
* ``DiscreteGaussianDpEvent`` (``run.secure_noise``): a / (2 z_eff^2) at every order, its zCDP curve (Canonne,
  Kamath, Steinke 2020; ``discrete_gaussian_rdp``). Sampled, it goes through the general bounds above and below
  (valid for any mechanism with that curve), never Thm 27 nor dp_accounting's Gaussian-specific sampled curves;
* ``BinomialSumDpEvent`` (Cheu et al.'s shuffled binomial summation) is only *approximately* RDP: its curve (integer
  orders, interpolated as above) holds for a distribution within ``tail_delta(event)`` of the mechanism's
  (``dpfl.accounting.binomial``). ``tail_delta`` of a composition is the sum of its parts' (a participation mixture:
  p times the inner one, a disjoint union: the largest), and ``RdpAccountant`` converts at delta minus the composed
  tails. Subsampling records around it (without replacement or Poisson) is refused: no tail bound is proved here;
* ``PoissonSampledDpEvent`` around an event dp_accounting has no Poisson bound for (Skellam, Laplace, compositions,
  ...): Zhu, Wang 2019, Thm 6 (``dpfl.accounting.skellam``) on the inner curve under add/remove (or zero-out, whose
  null record adds nothing to the sampled statistic, so that it is add/remove for the sampled mechanism), interpolated as
  above; with bound "tight" (default) the smaller of it and the mixture bound of ``participation_rdp`` (joint
  convexity, valid for Poisson sampling too) at every order;
* anything else (Gaussian, Laplace, Poisson-subsampled Gaussian, ...) is delegated to dp_accounting's
  ``RdpAccountant``: the event is composed into a fresh accountant with these orders and its curve read back.

A NaN anywhere reads as "no bound" (+inf), never as 0. Curves are cached on (event, orders, neighbouring relation,
subsampling bound), one computed at a time in the process (``_CURVES``): a curve two threads ask for at once (the
ledger reads epsilon on a background thread, ``dpfl.accounting.ledger``) is computed once, the second finding it
cached (a subsampled Gaussian's fractional orders can take seconds).
"""

from __future__ import annotations

import functools
import math
import numbers
import threading

import numpy as np
from dp_accounting import dp_event, privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant
from scipy.special import gammaln, logsumexp

from dpfl.accounting.conversion import CONVERSIONS, rdp_to_epsilon
from dpfl.accounting.binomial import binomial_sum_rdp, binomial_sum_tail
from dpfl.accounting.events import (BinomialSumDpEvent, DiscreteGaussianDpEvent, DisjointUnionDpEvent,
                                    LabelledMixtureDpEvent, ParticipationDpEvent, SkellamDpEvent, WorstOwnerDpEvent,
                                    unsupported_part)
from dpfl.accounting.skellam import poisson_subsampled_rdp, skellam_rdp
from dpfl.errors import ConfigError, check_range

NeighborRel = privacy_accountant.NeighboringRelation

#: Orders 1.1..10.9 (step 0.1), every integer 2..256, and 512, 1024 (dp_accounting's default grid, densified).
DEFAULT_ORDERS = np.unique(np.concatenate([1 + np.arange(1, 100) / 10, np.arange(2, 257), [512, 1024]]))

#: Bounds for subsampling without replacement (see ``rdp_curve``).
SUBSAMPLING_BOUNDS = ("tight", "paper")

#: Largest integer order at which the "tight" bound also evaluates Wang et al.'s Gaussian-specific Thm 27
#: (``wang_gaussian_subsampled_rdp``; dp_accounting's own limit for it). Above it the tight bound is min(general
#: bound, inner curve).
THM27_MAX_ORDER = 256

#: Relations tried, in this order, for a leaf event when the caller names none.
_LEAF_RELATIONS = (NeighborRel.REPLACE_ONE, NeighborRel.ADD_OR_REMOVE_ONE, NeighborRel.REPLACE_SPECIAL)


def rdp_curve(event: dp_event.DpEvent, orders=DEFAULT_ORDERS, neighboring_relation=None,
              subsampling_bound: str = "tight") -> np.ndarray:
    """RDP of ``event`` at ``orders`` (finite, > 1), as described in the module docstring.

    Args:
      event: the event.
      orders: RDP orders.
      neighboring_relation: a ``dp_accounting.NeighboringRelation`` the event is accounted under; None lets each
        leaf event use the first relation dp_accounting supports it under (replace-one, add/remove, replace-special).
        Subsampling without replacement (and everything inside it) is always replace-one.
      subsampling_bound: for sampling without replacement, "paper" is Wang et al.'s general bound alone, exactly as
        Noble et al. 2022, App. B computes it (reproduces its published epsilons); "tight" (default) takes at every
        order the smallest of that bound, the inner mechanism's own curve (subsampling never hurts) and, around a
        Gaussian, Wang et al.'s Gaussian-specific Thm 27: each valid for sampling records, and much smaller when the
        general bound saturates.

    Raises:
      dp_accounting.UnsupportedEventError: some part of ``event`` has no RDP bound here.
    """
    orders = _check_orders(orders)
    if subsampling_bound not in SUBSAMPLING_BOUNDS:
        raise ConfigError("subsampling_bound", subsampling_bound, f"one of {SUBSAMPLING_BOUNDS}")
    with _CURVES:
        return _cached_curve(_EventKey(event), tuple(orders.tolist()), neighboring_relation, subsampling_bound).copy()


#: held while a curve is looked up or computed (module docstring)
_CURVES = threading.RLock()  # reentrant: a part of an event may be looked up through rdp_curve again


def composition_error(event: dp_event.DpEvent, neighboring_relation=None) -> str | None:
    """Why ``rdp_curve`` cannot account for ``event`` under ``neighboring_relation``, or None if it can."""
    if isinstance(event, (dp_event.NoOpDpEvent, SkellamDpEvent, DiscreteGaussianDpEvent)):
        return None
    if isinstance(event, BinomialSumDpEvent):
        if neighboring_relation not in (None, NeighborRel.REPLACE_ONE):
            return f"{event}: the binomial summation is accounted under REPLACE_ONE (one user's vector replaced)"
        return None
    if isinstance(event, (dp_event.SampledWithoutReplacementDpEvent, dp_event.PoissonSampledDpEvent)) and \
            tail_delta(event.event):
        return f"{event}: no subsampling bound for an approximately RDP event (a tail delta) here"
    if isinstance(event, (dp_event.SelfComposedDpEvent, ParticipationDpEvent)):
        return composition_error(event.event, neighboring_relation)
    if isinstance(event, WorstOwnerDpEvent):
        return composition_error(event.bound, neighboring_relation)
    if isinstance(event, (dp_event.ComposedDpEvent, DisjointUnionDpEvent, LabelledMixtureDpEvent)):
        return next(filter(None, (composition_error(e, neighboring_relation) for e in event.events)), None)
    if isinstance(event, dp_event.SampledWithoutReplacementDpEvent):
        if neighboring_relation not in (None, NeighborRel.REPLACE_ONE):
            return f"{event}: sampling without replacement is accounted under REPLACE_ONE, not {neighboring_relation}"
        return composition_error(event.event, NeighborRel.REPLACE_ONE)
    if _general_poisson(event, neighboring_relation):
        # zero-out (REPLACE_SPECIAL): the null record adds nothing to the sampled statistic, so the sampled mechanism
        # on the zeroed dataset is the one on the dataset without the record: add/remove (as dp_accounting's Gaussian)
        if neighboring_relation not in (None, NeighborRel.ADD_OR_REMOVE_ONE, NeighborRel.REPLACE_SPECIAL):
            return (f"{event}: Poisson sampling is accounted under ADD_OR_REMOVE_ONE (or zero-out), not "
                    f"{neighboring_relation}")
        return composition_error(event.event, NeighborRel.ADD_OR_REMOVE_ONE)
    if _leaf_relation(event, neighboring_relation) is None:
        return f"{event}: no RDP bound under {neighboring_relation or 'any neighbouring relation'}"
    return None


class RdpAccountant(privacy_accountant.PrivacyAccountant):
    """A dp_accounting ``PrivacyAccountant`` on ``rdp_curve``, with a choice of RDP -> DP conversion.

    Supports everything dp_accounting's RDP accountant does, plus sampling without replacement around any event and
    ``SkellamDpEvent``. The default neighbouring relation is dp_accounting's (add/remove); events sampled without
    replacement need ``NeighboringRelation.REPLACE_ONE``.
    """

    def __init__(self, orders=None, neighboring_relation=NeighborRel.ADD_OR_REMOVE_ONE, conversion="classic",
                 subsampling_bound="tight"):
        super().__init__(neighboring_relation)
        if subsampling_bound not in SUBSAMPLING_BOUNDS:
            raise ConfigError("subsampling_bound", subsampling_bound, f"one of {SUBSAMPLING_BOUNDS}")
        self._subsampling_bound = subsampling_bound
        if conversion not in CONVERSIONS:
            raise ConfigError("conversion", conversion, f"one of {CONVERSIONS}")
        self._orders = _check_orders(DEFAULT_ORDERS if orders is None else orders)
        self._rdp = np.zeros_like(self._orders)
        self._tail = 0.0
        self._conversion = conversion

    def _maybe_compose(self, event, count, do_compose):
        error = composition_error(event, self.neighboring_relation)
        if error is not None:
            part = unsupported_part(event, lambda e: composition_error(e, self.neighboring_relation) is None)
            return self.CompositionErrorDetails(invalid_event=part, error_message=error)
        if do_compose and count:
            self._rdp = self._rdp + count * rdp_curve(event, self._orders, self.neighboring_relation,
                                                      self._subsampling_bound)
            self._tail += count * tail_delta(event)
        return None

    def get_epsilon_and_optimal_order(self, target_delta: float) -> tuple[float, float]:
        """(epsilon, optimal order) of everything composed so far, with this accountant's conversion, at
        target_delta minus the composed tails of approximately RDP events (+inf when they use it all). The edges
        are dp_accounting's contract: nothing composed is (0, delta)-DP at every delta in [0, 1], a non-private
        event (an infinite curve) is (inf, delta) at every delta, and at delta = 1 anything is (0, 1)-DP."""
        check_range("target_delta", target_delta, 0.0, 1.0)
        first = float(self._orders[0])
        if self._tail == 0 and not self._rdp.any():
            return 0.0, first
        if self._tail >= target_delta or np.isinf(self._rdp).all():
            return math.inf, first
        if target_delta == 1:
            return 0.0, first
        return rdp_to_epsilon(self._orders, self._rdp, target_delta - self._tail, self._conversion)

    def get_epsilon(self, target_delta: float) -> float:
        return self.get_epsilon_and_optimal_order(target_delta)[0]

    @property
    def conversion(self) -> str:
        return self._conversion

    @property
    def orders(self) -> np.ndarray:
        return self._orders.copy()

    @property
    def rdp(self) -> np.ndarray:
        return self._rdp.copy()


def _check_orders(orders) -> np.ndarray:
    orders = np.asarray(orders, dtype=float)
    if orders.ndim != 1 or orders.size == 0 or not np.all(np.isfinite(orders)) or not np.all(orders > 1):
        raise ConfigError("orders", orders.tolist(), "a non-empty 1-D array of finite RDP orders > 1")
    return orders


class _EventKey:
    """Hashable stand-in for an event (``ComposedDpEvent`` holds a list, so events are not always hashable)."""

    __slots__ = ("event", "_repr")

    def __init__(self, event):
        self.event, self._repr = event, repr(event)

    def __hash__(self):
        return hash(self._repr)

    def __eq__(self, other):
        return isinstance(other, _EventKey) and self._repr == other._repr


@functools.lru_cache(maxsize=4096)
def _cached_curve(key: _EventKey, orders: tuple, relation, bound: str) -> np.ndarray:
    curve = _compute_curve(key.event, np.array(orders), relation, bound)
    curve = np.where(np.isnan(curve), np.inf, curve)  # NaN means "no bound", never 0
    curve.setflags(write=False)
    return curve


def _curve(event, orders: np.ndarray, relation, bound: str) -> np.ndarray:
    return _cached_curve(_EventKey(event), tuple(orders.tolist()), relation, bound)


def _compute_curve(event, orders: np.ndarray, relation, bound: str) -> np.ndarray:
    error = composition_error(event, relation)
    if error is not None:
        raise privacy_accountant.UnsupportedEventError(error)
    if isinstance(event, dp_event.NoOpDpEvent) or (isinstance(event, dp_event.SelfComposedDpEvent) and not event.count):
        return np.zeros_like(orders)
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return event.count * _curve(event.event, orders, relation, bound)
    if isinstance(event, dp_event.ComposedDpEvent):
        return sum((_curve(e, orders, relation, bound) for e in event.events), np.zeros_like(orders))
    if isinstance(event, ParticipationDpEvent):
        return participation_rdp(event.probability, _curve(event.event, orders, relation, bound), orders)
    if isinstance(event, DisjointUnionDpEvent):
        return np.max([_curve(e, orders, relation, bound) for e in event.events], axis=0, initial=0.0)
    if isinstance(event, LabelledMixtureDpEvent):
        return labelled_mixture_rdp(event.weights, [_curve(e, orders, relation, bound) for e in event.events], orders)
    if isinstance(event, WorstOwnerDpEvent):  # outside a ledger, which accounts each owner (``dpfl.accounting.owners``)
        return _curve(event.bound, orders, relation, bound)
    if isinstance(event, dp_event.SampledWithoutReplacementDpEvent):
        return _sampled_without_replacement_curve(event, orders, bound)
    if isinstance(event, SkellamDpEvent):
        return _interpolate_integer_orders(lambda ints: skellam_rdp(event, ints), orders)
    if isinstance(event, DiscreteGaussianDpEvent):
        return discrete_gaussian_rdp(event, orders)
    if isinstance(event, BinomialSumDpEvent):
        return _interpolate_integer_orders(lambda ints: binomial_sum_rdp(*_binomial_fields(event), ints), orders)
    if _general_poisson(event, relation):
        return _poisson_sampled_curve(event, orders, bound)
    accountant = rdp_privacy_accountant.RdpAccountant(orders, _leaf_relation(event, relation))
    return accountant.compose(event).rdp


def _binomial_fields(event: BinomialSumDpEvent) -> tuple:
    return event.trials, event.probability, event.dimension, event.grid, event.l2_shift


def tail_delta(event: dp_event.DpEvent) -> float:
    """The delta an event's RDP curve leaves out (approximate RDP, Bun & Steinke 2016 Def. 8.1; adaptive composition
    adds them, Lemma 8.3): 0 for every RDP event, ``binomial_sum_tail`` for ``BinomialSumDpEvent``. A participation
    mixture (1 - p) R + p P with P <= G + t is <= (1 - p) R + p G + p t: p t."""
    if isinstance(event, BinomialSumDpEvent):
        return binomial_sum_tail(*_binomial_fields(event))
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return event.count * tail_delta(event.event)
    if isinstance(event, dp_event.ComposedDpEvent):
        return sum(tail_delta(e) for e in event.events)
    if isinstance(event, DisjointUnionDpEvent):
        return max((tail_delta(e) for e in event.events), default=0.0)
    if isinstance(event, ParticipationDpEvent):
        return event.probability * tail_delta(event.event)
    if isinstance(event, LabelledMixtureDpEvent):
        return sum(w * tail_delta(e) for w, e in zip(event.weights, event.events))
    if isinstance(event, WorstOwnerDpEvent):
        return tail_delta(event.bound)
    return 0.0


def _leaf_relation(event, relation):
    """The relation dp_accounting accounts ``event`` under: ``relation`` if given, else the first it supports."""
    candidates = _LEAF_RELATIONS if relation is None else (relation,)
    for candidate in candidates:
        if rdp_privacy_accountant.RdpAccountant([2.0], candidate).supports(event):
            return candidate
    return None


def _general_poisson(event, relation) -> bool:
    """Poisson sampling around an event whose Poisson-sampled curve dp_accounting does not compute."""
    return isinstance(event, dp_event.PoissonSampledDpEvent) and _leaf_relation(event, relation) is None


def _poisson_sampled_curve(event: dp_event.PoissonSampledDpEvent, orders, bound: str):
    q = event.sampling_probability
    inner = functools.partial(_curve, event.event, relation=NeighborRel.ADD_OR_REMOVE_ONE, bound=bound)
    curve = _interpolate_integer_orders(lambda ints: poisson_subsampled_rdp(q, inner(orders=ints)), orders)
    if bound == "paper":
        return curve
    return np.minimum(curve, participation_rdp(q, inner(orders=orders), orders))


def _sampled_without_replacement_curve(event: dp_event.SampledWithoutReplacementDpEvent, orders, bound: str):
    n, m = event.source_dataset_size, event.sample_size
    if not (isinstance(n, numbers.Integral) and isinstance(m, numbers.Integral) and 0 <= m <= n and n >= 1):
        raise ConfigError("sample_size / source_dataset_size", f"{m} / {n}", "integers with 0 <= sample <= population")
    if m == 0:
        return np.zeros_like(orders)
    if m == n:
        return np.array(_curve(event.event, orders, NeighborRel.REPLACE_ONE, bound))
    q = m / n

    def integer_curve(ints):
        inner = _curve(event.event, ints, NeighborRel.REPLACE_ONE, bound)
        general = wang_subsampled_rdp(q, inner)
        if bound == "paper":
            return general
        # Subsampling never hurts: couple the samples of neighbouring datasets on the same index set; each coupled
        # pair differs in at most one record, and exp((a-1) D_a) is jointly convex, so the subsampled mechanism's RDP
        # is at most the inner one's. The general bound can exceed it (its j >= 3 terms do not vanish as the noise
        # grows: Noble et al.'s "saturation"), so take the smaller of the two at every order. Around a Gaussian, Wang et
        # al.'s Gaussian-specific Thm 27 (dp_accounting) is a third valid bound.
        tight = np.minimum(general, inner)
        if isinstance(event.event, dp_event.GaussianDpEvent) and event.event.noise_multiplier > 0:
            low = ints[ints <= THM27_MAX_ORDER]
            specific = wang_gaussian_subsampled_rdp(q, event.event.noise_multiplier, low.size + 1)
            tight[: low.size] = np.minimum(tight[: low.size], specific)
        return tight

    curve = _interpolate_integer_orders(integer_curve, orders)
    if bound == "paper":
        return curve
    return np.minimum(curve, _curve(event.event, orders, NeighborRel.REPLACE_ONE, bound))  # at non-integer orders too


def discrete_gaussian_rdp(event: DiscreteGaussianDpEvent, orders) -> np.ndarray:
    """a / (2 z_eff^2) at ``orders`` (any a > 1), z_eff = z 2^k / (2^k + sqrt(d)): the zCDP curve of the rounded
    discrete Gaussian mechanism (derived in ``DiscreteGaussianDpEvent``'s docstring)."""
    check_range("noise_multiplier", event.noise_multiplier, 0.0, low_open=True)
    check_range("grid_bits", event.grid_bits, 0, integer=True)
    check_range("dimension", event.dimension, 1, integer=True)
    return np.asarray(orders, dtype=float) / (2 * event.effective_multiplier**2)


def participation_rdp(probability: float, inner: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """RDP of ``ParticipationDpEvent(probability, inner mechanism)``: log(1 - p + p exp((a - 1) eps_in(a))) / (a - 1),
    in log space (joint convexity of exp((a - 1) D_a); exact for an observer who knows whether the owner took part)."""
    if not 0 <= probability <= 1:
        raise ConfigError("probability", probability, "a participation probability in [0, 1]")
    inner = np.asarray(inner, dtype=float)
    if probability == 0:
        return np.zeros_like(inner)
    if probability == 1:
        return inner.copy()
    with np.errstate(invalid="ignore"):
        log_moment = np.logaddexp(math.log1p(-probability), math.log(probability) + (orders - 1) * inner)
    return log_moment / (orders - 1)


def labelled_mixture_rdp(weights, curves, orders: np.ndarray) -> np.ndarray:
    """RDP of ``LabelledMixtureDpEvent``: log(sum_k w_k exp((a - 1) eps_k(a))) / (a - 1), in log space (the label
    shown: exact; hidden: an upper bound, by the joint convexity of exp((a - 1) D_a))."""
    orders = np.asarray(orders, dtype=float)
    terms = [math.log(w) + (orders - 1) * np.asarray(c, dtype=float) for w, c in zip(weights, curves) if w > 0]
    with np.errstate(invalid="ignore"):
        return np.logaddexp.reduce(terms, axis=0) / (orders - 1)


def wang_subsampled_rdp(q: float, inner: np.ndarray) -> np.ndarray:
    """Wang, Balle, Kasiviswanathan 2019, Thm 9: RDP at orders 2..A of a mechanism with RDP ``inner`` at 2..A
    run on a uniformly sampled fraction ``q`` of the data without replacement (replace-one neighbouring).

    Uses min{2, (e^{eps(inf)} - 1)^j} <= 2, valid for any mechanism. Computed in log space.
    """
    inner = np.asarray(inner, dtype=float)
    a = np.arange(2, inner.size + 2, dtype=float)[:, None]
    j = a.T
    eps_j = inner[None, :]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        log_binom = gammaln(a + 1) - gammaln(j + 1) - gammaln(a - j + 1)
        eps_2 = inner[0]
        log_second = min(math.log(4) + eps_2 + np.log(-np.expm1(-eps_2)), math.log(2) + eps_2)
        log_factor = np.where(j == 2, log_second, math.log(2) + (j - 1) * eps_j)
        terms = np.where(j <= a, j * math.log(q) + log_binom + log_factor, -np.inf)
    log_moment = np.logaddexp(0.0, logsumexp(terms, axis=1))
    return log_moment / (a[:, 0] - 1)


#: What the Gaussian's even forward differences add to their quadrature in log (``gaussian_even_differences_in_log``):
#: 100 times the largest error measured against an 800-digit reference.
QUADRATURE_MARGIN = 1e-10


def gaussian_even_differences_in_log(sigma: float, max_order: int) -> np.ndarray:
    """log Delta^{2m} for 2m = 0, 2, 4, ..., <= max_order (index m): the even forward differences at 0 of the
    sequence g(k) = e^{c(k - 1)}, c(x) = x (x + 1) / (2 sigma^2) the Gaussian's cumulant (Wang, Balle,
    Kasiviswanathan 2019, Thm 27), plus ``QUADRATURE_MARGIN``: upper bounds.

    As alternating sums sum_k (-1)^{j-k} C(j, k) g(k) they cancel, and float64 loses them: at sigma = 19.2
    dp_accounting's value of a high-order difference is rounding noise e^{215} times the exact one, and some are
    below it. Written with e^{t k^2} = E[e^{k sqrt(2t) Z}] (t = 1 / (2 sigma^2), Z standard normal), the sum is an
    expectation,

        Delta^j = E[(e^Y - 1)^j],    Y ~ N(mu, sd^2),  mu = -1 / (2 sigma^2),  sd = 1 / sigma

    (e^Y is the Gaussian mechanism's likelihood ratio, of mean one), whose integrand f is non-negative for even j: no
    cancellation. On each side of 0, log f = j log|e^y - 1| + log phi(y) is concave with curvature at least 1 / sd^2,
    so its mass lies within 40 sd of the side's peak (``_side_peaks``) but for a fraction e^{-800}. When the two
    peaks are within 320 sd, one trapezoid rule of step sd / 40 runs from 40 sd below the lower one to 40 sd above the
    upper one: f is entire, so the rule's error is far below float64's (measured within 1e-12 in log of an 800-digit
    reference for sigma from 0.7 to 240 and orders up to 256). Farther apart (small sigma, high order) the positive
    side is integrated around its peak and the negative side bounded by P(Y < 0) <= 1, which is then negligible."""
    mean, sd = -0.5 / sigma**2, 1.0 / sigma
    step = sd / 40.0
    log_normaliser = math.log(step) - math.log(sd * math.sqrt(2.0 * math.pi))
    orders = np.arange(2, max_order + 1, 2)
    low, high = _side_peaks(orders.astype(float), mean, sd)
    out = [0.0]
    for j, lower, upper in zip(orders, low, high):
        together = upper - lower <= 320.0 * sd
        y = np.arange((lower if together else upper) - 40.0 * sd, upper + 40.0 * sd + step, step)
        with np.errstate(divide="ignore"):
            log_distance = np.where(y > 0, y + np.log1p(-np.exp(-np.abs(y))), np.log(-np.expm1(np.minimum(y, 0.0))))
        value = logsumexp(j * log_distance - 0.5 * ((y - mean) / sd) ** 2) + log_normaliser
        out.append((value if together else np.logaddexp(value, 0.0)) + QUADRATURE_MARGIN)
    return np.array(out)


def _side_peaks(orders: np.ndarray, mean: float, sd: float) -> tuple[np.ndarray, np.ndarray]:
    """For each order j, where j log|e^y - 1| - (y - mean)^2 / (2 sd^2) peaks on y < 0 and on y > 0: the roots of
    its derivative, decreasing on each side, by bisection (to a thousandth of sd) from brackets where it changes
    sign (below: e^y / (1 - e^y) <= 0.59 for y <= -1; above: e^y / (e^y - 1) < 2 for y > log 2)."""
    def negative_side(y):
        return -orders * np.exp(y) / -np.expm1(y) - (y - mean) / sd**2

    def positive_side(y):
        return orders / -np.expm1(-y) - (y - mean) / sd**2

    peaks = []
    for slope, lo, hi in ((negative_side, min(mean, -1.0) - orders * sd**2 - 1.0, np.zeros_like(orders)),
                          (positive_side, np.zeros_like(orders), np.maximum(mean + 2.0 * orders * sd**2 + 1.0, 1.0))):
        lo, hi = np.broadcast_to(lo, orders.shape).copy(), hi.copy()
        with np.errstate(divide="ignore", invalid="ignore"):
            while np.max(hi - lo) > 1e-3 * sd:
                middle = 0.5 * (lo + hi)
                rising = slope(middle) > 0
                lo, hi = np.where(rising, middle, lo), np.where(rising, hi, middle)
        peaks.append(0.5 * (lo + hi))
    return peaks[0], peaks[1]


def wang_gaussian_subsampled_rdp(q: float, sigma: float, max_order: int) -> np.ndarray:
    """Wang, Balle, Kasiviswanathan 2019, Thm 27: RDP at the integer orders 2..``max_order`` of the Gaussian mechanism
    (noise multiplier ``sigma``) run on a uniformly sampled fraction ``q`` of the data without replacement
    (replace-one neighbouring). With c(x) = x (x + 1) / (2 sigma^2) the Gaussian's cumulant at order x + 1 and
    Delta^j the j-th forward difference of e^{c} at 0, order a's moment is

        1 + q^2 C(a,2) min{4 (e^{eps(2)} - 1), 2 e^{eps(2)}}
          + sum_{j=3..a} q^j C(a,j) min{4 sqrt(Delta^{2 floor(j/2)} Delta^{2 ceil(j/2)}), 2 e^{c(j-1)}},

    term for term what dp_accounting's ``_compute_rdp_sample_wor_gaussian`` evaluates, with the forward differences
    from an expectation without cancellation (``gaussian_even_differences_in_log``: dp_accounting's float64 alternating
    sums can be below the exact ones) and a margin on the log moment for its own rounding: an upper bound. For all
    orders at once: the differences do not depend on the order (6 s up to 256 in dp_accounting, 0.05 s here). The
    general bound's factor 2 e^{c(j-1)} does not vanish as sigma grows, which put a floor under epsilon when only
    orders <= 32 had this bound."""
    sigma2 = 2.0 * sigma**2

    def cgf(x):
        return x * (x + 1.0) / sigma2

    even = gaussian_even_differences_in_log(sigma, max_order + 1)  # even[m] = log Delta^{2m}
    j = np.arange(2, max_order + 1, dtype=float)
    eps_2 = 2.0 / sigma2
    second = min(math.log(4) + eps_2 + math.log(-math.expm1(-eps_2)), eps_2 + math.log(2))
    even_lo, even_hi = even[np.floor(j / 2).astype(int)], even[np.ceil(j / 2).astype(int)]
    factor = np.where(j == 2, second, np.minimum(math.log(4) + 0.5 * (even_lo + even_hi), math.log(2) + cgf(j - 1)))
    a = j[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_binom = gammaln(a + 1) - gammaln(j + 1) - gammaln(a - j + 1)
        terms = np.where(j[None, :] <= a, j * math.log(q) + log_binom + factor[None, :], -np.inf)
        # the log terms' rounding (gammaln's ~1e-15 relative, the sums, logsumexp): within 1e-12 (1 + the largest
        # |term|) of their log-sum, so the sum of the terms is inflated by that much
        margin = 1e-12 * (1.0 + np.max(np.where(np.isfinite(terms), np.abs(terms), 0.0), axis=1))
    log_moment = np.logaddexp(0.0, logsumexp(terms, axis=1) + margin)
    return log_moment / (j - 1)


def _interpolate_integer_orders(integer_curve, orders: np.ndarray) -> np.ndarray:
    """Curve at ``orders`` from its values at integer orders, by convexity of the cumulant (a - 1) eps(a) in a.

    ``integer_curve(ints)`` gives eps at ``ints`` = 2, 3, ..., ceil(max order) (all of them, in this order).
    For a in (1, 2) the bound is eps(2).
    """
    ints = np.arange(2, math.ceil(orders.max()) + 1, dtype=float)
    cumulant = np.concatenate([[0.0], (ints - 1) * integer_curve(ints)])  # index k holds order k + 1
    lo, hi = np.floor(orders).astype(int), np.ceil(orders).astype(int)
    t = orders - lo
    with np.errstate(invalid="ignore"):
        interpolated = np.where(t == 0, cumulant[lo - 1], (1 - t) * cumulant[lo - 1] + t * cumulant[hi - 1])
    return interpolated / (orders - 1)


__all__ = ["SUBSAMPLING_BOUNDS", "DEFAULT_ORDERS", "rdp_curve", "composition_error", "tail_delta", "RdpAccountant",
           "participation_rdp", "wang_subsampled_rdp", "discrete_gaussian_rdp"]
