"""Last-iterate accountant (seed 003, Asoodeh et al.): Lemma 1, Theorem 2, Corollary 3, reference values of the notes
(/work/shared/notes/003-last-iterate.md)."""

import json
import math

import numpy as np
import pytest

from dpfl.accounting import last_iterate as li
from dpfl.cli import main
from dpfl.errors import ConfigError


def brute_delta(eps, lrs, sigmas, n, m, lipschitz, radius, nonconvex=False, random_stop=False):
    """The notes' recursions in plain Python: S += b_t P; P *= a_t (t = T..1), or S_tau = a_tau S_{tau-1} + b_tau."""
    b = [li.theta(eps, 2 * lipschitz / (math.sqrt(m) * s)) for s in sigmas]
    diameters = [2 * (radius + eta * lipschitz) if nonconvex else 2 * radius for eta in lrs]
    a = [li.theta(eps, d * math.sqrt(m) / (eta * s)) for d, eta, s in zip(diameters, lrs, sigmas)]
    if random_stop:
        s_tau, total = 0.0, 0.0
        for a_t, b_t in zip(a, b):
            s_tau = a_t * s_tau + b_t
            total += s_tau
        return m / n * total / len(lrs)
    s, p = 0.0, 1.0
    for a_t, b_t in zip(reversed(a), reversed(b)):
        s += b_t * p
        p *= a_t
    return m / n * s


FIG2 = dict(lr=0.5, sigma=1.5, n=100, lipschitz=1.0, radius=1.0)


# Lemma 1 ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "eps, r, expected",
    [(0, 1, 0.3829249225), (1, 1, 0.1269367375), (0.5, 0.5, 0.0524403233), (1, 2, 0.5098616601), (2, 5, 0.9683489803)],
)
def test_theta_reference_values(eps, r, expected):
    assert li.theta(eps, r) == pytest.approx(expected, abs=1e-9)


def test_theta_limits_and_vectorised():
    r = np.array([0.0, 0.5, 1.0, np.inf])
    values = li.theta(1.0, r)
    assert values.shape == (4,) and values[0] == 0.0 and values[-1] == 1.0
    assert li.theta(0.0, 0.0) == 0.0 and li.log_theta(2.0, 0.0) == -math.inf
    assert np.all(np.diff(values) > 0)  # theta_eps increases with the distance r
    assert li.theta(0.0, 1.3) == pytest.approx(math.erf(1.3 / (2 * math.sqrt(2))), rel=1e-14)


def test_complement_is_direct_near_one():
    # 1 - theta_1(40) ~ e^-202.7: 1 - theta underflows, the complement does not (mpmath, 300 digits).
    assert li.log1m_theta(1.0, 40.0) == pytest.approx(-202.72431914721445, rel=1e-12)
    assert li.log1m_theta(0.5, 20.0) == pytest.approx(-52.28844451129216, rel=1e-12)
    assert li.log_theta(0.5, 20.0) == pytest.approx(-1.9562172375169027e-23, rel=1e-9)
    r = np.linspace(0.1, 6, 30)
    np.testing.assert_allclose(li.theta(0.7, r) + np.exp(li.log1m_theta(0.7, r)), 1.0, rtol=1e-14)


def test_log_theta_small_distance_stays_finite():
    # theta_1(1e-3) = e^-500021.14...: Q(x) - e^eps Q(y) cancels completely in floating point (mpmath reference).
    assert li.log_theta(1.0, 1e-3) == pytest.approx(-500021.14220749512, rel=1e-12)
    assert li.log_theta(0.0, 1e-6) == pytest.approx(-14.734449091168989, rel=1e-9)


# Theorem 2 -------------------------------------------------------------------------------------------------------

# Figure 2 (eta=0.5, L=1, rho=1, sigma=1.5, n=100): m, T as the paper evaluates it, delta at eps 0.5, 1, 2, eps(1e-5)
FIG2_TABLE = [
    (10, 10, (3.0798e-2, 2.0211e-3, 2.3027e-7), 1.6485),
    (20, 5, (7.3409e-3, 5.0375e-5, 1.1303e-12), 1.1241),
    (30, 10 / 3, (2.2805e-3, 1.7561e-6, 8.1907e-18), 0.8997),
]


