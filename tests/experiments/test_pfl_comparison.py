"""benchmarks/pfl_comparison.py (dpfl against pfl-research, the README's table) at a tiny size: the dpfl side runs end
to end in its own process and reports dp_accounting's PLD of the Poisson subsampled Gaussian towards both observers
(the epsilon pfl's accountant reports), pfl is reported "not installed" where no interpreter imports it, and pfl's
process reads exactly the records dpfl's run is built from. With ``PFL_PYTHON`` naming an environment that has pfl,
the slow test runs pfl's side too. So the benchmark cannot rot."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant

ROOT = Path(__file__).resolve().parents[2]
PATH = ROOT / "benchmarks" / "pfl_comparison.py"
TINY = ["--clients", "20", "--records", "10"]

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def load():
    spec = importlib.util.spec_from_file_location("pfl_comparison", PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def subsampled_gaussian_epsilon(rounds: int) -> float:
    """dp_accounting's PLD of PoissonSampledDpEvent(q = 0.1, GaussianDpEvent(z = 1)) composed ``rounds`` times, at
    delta = 1e-6: what pfl's PLDPrivacyAccountant computes for the workload."""
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0)), rounds)
    return accountant.get_epsilon(1e-6)


def test_the_dpfl_side_runs_and_reports_pfls_epsilon_without_pfl(tmp_path, capsys):
    comparison = load()
    found = comparison.main([*TINY, "--rounds", "3", "--pfl-python", "", "--json", str(tmp_path / "out.json")])
    assert found["pfl"] == "not installed" and [run["rounds"] for run in found["runs"]] == [3]
    assert json.loads((tmp_path / "out.json").read_text()) == found
    run = found["runs"][0]
    dpfl = run["dpfl"]
    assert run["pfl"] is None and dpfl["framework"] == "dpfl"
    assert dpfl["epsilon"]["third_party"] == dpfl["epsilon"]["other_silo"]  # neither knows the cohort
    assert dpfl["epsilon"]["third_party"] == pytest.approx(subsampled_gaussian_epsilon(3), rel=1e-6)
    seconds = dpfl["round_seconds"]
    assert len(seconds) == 3 and dpfl["seconds_per_round"] == comparison.round_seconds(seconds)
    assert 0 <= dpfl["test_accuracy"] <= 1 and dpfl["peak_mib"] > 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].endswith("pfl: not installed") and len(printed) == 3 + 2
    assert printed[3].split()[:2] == ["3", "dpfl"] and printed[4].split() == ["3", "pfl", "pfl:", "not", "installed"]
    assert printed[3].split()[4:6] == [f"{dpfl['epsilon']['third_party']:.4f}"] * 2


def test_round_seconds_separates_the_first_round():
    comparison = load()
    assert comparison.round_seconds([4.0, 1.0, 2.0]) == {"first": 4.0, "mean_after_first": 1.5, "mean_all": 7 / 3,
                                                          "rounds": 3}
    assert comparison.round_seconds([4.0])["mean_after_first"] is None  # one round: nothing after it


def test_pfl_reads_the_records_dpfls_run_is_built_from(tmp_path):
    comparison = load()
    import dpfl

    comparison.export_data(20, 10, tmp_path / "records.npz")
    sim = dpfl.build(dpfl.load_config(None, comparison.dpfl_settings(20, 10, 1)))
    with np.load(tmp_path / "records.npz") as records:
        assert records["x_train"].shape == (20, 8, 40)  # 80% of 10 records train, 40 features
        for split in ("train", "test"):
            arrays = getattr(sim, split)
            for name in ("x", "y", "counts"):
                np.testing.assert_array_equal(records[f"{name}_{split}"], getattr(arrays, name).numpy())


def test_an_interpreter_without_pfl_is_not_installed():
    comparison = load()
    assert comparison.pfl_installed(None) is None and comparison.pfl_installed("") is None
    assert comparison.pfl_installed(sys.executable) is None  # dpfl's environment has no pfl
    assert comparison.pfl_installed(str(PATH.parent / "no-such-python")) is None


def test_the_readme_table_names_the_benchmark_and_its_epsilons_are_the_subsampled_gaussians():
    """README.md, "Against pfl-research": the command, and per rounds the epsilon both columns print (to 4 decimals),
    dp_accounting's PLD of the workload's event (one accountant: 20 rounds, then 180 more)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("### Against pfl-research"):text.index("## Scale")]
    assert "`python benchmarks/pfl_comparison.py --pfl-python" in section
    rows = re.findall(r"^\| (\d+) \| (dpfl|pfl 0\.6\.0) \|.*\| ([\d.]+) \| ([\d.]+|\(none\)) \| [\d, ]+ \|$", section,
                      flags=re.MULTILINE)
    assert [(int(r[0]), r[1]) for r in rows] == [(20, "dpfl"), (20, "pfl 0.6.0"), (200, "dpfl"), (200, "pfl 0.6.0")]
    accountant = pld_privacy_accountant.PLDAccountant()
    event = dp_event.PoissonSampledDpEvent(0.1, dp_event.GaussianDpEvent(1.0))
    expected = {20: accountant.compose(event, 20).get_epsilon(1e-6)}
    expected[200] = accountant.compose(event, 180).get_epsilon(1e-6)
    for rounds, framework, third_party, other_silo in rows:
        assert float(third_party) == pytest.approx(expected[int(rounds)], abs=5e-5)
        assert other_silo == ("(none)" if framework.startswith("pfl") else third_party)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("PFL_PYTHON"), reason="PFL_PYTHON names no interpreter with pfl")
def test_pfl_reports_the_same_epsilon_as_dpfls_default(tmp_path):
    """100 users, so that no cohort is empty (0.9^100): pfl's simulator fails on an empty cohort."""
    comparison = load()
    found = comparison.main(["--clients", "100", "--records", "10", "--rounds", "2", "--pfl-python",
                             os.environ["PFL_PYTHON"]])
    run = found["runs"][0]
    assert found["pfl"] == "0.6.0" and run["pfl"]["seconds_per_round"]["rounds"] == 2
    assert run["pfl"]["epsilon"]["pfl"] == pytest.approx(run["dpfl"]["epsilon"]["third_party"], rel=1e-6)
