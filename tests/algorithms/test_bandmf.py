"""BandMF with the banded square root strategy (``dpfl.algorithms.bandmf``): the strategy's coefficients, the
sensitivity under b-min-separated participation (and its excess when participations are closer), the noise
C^{-1} nu drawn from the server's stream, the ledger's charge (one Gaussian per participation, at its round), the
samplers and bands it refuses, its exact worst case run through the real engine, and a resume mid-band (calibration
to privacy.epsilon: tests/experiments/test_noise_level.py, over every calibrated family); amplified BandMF (Poisson
within b partitions taking turns): its charge per observer, its refusals, its exact worst case and its calibration."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import OTHER_SILO, SERVER, THIRD_PARTY
from dpfl.accounting.theory import gdp_epsilon
from dpfl.algorithms.bandmf import banded_sqrt_coefficients
from dpfl.engine import randomness
from dpfl.engine.boundary import Delivery
from dpfl.engine.protocol import ServerContext
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation
import dpfl
from dpfl.accounting.events import ParticipationDpEvent
from ftrl_worst_case import (amplified_bandmf_worst_case, band_noise_matrix, bandmf_worst_case_mu,
                             subsampled_gaussian_epsilon)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def simulation(*extra: str, out=None, noise_key=None):
    """8 clients, cohorts of 2 in round robin: a client's rounds are 4 apart (b = 4 by default)."""
    return build_simulation(load_config(None, [
        "algorithm.name='bandmf'", "data.num_clients=8", "data.samples_per_client=30", "run.seed=1",
        "algorithm.client_rate=0.25", "algorithm.rounds=8", *extra]), out, noise_key=noise_key)


def strategy(coefficients: tuple[float, ...], rounds: int) -> np.ndarray:
    return sum(c * np.eye(rounds, k=-k) for k, c in enumerate(coefficients))


def test_the_banded_square_root_squares_to_the_prefix_sums_when_it_has_every_band():
    assert banded_sqrt_coefficients(5) == (1.0, 0.5, 0.375, 0.3125, 0.2734375)  # binom(2k, k) / 4^k
    C = strategy(banded_sqrt_coefficients(12), 12)
    np.testing.assert_allclose(C @ C, np.tril(np.ones((12, 12))), atol=1e-12)
    banded = strategy(banded_sqrt_coefficients(4), 12)  # truncated: B = A C^{-1} still factors A
    np.testing.assert_allclose(band_noise_matrix(banded_sqrt_coefficients(4), 12) @ banded, np.tril(np.ones((12, 12))),
                               atol=1e-9)


def test_the_sensitivity_is_sqrt_k_column_norms_for_participations_b_apart_and_more_when_closer():
    """max over d in {-1, 1}^P of ||C d||: sqrt(k) ||c|| for rounds 4 apart under 4 bands (whatever the signs: the
    columns do not overlap), the cut last column counting only its rows; rounds 2 apart exceed sqrt(k) ||c||."""
    c = banded_sqrt_coefficients(4)
    C, norm = strategy(c, 16), math.sqrt(sum(x * x for x in c))

    def sensitivity(rounds: list[int]) -> float:
        columns = C[:, rounds]
        signs = itertools.product((-1, 1), repeat=len(rounds))
        return max(np.linalg.norm(columns @ np.array(d)) for d in signs)

    assert sensitivity([0, 4, 8, 12]) == pytest.approx(2 * norm, rel=1e-12)
    assert sensitivity([2, 6, 10, 14]) == pytest.approx(math.sqrt(3 * norm**2 + 1 + 0.25), rel=1e-12)  # 14: 2 rows
    assert sensitivity([0, 2, 4, 6]) > 2 * norm * 1.2


