"""Calibration: the noise, or the number of steps, that meets a target epsilon; epsilon of a schedule of events.

Epsilon decreases in the noise multiplier and increases in the number of steps, so both are found by a bracket
search (doubling steps) followed by bisection: in log space for the noise, splitting at the secant point of
log epsilon (false position with the Illinois rule, Dowell & Jarratt 1971), and on the integers for the steps.
dp_accounting's ``mechanism_calibration`` does the same with Brent's method at one resolution.

Coarse to fine: the search first runs with cheap, coarse accounting; each finer level takes one Newton step from the
coarser answer (with the coarser slope), overshot by half the tolerance so that it usually brackets the answer at
once, and bisects again. Only the last level is the exact
``account`` call, so the answer is that of the default accountant.

* PLD: grid steps 1e-2, then 1e-3, then ``dpfl.accounting.pld.VALUE_DISCRETIZATION_INTERVAL`` (each 3-10x dearer).
* RDP: the 31 ``COARSE_RDP_ORDERS`` (5x cheaper), then ``dpfl.accounting.rdp.DEFAULT_ORDERS``. ``rdp_curve``
  caches the curves of sub-events, so for ``SelfComposedDpEvent(step, n)`` a new n costs one multiplication of the
  cached curve of ``step`` (RDP is linear in composition, Mironov 2017, Prop. 1): ``max_steps`` needs no coarse
  level, and calibrating the noise of n Poisson-sampled Gaussian steps costs one curve of one step per trial.
"""

from __future__ import annotations

import math
from typing import Callable, Iterable

from dp_accounting import dp_event

from dpfl.accounting import pld
from dpfl.accounting.accountant import NEIGHBORING, AccountingResult, account, check_options
from dpfl.errors import ConfigError, check_range

#: PLD grid steps of the coarse levels, coarsest first.
COARSE_PLD_INTERVALS = (1e-2, 1e-3)
#: RDP orders of the coarse level: few fractional orders (dp_accounting's slow series), same range as DEFAULT_ORDERS.
COARSE_RDP_ORDERS = (1.25, 1.5, 1.75, 2, 2.25, 2.5, 3, 3.5, 4, 4.5, 5, 6, 7, 8, 9, 10, 12, 14, 16, 20, 24, 28, 32, 40,
                     48, 56, 64, 128, 256, 512, 1024)  # fmt: skip
#: The bracket search gives up beyond initial_noise * 2**+-MAX_DOUBLINGS, and beyond 2**MAX_DOUBLINGS steps.
MAX_DOUBLINGS = 40
#: the fraction of a step up in log noise under which log epsilon's fall means a floor (``_bracket``)
STALL = 0.01


