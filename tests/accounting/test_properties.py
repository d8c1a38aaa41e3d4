"""Properties of ``account`` and ``calibrate_noise`` over random settings (hypothesis, derandomised, few examples)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpfl.accounting.accountant import account, gaussian_event
from dpfl.accounting.calibrate import calibrate_noise

few = settings(max_examples=6, deadline=None, derandomize=True)

noise = st.floats(0.8, 20.0)
rate = st.floats(1e-3, 0.1)
steps = st.integers(1, 100)
accountant = st.sampled_from([("pld", "classic"), ("rdp", "classic"), ("rdp", "modern")])


def epsilon(z, q, n, options, delta=1e-5):
    return account(gaussian_event(z, n, "poisson", q), delta, *options).epsilon


@few
@given(noise, rate, steps, accountant, st.floats(1e-9, 0.5))
def test_epsilon_is_non_negative_and_never_nan(z, q, n, options, delta):
    eps = epsilon(z, q, n, options, delta)
    assert not math.isnan(eps) and eps >= 0


@few
@given(noise, noise, rate, steps, accountant)
def test_epsilon_decreases_with_noise(z1, z2, q, n, options):
    low, high = sorted((z1, z2))
    assert epsilon(high, q, n, options) <= epsilon(low, q, n, options) * (1 + 1e-9)


@few
@given(noise, rate, steps, steps, accountant)
def test_epsilon_increases_with_steps(z, q, n1, n2, options):
    low, high = sorted((n1, n2))
    assert epsilon(z, q, low, options) <= epsilon(z, q, high, options) * (1 + 1e-9)


@few
@given(noise, rate, rate, steps, accountant)
def test_epsilon_increases_with_sampling_rate(z, q1, q2, n, options):
    low, high = sorted((q1, q2))
    assert epsilon(z, low, n, options) <= epsilon(z, high, n, options) * (1 + 1e-9)


@settings(max_examples=4, deadline=None, derandomize=True)
@given(st.floats(0.2, 10.0), st.floats(1e-3, 0.05), st.integers(1, 500), st.sampled_from(["classic", "modern"]))
def test_calibrate_then_account_returns_the_target(target, q, n, conversion):
    # RDP here for speed; tests/accounting/test_calibrate.py checks PLD on fixed settings.
    options, rtol = ("rdp", conversion), 1e-4
    make_event = lambda z: gaussian_event(z, n, "poisson", q)  # noqa: E731
    try:
        z = calibrate_noise(make_event, target, 1e-5, *options, rtol=rtol)
    except ValueError as err:  # the RDP conversions put a floor under epsilon
        assert "target_epsilon" in str(err)
        return
    assert account(make_event(z), 1e-5, *options).epsilon <= target
    assert account(make_event(z / (1 + rtol)), 1e-5, *options).epsilon > target
    assert account(make_event(z), 1e-5, *options).epsilon == pytest.approx(target, rel=5e-3)
