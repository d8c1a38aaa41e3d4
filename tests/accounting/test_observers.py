"""What each observer sees: Release, observer_events (sound and paper analyses), scale_noise."""

import dataclasses
import math

import numpy as np
import pytest
from dp_accounting import dp_event

from dpfl.accounting.accountant import account
from dpfl.accounting.dp_scaffold import dp_scaffold_round_events
from dpfl.accounting.events import ParticipationDpEvent
from dpfl.accounting.observers import (OBSERVERS, OTHER_SILO, SERVER, THIRD_PARTY, Cohort, Release,
                                       local_steps_additive, observer_events, scale_noise)
from dpfl.errors import ConfigError

G = dp_event.GaussianDpEvent
SC = dp_event.SelfComposedDpEvent


def wor(n, b, inner):
    return dp_event.SampledWithoutReplacementDpEvent(n, b, inner)


def fedavg(step, k, ratio=1.0):
    return Release((step,) * k, local_steps_additive(k, moves_locally=True, carries_noise=False), ratio)


def epsilon(event, rounds=100, delta=1e-5, neighboring="replace_one"):
    return account(SC(event, rounds), delta, "rdp", "modern", neighboring).epsilon


def test_scale_noise_gaussian():
    assert scale_noise(G(2.0), 3.0) == G(6.0)
    assert scale_noise(G(1.5), math.sqrt(4)) == G(3.0)


def test_scale_noise_nested():
    event = wor(100, 10, SC(dp_event.ComposedDpEvent([G(1.0), dp_event.PoissonSampledDpEvent(0.1, G(2.0)),
                                                       dp_event.NoOpDpEvent()]), 5))
    expected = wor(100, 10, SC(dp_event.ComposedDpEvent([G(3.0), dp_event.PoissonSampledDpEvent(0.1, G(6.0)),
                                                          dp_event.NoOpDpEvent()]), 5))
    assert scale_noise(event, 3.0) == expected
    assert scale_noise(event, 1.0) == event


def test_scale_noise_rejects_noise_that_does_not_sum():
    assert scale_noise(dp_event.NonPrivateDpEvent(), 2.0) == dp_event.NonPrivateDpEvent()
    with pytest.raises(ValueError, match="LaplaceDpEvent"):
        scale_noise(wor(10, 2, dp_event.LaplaceDpEvent(1.0)), 2.0)


def test_additive_steps_of_each_family():
    assert local_steps_additive(3, moves_locally=True, carries_noise=False) == (False, False, True)  # FedAvg
    assert local_steps_additive(3, moves_locally=False, carries_noise=False) == (True, True, True)  # FedSGD
    assert local_steps_additive(3, moves_locally=True, carries_noise=True) == (False, False, False)  # SCAFFOLD
    assert local_steps_additive(3, moves_locally=False, carries_noise=True) == (False, False, False)


def test_sound_fixed_cohort_fedavg():
    """Participation mixture with l = n/M; only the last step gets the cohort's noise; another silo removes its own
    share and knows it is in the cohort (p = n/(M-1))."""
    step = wor(4000, 800, G(60.0))
    ev = observer_events(fedavg(step, 50), Cohort.fixed(100, 20))
    credited = lambda others: dp_event.ComposedDpEvent(  # noqa: E731
        [SC(step, 49), SC(wor(4000, 800, G(60.0 * math.sqrt(1 + others))), 1)])
    assert ev[THIRD_PARTY] == ParticipationDpEvent(0.2, credited(19))
    assert ev[SERVER] == ParticipationDpEvent(0.2, SC(step, 50))
    assert ev[OTHER_SILO] == ParticipationDpEvent(20 / 99, credited(18))
    assert set(ev) == set(OBSERVERS)
    secagg = observer_events(fedavg(step, 50), Cohort.fixed(100, 20), boundary="secagg")
    assert secagg[SERVER] == secagg[THIRD_PARTY] == ev[THIRD_PARTY]


