"""Privacy loss distribution (PLD) accounting over dp_accounting's ``PrivacyLossDistribution``.

The PLD accountant (Koskela et al. 2020; Doroshenko et al. 2022, "Connect the dots"; dp_accounting docs,
https://github.com/google/differential-privacy/tree/main/python/dp_accounting) composes discretised privacy loss
distributions by FFT and reads epsilon(delta) off the composition: tight up to the discretisation.

``pld_of(event)`` builds the PLD of an event recursively:

* composition (``ComposedDpEvent``, ``SelfComposedDpEvent``) convolves PLDs;
* ``ParticipationDpEvent(p, inner)`` is the mixture (1 - p) identity + p PLD(inner): with probability 1 - p the
  owner is absent and the privacy loss is 0, else it is the inner event's. This is the exact PLD of the pair where the
  observer learns whether the owner took part, which dominates any observer who does not (joint convexity of the
  hockey-stick divergence); ``LabelledMixtureDpEvent`` is likewise sum_k w_k PLD_k;
* a restarted tree's epoch (``SingleEpochTreeAggregationDpEvent``, zero-out) is the Gaussian mechanism it is
  (``tree_as_gaussian``);
* a batch of b of n records drawn without replacement around the Gaussian mechanism
  (``SampledWithoutReplacementDpEvent(n, b, GaussianDpEvent(z))``, replace-one) is the Poisson-subsampled Gaussian at
  rate b / n under add/remove (``without_replacement_as_poisson``, derived there);
* one coordinate of the Skellam mechanism (alone or Poisson-sampled) and of the binomial summation with p = 1/2
  have their exact PLDs on the integer lattice (``dpfl.accounting.discrete_pld``, the rounding charged);
* a Gaussian and a Poisson-subsampled Gaussian are dp_accounting's PLDs built with their connect-the-dots grid
  computed at once (``dpfl.accounting.gaussian_pld``: the same numbers, 10-30x faster: a run's first round);
* every other event is handed to dp_accounting's ``PLDAccountant`` (Laplace, discrete Laplace, randomized response,
  mixtures of Gaussians, Poisson sampling around Laplace).

**Replace-one Gaussians.** dpfl's convention (``dpfl.accounting.events``): ``GaussianDpEvent(z)`` under replace-one
neighbouring has std z times the replace-one sensitivity (the distance between the statistic on the two datasets).
dp_accounting's PLD reads a replace-one Gaussian as two sensitivities apart (its RDP accountant does not), so this
module hands it ``GaussianDpEvent(2 z)``; both accountants then agree (tests check PLD <= RDP on every event both
support).

Discretisation: privacy losses are rounded to a grid of step ``VALUE_DISCRETIZATION_INTERVAL`` = 1e-4 (dp_accounting's
default). At 1e-4 every PLD number of the accounting test vectors comes out within 1e-3 relative (checked by
tests/accounting/test_vectors.py); at 1e-3 they are up to 1.6% too high, at 1e-2 up to 80%. Losses are rounded
*pessimistically* (up), so the epsilon reported is an upper bound on the true one, not merely an estimate.

Size guard: a PLD spans its privacy losses on that grid, so an event with huge losses (tiny noise, many
compositions: epsilon in the hundreds or more) would take minutes and gigabytes to build. ``estimated_points`` reads
the span off the event's RDP curve before anything is built: the log moment generating function of the privacy loss
L is (a - 1) eps(a), so by Chernoff's bound P(L > t) <= exp((a - 1)(eps(a) - t)) and the losses above
min_a eps(a) + log(1/tau) / (a - 1) (the classic conversion at delta = tau, Mironov 2017, Prop. 3) carry mass at most
tau; dp_accounting truncates the same tails (Doroshenko et al. 2022) when it sizes its convolutions. ``pld_of``
refuses (``PldTooLargeError``, which names the RDP accountant) an event whose estimate exceeds ``MAX_POINTS``. The
estimate is a minimum over the orders, so the same minimum over a few of them, the integer orders whose curves are
cheap (``_QUICK_ORDERS``; the fractional ones near 1 cost a slowly converging series each, 0.1-0.3 s for a subsampled
Gaussian), bounds it from above: where that bound is within ``MAX_POINTS``, so is the estimate, and the full curve is
not computed (``within_max_points``: the same decision, at a run's first round mostly).

Not supported: sampling without replacement around anything but one Gaussian (use the RDP accountant,
``accountant="rdp"``), dpfl's disjoint-union events, Skellam and binomial events of several coordinates
(``dpfl.accounting.discrete_pld`` says why).
"""