def test_the_server_draws_one_gaussian_per_round_and_adds_c_inverse_of_the_draws():
    """Rows of independent trials, 4 bands, nothing delivered: x_t = x_0 - (eta / n) (A C^{-1} nu)_t exactly, nu_t =
    z ||c|| C times the normals of stream (key, round t - 1, row, server_noise), against the oracle's dense inverse."""
    alg = simulation("algorithm.noise_multiplier=1.5", "algorithm.clip=0.5", "algorithm.global_lr=2.0").algorithm
    assert (alg.bands, alg.separation, alg.cohort_size) == (4, 4, 2)
    assert alg.draw_sensitivity == pytest.approx(0.5 * math.sqrt(1 + 0.25 + 0.375**2 + 0.3125**2))
    rounds, P, key, rows = 9, 3, 11, torch.arange(3)
    scale, std = alg.global_lr / alg.cohort_size, alg.noise_multiplier * alg.draw_sensitivity
    state = alg.init_state(torch.zeros(P), 8)
    server = {k: v.expand(len(rows), *v.shape).clone() for k, v in state.server.items()}
    released = []
    for t in range(rounds):
        ctx = ServerContext(key, t, stream_ids=rows)
        server = alg.server_update(t, server, Delivery({"u": torch.zeros(len(rows), P)}, 2, 8), ctx)
        assert ctx.events == [dp_event.GaussianDpEvent(1.5)]
        released.append(-server["x"] / scale)
    nu = std * torch.stack([torch.stack([torch.randn(P, generator=randomness.generator(key, t, int(r), "server_noise"))
                                         for r in rows]) for t in range(rounds)]).double()  # [T, rows, P]
    G = torch.from_numpy(band_noise_matrix(alg.coefficients, rounds))
    expected = torch.einsum("ts,srp->trp", G, nu)
    torch.testing.assert_close(torch.stack(released).double(), expected, rtol=1e-5, atol=1e-5)


def test_the_ledger_charges_a_gaussian_at_each_participation_and_a_budget_stops_before_one():
    sim = simulation("algorithm.noise_multiplier=2.0", "run.epsilon_every=1")
    sim.run(8)
    gaussian = dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(2.0), 1)
    for round_number in range(1, 9):  # client 0 in rounds 1 and 5
        expected = gaussian if round_number in (1, 5) else dp_event.NoOpDpEvent()
        assert sim.ledger.charged(round_number) == {THIRD_PARTY: expected, OTHER_SILO: expected}, round_number
    spent = {m.round: m.epsilon[THIRD_PARTY] for m in sim.history}
    assert spent[1] == spent[4] < spent[5] == spent[8]
    assert spent[8] == pytest.approx(gdp_epsilon(math.sqrt(2) / 2.0, sim.ledger.delta), rel=1e-3)
    budget = simulation("algorithm.noise_multiplier=2.0", f"privacy.budget={(spent[1] + spent[5]) / 2!r}")
    budget.run(8)
    assert budget.stopped_by == "budget" and budget.next_round == 4


def test_a_schema_that_does_not_enforce_the_separation_is_refused_naming_its_key():
    for scheme in ("fixed", "poisson", "disjoint"):
        with pytest.raises(ConfigError) as caught:
            simulation(f"algorithm.client_sampling='{scheme}'")
        assert caught.value.field == "algorithm.client_sampling" and "round_robin" in str(caught.value)
    for bands in (5, 0):
        with pytest.raises(ConfigError) as caught:
            simulation(f"algorithm.bands={bands}")
        assert caught.value.field == "algorithm.bands"
    assert "at most 4" in str(pytest.raises(ConfigError, simulation, "algorithm.bands=5").value)
    # cohorts of 3 out of 8 wrap: client 0 in rounds 1 and 3, so the separation is floor(8 / 3) = 2
    wrapped = simulation("algorithm.client_rate=0.375").algorithm
    assert (wrapped.separation, wrapped.bands) == (2, 2)
    with pytest.raises(ConfigError, match="algorithm.bands"):
        simulation("algorithm.client_rate=0.375", "algorithm.bands=3")
    with pytest.raises(ConfigError) as caught:
        simulation("privacy.analysis='paper'")
    assert caught.value.field == "privacy.analysis"


@pytest.mark.parametrize(("boundary", "rounds", "bands"), [("trusted", 12, 4), ("plain", 12, 2),
                                                           ("secagg", 10, 4)])