def calibrate_noise(
    make_event: Callable[[float], dp_event.DpEvent],
    target_epsilon: float,
    delta: float,
    accountant: str = "pld",
    conversion: str = "classic",
    neighboring: str = "add_remove",
    *,
    initial_noise: float = 1.0,
    rtol: float = 1e-4,
    progress: Callable[[float, float], None] | None = None,
) -> float:
    """The smallest noise multiplier z (to relative precision ``rtol``) with ``make_event(z)`` meeting
    ``target_epsilon`` at ``delta``: ``account(make_event(z), delta, ...)`` is <= ``target_epsilon`` and noise
    z / (1 + rtol) would exceed it.

    Args:
      make_event: noise multiplier -> event; epsilon must decrease as the noise grows.
      target_epsilon: > 0.
      delta, accountant, conversion, neighboring: as for ``account``.
      initial_noise: where the bracket search starts, > 0.
      rtol: relative precision of the answer, in (0, 0.1].
      progress: called with (noise, epsilon) after every trial (e.g. ``dpfl.engine.progress.Heartbeat``).

    Raises:
      pld.PldTooLargeError: with PLD, when its grid near the answer would exceed ``pld.MAX_POINTS`` (a target above
        a few hundred; coarse levels skip such noise unbuilt).
      ConfigError: a parameter is out of range, or no noise in
        [initial_noise / 2**MAX_DOUBLINGS, initial_noise * 2**MAX_DOUBLINGS] separates epsilons above and below the
        target (for example RDP's conversion puts a floor under epsilon: log(1/delta) / (max order - 1) for classic).
    """
    target_epsilon = check_range("target_epsilon", target_epsilon, 0, math.inf, low_open=True, high_open=True)
    delta = check_range("delta", delta, 0, 1, low_open=True, high_open=True)
    check_options(accountant, conversion, neighboring)
    initial_noise = check_range("initial_noise", initial_noise, 0, low_open=True)
    rtol = check_range("rtol", rtol, 0, 0.1, low_open=True)
    if accountant == "pld":
        pld.check_target(target_epsilon)

    center = math.log(initial_noise)
    tol = math.log1p(rtol)
    start, step, slope = center, math.log(2), -1.0
    for level, options in enumerate(_levels(accountant)):

        def gap(log_noise: float, options=options) -> float:
            epsilon = _level_epsilon(make_event(math.exp(log_noise)), delta, accountant, conversion, neighboring,
                                      options)
            _report(progress, math.exp(log_noise), epsilon)
            return _log_ratio(epsilon, target_epsilon)

        gap = _memoize(gap)
        if level:  # first step: Newton's from the coarser answer (with the coarser slope), overshot by tol / 2
            step = (abs(gap(start) / slope) if math.isfinite(gap(start)) else 0.0) + tol / 2
        lo, hi = _bracket(gap, start, step, center, target_epsilon)
        lo, hi = _bisect(gap, lo, hi, tol)
        start, slope = hi, _slope(gap, lo, hi)
    return math.exp(hi)