from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict

import attr
import numpy as np
from dp_accounting import dp_event, privacy_accountant
from dp_accounting.pld import pld_pmf, pld_privacy_accountant, privacy_loss_distribution

from dpfl.accounting import discrete_pld, gaussian_pld, pld_power
from dpfl.accounting.conversion import rdp_to_epsilon
from dpfl.accounting.events import LabelledMixtureDpEvent, ParticipationDpEvent
from dpfl.accounting.rdp import composition_error, rdp_curve
from dpfl.errors import ConfigError, check_range

NeighborRel = privacy_accountant.NeighboringRelation

#: Grid step of the discretised privacy losses (see the module docstring).
VALUE_DISCRETIZATION_INTERVAL = 1e-4

#: The most grid points a PLD may span (``estimated_points``). Building a leaf in dp_accounting's connect-the-dots loop
#: costs 2-5 us per point on one core, so a PLD within it takes at most about 10 s (a Gaussian leaf, built by
#: ``gaussian_pld``, 10-30x less; its self-compositions' FFTs, 16 bytes a point, stay).
MAX_POINTS = 2_000_000
#: Tail mass below which losses need no grid points (dp_accounting's truncation of self-compositions).
TAIL_MASS = 1e-15
#: RDP orders of the size estimate: a few near 1 (where the optimum lies when the losses are huge) and integers.
_SIZE_ORDERS = np.array([1.05, 1.1, 1.25, 1.5, 1.75, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64, 128, 256, 512,
                         1024], dtype=float)
#: Some of ``_SIZE_ORDERS``, integers: their minimum bounds the estimate from above (``within_max_points``)
_QUICK_ORDERS = np.array([2, 4, 8, 16, 32, 64], dtype=float)

#: (repr(event), relation, interval) -> PLD, least recently used first; PLDs are never modified in place. Every
#: part of a composition is cached too (``_build``), so the ledger's round t, SelfComposed(round event, t), reuses the
#: round event's PLD built at round 1 and only self-composes it (``dpfl.accounting.pld_power``, which also keeps the
#: round event's Chernoff moments): the same operations on the same operands as building it afresh, so the same
#: numbers. The cache holds at most ``_CACHE_SIZE`` PLDs (the least recently used goes) and ``_CACHE_POINTS`` grid
#: points in all (8 bytes each; the largest PLDs go first): a ledger's t-fold compositions grow with t (10^6 points
#: and more, each used once), and 64 of them held 1.5 GB, while its round events are small and used every round.
_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 64
_CACHE_POINTS = 6_000_000
#: held while absl's logger is quieted for a size estimate (``_points_at``; ``pld.tractable`` may run on two threads:
#: ``dpfl.accounting.ledger`` reads epsilon on a background thread)
_QUIET = threading.Lock()


def supports(event: dp_event.DpEvent, neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE) -> bool:
    """Whether ``pld_of`` can build the PLD of ``event`` under ``neighboring_relation``."""
    return _unsupported(event, neighboring_relation) is None


class PldTooLargeError(ConfigError):
    """The PLD of an event would span more than ``MAX_POINTS`` grid points; ``points`` is the estimate."""

    def __init__(self, points: float, interval: float = VALUE_DISCRETIZATION_INTERVAL):
        self.points, self.losses = points, points * interval
        super().__init__(
            "accountant", "pld",
            f"'rdp' for this event: its privacy losses reach about {self.losses:.3g}, so its PLD would span about "
            f"{points:.2g} grid points of {interval:g} (more than pld.MAX_POINTS = {MAX_POINTS:.0e}: minutes and "
            "gigabytes); at such epsilons RDP is within a few per cent of PLD and is computed at once")


def estimated_points(event: dp_event.DpEvent, neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
                     value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL) -> float:
    """About how many grid points the PLD of ``event`` spans: its privacy losses above ``TAIL_MASS`` (the Chernoff
    bound of the module docstring, from the RDP curve) divided by the grid step; within a factor of about 3 of the
    real size. 0 when the RDP curve cannot tell (no RDP bound, or a non-private part: ``pld_of`` answers those at
    once)."""
    return _points_at(_SIZE_ORDERS, event, neighboring_relation, value_discretization_interval)


