"""`dpfl plan queries-replies` through the real entry point: flags only (Table I's MNIST constants), a config whose
data and model give non-private estimates, the Gaussian rule, the plot, --help and errors."""

import json
import math

import pytest

from dpfl.cli import main

# Table I, MNIST (the fit of tests/planning/test_queries_replies.py): gamma = 2.70, U = 412, V = 197, with mu = 1,
# lambda = gamma / 2, Gamma = 0: G = sqrt(4 p xi^2 U) / d and Y0 = 32 p xi^2 V / (gamma d^2).
P, XI, D, GAMMA = 7840, 300.0, 60000, 2.70
MNIST = ["plan", "queries-replies", "--N", "10", "--d", "6000", "--p", str(P), "--xi1", str(XI), "--mu", "1",
         "--lambda", str(GAMMA / 2), "--G", str(math.sqrt(4 * P * XI**2 * 412) / D), "--Gamma", "0",
         "--Y0", str(32 * P * XI**2 * 197 / (GAMMA * D**2))]


def run_json(capsys, argv):
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_flags_reproduce_table_one(capsys):
    joint = run_json(capsys, [*MNIST, "--epsilon", "5"])
    assert (joint["rounds"], joint["clients_per_round"]) == (121, 1)  # Table I: T* = 121 at b* = 1
    assert joint["constants"]["gamma"] == pytest.approx(GAMMA)
    assert joint["nonprivate_estimates"] == [] and "warning" not in joint
    assert run_json(capsys, [*MNIST, "--epsilon", "5", "--solve", "rounds", "--b", "5"])["rounds"] == 32
    fixed_T = run_json(capsys, [*MNIST, "--epsilon", "10", "--solve", "clients", "--T", "50", "--rounding", "up"])
    assert fixed_T["clients_per_round"] == 5 and fixed_T["rounding"] == "up"


def test_per_client_budgets_are_a_list(capsys):
    out = run_json(capsys, [*MNIST, "--epsilon", ",".join(["5"] * 10)])
    assert out["rounds"] == 121 and out["constants"]["epsilon"] == [5.0] * 10


def test_config_estimates_constants_without_privacy_and_flags_override(capsys, tmp_path, one_torch_thread):
    config = tmp_path / "plan.toml"
    config.write_text('[data]\nname = "breast_cancer"\nnum_clients = 3\nstandardize = "pooled"\n'
                      '[algorithm]\nname = "fedsgd"\nrounds = 50\nclient_rate = 0.4\n[privacy]\nepsilon = 5.0\n')
    plot = tmp_path / "u.png"
    out = run_json(capsys, ["plan", "queries-replies", str(config), "--xi1", "10", "--Gamma", "0.5", "--steps", "2",
                            "--plot", str(plot)])
    assert {"rounds", "clients_per_round", "bound", "constants"} <= set(out)
    assert out["nonprivate_estimates"] == ["G", "Y0", "lambda", "mu"]  # Gamma was given
    assert "WITHOUT privacy" in out["warning"]
    constants = out["constants"]
    assert constants["Gamma"] == 0.5 and constants["xi1"] == 10.0 and constants["epsilon"] == [5.0] * 3
    assert constants["mu"] == pytest.approx(0.005, abs=1e-9)  # logistic regression: mu = the weight decay
    assert constants["p"] == 62 and constants["N"] == 3 and sum(constants["d"]) == 455  # 569 records, 20% test
    assert out["data_gradient_norms"]["xi1"] > 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["plot"] == str(plot)


def test_gaussian_rule_trains_as_long_as_practical(capsys):
    argv = [*MNIST, "--mechanism", "gaussian", "--epsilon", "1", "--delta", "1e-5", "--xi2", "10", "--Lambda", "1",
            "--q", "0.01", "--T", "100"]
    out = run_json(capsys, argv)
    assert (out["rounds"], out["clients_per_round"]) == (100, 10)  # Solution 1: T = max, b = N
    assert out["constants"]["c2"] > 0 and "accountant" in out["c2_source"]


