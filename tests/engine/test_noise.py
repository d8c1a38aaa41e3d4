"""Noise mechanisms: the noise they add matches the event they declare."""

import math

import pytest
import torch
from dp_accounting import dp_event

from dpfl.noise import GaussianMechanism, LaplaceMechanism
from dpfl.errors import ConfigError


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_gaussian_std_per_row_and_mean():
    z = 1.7
    sensitivity = torch.tensor([0.5, 2.0, 0.01, 3.0])
    value = torch.arange(4, dtype=torch.float32).unsqueeze(1).expand(4, 100_000).contiguous()
    noisy, event = GaussianMechanism(z)(value, sensitivity, gen(1))
    assert event == dp_event.GaussianDpEvent(z)
    assert noisy.shape == value.shape and noisy.dtype == torch.float32
    noise = (noisy - value).double()
    std = noise.std(dim=1)
    torch.testing.assert_close(std, z * sensitivity.double(), rtol=0.02, atol=0)
    # mean ~ 0: within 5 standard errors of the sample mean
    assert (noise.mean(dim=1).abs() < 5 * z * sensitivity.double() / math.sqrt(100_000)).all()
    # Gaussian tails: about 4.55% of draws beyond 2 std
    beyond = (noise.abs() > 2 * z * sensitivity.double().unsqueeze(1)).double().mean()
    assert float(beyond) == pytest.approx(0.0455, abs=0.002)


