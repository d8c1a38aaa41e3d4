"""The rounds' likelihood-ratio factors (dpfl.audit.likelihood_ratio): rounds of different shift-to-noise ratios
weighted by its square, end to end through the many-run audit's real trials."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event
from scipy import stats

from dpfl.accounting.events import ParticipationDpEvent
from dpfl.algorithms.dp_ftrl import DpFtrl
from dpfl.algorithms.local_sgd import LocalSGD
from dpfl.audit import gdp, likelihood_ratio, runs
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation
from dpfl.noise import GaussianMechanism

DELTA = 1e-2
#: Two rounds' noise multipliers: shift-to-noise ratios mu_t = 2 and 0.25
SCHEDULE = (0.5, 4.0)
FPR = 0.1
#: the fields of a DpFtrl that its encoder does not read
ENCODER_ONLY = dict(local_steps=1, lr=0.1, sampler=None, clip=1.0, noise_multiplier=1.0, global_lr=1.0, population=8,
                    cohort_size=2)


@dataclasses.dataclass(frozen=True)
class ScheduledNoise(LocalSGD):
    """FedSGD whose round t draws (and declares) noise multiplier ``SCHEDULE[t]``: a noise schedule."""

    def at(self, round_index: int) -> LocalSGD:
        return dataclasses.replace(self, mechanism=GaussianMechanism(SCHEDULE[round_index]))

    def release(self, round_index, state, counts):
        return LocalSGD.release(self.at(round_index), round_index, state, counts)

    def client_round(self, round_index, server, clients, data, ctx):
        return LocalSGD.client_round(self.at(round_index), round_index, server, clients, data, ctx)


def test_the_factors_are_the_squared_ratios_scaled_by_the_largest_and_1_where_a_round_is_not_gaussian():
    gaussian = [dp_event.GaussianDpEvent(z) for z in SCHEDULE]
    assert likelihood_ratio.round_factors(gaussian) == [1.0, 1 / 64]
    assert likelihood_ratio.round_factors([dp_event.GaussianDpEvent(0.7)] * 3) == [1.0, 1.0, 1.0]
    two_steps = dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(1.0), 2)  # mu^2 = 2
    assert likelihood_ratio.round_factors([two_steps, dp_event.GaussianDpEvent(1.0)]) == pytest.approx([1.0, 0.5])
    for odd in (ParticipationDpEvent(0.5, gaussian[0]), dp_event.LaplaceDpEvent(1.0), dp_event.NoOpDpEvent(),
                dp_event.GaussianDpEvent(0.0)):
        assert likelihood_ratio.round_factors([gaussian[0], odd]) == [1.0, 1.0]


def power(negatives: np.ndarray, positives: np.ndarray) -> tuple[float, float]:
    """(TPR at FPR = ``FPR``: the threshold at the negatives' 1 - FPR quantile; the scores' separation
    (mean difference over the pooled standard deviation), an estimate of mu for Gaussian scores)."""
    threshold = np.quantile(negatives, 1 - FPR)
    spread = math.sqrt((negatives.var(ddof=1) + positives.var(ddof=1)) / 2)
    return float((positives > threshold).mean()), float((positives.mean() - negatives.mean()) / spread)


def test_the_likelihood_ratio_score_of_two_uneven_rounds_has_the_composed_mu(make_sim, monkeypatch):
    """One client, the plain server, two rounds at z = 0.5 and 4 (mu_t = 2 and 0.25), 1000 runs per world, run seed
    0: the likelihood-ratio score separates the worlds by mu = sqrt(4 + 1/16) = 2.016 (exact Gaussian: TPR 0.769 at
    FPR 0.1), the equal-weight sum by 2 / sqrt(1/4 + 16) = 0.496 (TPR 0.216). Measured: 2.00 (TPR 0.756) against
    0.45 (TPR 0.198), within sampling error (the separation's standard error ~0.055, the TPR's ~0.02). The audit's
    GDP fit certifies 0.82x of the claim with the factors, 0.06x without."""
    sim = make_sim(1.0, DELTA, 1, "algorithm.rounds=2")
    sim.algorithm = ScheduledNoise(**{f.name: getattr(sim.algorithm, f.name)
                                      for f in dataclasses.fields(LocalSGD)})
    assert [gdp.event_mu(sim.round_privacy(t)["server"]) for t in range(2)] == [2.0, 0.25]
    mu = math.sqrt(sum(1 / z ** 2 for z in SCHEDULE))
    equal_mu = len(SCHEDULE) / math.sqrt(sum(z ** 2 for z in SCHEDULE))
    exact_tpr = stats.norm.sf(stats.norm.isf(FPR) - mu)
    likelihood_scores = runs.run_trials(sim, "server", 1000, rounds=2)
    monkeypatch.setattr(likelihood_ratio, "round_factors", lambda events: [1.0] * len(events))
    equal_scores = runs.run_trials(sim, "server", 1000, rounds=2)
    (lr_tpr, lr_mu), (equal_tpr, equal_sep) = power(*likelihood_scores), power(*equal_scores)
    assert lr_mu == pytest.approx(mu, abs=0.15) and lr_tpr == pytest.approx(exact_tpr, abs=0.04)
    assert equal_sep == pytest.approx(equal_mu, abs=0.1)
    assert equal_tpr == pytest.approx(stats.norm.sf(stats.norm.isf(FPR) - equal_mu), abs=0.04)
    assert lr_tpr > equal_tpr + 0.4
    # the audit's GDP fit of the claim (6.06 at delta 1e-2): 4.99 (0.82x) with the factors, 0.37 (0.06x) without
    claim = runs.claimed_epsilon(sim, "server", rounds=2)
    fits = [gdp.gdp_lower_bound(*scores, DELTA, claimed_epsilon=claim) for scores in (likelihood_scores, equal_scores)]
    assert claim == pytest.approx(6.064, abs=1e-3)
    assert [fit.mu for fit in fits] == pytest.approx([1.754, 0.255], abs=1e-3) and fits[0].epsilon < claim


# -- correlated rounds: a matrix-factorization release read through its encoder ------------------------------------
def test_the_encoded_score_separates_by_the_norm_of_the_encoded_shift():
    """DP-FTRL's tree over 4 rounds (nodes {1}, {1, 2}, {3}, {1..4}): scores s = h + C^-1 nu, nu standard normal,
    20,000 draws. The canary in round 1 lies in 3 nodes: the encoded score separates by ||C h|| = sqrt(3) = 1.73
    (noise-free it is exactly ||C h||^2 = 3); the plain sum of the rounds, the last prefix sum, holds the root alone:
    1. In round 4, one node: 1 either way. Measured separations within 0.03 of these."""
    encoder = DpFtrl(**ENCODER_ONLY, epoch=4).noise_encoder(4)
    noise = torch.randn(20000, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) \
        @ torch.linalg.inv(encoder).T
    for round_held, nodes in ((0, 3), (3, 1)):
        h = torch.zeros(4, dtype=torch.float64)
        h[round_held] = 1.0
        presence = h.expand(20000, 4)
        assert likelihood_ratio.encoded_scores(encoder, h.unsqueeze(0), h.unsqueeze(0)).item() == pytest.approx(nodes)
        without = likelihood_ratio.encoded_scores(encoder, noise, presence)
        with_canary = likelihood_ratio.encoded_scores(encoder, h + noise, presence)
        assert separation(without, with_canary) == pytest.approx(math.sqrt(nodes), abs=0.03)
        assert separation(noise.sum(1), (h + noise).sum(1)) == pytest.approx(1.0, abs=0.03)


def separation(without: torch.Tensor, with_canary: torch.Tensor) -> float:
    return float((with_canary.mean() - without.mean()) / without.std())


@pytest.mark.parametrize("sampling, cohort, floor, ceiling", [("round_robin", "published", 0.75, 1.0),
                                                               ("disjoint", "published", 0.5, 0.75)])
def test_dp_ftrl_audited_through_its_tree_certifies_most_of_the_claim(monkeypatch, sampling, cohort, floor, ceiling):
    """dp-ftrl, 10 clients in epochs of E = 5 rounds (2 a round), z = 1, the third party knowing the cohort, 1000 runs
    per world over the epoch (R = 5, claim 4.90 at delta 1e-2: the tree's sqrt(3) / z). Read through the tree's
    encoder the audit certifies 0.84x of the claim under round robin (the canary's client in round 1, whose leaf is in
    3 nodes) and 0.61x under disjoint batches (its round drawn anew in each run: 3, 2, 2, 1 or 1 nodes); the sum of
    the rounds' scores certified 0.16x in both."""
    sim = build_simulation(load_config(None, [
        "data.num_clients=10", "data.samples_per_client=20", "algorithm.name='dp-ftrl'", "algorithm.local_steps=1",
        "algorithm.sample_rate=1.0", "algorithm.client_rate=0.2", f"algorithm.client_sampling='{sampling}'",
        "algorithm.noise_multiplier=1.0", "algorithm.rounds=5", "algorithm.lr=1.0", "algorithm.clip=1.0",
        f"privacy.delta={DELTA!r}", f"privacy.cohort='{cohort}'", "run.noise_seed=0"]))
    assert sim.algorithm.epoch == 5 and "third_party" in sim.boundary.knows_cohort
    encoded = runs.audit(sim, "third_party", 1000, rounds=5)
    assert encoded.claimed_epsilon == pytest.approx(4.904, abs=1e-3)
    assert floor <= encoded.strength < ceiling and not encoded.violated
    monkeypatch.setattr(DpFtrl, "noise_encoder", lambda self, rounds: None)
    summed = runs.audit(sim, "third_party", 1000, rounds=5)
    assert summed.strength < 0.25