def _points_at(orders: np.ndarray, event: dp_event.DpEvent, neighboring_relation: NeighborRel,
               value_discretization_interval: float) -> float:
    """``estimated_points``'s Chernoff estimate minimised over ``orders`` only."""
    if composition_error(event, neighboring_relation) is not None or _non_private(event):
        return 0.0
    absl = logging.getLogger("absl")  # dp_accounting logs orders whose series does not converge: an estimate needs none
    with _QUIET:  # the level is process-wide: two threads' estimates would restore each other's
        level = absl.level
        absl.setLevel(logging.ERROR)
        try:
            curve = rdp_curve(event, orders, neighboring_relation)
        finally:
            absl.setLevel(level)
    losses, _ = rdp_to_epsilon(orders, curve, TAIL_MASS, "classic")
    return losses / value_discretization_interval


def within_max_points(event: dp_event.DpEvent, neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
                      value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL) -> bool:
    """``estimated_points(...) <= MAX_POINTS``, decided by the estimate at ``_QUICK_ORDERS`` where that is within
    it (an upper bound on the estimate, a minimum over more orders; a margin of 1e-9 for rounding), else by the
    estimate itself (module docstring)."""
    if _quickly_within_max_points(event, neighboring_relation, value_discretization_interval):
        return True
    return estimated_points(event, neighboring_relation, value_discretization_interval) <= MAX_POINTS


def _quickly_within_max_points(event: dp_event.DpEvent, neighboring_relation: NeighborRel,
                               value_discretization_interval: float) -> bool:
    """``within_max_points``'s first test: the estimate at ``_QUICK_ORDERS`` (a bound on it) within ``MAX_POINTS``."""
    return _points_at(_QUICK_ORDERS, event, neighboring_relation,
                      value_discretization_interval) <= MAX_POINTS * (1 - 1e-9)


def surely_tractable(event: dp_event.DpEvent, neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
                     value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL) -> bool:
    """A sufficient condition for ``tractable`` at the cost of six integer orders' RDP curve (never the slowly
    converging fractional orders): supported, and within ``MAX_POINTS`` by the estimate at ``_QUICK_ORDERS``."""
    return supports(event, neighboring_relation) and \
        _quickly_within_max_points(event, neighboring_relation, value_discretization_interval)


def check_target(target_epsilon: float) -> None:
    """PldTooLargeError for a calibration to ``target_epsilon`` above ``MAX_POINTS`` grid steps: the PLD at its answer
    spans privacy losses beyond epsilon (delta > ``TAIL_MASS``), so it would exceed ``MAX_POINTS``."""
    if target_epsilon > MAX_POINTS * VALUE_DISCRETIZATION_INTERVAL:
        raise PldTooLargeError(target_epsilon / VALUE_DISCRETIZATION_INTERVAL)


def tractable(event: dp_event.DpEvent, neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
              value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL) -> bool:
    """Whether ``pld_of`` builds the PLD of ``event`` (it is supported and within ``MAX_POINTS``)."""
    return supports(event, neighboring_relation) and \
        within_max_points(event, neighboring_relation, value_discretization_interval)


def pld_of(
    event: dp_event.DpEvent,
    neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
    value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL,
) -> privacy_loss_distribution.PrivacyLossDistribution | None:
    """The PLD of ``event`` (see the module docstring); None for an event that is not private at all.

    Raises:
      ConfigError (field ``accountant``) if some part of ``event`` has no PLD here; the message names it and suggests
      ``accountant="rdp"``. PldTooLargeError (a ConfigError) if the PLD would span more than ``MAX_POINTS`` grid
      points.
    """
    problem = _unsupported(event, neighboring_relation)
    if problem is not None:
        raise ConfigError(
            "accountant", "pld",
            f"'rdp' for this event: the PLD accountant cannot compose {problem} under {neighboring_relation.name}")
    if (repr(event), neighboring_relation, value_discretization_interval) not in _CACHE and \
            not within_max_points(event, neighboring_relation, value_discretization_interval):
        raise PldTooLargeError(estimated_points(event, neighboring_relation, value_discretization_interval),
                               value_discretization_interval)
    return _cached(event, neighboring_relation, value_discretization_interval)