def max_steps(
    make_event: Callable[[int], dp_event.DpEvent],
    target_epsilon: float,
    delta: float,
    accountant: str = "pld",
    conversion: str = "classic",
    neighboring: str = "add_remove",
    *,
    subsampling_bound: str = "tight",
    progress: Callable[[int, float], None] | None = None,
) -> int:
    """The largest number of steps n with ``make_event(n)`` meeting ``target_epsilon`` at ``delta``; 0 if even one
    step exceeds it.

    Args:
      make_event: steps -> event; epsilon must not decrease as steps grow. With RDP, build it as
        ``SelfComposedDpEvent(step, n)`` so every n reuses the cached curve of ``step``.
      target_epsilon, delta, accountant, conversion, neighboring: as for ``calibrate_noise``.
      subsampling_bound: as for ``account`` (RDP only).
      progress: called with (steps, epsilon) after every trial.

    Raises:
      ConfigError: a parameter is out of range, or 2**MAX_DOUBLINGS steps still meet the target.
    """
    target_epsilon = check_range("target_epsilon", target_epsilon, 0, math.inf, low_open=True, high_open=True)
    delta = check_range("delta", delta, 0, 1, low_open=True, high_open=True)
    check_options(accountant, conversion, neighboring)
    if accountant == "pld":
        pld.check_target(target_epsilon)

    steps = 1
    for options in _levels(accountant)[-1 if accountant == "rdp" else 0 :]:
        steps = max(1, steps)

        def meets(n: int, options=options) -> bool:
            epsilon = _level_epsilon(make_event(n), delta, accountant, conversion, neighboring,
                                      dict(options, subsampling_bound=subsampling_bound))
            _report(progress, n, epsilon)
            return epsilon <= target_epsilon

        steps = largest_integer(_memoize(meets), steps, max(1, steps // 64), target_epsilon)
    return steps


def epsilon_for_schedule(
    events: Iterable[dp_event.DpEvent],
    delta: float,
    accountant: str = "pld",
    conversion: str = "classic",
    neighboring: str = "add_remove",
) -> AccountingResult:
    """Epsilon of running ``events`` one after the other (e.g. rounds with a noise or sampling schedule): ``account``
    of their composition (Mironov 2017, Prop. 1 for RDP; convolution of PLDs for PLD)."""
    events = list(events)
    if not events or not all(isinstance(e, dp_event.DpEvent) for e in events):
        raise ConfigError("events", events, "a non-empty sequence of DpEvents")
    return account(dp_event.ComposedDpEvent(events), delta, accountant, conversion, neighboring)


def solve_noise(epsilon_of: Callable[[float], float], target_epsilon: float, *, initial_noise: float = 1.0,
                rtol: float = 1e-4, progress: Callable[[float, float], None] | None = None) -> float:
    """The smallest noise z (to relative precision ``rtol``) with ``epsilon_of(z) <= target_epsilon``, for any
    accountant given as a function decreasing in z: the bracket search and Illinois bisection of ``calibrate_noise``
    at one level. Serves the accountants that are not DpEvents (last iterate, shuffle, a run's ledger). ``progress``
    is called with (noise, epsilon) after every trial."""
    target_epsilon = check_range("target_epsilon", target_epsilon, 0, math.inf, low_open=True, high_open=True)
    initial_noise = check_range("initial_noise", initial_noise, 0, low_open=True)
    rtol = check_range("rtol", rtol, 0, 0.1, low_open=True)

    def gap(log_noise: float) -> float:
        epsilon = epsilon_of(math.exp(log_noise))
        _report(progress, math.exp(log_noise), epsilon)
        return _log_ratio(epsilon, target_epsilon)

    gap = _memoize(gap)
    center = math.log(initial_noise)
    lo, hi = _bracket(gap, center, math.log(2), center, target_epsilon)
    return math.exp(_bisect(gap, lo, hi, math.log1p(rtol))[1])


def last_iterate_sigma(target_epsilon: float, delta: float, n: int, batch_size: int, lipschitz: float, radius: float,
                       lr: float, *, nonconvex: bool = False, random_stop: bool = False,
                       smoothness: float | None = None, rtol: float = 1e-4) -> float:
    """The smallest constant noise multiplier sigma for which releasing only the last iterate of Asoodeh et al.'s
    Algorithm 1 (T = n // batch_size disjoint batches, step size ``lr``) is (target_epsilon, delta)-DP (Thm 2)."""
    from dpfl.accounting import last_iterate

    def epsilon_of(sigma: float) -> float:
        return last_iterate.epsilon(delta, lr, sigma, n, batch_size, lipschitz, radius, nonconvex=nonconvex,
                                    random_stop=random_stop, smoothness=smoothness)

    return solve_noise(epsilon_of, target_epsilon, rtol=rtol)


def _levels(accountant: str) -> list[dict]:
    """Keyword options of ``account`` from the coarsest level to the exact one (``{}``)."""
    if accountant == "pld":
        return [{"value_discretization_interval": v} for v in COARSE_PLD_INTERVALS] + [{}]
    return [{"orders": COARSE_RDP_ORDERS}, {}]


def _level_epsilon(event, delta, accountant, conversion, neighboring, options: dict) -> float:
    """``account(event, ...).epsilon`` at a level's options. A PLD too large to build at the exact grid
    (``pld.PldTooLargeError``) reads as +inf at a coarse level, unbuilt (the exact level would refuse that noise, so
    the search must look elsewhere), and is raised at the exact level, where the caller decides (the CLI switches to
    RDP and says so)."""
    coarse = options.get("value_discretization_interval", pld.VALUE_DISCRETIZATION_INTERVAL) != \
        pld.VALUE_DISCRETIZATION_INTERVAL
    if accountant == "pld" and coarse and pld.estimated_points(event, NEIGHBORING[neighboring]) > pld.MAX_POINTS:
        return math.inf
    return account(event, delta, accountant, conversion, neighboring, **options).epsilon


def _report(progress, value, epsilon: float) -> None:
    if progress is not None:
        progress(value, epsilon)


def _log_ratio(epsilon: float, target: float) -> float:
    """log(epsilon / target), +inf for an infinite epsilon and -inf for 0."""
    if epsilon == 0:
        return -math.inf
    return math.log(epsilon / target) if math.isfinite(epsilon) else math.inf


def _memoize(f):
    cache = {}

    def memoized(x):
        if x not in cache:
            cache[x] = f(x)
        return cache[x]

    return memoized


def _bracket(gap, start: float, step: float, center: float, target: float) -> tuple[float, float]:
    """[lo, hi] with gap(lo) > 0 >= gap(hi) (gap decreasing in log noise), walking from ``start`` by doubling steps
    towards the sign change; a target below epsilon's floor (more noise no longer lowers it: e.g. a rounding term that
    does not shrink with the noise) is refused as soon as the walk stops making progress."""
    direction = 1 if gap(start) > 0 else -1
    here = start
    while (gap(here) > 0) == (direction > 0):
        before, taken = gap(here), step
        here, step = here + direction * step, 2 * step
        # a floor, 2^10 times past the initial noise: log epsilon falls by under 1% of the step in log noise (a
        # mechanism's epsilon falls at least as fast as the noise grows there: ~1 / z to ~1 / z^2)
        stalled = (direction > 0 and here - center > 10 * math.log(2) and math.isfinite(before)
                   and before - gap(here) < STALL * taken)
        if stalled or abs(here - center) > MAX_DOUBLINGS * math.log(2):
            last = here if stalled else here - direction * step / 2
            if direction > 0:
                raise ConfigError(
                    "target_epsilon",
                    target,
                    f"a target some noise reaches: with noise multiplier {math.exp(last):.3g} epsilon is still "
                    f"{target * math.exp(gap(last)):.4g}",
                )
            raise ConfigError(
                "target_epsilon",
                target,
                f"a target some noise misses: epsilon is only {target * math.exp(gap(last)):.4g} with noise "
                f"multiplier {math.exp(last):.3g}",
            )
    previous = here - direction * step / 2
    return (previous, here) if direction > 0 else (here, previous)


def _bisect(gap, lo: float, hi: float, tol: float) -> tuple[float, float]:
    """Shrinks [lo, hi] (gap(lo) > 0 >= gap(hi)) to width <= tol by false position with the Illinois rule (the
    value at an end kept twice in a row is halved, Dowell & Jarratt 1971), halving when a value is not finite."""
    g_lo, g_hi, kept = gap(lo), gap(hi), 0
    while hi - lo > tol:
        if math.isfinite(g_lo) and math.isfinite(g_hi):
            split = hi - g_hi * (hi - lo) / (g_hi - g_lo)
            split = min(max(split, lo + tol / 2), hi - tol / 2)
        else:
            split = (lo + hi) / 2
        g_split = gap(split)
        if g_split > 0:
            lo, g_lo = split, g_split
            g_hi, kept = (g_hi / 2 if kept == 1 else g_hi), 1
        else:
            hi, g_hi = split, g_split
            g_lo, kept = (g_lo / 2 if kept == -1 else g_lo), -1
    return lo, hi


def _slope(gap, lo: float, hi: float) -> float:
    """Slope of gap across [lo, hi], or -1 (epsilon ~ 1 / noise) where it is not finite and negative."""
    slope = (gap(hi) - gap(lo)) / (hi - lo)
    return slope if math.isfinite(slope) and slope < 0 else -1.0


def largest_integer(meets: Callable[[int], bool], start: int, step: int, target: float) -> int:
    """Largest n >= 0 with meets(n), for meets true up to some n and false after: doubling steps from ``start``,
    then bisection. ``target`` (the epsilon sought) only words the error when no n > 2**MAX_DOUBLINGS fails."""
    if meets(start):
        lo, hi = start, start + step
        while meets(hi):
            lo, hi, step = hi, hi + step, 2 * step
            if hi > 2**MAX_DOUBLINGS:
                raise ConfigError("target_epsilon", target, f"a budget that some number of steps exceeds (not {hi})")
    else:
        lo, hi = start - step, start
        while lo > 0 and not meets(lo):
            lo, hi, step = max(0, lo - step), lo, 2 * step
        lo = max(lo, 0)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if meets(mid):
            lo = mid
        else:
            hi = mid
    return lo
