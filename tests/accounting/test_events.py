"""Skellam events and JSON round trips of events (dpfl.accounting.events)."""

import json
import math

import attr
import numpy as np
import pytest
from dp_accounting import dp_event

from dpfl.accounting.events import EVENT_TYPES, SkellamDpEvent, event_from_dict, event_to_dict, skellam_l1_bound
from dpfl.accounting.skellam import skellam_rdp
from dpfl.accounting.rdp import rdp_curve
from dpfl.errors import ConfigError

INTS = np.arange(2, 257, dtype=float)

EVENTS = [
    dp_event.NoOpDpEvent(),
    dp_event.NonPrivateDpEvent(),
    dp_event.UnsupportedDpEvent(),
    dp_event.GaussianDpEvent(1.5),
    dp_event.LaplaceDpEvent(0.5),
    dp_event.DiscreteLaplaceDpEvent(0.3, 2),
    dp_event.RandomizedResponseDpEvent(0.1, 4),
    dp_event.ZCDpEvent(0.2, 0.01),
    dp_event.SingleEpochTreeAggregationDpEvent(2.0, [3, 4]),
    dp_event.MixtureOfGaussiansDpEvent(1.0, [0.0, 1.0], [0.5, 0.5]),
    dp_event.TruncatedSubsampledGaussianDpEvent(1000, 0.01, 20, 1.1),
    dp_event.RepeatAndSelectDpEvent(dp_event.GaussianDpEvent(1.0), 10.0, 1.0),
    dp_event.SampledWithReplacementDpEvent(100, 10, dp_event.LaplaceDpEvent(1.0)),
    SkellamDpEvent(l2_sensitivity=1.0, l1_sensitivity=1.0, variance=4.0, scale=2.0**10),
    # the DP-SCAFFOLD third-party round, composed with a Poisson-sampled event
    dp_event.ComposedDpEvent(
        [
            dp_event.SampledWithoutReplacementDpEvent(
                100,
                20,
                dp_event.SelfComposedDpEvent(
                    dp_event.SampledWithoutReplacementDpEvent(4000, 800, dp_event.GaussianDpEvent(60 * math.sqrt(20))), 50
                ),
            ),
            dp_event.PoissonSampledDpEvent(0.1, SkellamDpEvent(1.0, 1.0, 2.0)),
        ]
    ),
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: type(e).__name__)
def test_json_round_trip(event):
    d = event_to_dict(event)
    assert d["type"] == type(event).__name__
    assert event_from_dict(json.loads(json.dumps(d))) == event


def test_round_trip_is_recursive_and_plain():
    d = event_to_dict(EVENTS[-1])
    inner = d["events"][0]["event"]
    assert inner == {"type": "SelfComposedDpEvent", "count": 50, "event": inner["event"]}
    assert inner["event"]["event"] == {"type": "GaussianDpEvent", "noise_multiplier": 60 * math.sqrt(20)}


def test_registry_covers_every_dp_accounting_event():
    for name in ("GaussianDpEvent", "SampledWithoutReplacementDpEvent", "PoissonSampledDpEvent", "ComposedDpEvent"):
        assert EVENT_TYPES[name] is getattr(dp_event, name)
    assert EVENT_TYPES["SkellamDpEvent"] is SkellamDpEvent


@pytest.mark.parametrize("bad", [{"type": "os.system"}, {"noise_multiplier": 1.0}, ["GaussianDpEvent"]])
def test_unknown_types_are_refused(bad):
    with pytest.raises(ConfigError, match="event type"):
        event_from_dict(bad)


def test_foreign_event_classes_are_refused():
    @attr.s(frozen=True)
    class GaussianDpEvent(dp_event.DpEvent):  # same name, not the registered class
        noise_multiplier = attr.ib()

    with pytest.raises(ConfigError, match="event"):
        event_to_dict(GaussianDpEvent(1.0))


# ---- Skellam, Agarwal et al. 2021 ------------------------------------------------------------------------------


def test_skellam_formula():
    event = SkellamDpEvent(l2_sensitivity=2.0, l1_sensitivity=3.0, variance=4.0, scale=5.0)
    a = 7.0
    expected = a * 4 / 8 + min(13 * 4 / (4 * 25 * 16) + 9 / (2 * 125 * 16), 9 / (2 * 5 * 4))
    assert skellam_rdp(event, [a])[0] == pytest.approx(expected)
    np.testing.assert_allclose(rdp_curve(event, INTS), skellam_rdp(event, INTS))  # integer orders: the formula


def test_skellam_approaches_the_gaussian_for_large_scale():
    sigma = 1.3
    gaussian = rdp_curve(dp_event.GaussianDpEvent(sigma), INTS)
    previous_gap = np.inf
    for scale in (1.0, 2.0**4, 2.0**8, 2.0**16, 2.0**32):
        skellam = rdp_curve(SkellamDpEvent(1.0, skellam_l1_bound(1.0, 1000), sigma**2, scale), INTS)
        gap = np.max(skellam - gaussian)
        assert np.all(skellam >= gaussian * (1 - 1e-12)) and gap < previous_gap
        previous_gap = gap
    assert previous_gap < 1e-9


def test_skellam_non_integer_orders_and_subsampling():
    event = SkellamDpEvent(1.0, 1.0, 1.0, 1.0)
    curve = rdp_curve(event, np.array([1.5, 2.0, 2.5, 3.0]))
    assert curve[0] == pytest.approx(curve[1])
    assert curve[2] == pytest.approx((0.5 * curve[1] + 0.5 * 2 * curve[3]) / 1.5)
    sampled = rdp_curve(dp_event.SampledWithoutReplacementDpEvent(100, 5, event))
    assert np.all(np.isfinite(sampled)) and np.all(sampled < rdp_curve(event))


def test_skellam_l1_bound():
    assert skellam_l1_bound(1.0, 1000) == pytest.approx(1.0)  # ||x||_1 <= ||x||_2^2
    assert skellam_l1_bound(100.0, 1000) == pytest.approx(100.0 * 32)  # sqrt(1024) ||x||_2
    with pytest.raises(ConfigError, match="dimension"):
        skellam_l1_bound(1.0, 0)


def test_skellam_validates_its_fields():
    with pytest.raises(ConfigError, match="variance"):
        rdp_curve(SkellamDpEvent(1.0, 1.0, 0.0))
    assert hash(SkellamDpEvent(1.0, 1.0, 2.0)) == hash(SkellamDpEvent(1.0, 1.0, 2.0))