def test_sound_scaffold_credits_nothing():
    """SCAFFOLD's c_i carries every noisy step into later rounds: no other client's share is credited, to any
    observer (defect 3 of the soundness review)."""
    step = wor(100, 20, G(2.0))
    release = Release((step,) * 4, local_steps_additive(4, True, carries_noise=True))
    ev = observer_events(release, Cohort.fixed(10, 5), boundary="secagg")
    assert ev[THIRD_PARTY] == ev[SERVER] == ParticipationDpEvent(0.5, SC(step, 4))
    assert ev[OTHER_SILO] == ParticipationDpEvent(5 / 9, SC(step, 4))


def test_sound_fedsgd_credits_every_step():
    step = G(2.0)
    release = Release((step,) * 3, local_steps_additive(3, moves_locally=False, carries_noise=False))
    ev = observer_events(release, Cohort.fixed(8, 8))
    assert ev[THIRD_PARTY] == SC(G(2.0 * math.sqrt(8)), 3)  # whole population: no participation mixture
    assert ev[SERVER] == SC(step, 3)
    assert ev[OTHER_SILO] == SC(G(2.0 * math.sqrt(7)), 3)


def test_sound_poisson_cohort_mixes_the_credit_over_its_members():
    """A Poisson cohort: the plain server gets the owner's own steps; the third party and another silo the last
    (additive) step credited with the Binomial number of other members' shares, mixed (a fixed cohort would credit a
    fixed number); every one of them inside the participation mixture."""
    from dpfl.accounting.events import LabelledMixtureDpEvent

    step = wor(100, 10, G(1.2))
    ev = observer_events(fedavg(step, 5), Cohort.poisson(40, 0.25))
    assert ev[SERVER] == ParticipationDpEvent(0.25, SC(step, 5))
    for observer in (THIRD_PARTY, OTHER_SILO):
        assert ev[observer].probability == 0.25 and isinstance(ev[observer].event, LabelledMixtureDpEvent)
    assert 0 < epsilon(ev[THIRD_PARTY]) <= epsilon(ev[OTHER_SILO]) < epsilon(ev[SERVER]) < epsilon(SC(step, 5))


def test_poisson_records_with_a_fixed_cohort_are_accounted():
    """Defect 6: Poisson record sampling under a fixed cohort used to raise inside the accountant."""
    step = dp_event.PoissonSampledDpEvent(0.1, G(1.0))
    ev = observer_events(fedavg(step, 3), Cohort.fixed(20, 5))
    for observer in OBSERVERS:
        eps = account(SC(ev[observer], 10), 1e-5, "pld", neighboring="add_remove").epsilon
        assert 0 < eps < math.inf


def test_laplace_draws_are_charged_at_the_owners_noise():
    step = dp_event.LaplaceDpEvent(2.0)
    ev = observer_events(Release((step,), (True,)), Cohort.fixed(10, 10))
    assert ev[THIRD_PARTY] == ev[SERVER] == SC(step, 1)


def test_server_never_below_the_third_party():
    for release, m, n, boundary in [(fedavg(wor(100, 20, G(1.0)), 5), 20, 5, "plain"),
                                    (fedavg(wor(100, 20, G(3.0)), 1), 50, 2, "plain"),
                                    (fedavg(wor(10, 9, G(0.7)), 2), 10, 10, "secagg")]:
        ev = observer_events(release, Cohort.fixed(m, n), boundary)
        third, server, silo = (epsilon(ev[o]) for o in (THIRD_PARTY, SERVER, OTHER_SILO))
        assert server >= third - 1e-9 and silo >= third - 1e-9