def _cached(event, relation, interval):
    """``_build(event)`` from ``_CACHE`` (a run accounts the same round event, and its parts, again and again)."""
    key = (repr(event), relation, interval)
    if key in _CACHE:
        _CACHE.move_to_end(key)
        return _CACHE[key]
    pld = _build(event, relation, interval)
    _CACHE[key] = pld
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    sizes = {k: _points(v) for k, v in _CACHE.items()}
    while sum(sizes.values()) > _CACHE_POINTS:  # the largest first: a ledger's t-fold compositions, not round events
        largest = max(sizes, key=sizes.get)
        del _CACHE[largest], sizes[largest]
    return pld


def _points(pld) -> int:
    """Grid points a cached PLD holds (both directions; a sparse PMF, or another layout, counts 0)."""
    if pld is None:
        return 0
    pmfs = (getattr(pld, "_pmf_remove", None), None if getattr(pld, "_symmetric", True) else pld._pmf_add)
    return sum(len(getattr(pmf, "_probs", ())) for pmf in pmfs if pmf is not None)


#: Losses per block of ``_dense_epsilon_for_delta`` (the scan usually stops in its first blocks)
_SCAN_BLOCK = 8192


def epsilon_for_delta(pld: privacy_loss_distribution.PrivacyLossDistribution, delta: float) -> float:
    """``pld.get_epsilon_for_delta(delta)``, bit for bit, with each dense PMF scanned block by block in numpy
    (``_dense_epsilon_for_delta``) where dp_accounting loops over its points in Python (~0.1 s per PMF of 10^5
    points): the larger of the two directions' epsilons (the remove one alone for a symmetric PLD)."""
    try:  # dp_accounting's private layout (0.6.0); any other: its own loop
        pmfs = [pld._pmf_remove] if pld._symmetric else [pld._pmf_remove, pld._pmf_add]
        return max(_dense_epsilon_for_delta(pmf, delta) if isinstance(pmf, pld_pmf.DensePLDPmf)
                   else pmf.get_epsilon_for_delta(delta) for pmf in pmfs)
    except AttributeError:
        return pld.get_epsilon_for_delta(delta)


def _dense_epsilon_for_delta(pmf: pld_pmf.DensePLDPmf, delta: float) -> float:
    """dp_accounting's ``pld_pmf._get_epsilon_for_delta`` on a dense PMF, the same floating-point operations in the
    same order: from the largest loss l_k down (l_0 the top, l_{k+1} = l_k - interval by repeated addition, as its
    ``itertools.count``), the running masses U_k = inf_mass + p_0 + ... + p_{k-1} and L_k = sum_{i<k} e^{-l_i} p_i
    (sequential sums: ``np.add.accumulate``; e^{-l} from the C library, ``math.exp``, as there); the scan stops at
    the first k with U_k > delta, L_k > 0 and log((U_k - delta)/L_k) >= l_k (then eps = log((U_k - delta)/L_k), or
    0 if U_k <= L_k + delta), or returns max(0, l_k) at the first k with U_{k+1} >= delta and L_{k+1} = 0. numpy's
    log picks the candidate stops (with a margin: it may differ from the C library's in the last bit), ``math.log``
    decides each in order. Any overflow of e^{-l} hands the PMF to dp_accounting itself (it raises, or stops first).
    The e^{-l} are numpy's where numpy's exp is the C library's (``_EXP_IS_LIBM``: x86 numpy without AVX-512 calls
    it), 20x faster than a Python call per point; elsewhere ``math.exp``'s."""
    infinity_mass = pmf._infinity_mass
    if infinity_mass > delta:
        return math.inf
    probs = np.flip(pmf._probs)
    top_loss = (pmf._lower_loss + len(pmf._probs) - 1) * pmf._discretization
    upper, lower, loss = infinity_mass, 0, top_loss  # U_k, L_k, l_k at the start of each block
    for start in range(0, len(probs), _SCAN_BLOCK):
        p = probs[start: start + _SCAN_BLOCK]
        losses = np.add.accumulate(np.concatenate([[loss], np.full(len(p) - 1, -pmf._discretization)]))
        exps = _exp(-losses)
        if exps is None:
            return pmf.get_epsilon_for_delta(delta)
        uppers = np.add.accumulate(np.concatenate([[upper], p]))  # U_k .. U_{k+len}
        lowers = np.add.accumulate(np.concatenate([[lower], exps * p]))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio_log = np.log((uppers[:-1] - delta) / lowers[:-1])
        maybe_stop = (uppers[:-1] > delta) & (lowers[:-1] > 0) & (ratio_log >= losses - 1e-9 * (1 + np.abs(losses)))
        returns = (uppers[1:] >= delta) & (lowers[1:] == 0)
        for k in np.flatnonzero(maybe_stop | returns).tolist():
            u, l_ = float(uppers[k]), float(lowers[k])
            if maybe_stop[k] and math.log((u - delta) / l_) >= float(losses[k]):
                return _final_epsilon(u, l_, delta)
            if returns[k]:
                return max(0, float(losses[k]))
        upper, lower, loss = float(uppers[-1]), float(lowers[-1]), float(losses[-1]) - pmf._discretization
    return _final_epsilon(upper, lower, delta)


