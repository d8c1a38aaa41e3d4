"""Calibration of noise and steps, schedules, and the validation of every accounting entry point."""

import math

import pytest
from dp_accounting import dp_event

from dpfl.accounting.accountant import (
    AccountingResult,
    account,
    delta_for_epsilon,
    gaussian_event,
    laplace_event,
    pure_epsilon,
)
from dpfl.accounting.calibrate import calibrate_noise, epsilon_for_schedule, max_steps, solve_noise
from dpfl.errors import ConfigError

Q = 256 / 60000


def poisson(z, n=1000):
    return gaussian_event(z, n, "poisson", Q)


@pytest.mark.parametrize("accountant", ["pld", "rdp"])
def test_calibrated_noise_meets_the_target_and_no_less_noise_does(accountant):
    z = calibrate_noise(poisson, 2.0, 1e-5, accountant, rtol=1e-4)
    assert account(poisson(z), 1e-5, accountant).epsilon <= 2.0
    assert account(poisson(z / 1.0001), 1e-5, accountant).epsilon > 2.0


def test_calibration_searches_down_from_a_large_initial_noise():
    z = calibrate_noise(poisson, 2.0, 1e-5, "rdp")
    assert calibrate_noise(poisson, 2.0, 1e-5, "rdp", initial_noise=1000.0) == pytest.approx(z, rel=2e-4)


def test_unreachable_target_says_so():
    # The classic conversion never goes below log(1/delta) / (1024 - 1) = 0.0113, whatever the noise.
    with pytest.raises(ConfigError, match="target_epsilon = 0.001 .*some noise reaches"):
        calibrate_noise(poisson, 1e-3, 1e-5, "rdp", "classic")


def test_a_target_below_epsilons_floor_is_refused_where_the_walk_stops_making_progress():
    """An epsilon with a floor (a term that more noise does not lower, as a rounding term) is refused after a few
    doublings, not at the end of 40: a family's builder refuses multipliers above 1e6 with a message about the
    multiplier, which told a user nothing about the target (Skellam shares under the paper's analysis)."""
    tried = []

    def epsilon_of(z: float) -> float:
        tried.append(z)
        return 1.34 + 1.0 / z

    with pytest.raises(ConfigError, match="target_epsilon = 1.0 .*some noise reaches: with noise multiplier .* "
                                          "epsilon is still 1.34"):
        solve_noise(epsilon_of, 1.0)
    assert max(tried) < 1e6


def test_max_steps_is_the_last_step_count_within_budget():
    make_event = lambda n: gaussian_event(1.1, n, "poisson", Q)  # noqa: E731
    n = max_steps(make_event, 3.0, 1e-5, "rdp", "modern")
    eps = [account(make_event(steps), 1e-5, "rdp", "modern").epsilon for steps in (n, n + 1)]
    assert eps[0] <= 3.0 < eps[1]
    assert n == 18338


def test_max_steps_with_pld_is_close_to_rdp_and_larger():
    make_event = lambda n: gaussian_event(2.0, n, "poisson", 0.01)  # noqa: E731
    n_pld = max_steps(make_event, 1.0, 1e-5, "pld")
    assert account(make_event(n_pld), 1e-5).epsilon <= 1.0 < account(make_event(n_pld + 1), 1e-5).epsilon
    assert n_pld > max_steps(make_event, 1.0, 1e-5, "rdp", "modern")


def test_max_steps_is_zero_when_one_step_is_too_many():
    assert max_steps(lambda n: gaussian_event(0.5, n, "none"), 1.0, 1e-5, "rdp") == 0


def test_schedule_composes_its_events():
    events = [poisson(1.0, 100), poisson(2.0, 300)]
    scheduled = epsilon_for_schedule(events, 1e-5, "rdp", "modern")
    composed = account(dp_event.ComposedDpEvent(events), 1e-5, "rdp", "modern")
    assert scheduled == composed
    assert scheduled.epsilon > max(account(e, 1e-5, "rdp", "modern").epsilon for e in events)
    with pytest.raises(ConfigError, match="events"):
        epsilon_for_schedule([], 1e-5)