def test_unequal_client_sensitivities_shrink_the_noise_credit():
    """Client j's std is z Delta_j: the last step's sum has multiplier z sqrt(1 + (n-1) r^2), r = min/max."""
    equal = observer_events(fedavg(G(2.0), 1, 1.0), Cohort.fixed(5, 5))
    skewed = observer_events(fedavg(G(2.0), 1, 0.5), Cohort.fixed(5, 5))
    assert equal[OTHER_SILO] == SC(G(2.0 * math.sqrt(4)), 1)
    assert skewed[OTHER_SILO] == SC(G(2.0 * math.sqrt(1 + 3 * 0.25)), 1)
    assert epsilon(skewed[THIRD_PARTY]) > epsilon(equal[THIRD_PARTY])


def test_paper_analysis_is_the_papers_accountant():
    step = wor(4000, 800, G(60.0))
    ev = observer_events(fedavg(step, 50), Cohort.fixed(100, 20), analysis="paper")
    aggregate = SC(wor(4000, 800, G(60.0 * math.sqrt(20))), 50)
    assert ev[THIRD_PARTY] == wor(100, 20, aggregate)
    assert ev[SERVER] == SC(step, 50)
    assert ev[OTHER_SILO] == SC(wor(4000, 800, G(60.0 * math.sqrt(19))), 50)
    assert dp_scaffold_round_events(100, 4000, 0.2, 0.2, 50, 60.0, analysis="paper") == ev


def test_paper_analysis_credits_declared_shares_in_their_units():
    """A release that declares its clients' (noise std, sensitivity) (``Release.shares``) is credited with them under
    Noble et al.'s paper analysis too: the owner of sensitivity 2 among shares of std 1 earns sqrt(4 + 2) / 2, not
    the sqrt(3) of ratio 1 (the shares were dropped)."""
    release = Release((G(1.0),), (True,), shares=((2.0, 2.0), (1.0, 1.0), (1.0, 1.0)))
    ev = observer_events(release, Cohort.fixed(3, 3), analysis="paper")
    assert ev[THIRD_PARTY] == SC(G(math.sqrt(6) / 2), 1)
    assert ev[OTHER_SILO] == SC(G(math.sqrt(5) / 2), 1)
    assert ev[THIRD_PARTY] == observer_events(release, Cohort.fixed(3, 3))[THIRD_PARTY]


def test_paper_analysis_refuses_what_the_paper_does_not_cover():
    with pytest.raises(ConfigError, match="client_sampling"):
        observer_events(fedavg(G(1.0), 2), Cohort.poisson(10, 0.2), analysis="paper")
    with pytest.raises(ConfigError, match="record_sampling"):
        observer_events(fedavg(dp_event.PoissonSampledDpEvent(0.1, G(1.0)), 2), Cohort.fixed(10, 2),
                        analysis="paper")


def test_client_sampling_counterexample_of_the_review():
    """Defect 1. K = 1, s = 1, M = 100, cohort 1, sigma_g = 1, T = 100: the paper's accountant claims 1.90 at
    delta 1e-5, but the instance (owner present with prob 0.01, far from the absent branch) has delta 5.5e-2 there
    (tests/privacy/ compute it exactly). The sound claim is the disjoint-participation PLD itself."""
    paper = observer_events(Release((G(1.0),), (True,)), Cohort.fixed(100, 1), analysis="paper")[THIRD_PARTY]
    sound = observer_events(Release((G(1.0),), (True,)), Cohort.fixed(100, 1))[THIRD_PARTY]
    assert sound == ParticipationDpEvent(0.01, SC(G(1.0), 1))
    paper_eps = account(SC(paper, 100), 1e-5, "rdp", "classic", "replace_one", subsampling_bound="paper").epsilon
    assert paper_eps == pytest.approx(1.90, abs=0.01)
    assert account(SC(sound, 100), 1e-5, "pld", neighboring="replace_one").epsilon > 8


