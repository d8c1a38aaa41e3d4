"""The contract every accountant of dpfl keeps, parametrised over every name ``accountants.make`` knows
(``ACCOUNTANT_NAMES``), as dp_accounting holds its own accountants to one shared test case.

1. dp_accounting's own abstract test case (``privacy_accountant_test.PrivacyAccountantTest``: unsupported events
   refused, also nested, naming the sub-event; no events and NoOp cost 0; a non-private event costs inf), run on a
   fresh accountant of each name;
2. dpfl's additions, on an event each name supports: ``supports`` agrees with ``compose``; composing an event n times
   is ``SelfComposed(event, n)``; epsilon never falls as events are added, and never rises as delta grows;
   ``ACCOUNTANT_NAMES`` is exactly what ``make`` builds, and an unknown name is a ConfigError naming the allowed ones.
"""

from __future__ import annotations

import math

import pytest
from dp_accounting import dp_event, privacy_accountant
from dp_accounting import privacy_accountant_test

from dpfl.accounting import accountants
from dpfl.accounting.events import ProjectedStepDpEvent
from dpfl.errors import ConfigError

NeighborRel = privacy_accountant.NeighboringRelation
NAMES = accountants.ACCOUNTANT_NAMES


def fresh(name: str) -> privacy_accountant.PrivacyAccountant:
    """An accountant of ``name`` for the relation its events are meant for (the last-iterate accountant is
    replace-one: Asoodeh et al. 2021 swap one record)."""
    relation = NeighborRel.REPLACE_ONE if name == "last_iterate" else NeighborRel.ADD_OR_REMOVE_ONE
    return accountants.make(name, relation)


#: An event of each name's domain: Laplace for pure DP, a projected noisy SGD step for the last iterate, a
#: Poisson-subsampled Gaussian for the others.
SUPPORTED = {
    "pure": dp_event.LaplaceDpEvent(2.0),
    "last_iterate": ProjectedStepDpEvent(100, 1, 1.0, 1.0, 0.5, 4.0, False, False, 100, dp_event.NoOpDpEvent()),
}
SUBSAMPLED_GAUSSIAN = dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(1.5))


def supported(name: str) -> dp_event.DpEvent:
    return SUPPORTED.get(name, SUBSAMPLED_GAUSSIAN)


class TestDpAccountingContract(privacy_accountant_test.PrivacyAccountantTest):
    """dp_accounting's shared test case, on one fresh accountant of every name."""

    def _make_test_accountants(self):
        return [fresh(name) for name in NAMES]


def test_the_names_are_what_make_builds():
    assert len(set(map(type, (fresh(name) for name in NAMES)))) >= len(NAMES) - 1  # rdp-integer is rdp's class
    with pytest.raises(ConfigError, match="accountant = 'prv' is not allowed: expected one of"):
        accountants.make("prv", NeighborRel.ADD_OR_REMOVE_ONE)


@pytest.mark.parametrize("name", NAMES)
def test_supports_agrees_with_compose(name):
    accountant, event = fresh(name), supported(name)
    assert accountant.supports(event)
    accountant.compose(event)
    assert 0 < accountant.get_epsilon(1e-5) < math.inf
    other = SUPPORTED["last_iterate"] if name != "last_iterate" else SUBSAMPLED_GAUSSIAN
    if not accountant.supports(other):
        with pytest.raises(privacy_accountant.UnsupportedEventError):
            accountant.compose(other)


@pytest.mark.parametrize("name", NAMES)
def test_composing_n_times_is_the_self_composition(name):
    one_by_one, at_once, event = fresh(name), fresh(name), supported(name)
    for _ in range(5):
        one_by_one.compose(event)
    at_once.compose(dp_event.SelfComposedDpEvent(event, 5))
    assert one_by_one.get_epsilon(1e-5) == pytest.approx(at_once.get_epsilon(1e-5), rel=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_epsilon_grows_with_the_events_and_falls_with_delta(name):
    accountant, event = fresh(name), supported(name)
    previous = 0.0
    for _ in range(4):
        accountant.compose(event)
        epsilon = accountant.get_epsilon(1e-5)
        assert epsilon >= previous
        previous = epsilon
    by_delta = [accountant.get_epsilon(d) for d in (1e-8, 1e-5, 1e-2)]
    assert by_delta == sorted(by_delta, reverse=True)