def test_result_to_dict():
    result = account(poisson(1.0), 1e-5, "rdp", "modern")
    assert isinstance(result, AccountingResult)
    assert set(result.to_dict()) == {"epsilon", "delta", "accountant", "conversion", "order"}
    assert account(poisson(1.0), 1e-5).to_dict()["conversion"] is None


@pytest.mark.parametrize("accountant, conversion", [("pld", "classic"), ("rdp", "classic"), ("rdp", "modern")])
def test_delta_for_epsilon_inverts_account(accountant, conversion):
    event = poisson(1.0)
    eps = account(event, 1e-5, accountant, conversion).epsilon
    assert delta_for_epsilon(event, eps, accountant, conversion).delta == pytest.approx(1e-5, rel=1e-3)


def test_pure_epsilon_is_basic_composition():
    assert pure_epsilon(laplace_event(2.0, 0.5, 8)) == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="event"):
        pure_epsilon(poisson(1.0))


def test_fixed_sampling_is_replace_one_and_rdp_only():
    event = gaussian_event(1.0, 100, "fixed", 0.01, dataset_size=1000)
    assert event.event.sample_size == 10 and event.event.source_dataset_size == 1000
    assert gaussian_event(1.0, 1, "fixed", Q).event.sample_size == math.ceil(Q * 10**9)
    with pytest.raises(ConfigError, match="accountant = 'pld' .*'rdp'"):
        account(event, 1e-5)
    with pytest.raises(ConfigError, match="REPLACE_ONE"):
        account(event, 1e-5, "rdp")
    assert 0 < account(event, 1e-5, "rdp", neighboring="replace_one").epsilon < math.inf


BAD_EVENTS = [
    (dict(noise_multiplier=1.0, steps=10, sampling_rate=0), "sampling_rate = 0 .*\\(0, 1\\]"),
    (dict(noise_multiplier=1.0, steps=10, sampling_rate=1.5), "sampling_rate = 1.5 .*\\(0, 1\\]"),
    (dict(noise_multiplier=1.0, steps=10), "sampling_rate = None"),
    (dict(noise_multiplier=0.0, steps=10, sampling_rate=0.1), "noise_multiplier = 0.0 .*\\(0, inf\\)"),
    (dict(noise_multiplier=-1.0, steps=10, sampling_rate=0.1), "noise_multiplier = -1.0 .*\\(0, inf\\)"),
    (dict(noise_multiplier=1.0, steps=0, sampling_rate=0.1), "steps = 0 .*integer in \\[1, inf\\)"),
    (dict(noise_multiplier=1.0, steps=2.5, sampling_rate=0.1), "steps = 2.5 .*integer"),
    (dict(noise_multiplier=1.0, steps=10, sampling="uniform"), "sampling = 'uniform'"),
    (dict(noise_multiplier=1.0, steps=10, sampling_rate=0.1, dataset_size=100), "dataset_size = 100"),
    (dict(noise_multiplier=1.0, steps=10, sampling="fixed", sampling_rate=0.1, dataset_size=0), "dataset_size = 0"),
]


@pytest.mark.parametrize("kwargs, message", BAD_EVENTS)
def test_bad_event_parameters(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        gaussian_event(**kwargs)


@pytest.mark.parametrize("delta", [0, 1, -0.1, float("nan")])
def test_bad_delta(delta):
    with pytest.raises(ConfigError, match="delta = .*\\(0, 1\\)"):
        account(poisson(1.0), delta)
    with pytest.raises(ConfigError, match="delta = .*\\(0, 1\\)"):
        calibrate_noise(poisson, 1.0, delta)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(accountant="prv"), "accountant = 'prv' .*'pld', 'rdp'"),
        (dict(conversion="tight"), "conversion = 'tight'"),
        (dict(neighboring="swap"), "neighboring = 'swap'"),
    ],
)
def test_bad_options(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        account(poisson(1.0), 1e-5, **kwargs)


def test_bad_laplace_and_targets():
    with pytest.raises(ConfigError, match="scale = 0"):
        laplace_event(0, 1, 1)
    with pytest.raises(ConfigError, match="target_epsilon = 0 .*\\(0, inf\\)"):
        calibrate_noise(poisson, 0, 1e-5)
    with pytest.raises(ConfigError, match="target_epsilon = -1"):
        max_steps(lambda n: poisson(1.0, n), -1, 1e-5)