def _exp(values: np.ndarray) -> np.ndarray | None:
    """``[math.exp(v) for v in values]`` (the C library's exp), None if one overflows."""
    if _EXP_IS_LIBM:
        with np.errstate(over="ignore"):
            exps = np.exp(values)
        return None if np.isinf(exps).any() else exps
    try:
        return np.fromiter(map(math.exp, values.tolist()), float, len(values))
    except OverflowError:
        return None


def _numpy_exp_is_libm() -> bool:
    """Whether numpy's exp gives the C library's numbers (``math.exp``) on 20,000 points of [-745, 709] (numpy's own
    SIMD exp, with AVX-512, may differ in the last bit: an epsilon then differs by about 1e-16 relative, as a stop
    decided on a tie moves one point, and the stop's epsilon is continuous there; ``math.exp`` is used then)."""
    probe = np.concatenate([np.linspace(-745.0, 709.0, 10_000), np.random.default_rng(0).uniform(-40, 40, 10_000)])
    return bool(np.array_equal(np.exp(probe), np.fromiter(map(math.exp, probe.tolist()), float, len(probe))))


_EXP_IS_LIBM = _numpy_exp_is_libm()


def _final_epsilon(upper: float, lower: float, delta: float) -> float:
    if upper <= lower + delta:
        return 0
    return math.log((upper - delta) / lower)


def pld_epsilon(
    event: dp_event.DpEvent,
    delta: float,
    neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
    value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL,
) -> float:
    """Smallest epsilon with ``event`` (epsilon, delta)-DP by its discretised PLD; +inf if none, never NaN or < 0."""
    pld = pld_of(event, neighboring_relation, value_discretization_interval)
    if pld is None:
        return math.inf
    epsilon = epsilon_for_delta(pld, delta)
    return math.inf if math.isnan(epsilon) else max(0.0, float(epsilon))


def pld_delta(
    event: dp_event.DpEvent,
    epsilon: float,
    neighboring_relation: NeighborRel = NeighborRel.ADD_OR_REMOVE_ONE,
    value_discretization_interval: float = VALUE_DISCRETIZATION_INTERVAL,
) -> float:
    """Smallest delta with ``event`` (epsilon, delta)-DP by its discretised PLD, in [0, 1]."""
    pld = pld_of(event, neighboring_relation, value_discretization_interval)
    if pld is None:
        return 1.0
    delta = pld.get_delta_for_epsilon(epsilon)
    return 1.0 if math.isnan(delta) else min(1.0, max(0.0, float(delta)))


def _non_private(event) -> bool:
    if isinstance(event, dp_event.NonPrivateDpEvent):
        return True
    children = getattr(event, "events", None) or [getattr(event, "event", None)]
    return any(isinstance(e, dp_event.DpEvent) and _non_private(e) for e in children)


def tree_depth(leaves: int) -> int:
    """D = ceil(log2(E + 1)) = floor(log2 E) + 1: the most drawn nodes one leaf of a tree of E leaves lies in (one per
    level; dp_accounting's ``_compute_rdp_single_epoch_tree_aggregation`` counts the same)."""
    check_range("leaves", leaves, 1, integer=True)
    return leaves.bit_length()