def test_the_ledger_is_never_below_the_exact_privacy_of_the_worst_case(boundary, rounds, bands):
    """The linear instance of ``ftrl_worst_case`` (every update the constant -C e_0, the owner's 0 on its zero-out
    neighbour): the T released models are a linear Gaussian mechanism x = x_0 - (eta / n)(A s + A C^{-1} nu), whose
    exact privacy is mu-GDP with mu the Mahalanobis length of the shift measured through the engine. The owner
    (client 0) is in rounds 1, 5, 9: with whole columns mu = sqrt(3) / z and the ledger (PLD) is exact; at T = 10
    the last column is cut to 2 of its 4 rows, which the ledger charges whole (ratio 1.037)."""
    sim, mu, moved = bandmf_worst_case_mu(boundary, rounds, bands=bands)
    alg = sim.algorithm
    assert (alg.bands, alg.separation, alg.noise_multiplier) == (bands, 4, 0.8)
    columns = np.zeros(rounds)  # the owner's move of C g, in units of C: its columns at rounds 1, 5, 9
    for start in (0, 4, 8):
        columns[start:start + bands] = alg.coefficients[:rounds - start]
    np.testing.assert_allclose(moved, columns, atol=1e-5)
    exact = gdp_epsilon(mu, sim.ledger.delta)
    epsilon = sim.ledger.epsilon()
    for observer in (THIRD_PARTY, OTHER_SILO):  # the engine's float32 shift measures mu to 1e-6 relative
        assert epsilon[observer] >= exact * (1 - 1e-6), (observer, epsilon[observer], exact)
    claimed = gdp_epsilon(math.sqrt(3) / 0.8, sim.ledger.delta)
    assert epsilon[THIRD_PARTY] == pytest.approx(claimed, rel=1e-4)
    if rounds == 12:
        assert mu == pytest.approx(math.sqrt(3) / 0.8, rel=1e-5)
        assert epsilon[THIRD_PARTY] <= exact * (1 + 1e-4)
    else:
        cut = 2 + (1 + 0.25) / sum(c * c for c in alg.coefficients)
        assert mu == pytest.approx(math.sqrt(cut) / 0.8, rel=1e-5)
        assert epsilon[THIRD_PARTY] / exact == pytest.approx(1.037, abs=0.001)  # measured: 1.03699
    if boundary == "trusted":
        assert SERVER not in epsilon
    else:
        assert math.isinf(epsilon[SERVER])


def test_a_run_resumed_mid_band_draws_the_same_noise(tmp_path):
    extra = ("run.checkpoint_every=3",)
    first = simulation(*extra, out=tmp_path)
    reference = simulation(*extra, noise_key=first.seed)
    reference.run(8)
    first.run(3)
    assert bool(first.state.server["recent"].abs().sum(-1).gt(0).all())
    resumed = simulation(*extra, out=tmp_path)
    resumed.load_checkpoint(tmp_path)
    resumed.run(8)
    assert torch.equal(resumed.model, reference.model)
    assert torch.equal(resumed.state.server["recent"], reference.state.server["recent"])



# -- amplified BandMF: partitioned Poisson ----------------------------------------------------------------------------
def amplified(*extra: str):
    """8 clients in 4 partitions (the bands), each client of the round's partition in with q = l b = 0.5."""
    return simulation("algorithm.client_sampling='partitioned_poisson'", "algorithm.client_rate=0.125",
                      "algorithm.bands=4", *extra)


def test_amplified_bandmf_is_charged_a_subsampled_gaussian_in_its_partitions_rounds_amplified_only_if_secret():
    alg = amplified("algorithm.noise_multiplier=2.0").algorithm
    assert (alg.bands, alg.separation, alg.partition_rate, alg.cohort_size) == (4, 4, 0.5, 1)
    sampled = dp_event.PoissonSampledDpEvent(0.5, dp_event.GaussianDpEvent(2.0))
    mixture = ParticipationDpEvent(0.5, dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(2.0), 1))
    for cohort, (third, silo) in {"secret": (sampled, sampled), "members": (sampled, mixture),
                                  "published": (mixture, mixture)}.items():
        sim = amplified("algorithm.noise_multiplier=2.0", f"privacy.cohort='{cohort}'")
        for t in range(8):
            expected = (third, silo) if t % 4 == 0 else (dp_event.NoOpDpEvent(),) * 2
            assert sim.round_privacy(t) == {THIRD_PARTY: expected[0], OTHER_SILO: expected[1]}, (cohort, t)
    narrower = amplified("algorithm.bands=2").algorithm  # 2 partitions: q = 0.25, separation 2
    assert (narrower.bands, narrower.separation, narrower.partition_rate) == (2, 2, 0.25)


