"""Worst-case instances for the ISRL-DP algorithms, run through the real ``ISRL.client_round``.

One silo of n = 12 records with 1-D linear losses <theta, x_j> (gradient x_j, independent of theta, so every round can
be run from theta = 0 and the rounds' messages are the transcript). All records are 0 except the owner's record,
+C or -C on the two neighbouring datasets (replace-one: the mean over a batch of K moves by 2C/K, its sensitivity).

* isrl-prox-sgd, R = 4 rounds, K = floor(12 / 4) = 3: the record lies in exactly one round's disjoint batch, so the
  coupled transcripts (same seeds) differ in exactly one round, by eta 2C/K; that round's message is Gaussian with std
  z eta 2C/K. An observer that knows the permutation (no credit for it is claimed) sees mu = 1/z.
* isrl-mb-sgd with s = 1 (the whole silo in every batch), R = 4: every round moves by eta 2C/n with std z eta 2C/n,
  so the sum over the rounds has mu = sqrt(R)/z; isrl-local-sgd with K = 2 steps: R K draws, mu = sqrt(R K)/z.
* isrl-spider with s = 1, q = 2: the checkpoint rounds (0 and 2) move h_i by 2C/n with std z1 2C/n; the difference rounds
  carry no signal (a linear loss has the same gradient at both iterates) but their noise is declared and composed,
  so the claim covers mu = sqrt(2)/z1 with room to spare.
* isrl-spider-alt (Lowy et al.'s Algorithm 11) with s = 1: the same rounds (it is the q = 2 recursion), one z for
  both streams: the gradient rounds 0 and 2 and the difference rounds 1 and 3, the difference noise std z 2(2C)/n.
  With a record whose clipped gradient flips sign with the model (``FlippingOracle``), every round, difference
  rounds included, moves by its full sensitivity: mu = 2/z, and the claim is exactly its Gaussian epsilon.

With one silo, no other silo's noise can be credited, so the server's and another silo's claim must both be at least
the exact Gaussian epsilon of that mu (Dong, Roth, Su 2022), and the single-release claim of Prox-SGD is exactly it.
With M = 4 such silos (the owner in silo 0, every other record 0), the third party sees the rounds' sums and another
silo the sums less its own message: the claims towards them credit the other silos' additive draws, and stay at or
above the sums' exact epsilon (``test_the_observers_of_the_sum_are_credited_the_other_silos_draws``).
The algorithms, their claims and mu are ``tests/helpers/isrl_worst_case.py`` (shared with benchmarks/tightness.py).
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from scipy import stats

import exact as ex
from dpfl.accounting.observers import OTHER_SILO, SERVER, THIRD_PARTY
from dpfl.engine.protocol import ClientContext, ClientData
from isrl_worst_case import CLIP, DELTA, EPSILON, ETA, RECORDS, ROUNDS, algorithm, claimed, exact_mu, sum_mu
from worst_case import LinearQuadraticOracle

logging.getLogger("absl").setLevel(logging.ERROR)

TRIALS, ALPHA = 2000, 1e-4


def transcript(alg, value: float, seed: int) -> torch.Tensor:
    """dy [trials, rounds] of TRIALS independent copies of the silo (one stream per row); the owner's record is
    ``value``."""
    x = torch.zeros(TRIALS, RECORDS, 1)
    x[:, 0, 0] = value
    data = ClientData(x, torch.zeros(TRIALS, RECORDS, dtype=torch.long), torch.full((TRIALS,), RECORDS))
    ids = torch.arange(TRIALS)
    rounds, server = [], alg.init_state(torch.zeros(1), 1).server
    for r in range(ROUNDS):
        out = alg.client_round(r, server, {}, data, ClientContext(LinearQuadraticOracle(1, ETA), seed, r, ids))
        (message,) = out.messages.values()
        rounds.append(message[:, 0].double())
    return torch.stack(rounds, dim=1)


def interval(shift: float, sample: torch.Tensor) -> tuple[float, float]:
    """(1 - ALPHA) chi-square interval of mu = shift / std."""
    std, n = float(sample.std()), sample.numel()
    upper, lower = stats.chi2.ppf(1 - ALPHA / 2, n - 1), stats.chi2.ppf(ALPHA / 2, n - 1)
    return shift / (std * math.sqrt((n - 1) / lower)), shift / (std * math.sqrt((n - 1) / upper))


def test_prox_sgd_uses_each_record_in_one_round_and_claims_the_exact_gaussian():
    alg = algorithm("isrl-prox-sgd")
    z = alg.steps.mechanism.noise_multiplier
    plus, minus = transcript(alg, CLIP, 0), transcript(alg, -CLIP, 0)
    differs = (plus - minus).abs() > 0
    assert differs.sum(1).tolist() == [1] * TRIALS  # parallel composition: exactly one round sees the record
    assert 0 < int(differs[:, 0].sum()) < TRIALS  # the round is the permutation's, not always round 0
    assert (plus - minus)[differs].abs().tolist() == pytest.approx([ETA * 2 * CLIP / 3] * TRIALS, rel=1e-5)
    used = plus[differs]  # the round that uses the record, per trial
    low, high = interval(ETA * 2 * CLIP / 3, used - used.mean())
    assert exact_mu("isrl-prox-sgd", alg) == 1 / z
    assert low <= 1 / z <= high, (low, 1 / z, high)
    truth = ex.gdp_epsilon(1 / z, DELTA)
    for observer, eps in claimed(alg).items():
        assert eps >= truth * (1 - 1e-6), observer
        assert eps == pytest.approx(truth, rel=1e-3)  # one Gaussian, accounted exactly
        assert eps <= EPSILON


@pytest.mark.parametrize("name, steps", [("isrl-mb-sgd", 1), ("isrl-local-sgd", 2)])
def test_the_baselines_compose_their_draws(name, steps):
    alg = algorithm(name)
    z = alg.steps.mechanism.noise_multiplier
    plus, minus = transcript(alg, CLIP, 1), transcript(alg, -CLIP, 1)
    assert (plus - minus).flatten().tolist() == pytest.approx([-steps * ETA * 2 * CLIP / RECORDS] * TRIALS * ROUNDS,
                                                              rel=1e-5)
    total = plus.sum(1)
    low, high = interval(ROUNDS * steps * ETA * 2 * CLIP / RECORDS, total)
    truth = exact_mu(name, alg)
    assert truth == pytest.approx(math.sqrt(ROUNDS * steps) / z)
    assert low <= truth <= high, (low, truth, high)
    for observer, eps in claimed(alg).items():
        assert eps >= ex.gdp_epsilon(truth, DELTA) * (1 - 1e-6), observer
        assert eps == pytest.approx(EPSILON, rel=1e-3)  # s = 1: no amplification, the exact composed Gaussian


def silo_sums(alg, value: float, seed: int, silos: int) -> torch.Tensor:
    """dy [trials, silos, rounds] of TRIALS independent federations of ``silos`` silos (one stream per row, trial
    after trial); the owner's record (record 0 of silo 0) is ``value``, every other record 0."""
    x = torch.zeros(TRIALS * silos, RECORDS, 1)
    x[::silos, 0, 0] = value
    rows = TRIALS * silos
    data = ClientData(x, torch.zeros(rows, RECORDS, dtype=torch.long), torch.full((rows,), RECORDS))
    ids = torch.arange(TRIALS * silos)
    rounds, server = [], alg.init_state(torch.zeros(1), silos).server
    for r in range(ROUNDS):
        out = alg.client_round(r, server, {}, data, ClientContext(LinearQuadraticOracle(1, ETA), seed, r, ids))
        (message,) = out.messages.values()
        rounds.append(message[:, 0].double().reshape(TRIALS, silos))
    return torch.stack(rounds, dim=2)