def tree_as_gaussian(event: dp_event.SingleEpochTreeAggregationDpEvent) -> dp_event.GaussianDpEvent:
    """GaussianDpEvent(z / sqrt(D)) of a restarted tree's epoch, D = ``tree_depth`` of its longest epoch
    (``_dp_accounting_reading``; dp_accounting's RDP of the event is a D / (2 z^2), the curve of that Gaussian)."""
    steps = event.step_counts if np.ndim(event.step_counts) else [event.step_counts]
    return dp_event.GaussianDpEvent(event.noise_multiplier / math.sqrt(tree_depth(int(max(steps)))))


def without_replacement_as_poisson(event: dp_event.SampledWithoutReplacementDpEvent) -> dp_event.DpEvent | None:
    """``PoissonSampledDpEvent(b / n, GaussianDpEvent(z))``, to be read under add/remove, for a batch of b of n
    records drawn without replacement around ``GaussianDpEvent(z)`` under replace-one; None for any other inner event.

    Derivation (Balle, Barthe, Gaboardi 2018, Thm 10, "advanced joint convexity"; the dominating pair is Zhu, Dong,
    Wang 2022, Prop. 30). Let the neighbours differ in record k and gamma = b / n. Coupling the two batches on the same
    index set, M(D) = (1 - gamma) A + gamma B and M(D') = (1 - gamma) A + gamma B', where A (batches without k) is the
    same under both, and every component of B, and of B', is a replace-one neighbour of a component of A (swap k for a
    uniform index outside the batch) and of each other. Theorem 10 bounds the hockey-stick divergence, in either
    order, by gamma H_{e^eps}(B || (1 - beta) A + beta B') <= gamma delta_G(eps), with
    e^eps = 1 + (e^eps' - 1) / gamma and delta_G the profile of the Gaussian with multiplier z (shift 1, std z, in
    units of the replace-one sensitivity). That is exactly the profile of the pair ((1 - gamma) N(0, z^2) +
    gamma N(1, z^2), N(0, z^2)): H_{e^eps'}((1 - gamma) Q + gamma P || Q) = gamma H_{e^eps}(P || Q). dp_accounting's
    add/remove PLD of the Poisson-subsampled Gaussian is that pair, taken in both orders (the larger delta of the two,
    which only adds), so its epsilon bounds the batch's. It is attained: a client whose other records all have the
    clipped gradient -C, the differing record +C against -C, releases this pair (``tests/helpers/exact.py``,
    ``without_replacement_pair``), so nothing tighter holds for every dataset."""
    if not isinstance(event.event, dp_event.GaussianDpEvent):
        return None
    n, b = event.source_dataset_size, event.sample_size
    if b >= n:
        return event.event
    return dp_event.PoissonSampledDpEvent(b / n, event.event) if b > 0 else dp_event.NoOpDpEvent()


def _without_replacement_gaussian(event, relation) -> bool:
    """Whether ``event`` is a Gaussian sampled without replacement under replace-one
    (``without_replacement_as_poisson``)."""
    return (relation == NeighborRel.REPLACE_ONE and isinstance(event, dp_event.SampledWithoutReplacementDpEvent)
            and without_replacement_as_poisson(event) is not None)


def _unsupported(event, relation) -> str | None:
    """Why ``event`` has no PLD here (the offending sub-event), or None."""
    if _without_replacement_gaussian(event, relation):
        return None
    if isinstance(event, (dp_event.SelfComposedDpEvent, ParticipationDpEvent)):
        return _unsupported(event.event, relation)
    if isinstance(event, (dp_event.ComposedDpEvent, LabelledMixtureDpEvent)):
        return next(filter(None, (_unsupported(e, relation) for e in event.events)), None)
    if discrete_pld.handles(event):
        return discrete_pld.unsupported(event, relation)
    accountant = pld_privacy_accountant.PLDAccountant(relation)
    return None if accountant.supports(_dp_accounting_reading(event, relation)) else repr(event)