def test_help_documents_every_input(capsys):
    assert main(["plan", "queries-replies", "--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("CONFIG", "--N", "--b", "--T", "--epsilon", "--d", "--mu", "--lambda", "--xi1", "--xi2", "--G",
                 "--Gamma", "--Y0", "--p", "--mechanism", "--solve", "--json", "--plot", "--delta", "--Lambda",
                 "--q", "--c2", "--max-rounds", "--rounding"):
        assert flag in text


@pytest.mark.parametrize("argv, message", [
    (["plan", "queries-replies", "--N", "10", "--epsilon", "1"], "--mu = None is not allowed"),
    ([*MNIST, "--epsilon", "1,2"], "epsilon = [1.0, 2.0] is not allowed: expected one value, or one per client (10 clients)"),
    ([*MNIST, "--epsilon", "0"], "epsilon = 0.0 is not allowed"),
    ([*MNIST, "--epsilon", "1", "--solve", "rounds"], "clients_per_round = None is not allowed"),
    ([*MNIST[:8], *MNIST[10:], "--epsilon", "1"], "--xi1 = None is not allowed: expected the algorithm's clip"),
])
def test_bad_input_names_the_field(capsys, argv, message):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_plan_last_iterate_gives_the_least_noise_under_each_accountant(capsys):
    """n = 100, m = 1, L = rho = 1, eta = 0.5: sigma = 4 gives eps 1.365 (last iterate) and 1.993 (composition) at
    delta 1e-5, so at eps 1.365 the last iterate needs sigma ~ 4 and composition more."""
    from dpfl.accounting import last_iterate as li

    argv = ["plan", "last-iterate", "--epsilon", "1.365", "--delta", "1e-5", "--n", "100", "--lipschitz", "1",
            "--radius", "1", "--lr", "0.5", "--json"]
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["sigma_last_iterate"] == pytest.approx(4.0, rel=2e-3)
    assert li.epsilon(1e-5, 0.5, plan["sigma_last_iterate"], 100, 1, 1.0, 1.0) <= 1.365
    assert li.composition_epsilon(1e-5, plan["sigma_composition"], 100, 1, 1.0) == pytest.approx(1.365, rel=1e-3)
    assert plan["saving"] == pytest.approx(plan["sigma_composition"] / plan["sigma_last_iterate"]) and plan["saving"] > 1.3
    assert plan["noise_multiplier_last_iterate"] == pytest.approx(plan["sigma_last_iterate"] / 2)
    assert plan["steps"] == 100 and plan["unused_users"] == 0
    assert main(argv[:-1] + ["--batch-size", "0"]) == 2
    assert "batch_size = 0" in capsys.readouterr().err


# -- the newcomer's minimal config: fedsgd-dpc on digits over 10 clients, keys left to their defaults --------------
MINIMAL = '[data]\nname = "digits"\nnum_clients = 10\n[algorithm]\nname = "fedsgd-dpc"\n[privacy]\nepsilon = 10.0\n'


def test_a_loss_without_strong_convexity_is_refused_at_once_naming_the_key_that_gives_it(capsys, tmp_path):
    """Without weight decay a softmax model's loss has mu = 0 (a null direction), which Zhou et al.'s bound
    (Assumption 4) does not allow; the planner used to run Lanczos on that null space for minutes and end in
    ArpackNoConvergence."""
    config = tmp_path / "minimal.toml"
    config.write_text(MINIMAL)
    assert main(["plan", "queries-replies", str(config)]) == 2
    err = capsys.readouterr().err
    assert "algorithm.weight_decay = 0.0 is not allowed" in err and "Traceback" not in err
    assert "strongly convex" in err and "Assumption 4" in err and "--mu" in err


def test_with_weight_decay_the_minimal_config_plans_with_progress_and_its_own_cohort(capsys, tmp_path,
                                                                                    one_torch_thread):
    """fedsgd-dpc's b defaults to every client (it has no algorithm.client_rate: a KeyError before); the estimation
    reports its stages on stderr; mu of logistic regression is the weight decay."""
    config = tmp_path / "minimal.toml"
    config.write_text(MINIMAL.replace('name = "fedsgd-dpc"', 'name = "fedsgd-dpc"\nweight_decay = 0.01')
                      .replace("num_clients = 10", "num_clients = 10\nsamples_per_client = 30"))
    assert main(["plan", "queries-replies", str(config), "--steps", "2", "--json"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["constants"]["mu"] == pytest.approx(0.01, rel=1e-6) and out["constants"]["N"] == 10
    assert "warnings" not in out  # every minimisation converged
    stages = [line for line in captured.err.splitlines() if line.startswith("dpfl plan: estimating")]
    assert len(stages) == 6 and "gradient norms" in stages[-1]
    assert main(["plan", "queries-replies", str(config), "--steps", "2", "--solve", "rounds", "--json",
                 "--no-progress", "--max-iterations", "1"]) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["clients_per_round"] == 10 and captured.err == ""
    assert any("theta*" in w and "1 L-BFGS-B iterations" in w for w in out["warnings"])


def test_an_estimated_mu_needs_a_config_with_weight_decay_but_a_given_mu_does_not(capsys, tmp_path,
                                                                                  one_torch_thread):
    config = tmp_path / "minimal.toml"
    config.write_text(MINIMAL.replace("num_clients = 10", "num_clients = 10\nsamples_per_client = 30"))
    assert main(["plan", "queries-replies", str(config), "--mu", "0.01", "--steps", "2", "--json",
                 "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["constants"]["mu"] == 0.01 and "mu" not in out["nonprivate_estimates"]