def test_gaussian_is_reproducible_and_rows_independent():
    value = torch.zeros(3, 1000)
    sens = torch.ones(3)
    a, _ = GaussianMechanism(1.0)(value, sens, gen(7))
    b, _ = GaussianMechanism(1.0)(value, sens, gen(7))
    c, _ = GaussianMechanism(1.0)(value, sens, gen(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert not torch.equal(a[0], a[1])
    assert abs(float(torch.corrcoef(a[:2])[0, 1])) < 0.15


def test_gaussian_float64_value_keeps_dtype():
    value = torch.zeros(2, 50_000, dtype=torch.float64)
    noisy, _ = GaussianMechanism(2.0)(value, torch.tensor([1.0, 0.25]), gen(2))
    assert noisy.dtype == torch.float64
    torch.testing.assert_close(noisy.std(dim=1), torch.tensor([2.0, 0.5], dtype=torch.float64), rtol=0.02, atol=0)


def test_zero_noise_is_identity_and_non_private():
    mech = GaussianMechanism(0.0)
    assert not mech.is_private
    assert mech.event == dp_event.NonPrivateDpEvent()
    value = torch.randn(3, 10, generator=gen())
    g = gen(4)
    state = g.get_state()
    out, event = mech(value, torch.ones(3), g)
    assert torch.equal(out, value)
    assert event == dp_event.NonPrivateDpEvent()
    assert torch.equal(g.get_state(), state)  # no randomness consumed


def test_private_flag_and_event():
    mech = GaussianMechanism(0.8)
    assert mech.is_private and mech.event == dp_event.GaussianDpEvent(0.8)
    with pytest.raises(ConfigError) as err:
        GaussianMechanism(-1.0)
    assert err.value.field == "noise_multiplier"


def test_laplace_scale():
    b = 0.7
    sensitivity = torch.tensor([1.0, 4.0, 0.1])
    value = torch.full((3, 200_000), 5.0)
    noisy, event = LaplaceMechanism(b)(value, sensitivity, gen(3))
    assert event == dp_event.LaplaceDpEvent(b)
    noise = (noisy - value).double()
    # Lap(0, beta): E|X| = beta, Var X = 2 beta^2, median 0
    beta = b * sensitivity.double()
    torch.testing.assert_close(noise.abs().mean(dim=1), beta, rtol=0.02, atol=0)
    torch.testing.assert_close(noise.std(dim=1), math.sqrt(2) * beta, rtol=0.02, atol=0)
    assert (noise.mean(dim=1).abs() < 5 * math.sqrt(2) * beta / math.sqrt(200_000)).all()
    # P(|X| > beta ln 2) = 1/2 for Laplace (it is 0.52 for a Gaussian with the same E|X|)
    frac = (noise.abs() > beta.unsqueeze(1) * math.log(2)).double().mean(dim=1)
    torch.testing.assert_close(frac, torch.full((3,), 0.5, dtype=torch.float64), atol=0.005, rtol=0)


def test_laplace_rejects_zero_scale():
    with pytest.raises(ConfigError) as err:
        LaplaceMechanism(0.0)
    assert err.value.field == "scale_multiplier"
    assert LaplaceMechanism(2.0).is_private


def test_laplace_noise_is_always_finite():
    # generator seed 12 draws an exact 0.0 at position 411302 of the first 2^20 float32 uniforms
    value = torch.zeros(1, 2**20)
    noisy, _ = LaplaceMechanism(1.0)(value, torch.ones(1), gen(12))
    assert torch.isfinite(noisy).all()


def test_noise_is_drawn_only_from_an_event():
    """Defect 9 of the soundness review: the noise's scale comes from the declared event in one place. No module of
    dpfl other than noise.py may draw Gaussian, Laplace, Skellam (Poisson) or binomial noise (a second place could drift
    from its event); engine/randomness.py draws the clients' standard streams, which it never scales, and exact_noise.py
    holds the exact integer samplers, which only noise.py may call. A model's initial weights drawn through
    torch.nn.init (models/sequence.py) are not noise of a mechanism."""
    import pathlib
    import re

    import dpfl

    package = pathlib.Path(dpfl.__file__).parent
    # a model's weight initialisation (torch.nn.init's draws from the seeded global generator) is not a mechanism
    drawing = re.compile(r"\b(randn|randn_like|(?<!init\.)normal_|\.normal\(|exponential_|Laplace\(|laplace\("
                         r"|torch\.poisson\(|binomial\(|discrete_gaussian\(|discrete_laplace\()")
    allowed = ("noise.py", "randomness.py", "exact_noise.py")
    offenders = [str(path.relative_to(package)) for path in package.rglob("*.py")
                 if path.name not in allowed and drawing.search(path.read_text())]
    assert offenders == []
    assert "noise_multiplier" not in (package / "engine" / "randomness.py").read_text()
    # and the noise's std is the event's multiplier times the sensitivity, whatever the mechanism object holds
    from dpfl.noise import gaussian_noise

    noise = gaussian_noise(dp_event.GaussianDpEvent(3.0), torch.tensor([2.0]), torch.zeros(1, 200_000), gen(5))
    assert float(noise.std()) == pytest.approx(6.0, rel=0.01)


class _Streams:
    """Stand-in ``NoiseStreams``: each row's secure stream (``dpfl.engine.secure_streams``) of a fixed key."""

    def __init__(self, rows: int):
        from dpfl.engine.secure_streams import SecureStream

        self._secure = [SecureStream(11, 0, row, "noise") for row in range(rows)]

    def secure(self):
        return self._secure


def test_discrete_gaussian_mechanism_noise_per_row_on_its_grid():
    """Row i: gamma_i (round(x / gamma_i) + N_Z(0, s)), gamma_i = 2^(ceil(log2 Delta_i) - k), s = ceil(z^2 4^k): the
    noise's std in value units is z 2^k gamma_i (Delta_i = 0.75: gamma 2^k = 1; Delta_i = 2: gamma 2^k = 2, exactly z
    Delta_i), and every released coordinate is a multiple of gamma_i."""
    from dpfl.accounting.events import DiscreteGaussianDpEvent
    from dpfl.noise import DiscreteGaussianMechanism, grid_steps

    z, k, d = 1.3, 4, 50_000
    mechanism = DiscreteGaussianMechanism(z, k, d)
    assert mechanism.variance == math.ceil(z**2 * 4**k) == 433
    sensitivity = torch.tensor([0.75, 2.0])
    gamma = grid_steps(sensitivity, k)
    assert gamma.tolist() == [1 / 16, 2 / 16]
    value = torch.full((2, d), 0.3)
    draws = mechanism.draws(_Streams(2), (d,))
    assert draws.dtype == torch.int64 and draws.shape == (2, d)
    noisy, event = mechanism(value, sensitivity, draws)
    assert event == DiscreteGaussianDpEvent(z, k, d) and noisy.dtype == torch.float32
    units = noisy.double() / gamma.unsqueeze(1)
    assert torch.equal(units, units.round())
    rounded = torch.round(torch.tensor(0.3, dtype=torch.float64) / gamma).unsqueeze(1)
    assert torch.equal(units - rounded, draws.double())
    std = (noisy.double() - rounded * gamma.unsqueeze(1)).std(dim=1)
    torch.testing.assert_close(std, math.sqrt(433) * gamma.double(), rtol=0.02, atol=0)


def test_discrete_gaussian_mechanism_keeps_a_diverged_coordinate_and_refuses_what_it_was_not_declared_on():
    from dpfl.noise import DiscreteGaussianMechanism

    mechanism = DiscreteGaussianMechanism(1.0, 3, 3)
    value = torch.tensor([[float("nan"), float("inf"), 0.5]])
    noisy, _ = mechanism(value, torch.tensor([1.0]), torch.zeros(1, 3, dtype=torch.int64))
    assert math.isnan(noisy[0, 0]) and noisy[0, 1] == float("inf") and noisy[0, 2] == 0.5
    with pytest.raises(ValueError, match="declared on 3 coordinates"):
        mechanism(torch.zeros(1, 4), torch.tensor([1.0]), torch.zeros(1, 4, dtype=torch.int64))
    with pytest.raises(ValueError, match="int64 draws"):
        mechanism(torch.zeros(1, 3), torch.tensor([1.0]), torch.zeros(1, 3))
    with pytest.raises(ValueError, match="smallest normal"):
        mechanism(torch.zeros(1, 3), torch.tensor([1e-40]), torch.zeros(1, 3, dtype=torch.int64))
    float64, _ = mechanism(torch.full((1, 3), 0.3, dtype=torch.float64), torch.tensor([1.0]),
                           torch.tensor([[2**40, 0, -1]]))
    assert float64.dtype == torch.float64 and float64[0, 0] == (2**40 + 2) / 8  # exact past float32's 2^24