def _build(event, relation, interval):
    if isinstance(event, dp_event.NonPrivateDpEvent):
        return None
    if isinstance(event, dp_event.SelfComposedDpEvent):
        inner = _cached(event.event, relation, interval)
        return inner if inner is None or event.count == 1 else (
            privacy_loss_distribution.identity(interval) if event.count == 0 else
            pld_power.self_compose(inner, event.count))
    if isinstance(event, dp_event.ComposedDpEvent):
        total = privacy_loss_distribution.identity(interval)
        for part in event.events:
            pld = _cached(part, relation, interval)
            if pld is None:
                return None
            total = total.compose(pld)
        return total
    if isinstance(event, LabelledMixtureDpEvent):
        mus = [gaussian_mu(e) for e in event.events]
        if all(mu is not None for mu in mus):
            return gaussian_mixture_pld(event.weights, mus, interval)
        return _labelled_mixture([(w, _cached(e, relation, interval)) for w, e in zip(event.weights, event.events)
                                  if w > 0])
    if isinstance(event, ParticipationDpEvent):
        inner = _cached(event.event, relation, interval)
        if inner is None:
            return None if event.probability > 0 else privacy_loss_distribution.identity(interval)
        return inner.compute_mixture(privacy_loss_distribution.identity(interval), event.probability)
    if discrete_pld.handles(event):
        return discrete_pld.pld(event, interval)
    if _without_replacement_gaussian(event, relation):
        return _cached(without_replacement_as_poisson(event), NeighborRel.ADD_OR_REMOVE_ONE, interval)
    reading = _dp_accounting_reading(event, relation)
    gaussian = _gaussian_leaf(reading, relation, interval)
    if gaussian is not None:
        return gaussian
    accountant = pld_privacy_accountant.PLDAccountant(relation, interval)
    accountant.compose(reading)
    if accountant._contains_non_dp_event:  # noqa: SLF001 (dp_accounting keeps this flag private)
        return None
    return accountant._pld  # noqa: SLF001


#: the Gaussian privacy loss's tails beyond this mass go to infinity (upper) or to the lowest grid point (lower)
GAUSSIAN_TAIL = 1e-16
#: a labelled mixture's components of at most this weight are charged as infinite loss (``gaussian_mixture_pld``)
NEGLIGIBLE_WEIGHT = 1e-12


def gaussian_mu(event: dp_event.DpEvent) -> float | None:
    """mu = sum_i 1 / (2 z_i^2) if ``event`` is Gaussian mechanisms composed (their privacy loss is N(mu, 2 mu), the
    composition's too: Dong, Roth, Su 2022, Cor. 3.3, in dpfl's units, where ``GaussianDpEvent(z)`` is noise of z
    times the distance between the neighbours' statistics under any relation); None otherwise."""
    if isinstance(event, dp_event.GaussianDpEvent):
        return 0.5 / event.noise_multiplier**2 if event.noise_multiplier > 0 else None
    if isinstance(event, dp_event.SelfComposedDpEvent):
        inner = gaussian_mu(event.event)
        return None if inner is None else event.count * inner
    if isinstance(event, dp_event.ComposedDpEvent):
        parts = [gaussian_mu(e) for e in event.events]
        return None if any(mu is None for mu in parts) else sum(parts)
    return None


def gaussian_mixture_pld(weights, mus, interval: float) -> privacy_loss_distribution.PrivacyLossDistribution:
    """The PLD of the labelled mixture of Gaussian mechanisms (``LabelledMixtureDpEvent``): sum_k w_k N(mu_k, 2 mu_k),
    the privacy loss of N(1, z_k^2) against N(0, z_k^2) given label k (symmetric: removal and addition alike),
    discretised pessimistically: the mass of each cell ((j - 1) h, j h] at j h (the normal CDF's differences,
    vectorised), the upper tail beyond ``GAUSSIAN_TAIL`` as infinite loss, the lower tail at the lowest point kept, and
    a component of weight at most ``NEGLIGIBLE_WEIGHT`` wholly as infinite loss (it adds its weight to delta; kept, the
    least-noise component of a far tail would widen the grid many times over). Rounding losses up only raises every
    hockey-stick divergence: an upper bound at every epsilon."""
    from scipy import stats

    live = [(w, mu) for w, mu in zip(weights, mus) if w > NEGLIGIBLE_WEIGHT]
    infinity = sum(w for w in weights if w <= NEGLIGIBLE_WEIGHT)
    if not live:
        return privacy_loss_distribution.PrivacyLossDistribution(
            pld_pmf.DensePLDPmf(interval, 0, np.zeros(1), 1.0, pessimistic_estimate=True))
    tail = stats.norm.isf(GAUSSIAN_TAIL)
    lower = math.floor(min(mu - tail * (2 * mu) ** 0.5 for _, mu in live) / interval)
    upper = math.ceil(max(mu + tail * (2 * mu) ** 0.5 for _, mu in live) / interval)
    grid = np.arange(lower, upper + 1)
    probs = np.zeros(grid.size)
    for weight, mu in live:
        cdf = stats.norm.cdf(grid * interval, loc=mu, scale=(2 * mu) ** 0.5)
        cells = np.diff(cdf, prepend=0.0)  # (j - 1) h < L <= j h, and L <= lower h at the lowest point
        probs += weight * cells
        infinity += weight * float(stats.norm.sf(upper * interval, loc=mu, scale=(2 * mu) ** 0.5))
    pmf = pld_pmf.DensePLDPmf(interval, int(lower), probs, infinity, pessimistic_estimate=True)
    return privacy_loss_distribution.PrivacyLossDistribution(pmf)