def test_amplified_bandmf_refuses_more_bands_than_its_rate_allows_and_other_families_refuse_its_sampler():
    widest = amplified("algorithm.bands=8").algorithm  # floor(1 / l) = 8, the default: q = 1, no amplification
    assert (widest.bands, widest.partition_rate) == (8, 1.0)
    assert simulation("algorithm.client_sampling='partitioned_poisson'", "algorithm.client_rate=0.125").algorithm \
        .bands == 8
    for extra in (("algorithm.bands=9",), ("algorithm.bands=5", "algorithm.client_rate=0.25"), ("algorithm.bands=0",)):
        with pytest.raises(ConfigError) as caught:
            amplified(*extra)
        assert caught.value.field == "algorithm.bands", extra
    assert "at most 4" in str(pytest.raises(ConfigError, amplified, "algorithm.bands=5", "algorithm.client_rate=0.25")
                               .value)
    for name in ("dp-ftrl", "dp-fedavg-user", "dp-fedavg"):
        with pytest.raises(ConfigError) as caught:
            build_simulation(load_config(None, [f"algorithm.name='{name}'", "data.num_clients=8",
                                                "algorithm.client_sampling='partitioned_poisson'"]))
        assert caught.value.field == "algorithm.client_sampling" and "'bandmf'" in str(caught.value), name


def test_amplified_bandmf_is_never_below_the_exact_privacy_of_its_worst_case():
    """The linear instance of ``ftrl_worst_case`` with every other client null, under partitioned Poisson (8 clients,
    b = 4, q = 0.5, z = 0.8): the released models are x_0 - (eta / n) A (C^{-1} nu + sum of the owner's sampled
    columns), so, C^{-1} being known, the third party sees y = C g + nu: per block of b rows from the owner's round
    j_k, (1 - q) N(0, s^2 I) + q N(v_k, s^2 I) against N(0, s^2 I) with v_k the owner's column measured through the
    engine, independent across blocks. Its exact epsilon (``subsampled_gaussian_epsilon``, from the densities) is what
    the ledger must never be below; with whole columns the ledger is tight, with the last one cut to 2 rows (T = 10)
    it charges the whole column (the only slack)."""
    for rounds in (12, 10):
        sim, moved, eligible = amplified_bandmf_worst_case(rounds, client_rate=0.125, bands=4)
        alg = sim.algorithm
        assert eligible == [0, 4, 8] and alg.partition_rate == 0.5
        columns = np.zeros(rounds)
        for start in eligible:
            columns[start:start + 4] = alg.coefficients[:rounds - start]
        np.testing.assert_allclose(moved, columns, atol=1e-5)
        shifts = [np.linalg.norm(moved[j:j + 4]) / (alg.noise_multiplier * alg.column_norm) for j in eligible]
        exact = subsampled_gaussian_epsilon(0.5, shifts, sim.ledger.delta)
        spent = sim.ledger.epsilon()
        for observer in (THIRD_PARTY, OTHER_SILO):
            assert spent[observer] >= exact * (1 - 1e-3), (rounds, observer, spent[observer], exact)
        ratio = spent[THIRD_PARTY] / exact
        if rounds == 12:
            assert ratio == pytest.approx(1.0, abs=2e-3), ratio
        else:
            assert ratio == pytest.approx(1.0, abs=0.2) and ratio > 1.01, ratio


def test_amplified_bandmf_calibrates_to_privacy_epsilon_through_dpfl_run_and_needs_less_noise_than_round_robin():
    """privacy.epsilon = 2 over 12 rounds of 8 clients: the run spends 2 towards the third party (the least noise that
    does, to the search's precision); amplified (b = 4, q = 0.5) by the secret cohort, it needs less noise than
    round robin with the same bands and expected cohort (its charged rounds are the same 3, each subsampled)."""
    config = {"data": {"num_clients": 8, "samples_per_client": 30}, "privacy": {"epsilon": 2.0},
              "algorithm": {"name": "bandmf", "rounds": 12, "client_rate": 0.125, "bands": 4},
              "run": {"noise_seed": 1, "eval_every": 12}}
    noises = {}
    for sampling, rate in (("partitioned_poisson", 0.125), ("round_robin", 0.25)):
        config["algorithm"].update(client_sampling=sampling, client_rate=rate)
        results = dpfl.run(config)
        spent = results.epsilon
        assert spent[THIRD_PARTY] <= 2.0 * (1 + 1e-9) and max(spent.values()) >= 2.0 * (1 - 1e-3), (sampling, spent)
        noises[sampling] = results.privacy["calibration"]["noise_level"]
    assert noises["partitioned_poisson"] < noises["round_robin"] * 0.8, noises
