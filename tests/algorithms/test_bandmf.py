"""BandMF with the banded square root strategy (``dpfl.algorithms.bandmf``): the strategy's coefficients, the
sensitivity under b-min-separated participation (and its excess when participations are closer), the noise
C^{-1} nu drawn from the server's stream, the ledger's charge (one Gaussian per participation, at its round), the
samplers and bands it refuses, its exact worst case run through the real engine, and a resume mid-band (calibration
to privacy.epsilon: tests/experiments/test_noise_level.py, over every calibrated family)."""

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
from ftrl_worst_case import band_noise_matrix, bandmf_worst_case_mu

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