def _labelled_mixture(parts):
    """sum_k w_k PLD_k (None if a part is not private), folded pairwise: w_1 P_1 + ... as
    (W_k P + w_{k+1} P_{k+1}) / (W_k + w_{k+1})."""
    if any(pld is None for _, pld in parts):
        return None
    (total_weight, total), *rest = parts
    for weight, pld in rest:
        total = total.compute_mixture(pld, total_weight / (total_weight + weight))
        total_weight += weight
    return total


def _gaussian_leaf(event, relation, interval):
    """dp_accounting's ``PLDAccountant``'s PLD of a private Gaussian or Poisson-subsampled Gaussian event, as it
    composes one into its identity PLD (the subsampled one self-composed once, as it does), with the mechanism's PLD
    built by ``gaussian_pld`` (its connect-the-dots grid at once: the same numbers, 10-30x faster); None for any
    other event (dp_accounting builds it)."""
    identity = privacy_loss_distribution.identity(interval)
    if isinstance(event, dp_event.GaussianDpEvent) and event.noise_multiplier > 0:
        return identity.compose(gaussian_pld.gaussian_pld(event.noise_multiplier, 1.0, relation, interval))
    if isinstance(event, dp_event.PoissonSampledDpEvent) and isinstance(event.event, dp_event.GaussianDpEvent) \
            and 0 < event.sampling_probability <= 1 and event.event.noise_multiplier > 0:
        sampled = gaussian_pld.gaussian_pld(event.event.noise_multiplier, event.sampling_probability, relation,
                                            interval)
        return identity.compose(pld_power.self_compose(sampled, 1))  # sampled.self_compose(1), bit for bit
    return None


def _dp_accounting_reading(event, relation):
    """``event`` as dp_accounting's PLD reads dpfl's convention: under replace-one, a Gaussian's noise multiplier is
    relative to the replace-one distance, which dp_accounting's PLD takes to be twice its unit. A restarted tree's
    epoch (``SingleEpochTreeAggregationDpEvent(z, E)``, zero-out only) is the Gaussian mechanism of multiplier
    z / sqrt(D), D = ceil(log2(E + 1)): the curve dp_accounting's RDP accountant gives it, a D / (2 z^2), is that
    Gaussian's, and the tree's release is that Gaussian exactly (``dpfl.algorithms.dp_ftrl``)."""
    if isinstance(event, dp_event.SingleEpochTreeAggregationDpEvent):
        return tree_as_gaussian(event) if relation == NeighborRel.REPLACE_SPECIAL else event
    if relation != NeighborRel.REPLACE_ONE:
        return event
    if isinstance(event, dp_event.GaussianDpEvent):
        return dp_event.GaussianDpEvent(2 * event.noise_multiplier)
    children = {f.name: getattr(event, f.name) for f in attr.fields(type(event))
                if isinstance(getattr(event, f.name), dp_event.DpEvent)}
    if not children:
        return event
    return attr.evolve(event, **{name: _dp_accounting_reading(child, relation) for name, child in children.items()})


__all__ = ["VALUE_DISCRETIZATION_INTERVAL", "MAX_POINTS", "PldTooLargeError", "supports", "estimated_points",
           "within_max_points", "surely_tractable", "check_target", "tractable", "pld_of", "pld_epsilon", "epsilon_for_delta", "pld_delta",
           "tree_depth", "tree_as_gaussian", "without_replacement_as_poisson"]
