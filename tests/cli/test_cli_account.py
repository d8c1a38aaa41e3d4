"""`dpfl account gaussian|laplace` and `dpfl calibrate gaussian`: JSON output and errors (exit 2, stderr)."""

import json

import pytest

from dpfl.cli import main

Q = str(256 / 60000)
GAUSSIAN = ["account", "gaussian", "--noise-multiplier", "1.1", "--sampling-rate", Q, "--steps", "14063"]


def run_json(capsys, argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_account_gaussian_pld(capsys):
    out = run_json(capsys, [*GAUSSIAN, "--delta", "1e-5"])
    assert {"epsilon", "delta", "accountant", "conversion"} <= set(out)
    assert out["epsilon"] == pytest.approx(2.382, rel=1e-3)
    assert (out["accountant"], out["conversion"], out["neighboring"]) == ("pld", None, "add_remove")


def test_account_gaussian_rdp_classic(capsys):
    out = run_json(capsys, [*GAUSSIAN, "--delta", "1e-5", "--accountant", "rdp", "--conversion", "classic"])
    assert round(out["epsilon"], 2) == 3.01
    assert (out["accountant"], out["conversion"]) == ("rdp", "classic")


def test_account_gaussian_fixed_is_replace_one(capsys):
    argv = ["account", "gaussian", "--noise-multiplier", "1.0", "--sampling", "fixed", "--sampling-rate", "0.01"]
    out = run_json(capsys, [*argv, "--dataset-size", "1000", "--steps", "100", "--delta", "1e-5", "--accountant=rdp"])
    assert out["neighboring"] == "replace_one" and out["epsilon"] > 0


def test_account_laplace_pure_and_approximate(capsys):
    pure = run_json(capsys, ["account", "laplace", "--scale", "2", "--sensitivity", "1", "--steps", "10"])
    assert pure["epsilon"] == pytest.approx(5.0) and pure["delta"] == 0.0 and "basic composition" in pure["note"]
    argv = ["account", "laplace", "--scale", "1", "--sensitivity", "1", "--steps", "10", "--delta", "1e-5"]
    approx = run_json(capsys, argv)
    assert approx["epsilon"] == pytest.approx(9.990, rel=1e-3)
    assert {"epsilon", "delta", "accountant", "conversion"} <= set(approx)


def test_calibrate_gaussian(capsys):
    argv = ["calibrate", "gaussian", "--target-epsilon", "8", "--delta", "1e-5", "--sampling-rate", str(4096 / 50000)]
    out = run_json(capsys, [*argv, "--steps", "2500", "--accountant", "rdp", "--conversion", "modern"])
    assert {"noise_multiplier", "epsilon", "delta", "accountant", "conversion"} <= set(out)
    assert out["noise_multiplier"] == pytest.approx(2.730, rel=1e-3)
    assert out["epsilon"] <= 8.0


def test_plain_text_output(capsys):
    assert main([*GAUSSIAN, "--delta", "1e-5", "--accountant", "rdp"]) == 0
    assert "epsilon" in capsys.readouterr().out


BAD = [
    ([*GAUSSIAN[:4], "--sampling-rate", "0", "--steps", "10", "--delta", "1e-5"], "sampling_rate = 0.0", "(0, 1]"),
    ([*GAUSSIAN[:4], "--sampling-rate", "1.5", "--steps", "10", "--delta", "1e-5"], "sampling_rate = 1.5", "(0, 1]"),
    ([*GAUSSIAN, "--delta", "0"], "delta = 0.0", "(0, 1)"),
    ([*GAUSSIAN, "--delta", "1"], "delta = 1.0", "(0, 1)"),
    ([*GAUSSIAN[:2], "--noise-multiplier=0", *GAUSSIAN[4:], "--delta=1e-5"], "noise_multiplier = 0.0", "(0, inf)"),
    ([*GAUSSIAN[:2], "--noise-multiplier=-1", *GAUSSIAN[4:], "--delta=1e-5"], "noise_multiplier = -1.0", "(0, inf)"),
    ([*GAUSSIAN[:6], "--steps", "0", "--delta", "1e-5"], "steps = 0", "[1, inf)"),
    (
        ["calibrate", "gaussian", "--target-epsilon", "0.001", "--delta", "1e-5", "--sampling-rate", "0.01",
         "--steps", "100", "--accountant", "rdp"],
        "target_epsilon = 0.001",
        "some noise reaches",
    ),
    (["calibrate", "gaussian", "--target-epsilon", "0", "--delta", "1e-5", "--sampling-rate", "0.01", "--steps", "1"],
     "target_epsilon = 0.0", "(0, inf)"),
    (["account", "laplace", "--scale", "0", "--sensitivity", "1", "--steps", "1"], "scale = 0.0", "(0, inf)"),
    (["account", "laplace", "--scale=1", "--sensitivity=1", "--steps=1", "--accountant=rdp"], "delta = None", "(0, 1)"),
]  # fmt: skip


@pytest.mark.parametrize("argv, field, allowed", BAD)
def test_bad_input_exits_2_with_message_on_stderr(capsys, argv, field, allowed):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert field in captured.err and allowed in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_printed_values_err_on_the_safe_side(capsys):
    """Defect 8: a user copies the printed noise; it must meet the target when accounted again (it was rounded
    down before: 2.57583 re-accounts to 8.0000177 > 8)."""
    from dpfl.accounting.accountant import account, gaussian_event
    from dpfl.cli.common import safe_round

    argv = ("calibrate gaussian --target-epsilon 8 --delta 1e-5 --sampling poisson --sampling-rate 0.08192 "
            "--steps 2500").split()
    assert main(argv) == 0
    printed = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    noise = float(printed["noise_multiplier"])
    assert account(gaussian_event(noise, 2500, "poisson", 0.08192), 1e-5).epsilon <= 8
    assert float(printed["epsilon"]) >= account(gaussian_event(noise, 2500, "poisson", 0.08192), 1e-5).epsilon
    assert safe_round(2.5758349) == "2.57584" and safe_round(2.5758349, down=True) == "2.57583"
    assert safe_round(12.906331310546925) == "12.9064" and safe_round(1e-5) == "1e-05"
    assert float(safe_round(1 / 3)) >= 1 / 3 and float(safe_round(1 / 3, down=True)) <= 1 / 3


def test_account_dp_fedavg_user_is_the_runs_ledger(capsys):
    """User-level DP-FedAvg without training: server noise behind a trusted server by default (zero-out, Poisson
    cohorts), the third party charged the Poisson subsampled Gaussian at z per round where the cohort is secret, the
    participation of one Gaussian at z where it is published (each within 1% above its exact epsilon,
    ``tests/helpers/exact.py``); adaptive clipping's two draws cost what one round at z costs; shares behind a plain
    boundary charge the server z / sqrt(n)."""
    import exact

    def exact_epsilon(z: float) -> float:
        return exact.Instance(((1.0, 0.1, exact.gaussian_pair(z)),)).epsilon(1e-5, 20)

    argv = ["account", "dp-fedavg-user", "--num-clients", "100", "--client-rate", "0.1", "--rounds", "20",
            "--noise-multiplier", "1.2", "--delta", "1e-5"]
    out = run_json(capsys, argv)
    assert set(out["epsilon"]) == {"third_party", "other_silo"} and out["neighboring"] == "zero_out"
    secret = exact.Instance(((1.0, 1.0, exact.poisson_pair(0.1, 1.2)),)).epsilon(1e-5, 20)
    assert secret <= out["epsilon"]["third_party"] <= secret * 1.01
    truth = exact_epsilon(1.2)
    published = run_json(capsys, [*argv, "--cohort", "published"])
    assert truth <= published["epsilon"]["third_party"] <= truth * 1.01
    adaptive = run_json(capsys, [*argv, "--target-quantile", "0.5", "--count-noise", "2"])
    assert len(adaptive["noise_multipliers"]) == 2 and adaptive["noise_multipliers"][1] == 4.0  # z_b = 2 sigma_b
    assert adaptive["epsilon"]["third_party"] == pytest.approx(out["epsilon"]["third_party"], rel=1e-3)
    shares = run_json(capsys, [*argv, "--noise-at", "shares", "--boundary", "plain", "--client-sampling", "fixed"])
    truth = exact_epsilon(1.2 / 10**0.5)
    assert truth <= shares["epsilon"]["server"] <= truth * 1.01
    assert main([*argv, "--target-quantile", "0.5", "--count-noise", "0.5"]) == 2
    assert "algorithm.count_noise = 0.5" in capsys.readouterr().err


def test_account_dp_fedavg_user_amplifies_server_noise_where_the_cohort_is_secret(capsys):
    """Server noise under secret Poisson cohorts: the amplified epsilon by default (docs/user-level.md's 5.49), with
    what it assumes; --cohort published gives every observer the participation mixture (25.93); --analysis paper
    (McMahan et al.'s) gives the 5.49 too, and is refused for shares, naming the key."""
    argv = ["account", "dp-fedavg-user", "--num-clients", "1000", "--client-rate", "0.05", "--rounds", "200",
            "--noise-multiplier", "1.0", "--delta", "1e-6"]
    out = run_json(capsys, [*argv, "--analysis", "paper"])
    assert out["analysis"] == "paper" and "McMahan et al. 2018, Thm 1" in out["assumptions"]["cohort"]
    assert out["epsilon"]["third_party"] == pytest.approx(5.4859, abs=1e-4) == out["epsilon"]["other_silo"]
    sound = run_json(capsys, argv)
    assert sound["analysis"] == "sound" and "assumptions" not in sound
    assert sound["epsilon"] == pytest.approx(out["epsilon"], rel=1e-9)
    assert sound["cohort"]["secret_from"] == ["third_party", "other_silo"]
    assert "McMahan et al. 2018, Thm 1" in sound["cohort"]["assumes"]
    published = run_json(capsys, [*argv, "--cohort", "published"])
    assert published["epsilon"]["third_party"] == pytest.approx(25.9271, abs=1e-4)
    assert published["cohort"]["secret_from"] == [] and published["cohort"]["assumes"] is None
    assert main([*argv, "--analysis", "paper", "--noise-at", "shares"]) == 2
    assert "algorithm.noise_at = 'shares'" in capsys.readouterr().err