@pytest.mark.parametrize("m, steps, deltas, eps_at_1e5", FIG2_TABLE)
def test_figure2_closed_form(m, steps, deltas, eps_at_1e5):
    def log_delta(eps):
        return li.log_delta_constant(eps, FIG2["lr"], FIG2["sigma"], FIG2["n"], m, 1.0, 1.0, steps=steps)

    for eps, expected in zip((0.5, 1.0, 2.0), deltas):
        assert float(f"{math.exp(log_delta(eps)):.4e}") == expected
    assert li.solve_epsilon(log_delta, 1e-5) == pytest.approx(eps_at_1e5, abs=1e-3)


@pytest.mark.parametrize("m, steps, deltas, eps_at_1e5", FIG2_TABLE[:2])
def test_figure2_recursion(m, steps, deltas, eps_at_1e5):
    args = (FIG2["lr"], FIG2["sigma"], FIG2["n"], m, 1.0, 1.0)
    for eps, expected in zip((0.5, 1.0, 2.0), deltas):
        assert float(f"{li.delta(eps, *args):.4e}") == expected
    assert li.epsilon(1e-5, *args) == pytest.approx(eps_at_1e5, abs=1e-3)


def test_batch_size_not_dividing_n_leaves_remainder_out():
    # q = 0.3: T = 100 // 30 = 3 batches, 10 records never used; the factor m/n = 0.3 stays.
    assert li.epsilon(1e-5, 0.5, 1.5, 100, 30, 1.0, 1.0) == pytest.approx(0.8933, abs=1e-4)
    assert li.log_delta(1.0, 0.5, 1.5, 100, 30, 1.0, 1.0) == pytest.approx(
        li.log_delta_constant(1.0, 0.5, 1.5, 100, 30, 1.0, 1.0, steps=3), rel=1e-13
    )


def test_hiding_iterates_regime():
    # n=100, m=1, L=rho=1, eta=0.5, sigma=4: last iterate vs releasing every iterate.
    args = (0.5, 4.0, 100, 1, 1.0, 1.0)
    assert li.delta(1.0, *args) == pytest.approx(7.82e-5, rel=1e-3)
    assert li.epsilon(1e-5, *args) == pytest.approx(1.365, abs=1e-3)
    assert math.exp(li.composition_log_delta(1.0, 4.0, 100, 1, 1.0)) == pytest.approx(6.83e-3, rel=1e-3)
    assert li.composition_epsilon(1e-5, 4.0, 100, 1, 1.0) == pytest.approx(1.993, abs=1e-3)
    # with a constant schedule the baseline is the single-step theta_eps(2L / (sqrt(m) sigma))
    assert math.exp(li.composition_log_delta(1.0, 4.0, 100, 1, 1.0)) == pytest.approx(li.theta(1.0, 0.5), rel=1e-13)


