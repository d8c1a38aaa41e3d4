"""pld.within_max_points decides as ``estimated_points <= MAX_POINTS`` does, from the cheap integer orders where
their bound suffices (the fractional orders' curve is then never computed)."""

import pytest
from dp_accounting import dp_event

from dpfl.accounting import pld, rdp
from dpfl.accounting.events import ParticipationDpEvent

NeighborRel = pld.NeighborRel


def poisson(q: float, z: float, count: int = 1) -> dp_event.DpEvent:
    return dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(z)), count)


@pytest.mark.parametrize("event", [
    poisson(0.1, 1.0), poisson(0.2, 1.5, 5), poisson(0.2, 0.3, 3000), poisson(0.5, 0.2, 400), poisson(1.0, 0.05, 1),
    ParticipationDpEvent(0.5, dp_event.GaussianDpEvent(0.577)), dp_event.LaplaceDpEvent(5.0),
    dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(0.05), 2000), dp_event.NonPrivateDpEvent(),
])
def test_the_quick_decision_is_the_estimates(event):
    assert pld.within_max_points(event) == (pld.estimated_points(event) <= pld.MAX_POINTS)


def test_a_small_event_never_computes_the_fractional_orders(monkeypatch):
    asked = []

    def curve(event, orders, relation):
        asked.append(tuple(orders.tolist()))
        return rdp.rdp_curve(event, orders, relation)

    monkeypatch.setattr(pld, "rdp_curve", curve)
    assert pld.within_max_points(poisson(0.13, 1.1))
    assert asked == [tuple(pld._QUICK_ORDERS.tolist())]


def test_the_boundary_is_decided_by_the_estimate(monkeypatch):
    """With MAX_POINTS between the estimate and the quick bound (the optimum at order 1.25 here), the estimate
    decides, both ways."""
    event = dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(0.3), 100)
    estimate = pld.estimated_points(event)
    quick = pld._points_at(pld._QUICK_ORDERS, event, NeighborRel.ADD_OR_REMOVE_ONE, pld.VALUE_DISCRETIZATION_INTERVAL)
    assert estimate < 0.9 * quick
    monkeypatch.setattr(pld, "MAX_POINTS", (estimate + quick) / 2)
    assert pld.within_max_points(event)
    monkeypatch.setattr(pld, "MAX_POINTS", estimate * 0.999)
    assert not pld.within_max_points(event)