@pytest.mark.parametrize("name", ["isrl-prox-sgd", "isrl-mb-sgd", "isrl-local-sgd"])
def test_the_observers_of_the_sum_are_credited_the_other_silos_draws(name):
    """M = 4 silos, the same noise as one silo's (privacy.epsilon calibrates the transcript: the plain server's
    claim stays EPSILON). The third party's view is the rounds' sums over the silos, another silo's the sums less its
    own message: the owner's shift under 4 or 3 silos' independent draws, measured through ``client_round``
    (the composed score: the sum over the rounds, the owner's round alone for Prox-SGD), mu = ``sum_mu``. Their
    claims are at least its exact epsilon, and equal to it where every draw is additive (Prox-SGD, minibatch SGD);
    Local SGD's earlier steps are charged as the owner's own (its iterate moves with them), so its claim is above."""
    silos = 4
    alg = algorithm(name, silos)
    assert alg.steps.mechanism.noise_multiplier == pytest.approx(algorithm(name).steps.mechanism.noise_multiplier)
    plus, minus = silo_sums(alg, CLIP, 3, silos), silo_sums(alg, -CLIP, 3, silos)
    shift = (plus - minus).sum(1)  # [trials, rounds]: only the owner's silo moves
    claims = claimed(alg, silos)
    assert claims[SERVER] == pytest.approx(EPSILON, rel=1e-3)
    for observer, shares, view in ((THIRD_PARTY, silos, plus.sum(1)), (OTHER_SILO, silos - 1, plus[:, :-1].sum(1))):
        if name == "isrl-prox-sgd":  # the round of the owner's batch, per trial
            used = shift.abs() > 0
            assert used.sum(1).tolist() == [1] * TRIALS
            sample, moved = view[used], float(shift[used].abs().mean())
            sample = sample - sample.mean()
        else:
            sample, moved = view.sum(1), float(shift.sum(1).abs().mean())
        truth = sum_mu(name, alg, shares)
        low, high = interval(moved, sample)
        assert low <= truth <= high, (observer, low, truth, high)
        exact = ex.gdp_epsilon(truth, DELTA)
        assert claims[observer] >= exact * (1 - 1e-6), (observer, claims[observer], exact)
        if name != "isrl-local-sgd":
            assert claims[observer] == pytest.approx(exact, rel=2e-3), observer
        assert claims[observer] < claims[SERVER]