def test_credit_counterexample_of_the_review():
    """Defect 2. n = M = 20, s = 1, K = 50, sigma_g = 10: with a linear owner and clients that jump back to a fixed
    point after every step, the release is a Gaussian mechanism with mu = K / (sigma_g sqrt(K + n - 1)) = 0.602. The
    sound claim is mu^2 = 49/100 + 1/(100 * 20), above it; the paper's credit at every step claims mu = 0.158."""
    ev = observer_events(fedavg(G(10.0), 50), Cohort.fixed(20, 20))
    claimed_mu = math.sqrt(49 / 100 + 1 / 2000)
    assert ev[THIRD_PARTY] == dp_event.ComposedDpEvent([SC(G(10.0), 49), SC(G(10.0 * math.sqrt(20)), 1)])
    true_mu = 50 / (10 * math.sqrt(50 + 19))
    assert claimed_mu > true_mu
    mu_eps = lambda mu: account(G(1 / mu), 1e-5, "pld").epsilon  # noqa: E731
    assert account(ev[THIRD_PARTY], 1e-5, "pld", neighboring="replace_one").epsilon == pytest.approx(
        mu_eps(claimed_mu), rel=1e-3)
    paper = observer_events(fedavg(G(10.0), 50), Cohort.fixed(20, 20), analysis="paper")[THIRD_PARTY]
    assert account(paper, 1e-5, "pld", neighboring="replace_one").epsilon < mu_eps(true_mu) / 2


def test_bad_arguments():
    step = wor(10, 2, G(1.0))
    with pytest.raises(ConfigError, match="boundary"):
        observer_events(fedavg(step, 1), Cohort.fixed(10, 2), boundary="tee")
    with pytest.raises(ConfigError, match="analysis"):
        observer_events(fedavg(step, 1), Cohort.fixed(10, 2), analysis="tight")
    with pytest.raises(ValueError, match="flag"):
        Release((step, step), (True,))


def test_boundaries_and_schedules():
    """A trusted aggregator's server is no observer; a shuffler is charged as plain; a deterministic schedule charges
    the whole round when the owner takes part and nothing otherwise, with the noise credit of the smallest cohort."""
    step = G(2.0)
    release = fedavg(step, 2)
    trusted = observer_events(release, Cohort.fixed(10, 5), "trusted")
    assert set(trusted) == {THIRD_PARTY, OTHER_SILO}
    assert observer_events(release, Cohort.fixed(10, 5), "shuffler") == observer_events(release, Cohort.fixed(10, 5))
    on = observer_events(release, Cohort.scheduled(10, 5, 3, takes_part=True))
    off = observer_events(release, Cohort.scheduled(10, 5, 3, takes_part=False))
    assert on[THIRD_PARTY] == dp_event.ComposedDpEvent([SC(step, 1), SC(G(2.0 * math.sqrt(3)), 1)])
    assert on[SERVER] == SC(step, 2)
    assert all(e == dp_event.NoOpDpEvent() for e in off.values())


def test_mcmahans_amplification_charges_only_the_observers_of_the_servers_noise():
    """Release.paper = 'mcmahan' under the paper analysis: the third party and another silo of the server's noise get
    one Poisson subsampled Gaussian per round (two draws under one participation coin: the Gaussian their mu's add
    to); the server keeps its sound charge (it sees the unnoised messages); the sound analysis gives the same towards
    an observer the cohort is secret from and the mixture towards one that knows it; fixed-size and public cohorts
    are refused, naming the key."""
    draws = (dp_event.GaussianDpEvent(1.25), dp_event.GaussianDpEvent(5 / 3))  # 1/1.25^2 + 1/(5/3)^2 = 1
    release = Release((dp_event.NonPrivateDpEvent(),), (True,), server_events=draws, paper="mcmahan")
    poisson = Cohort.poisson(100, 0.1)
    amplified = observer_events(release, poisson, "plain", "paper")
    sampled = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0))
    assert amplified[THIRD_PARTY] == amplified[OTHER_SILO] == sampled
    sound = observer_events(release, poisson, "plain")
    assert amplified[SERVER] == sound[SERVER] and math.isinf(account(amplified[SERVER], 1e-5).epsilon)
    assert sound[THIRD_PARTY] == sampled  # the default: the cohort is secret from it
    known = observer_events(release, poisson, "plain", knows_cohort=frozenset(OBSERVERS))
    assert known[THIRD_PARTY] == ParticipationDpEvent(0.1, dp_event.ComposedDpEvent(
        [dp_event.SelfComposedDpEvent(d, 1) for d in draws]))
    with pytest.raises(ConfigError, match="algorithm.client_sampling"):
        observer_events(release, Cohort.fixed(100, 10), "trusted", "paper")
    with pytest.raises(ConfigError, match="privacy.analysis = 'paper'.*public"):
        observer_events(release, dataclasses.replace(poisson, public=True), "trusted", "paper")


