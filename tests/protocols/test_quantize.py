"""Discretisation into Z_(2^bits) and Skellam noise shares (dpfl.protocols.quantize, dpfl.noise)."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

from dpfl.accounting.events import SkellamDpEvent
from dpfl.noise import skellam_noise
from dpfl.errors import ConfigError
from dpfl.protocols.quantize import Discretisation, OverflowRiskError, rounded_l2_sensitivity, skellam_tail_margin
from dpfl.protocols.secagg import simulate_round


def gen(seed):
    return torch.Generator().manual_seed(seed)


def test_randomised_rounding_is_unbiased():
    """E[round(s x)] = s x: over 200,000 draws per value the mean is within 5 standard errors (sqrt(f(1-f)/n), f
    the fractional part), and each draw is floor or ceil."""
    q = Discretisation(scale=10.0, bits=16)
    values = torch.tensor([0.03, -0.17, 0.5049, -1.2345, 3.0])
    draws = 200_000
    encoded = q.encode(values.repeat(draws, 1), gen(1))
    signed = torch.where(encoded >= 2**15, encoded - 2**16, encoded).to(torch.float64)
    scaled = values.to(torch.float64) * 10
    assert torch.all((signed == torch.floor(scaled)) | (signed == torch.ceil(scaled)))
    fraction = scaled - torch.floor(scaled)
    standard_error = torch.sqrt(fraction * (1 - fraction) / draws)
    assert torch.all((signed.mean(0) - scaled).abs() <= 5 * standard_error + 1e-12)
    assert signed[:, 4].eq(30).all()  # an integer stays put


def test_rounding_with_given_uniform_draws():
    q = Discretisation(scale=1.0, bits=8)
    x = torch.tensor([0.25, 0.25, -0.75])
    assert q.encode(x, torch.tensor([0.2, 0.3, 0.2])).tolist() == [1, 0, 0]  # -0.75: floor -1, up w.p. 0.25
    assert q.encode(x, torch.tensor([0.9, 0.9, 0.3])).tolist() == [0, 0, 255]  # -1 wraps to 255
    with pytest.raises(ValueError, match="uniform draws of shape"):
        q.encode(x, torch.rand(2))


def test_decoding_is_signed_and_scaled():
    q = Discretisation(scale=4.0, bits=8)
    assert q.decode(torch.tensor([0, 1, 127, 128, 255, 256 + 3])).tolist() == [0, 0.25, 31.75, -32.0, -0.25, 0.75]


def test_the_modular_sum_of_encodings_decodes_to_the_sum():
    """Client encodings summed mod 2^bits (as secure aggregation does) decode to the sum of the rounded values, within
    n / s of the true sum, and exactly equal to it for values on the grid 1/s."""
    q = Discretisation(scale=2.0**10, bits=32)
    x = torch.randn(20, 300, generator=gen(2)).clamp(-1, 1)
    encoded = q.encode(x, gen(3))
    decoded = q.decode(encoded.sum(0))
    assert (decoded - x.sum(0).to(torch.float64)).abs().max() <= 20 / 2.0**10
    on_grid = torch.round(x * 2**10) / 2**10
    assert torch.equal(q.decode(q.encode(on_grid, gen(4)).sum(0)), on_grid.sum(0).to(torch.float64))


def test_headroom_is_checked_before_encoding():
    q = Discretisation(scale=100.0, bits=16)
    assert q.check_headroom(clip=1.0, clients=327) == 32700  # 327 x 100 <= 2^15 - 1 = 32767
    with pytest.raises(OverflowRiskError, match=r"328 clients' encoded values can reach 328 x ceil\(scale 100.0 x "
                                                r"clip 1.0\) \+ noise margin 0 = 32800, beyond 2\^\(bits-1\) - 1 = "
                                                r"32767 for bits = 16.*Lower the scale, the clip or the cohort"):
        q.check_headroom(clip=1.0, clients=328)
    with pytest.raises(OverflowRiskError, match="noise margin"):
        q.check_headroom(clip=1.0, clients=300, noise_variance=400.0**2, dimension=1000)


def test_what_the_headroom_check_prevents():
    """Beyond the bound the modular sum wraps and decodes to a wrong value of the opposite sign."""
    q = Discretisation(scale=100.0, bits=16)
    clients = torch.ones(328, 1)
    assert float(q.decode(q.encode(clients, gen(0)).sum(0))) == pytest.approx(328 - 655.36)
    assert float(q.decode(q.encode(clients[:327], gen(0)).sum(0))) == pytest.approx(327)


def test_skellam_tail_margin_is_the_chernoff_bound():
    variance, probability = 100.0, 1e-6
    margin = skellam_tail_margin(variance, probability)
    r = margin / variance
    assert 2 * math.exp(variance * (math.sqrt(1 + r * r) - 1) - margin * math.asinh(r)) == pytest.approx(probability)
    assert 4.9 * math.sqrt(variance) < margin < 6 * math.sqrt(variance)  # Gaussian-like tails at this variance
    assert skellam_tail_margin(0.0, 1e-9) == 0.0
    # empirically: the tail beyond the margin for probability 1e-2 is rarer than 1e-2
    noise = skellam_noise(SkellamDpEvent(1.0, 1.0, variance, 1.0), torch.zeros(100_000), gen(5))
    assert float((noise.abs() >= skellam_tail_margin(variance, 1e-2)).double().mean()) < 1e-2


def test_skellam_shares_sum_to_the_events_noise():
    """n shares Sk(lam, lam), lam = s^2 mu / (2n), are integers whose sum has mean 0 and variance s^2 mu, and the sum
    is Skellam(s^2 mu / 2, s^2 mu / 2) (a chi-square goodness-of-fit test against the exact pmf)."""
    event = SkellamDpEvent(l2_sensitivity=1.0, l1_sensitivity=1.0, variance=0.04, scale=10.0)  # s^2 mu = 4
    shares = torch.stack([skellam_noise(event, torch.zeros(50_000), gen(10 + i), shares=8) for i in range(8)])
    assert shares.dtype == torch.int64
    total = shares.sum(0).numpy()
    assert abs(total.mean()) < 5 * math.sqrt(4 / 50_000)
    assert total.var() == pytest.approx(4.0, rel=0.03)
    support = np.arange(-8, 9)
    observed = np.array([(total == k).sum() for k in support] + [(np.abs(total) > 8).sum()])
    pmf = stats.skellam.pmf(support, 2.0, 2.0)
    expected = np.append(pmf, 1 - pmf.sum()) * total.size
    assert stats.chisquare(observed, expected).pvalue > 1e-3


def test_encode_noisy_returns_its_event_and_adds_the_share():
    q = Discretisation(scale=4.0, bits=20)
    event = SkellamDpEvent(1.0, 1.0, variance=1.0, scale=4.0)
    x = torch.zeros(10_000)
    noisy, returned = q.encode_noisy(x, event, shares=4, rounding=gen(1), noise=gen(2))
    assert returned is event
    assert q.decode(noisy).mul(4.0).var().item() == pytest.approx(16.0 / 4, rel=0.1)  # s^2 mu / shares
    with pytest.raises(ConfigError, match="event.scale = 2.0 is not allowed: expected the discretisation's scale 4.0"):
        q.encode_noisy(x, SkellamDpEvent(1.0, 1.0, 1.0, 2.0), 4, gen(1), gen(2))


def test_discretise_add_noise_aggregate_decode():
    """The whole path: 10 clients clip-bounded vectors, scaled, rounded, each adding a Skellam share, summed by secure
    aggregation with two dropouts, decoded: the result is the survivors' sum plus noise of the declared variance."""
    clients, d, clip, scale, bits = 10, 4000, 1.0, 64.0, 24
    q = Discretisation(scale, bits)
    sigma = 2.0
    event = SkellamDpEvent(clip, rounded_l2_sensitivity(clip, scale, d), (sigma * clip) ** 2, scale)
    q.check_headroom(clip, clients, noise_variance=scale**2 * event.variance, dimension=d)
    x = (torch.rand(clients, d, generator=gen(6)) * 2 - 1) * clip / math.sqrt(d)
    encoded = torch.stack([q.encode_noisy(x[i], event, clients, gen(100 + i), gen(200 + i))[0]
                           for i in range(clients)])
    result = simulate_round(encoded, 6, {3: "masked_input", 7: "share_keys"}, bits=bits, seed=1)
    survivors = list(result.contributors)
    error = q.decode(result.total) - x[survivors].sum(0).to(torch.float64)
    # 8 of the 10 shares arrived: noise variance 8/10 sigma^2, plus the rounding error (variance <= 8/(4 s^2))
    assert error.var().item() == pytest.approx(0.8 * sigma**2, rel=0.08)
    assert abs(error.mean().item()) < 5 * math.sqrt(0.8 * sigma**2 / d)


def test_rounded_l2_sensitivity():
    assert rounded_l2_sensitivity(1.0, 100.0, 10_000) == pytest.approx(2.0)
    with pytest.raises(ConfigError, match="scale"):
        rounded_l2_sensitivity(1.0, 0.0, 10)


@pytest.mark.parametrize("kwargs, field", [({"scale": 0.0, "bits": 8}, "scale"), ({"scale": 1.0, "bits": 64}, "bits"),
                                            ({"scale": 1.0, "bits": 1}, "bits")])
def test_bad_discretisations_are_refused(kwargs, field):
    with pytest.raises(ConfigError, match=f"^{field} = "):
        Discretisation(**kwargs)


def test_values_beyond_exact_float_rounding_are_refused():
    with pytest.raises(ConfigError, match="scale"):
        Discretisation(scale=2.0**50, bits=63).encode(torch.tensor([8.0]), gen(0))
    with pytest.raises(OverflowRiskError, match="beyond 2\\^52"):
        Discretisation(scale=2.0**50, bits=63).check_headroom(clip=8.0, clients=1)