@pytest.mark.parametrize("name", ["isrl-spider", "isrl-spider-alt"])
def test_spider_composes_both_streams(name):
    alg = algorithm(name)
    z1, z2 = alg.checkpoint.noise_multiplier, alg.difference.noise_multiplier
    assert z2 == pytest.approx(z1)  # q = 2 over 4 rounds: 2 checkpoints, 2 differences, equal halves; alt: one z
    plus, minus = transcript(alg, CLIP, 2), transcript(alg, -CLIP, 2)
    shift = (plus - minus)[0].tolist()
    assert shift == pytest.approx([2 * CLIP / RECORDS, 0, 2 * CLIP / RECORDS, 0], abs=1e-6)  # h_i, no step
    checkpoints = plus[:, 0] + plus[:, 2]
    low, high = interval(2 * 2 * CLIP / RECORDS, checkpoints)
    truth = math.sqrt(2) / z1  # the linear instance: both checkpoint rounds
    if name == "isrl-spider":
        assert exact_mu(name, alg) == pytest.approx(truth)
    assert low <= truth <= high, (low, truth, high)
    # the difference rounds' noise: std z2 2 (2C) / n (no verified smoothness: B_r = 2C)
    assert float(plus[:, 1].std()) == pytest.approx(z2 * 2 * 2 * CLIP / RECORDS, rel=0.1)
    for observer, eps in claimed(alg).items():
        assert eps >= ex.gdp_epsilon(truth, DELTA), observer
        assert eps == pytest.approx(ex.gdp_epsilon(2 / z1, DELTA), rel=1e-3)  # all four Gaussians composed


class FlippingOracle:
    """Records x_j = v in {+1, 0, -1} (1-D) with gradient v theta / a, a = 1e-3: at theta = +-1 a record with
    v = +-1 has clipped gradient v C sign(theta), so its gradient flips with the model (the flipping Dirac canary's
    worst case)."""

    def clipped_sum(self, theta, x, y, mask, clip):
        g = x * theta.unsqueeze(1) / 1e-3
        norm = g.norm(dim=-1, keepdim=True)
        return (g * torch.clamp(clip / norm, max=1.0) * mask.unsqueeze(-1)).sum(1)


@pytest.mark.parametrize("name", ["isrl-spider", "isrl-spider-alt"])
def test_spider_is_tight_for_a_record_whose_gradient_flips(name):
    """isrl-spider-alt, and isrl-spider (q = 2: the same recursion, here at z1 = z2), s = 1, the owner's record
    v = +1 against v = -1 (replace-one), the others 0, and the iterates (x, x_prev) = (+1, +1), (-1, +1), (-1, -1),
    (+1, -1) (the composition covers any adaptively chosen ones): the gradient rounds 0, 2 move h_i by their full
    sensitivity 2C/n, the difference rounds 1, 3 by theirs, 2 (2C)/n, so the transcript's mu is 2/z, exactly the
    four composed Gaussians the release declares (isrl-spider's linear instance, 1.46x, is a weak instance)."""
    alg = algorithm(name)
    z = alg.checkpoint.noise_multiplier
    assert alg.difference.noise_multiplier == pytest.approx(z)
    iterates = [(1.0, 1.0), (-1.0, 1.0), (-1.0, -1.0), (1.0, -1.0)]

    def run(value: float) -> torch.Tensor:
        x = torch.zeros(TRIALS, RECORDS, 1)
        x[:, 0, 0] = value
        data = ClientData(x, torch.zeros(TRIALS, RECORDS, dtype=torch.long), torch.full((TRIALS,), RECORDS))
        messages = []
        for r, (now, before) in enumerate(iterates):
            server = {"x": torch.tensor([now]), "x_prev": torch.tensor([before]), "h": torch.zeros(1)}
            out = alg.client_round(r, server, {}, data, ClientContext(FlippingOracle(), 3, r, torch.arange(TRIALS)))
            messages.append(out.messages["h"][:, 0].double())
        return torch.stack(messages, dim=1)

    plus, minus = run(1.0), run(-1.0)
    full = [2 * CLIP / RECORDS, 4 * CLIP / RECORDS, 2 * CLIP / RECORDS, 4 * CLIP / RECORDS]
    shift = (plus - minus)[0]
    assert shift.tolist() == pytest.approx([full[0], -full[1], -full[2], full[3]], rel=1e-5)  # each at its sensitivity
    standardised = (plus * shift.sign() / torch.tensor(full, dtype=torch.float64)).sum(1)  # the likelihood ratio's axis
    low, high = interval(4 * 1.0, standardised)  # 4 rounds, each shifted by one sensitivity unit, std z each
    assert exact_mu(name, alg, flipping=True) == pytest.approx(2 / z)
    assert low <= 2 / z <= high, (low, 2 / z, high)
    for observer, eps in claimed(alg).items():
        assert eps >= ex.gdp_epsilon(2 / z, DELTA) * (1 - 1e-6), observer
        assert eps == pytest.approx(EPSILON, rel=1e-3)  # s = 1: no amplification, the exact composed Gaussian