def test_who_knows_the_cohort():
    """The server always; another silo behind secure aggregation (its members exchange keys) or when told
    (privacy.cohort = 'members'); everyone when published; a bad value names the key."""
    from dpfl.accounting.observers import cohort_known_to

    assert cohort_known_to("plain") == cohort_known_to("trusted") == {SERVER}
    assert cohort_known_to("secagg") == cohort_known_to("plain", "members") == {SERVER, OTHER_SILO}
    assert cohort_known_to("plain", "published") == set(OBSERVERS)
    with pytest.raises(ConfigError, match="privacy.cohort = 'hidden'"):
        cohort_known_to("plain", "hidden")


def test_the_server_noise_is_amplified_towards_observers_that_do_not_know_the_cohort():
    """Server noise (two draws at z_k composing to one Gaussian at (sum z_k^-2)^-1/2): the Poisson subsampled Gaussian,
    or sampling without replacement of n from the clients the observer does not know about (M for the third party,
    M - m for a coalition of m silos), towards an observer that does not know the cohort; the participation mixture
    towards one that does; never amplified for public cohorts, or noise other than Gaussian."""
    draws = (G(1.0), G(1.0))
    z = 2 ** -0.5
    release = Release((dp_event.NonPrivateDpEvent(),), (True,), server_events=draws)
    poisson = observer_events(release, Cohort.poisson(100, 0.1), "trusted")
    assert poisson == {THIRD_PARTY: dp_event.PoissonSampledDpEvent(0.1, G(z)),
                       OTHER_SILO: dp_event.PoissonSampledDpEvent(0.1, G(z))}
    fixed = observer_events(dataclasses.replace(release, colluders=3), Cohort.fixed(100, 10), "plain")
    assert fixed[THIRD_PARTY] == wor(100, 10, G(z)) and fixed[OTHER_SILO] == wor(97, 10, G(z))
    assert fixed[SERVER] == ParticipationDpEvent(0.1, SC(dp_event.NonPrivateDpEvent(), 1))  # the plain messages
    mixture = ParticipationDpEvent(0.1, SC(G(1.0), 2))
    secagg = observer_events(release, Cohort.poisson(100, 0.1), "secagg")
    assert secagg[THIRD_PARTY] == dp_event.PoissonSampledDpEvent(0.1, G(z)) and secagg[OTHER_SILO] == mixture
    known = observer_events(release, Cohort.poisson(100, 0.1), "trusted", knows_cohort=frozenset(OBSERVERS))
    assert known == {THIRD_PARTY: mixture, OTHER_SILO: mixture}
    public = dataclasses.replace(Cohort.poisson(100, 0.1), public=True)
    assert observer_events(release, public, "trusted")[THIRD_PARTY] == mixture
    laplace = Release((dp_event.NonPrivateDpEvent(),), (True,), server_events=(dp_event.LaplaceDpEvent(1.0),))
    assert observer_events(laplace, Cohort.poisson(100, 0.1), "trusted")[THIRD_PARTY] == \
        ParticipationDpEvent(0.1, SC(dp_event.LaplaceDpEvent(1.0), 1))
    assert observer_events(release, Cohort.fixed(10, 9), "trusted", knows_cohort=frozenset())[OTHER_SILO] == G(z)