@pytest.mark.parametrize("nonconvex", [False, True])
@pytest.mark.parametrize("n, m, lr, sigma", [(100, 1, 0.5, 4.0), (1000, 10, 0.1, 2.0), (60, 20, 1.0, 0.7)])
def test_closed_form_equals_recursion(n, m, lr, sigma, nonconvex):
    for eps in (0.0, 0.3, 1.0, 3.0):
        closed = li.log_delta_constant(eps, lr, sigma, n, m, 1.5, 2.0, nonconvex=nonconvex)
        assert li.log_delta(eps, lr, sigma, n, m, 1.5, 2.0, nonconvex=nonconvex) == pytest.approx(closed, rel=1e-12)
        brute = brute_delta(eps, [lr] * (n // m), [sigma] * (n // m), n, m, 1.5, 2.0, nonconvex)
        assert math.exp(closed) == pytest.approx(brute, rel=1e-10)


@pytest.mark.parametrize("random_stop", [False, True])
@pytest.mark.parametrize("nonconvex", [False, True])
def test_varying_schedule_matches_plain_recursion(random_stop, nonconvex):
    rng = np.random.default_rng(3)
    lrs = rng.uniform(0.05, 1.0, 40)
    sigmas = np.repeat(rng.uniform(0.5, 5.0, 8), 5)  # runs of equal sigma, lr varying
    lrs[10:20] = 0.3  # a run of fully equal steps
    for eps in (0.0, 0.5, 2.0):
        expected = brute_delta(eps, lrs, sigmas, 50, 1, 1.0, 1.0, nonconvex, random_stop)
        got = li.delta(eps, lrs, sigmas, 50, 1, 1.0, 1.0, nonconvex=nonconvex, random_stop=random_stop)
        assert got == pytest.approx(expected, rel=1e-10)


def test_nonconvex_diameter_is_looser():
    args = (0.5, 2.0, 100, 1, 1.0, 1.0)
    assert li.log_delta(1.0, *args, nonconvex=True) > li.log_delta(1.0, *args)


# Corollary 3 -----------------------------------------------------------------------------------------------------


def test_random_stop_constant_schedule():
    for sigma in (0.8, 2.0, 4.0):
        args = (0.5, sigma, 100, 1, 1.0, 1.0)
        for eps in (0.5, 1.0, 2.0):
            expected = brute_delta(eps, [0.5] * 100, [sigma] * 100, 100, 1, 1.0, 1.0, random_stop=True)
            random_stop = li.log_delta(eps, *args, random_stop=True)
            assert math.exp(random_stop) == pytest.approx(expected, rel=1e-10)
            # S_tau increases with tau for a constant schedule, so their mean is below S_T (Theorem 2)
            assert random_stop <= li.log_delta(eps, *args)


def test_random_stop_below_the_worst_stopping_time():
    # (1/T) sum_tau S_tau <= max_tau S_tau for any schedule (not <= S_T: late noisy steps can make S_T small).
    lrs, sigmas = [0.5] * 20 + [0.05] * 5, [1.0] * 20 + [50.0] * 5
    for eps in (0.5, 1.0):
        worst = max(brute_delta(eps, lrs[:tau], sigmas[:tau], 25, 1, 1.0, 1.0) for tau in range(1, 26))
        assert li.delta(eps, lrs, sigmas, 25, 1, 1.0, 1.0, random_stop=True) <= worst
    assert li.delta(1.0, lrs, sigmas, 25, 1, 1.0, 1.0) < li.delta(1.0, lrs, sigmas, 25, 1, 1.0, 1.0, random_stop=True)


def test_random_stop_small_contraction_series():
    # a = theta_eps(r) ~ 1 - 1e-12 over a long run: sum_{s<=c-2} (c-1-s) a^s by its series, against float128-free
    # exact arithmetic on the closed form (c(c-1)/2 to first order).
    c, log_a = np.array([1e4]), np.array([-1e-12])
    exact = math.log(c[0] * (c[0] - 1) / 2) + math.log1p(-(c[0] - 2) * 1e-12 / 3)
    assert li._log_double_geometric(log_a, c)[0] == pytest.approx(exact, rel=1e-14)


# epsilon ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("random_stop", [False, True])
def test_epsilon_inverts_delta(random_stop):
    args = (0.5, 4.0, 100, 1, 1.0, 1.0)
    for target in (1e-3, 1e-5, 1e-12, 1e-100):
        eps = li.epsilon(target, *args, random_stop=random_stop)
        log_delta = li.log_delta(eps, *args, random_stop=random_stop)
        assert log_delta <= math.log(target)
        assert log_delta == pytest.approx(math.log(target), rel=1e-9)


def test_epsilon_zero_when_eps_zero_suffices():
    args = (0.5, 4.0, 10**6, 1, 1.0, 1.0)
    assert li.delta(0.0, *args) < 1e-5
    assert li.epsilon(1e-5, *args) == 0.0


def test_monotone_in_sigma_and_steps():
    eps_by_sigma = [li.epsilon(1e-6, 0.5, s, 200, 2, 1.0, 1.0) for s in (1.0, 2.0, 4.0, 8.0)]
    assert all(a > b for a, b in zip(eps_by_sigma, eps_by_sigma[1:]))
    accountants = {analysis: li.LastIterateAccountant(n=200, batch_size=2, lipschitz=1.0, radius=1.0,
                                                      analysis=analysis) for analysis in li.ANALYSES}
    log_deltas = {analysis: [] for analysis in li.ANALYSES}
    for _ in range(100):
        for analysis, accountant in accountants.items():
            accountant.step(0.5, 2.0)
            log_deltas[analysis].append(accountant.log_delta(1.0))
    assert all(a < b for a, b in zip(log_deltas["paper"], log_deltas["paper"][1:]))
    # sound: step T + 1 adds the position k = T + 1 (its term underflows beside the others' once tiny)
    assert all(a <= b for a, b in zip(log_deltas["sound"], log_deltas["sound"][1:]))
    assert all(s <= p for s, p in zip(log_deltas["sound"], log_deltas["paper"]))


def test_a_million_steps_with_a_schedule_or_a_random_stop():
    """(Its time, under two seconds: benchmarks/accounting_speed.py.)"""
    steps = 10**6
    eps = li.epsilon(1e-9, np.full(steps, 0.5), np.full(steps, 4.0), steps, 1, 1.0, 1.0)
    eps_stop = li.epsilon(1e-9, np.full(steps, 0.5), 4.0, steps, 1, 1.0, 1.0, random_stop=True)
    step_decay = np.repeat(0.5 * 0.9 ** np.arange(100), steps // 100)
    eps_decay = li.epsilon(1e-9, step_decay, 4.0, steps, 1, 1.0, 1.0)
    assert 0 < eps_stop <= eps and eps_decay > 0


def test_tiny_log_delta_stays_finite():
    log_delta = li.log_delta(20.0, 0.5, 1.5, 100, 30, 1.0, 1.0)
    assert -1e5 < log_delta < -300 and li.delta(20.0, 0.5, 1.5, 100, 30, 1.0, 1.0) == 0.0
    log_stop = li.log_delta(40.0, 0.5, 4.0, 1000, 1, 1.0, 1.0, random_stop=True)
    assert -1e6 < log_stop < -300
    assert li.epsilon(1e-300, 0.5, 4.0, 1000, 1, 1.0, 1.0) > 0


# Accountant ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("analysis", li.ANALYSES)
@pytest.mark.parametrize("random_stop", [False, True])
def test_accountant_matches_batch_function(random_stop, analysis):
    lrs = [0.5] * 30 + [0.25] * 20 + list(np.linspace(0.2, 0.05, 25))
    sigmas = [2.0] * 40 + [3.0] * 35
    accountant = li.LastIterateAccountant(n=80, batch_size=1, lipschitz=1.0, radius=1.0, random_stop=random_stop,
                                          analysis=analysis)
    assert accountant.log_delta(1.0) == -math.inf and accountant.epsilon(1e-5) == 0.0
    for lr, sigma in zip(lrs, sigmas):
        accountant.step(lr, sigma)
    assert accountant.steps == 75 and len(accountant._counts) < 75
    options = dict(random_stop=random_stop, analysis=analysis)
    expected = li.log_delta(1.0, lrs, sigmas, 80, 1, 1.0, 1.0, **options)
    assert accountant.log_delta(1.0) == pytest.approx(expected, rel=1e-12)
    assert accountant.epsilon(1e-6) == pytest.approx(li.epsilon(1e-6, lrs, sigmas, 80, 1, 1.0, 1.0, **options),
                                                     rel=1e-10)


def test_accountant_rejects_more_steps_than_batches():
    accountant = li.LastIterateAccountant(n=5, batch_size=2, lipschitz=1.0, radius=1.0)
    accountant.step(0.1, 1.0)
    accountant.step(0.1, 1.0)
    with pytest.raises(ConfigError, match=r"steps = 3 .*at most n // batch_size = 2"):
        accountant.step(0.1, 1.0)


# Validation ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: li.delta(-1.0, 0.5, 1.0, 10, 1, 1.0, 1.0), r"eps = -1.0 .*\[0, inf\)"),
        (lambda: li.delta(1.0, 0.5, 1.0, 0, 1, 1.0, 1.0), r"n = 0 .*an integer in \[1, inf\)"),
        (lambda: li.delta(1.0, 0.5, 1.0, 10, 11, 1.0, 1.0), r"batch_size = 11 .*\[1, 10\]"),
        (lambda: li.delta(1.0, 0.5, 1.0, 10, 1, 0.0, 1.0), r"lipschitz = 0.0 .*\(0, inf\)"),
        (lambda: li.delta(1.0, 0.5, 1.0, 10, 1, 1.0, -2.0), r"radius = -2.0 .*\(0, inf\)"),
        (lambda: li.delta(1.0, [0.5, -0.1], 1.0, 10, 1, 1.0, 1.0), r"lrs\[1\] = -0.1 .*\(0, inf\)"),
        (lambda: li.delta(1.0, 0.5, [1.0, np.inf], 10, 1, 1.0, 1.0), r"sigmas\[1\] = inf"),
        (lambda: li.delta(1.0, [0.5] * 3, [1.0] * 2, 10, 1, 1.0, 1.0), r"len\(sigmas\) = 2 .*len\(lrs\) = 3"),
        (lambda: li.delta(1.0, [0.5] * 6, 1.0, 10, 2, 1.0, 1.0), r"len\(lrs\) = 6 .*at most n // batch_size = 5"),
        (lambda: li.delta(1.0, 0.5, 1.0, 10, 1, 1.0, 1.0, smoothness=5.0), r"lrs = 0.5 .*2/smoothness = 0.4"),
        (lambda: li.epsilon(0.0, 0.5, 1.0, 10, 1, 1.0, 1.0), r"delta = 0.0 .*\(0, 1\)"),
        (lambda: li.epsilon(1.5, 0.5, 1.0, 10, 1, 1.0, 1.0), r"delta = 1.5"),
        (lambda: li.log_delta_constant(1.0, 0.5, 1.0, 10, 3, 1.0, 1.0, steps=4), r"steps = 4 .*\(0, 3.33"),
        (lambda: li.theta(1.0, [1.0, -1.0]), r"r\[1\] = -1.0"),
    ],
)
def test_bad_input_names_the_parameter(call, message):
    with pytest.raises(ConfigError, match=message):
        call()


def test_smoothness_check_and_nonconvex_escape():
    lrs = [0.1, 0.1, 0.3]
    with pytest.raises(ConfigError, match=r"lrs\[2\] = 0.3 .*eta_t <= 2/beta"):
        li.delta(1.0, lrs, 1.0, 10, 1, 1.0, 1.0, smoothness=10.0)
    assert li.delta(1.0, lrs, 1.0, 10, 1, 1.0, 1.0, smoothness=5.0) > 0  # 0.3 <= 2/5
    assert li.delta(1.0, lrs, 1.0, 10, 1, 1.0, 1.0, smoothness=10.0, nonconvex=True) > 0


# CLI -------------------------------------------------------------------------------------------------------------

CLI = ["account", "last-iterate", "--n", "100", "--batch-size", "1", "--lipschitz", "1", "--radius", "1",
       "--lr", "0.5", "--sigma", "4", "--delta", "1e-5"]


def test_cli_json(capsys):
    assert main(CLI + ["--epsilon", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["epsilon"] == pytest.approx(1.365, abs=1e-3)
    assert result["epsilon_composition"] == pytest.approx(1.993, abs=1e-3)
    assert result["delta"] == 1e-5 and result["steps"] == 100 and result["unused_records"] == 0
    assert math.exp(result["log_delta"]) == pytest.approx(7.82e-5, rel=1e-3)


def test_cli_remainder_and_random_stop(capsys):
    argv = ["account", "last-iterate", "--n", "100", "--batch-size", "30", "--lipschitz", "1", "--radius", "1",
            "--lr", "0.5", "--sigma", "1.5", "--delta", "1e-5", "--json"]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["steps"] == 3 and result["unused_records"] == 10
    assert result["epsilon"] == pytest.approx(0.8933, abs=1e-4)
    assert main(CLI + ["--random-stop", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["epsilon"] < 1.365


def test_cli_bad_input_exits_2(capsys):
    assert main(CLI + ["--smoothness", "10"]) == 2
    assert "2/smoothness" in capsys.readouterr().err
    assert main(CLI[:-1] + ["0"]) == 2
    assert "delta = 0.0" in capsys.readouterr().err