def test_poisson_share_counts_are_binned_at_their_smallest_count():
    """K ~ Binomial(n, q) in bins that partition 0..n (the probabilities sum to 1), each charged its smallest k, the
    credited variance 1 + k growing by at most SHARE_BIN_RATIO within a bin; the lower 1e-12 tail at k = 0; a cap (the
    shares sure to reach a secure sum) bounds every k; small populations get one bin per k."""
    from scipy import stats

    from dpfl.accounting.observers import SHARE_BIN_RATIO, poisson_shares

    small = poisson_shares(3, 0.5)
    assert [k for _, k in small] == [0, 1, 2, 3]
    assert [w for w, _ in small] == pytest.approx(stats.binom.pmf(range(4), 3, 0.5), abs=1e-15)
    bins = poisson_shares(999, 0.05)
    weights, ks = zip(*bins)
    assert sum(weights) == pytest.approx(1.0, abs=1e-12) and list(ks) == sorted(set(ks))
    assert ks[0] == 0 and weights[0] <= 1e-12 and stats.binom.cdf(ks[1] - 1, 999, 0.05) <= 1e-12
    for (w, lo), (_, hi) in zip(bins[1:], bins[2:]):
        assert (1 + hi - 1) <= SHARE_BIN_RATIO * (1 + lo) or hi == lo + 1
        assert w == pytest.approx(stats.binom.cdf(hi - 1, 999, 0.05) - stats.binom.cdf(lo - 1, 999, 0.05), abs=1e-15)
    assert max(k for _, k in poisson_shares(999, 0.05, cap=20)) == 20
    assert poisson_shares(999, 0.05, cap=0) == ((1.0, 0),)


def test_poisson_cohorts_credit_the_shares_of_the_members_they_have():
    """Shares under Poisson: each observer of the sum is charged the labelled mixture over the Binomial count of the
    other members (another silo removes its own: one client fewer), its RDP the log-sum of the credited curves and its
    PLD the mixture of theirs; it survives the ledger's journal (event_to_dict / event_from_dict) and costs less than
    the owner's own share alone."""
    from dpfl.accounting.events import LabelledMixtureDpEvent, event_from_dict, event_to_dict
    from dpfl.accounting.observers import poisson_shares
    from dpfl.accounting.rdp import rdp_curve

    z = 0.3
    events = observer_events(Release((G(z),), (True,)), Cohort.poisson(40, 0.25), "secagg")
    third = events[THIRD_PARTY]
    assert isinstance(third, ParticipationDpEvent) and isinstance(third.event, LabelledMixtureDpEvent)
    bins = poisson_shares(39, 0.25)
    assert third.event.weights == tuple(w for w, _ in bins)
    assert third.event.events == tuple(SC(G(z * math.sqrt(1 + k)), 1) if k else SC(G(z), 1) for _, k in bins)
    assert events[OTHER_SILO].event.weights == tuple(w for w, _ in poisson_shares(38, 0.25))
    assert event_from_dict(event_to_dict(third)) == third
    orders = [2.0, 4.0, 8.0]
    curves = [rdp_curve(e, orders) for e in third.event.events]
    expected = np.log(sum(w * np.exp((np.asarray(orders) - 1) * c) for w, c in zip(third.event.weights, curves)))
    assert rdp_curve(third.event, orders) == pytest.approx(expected / (np.asarray(orders) - 1), rel=1e-9)
    alone = account(SC(ParticipationDpEvent(0.25, G(z)), 10), 1e-5, "pld", "modern", "zero_out").epsilon
    mixed = account(SC(third, 10), 1e-5, "pld", "modern", "zero_out").epsilon
    rdp = account(SC(third, 10), 1e-5, "rdp", "modern", "zero_out").epsilon
    assert mixed < rdp and mixed < alone / 2
