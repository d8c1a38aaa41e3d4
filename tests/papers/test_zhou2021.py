"""The Zhou et al. (2021) digits experiment on a tiny grid: its outputs' shape, the planned point it runs (T* = 0 is
the initial model, evaluated), the privacy each run spent, and its plan agreeing with `dpfl plan queries-replies`."""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest

from dpfl.cli import main as dpfl_main
from dpfl.papers.zhou2021 import experiment as zhou2021

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _toml(overrides: list[str]) -> str:
    """section.key=value overrides as a TOML file's tables."""
    sections: dict[str, list[str]] = {}
    for item in overrides:
        key, value = item.split("=", 1)
        section, name = key.split(".")
        sections.setdefault(section, []).append(f"{name} = {value}")
    return "\n".join(f"[{s}]\n" + "\n".join(lines) for s, lines in sections.items()) + "\n"


def test_a_tiny_grid_writes_every_run_the_table_and_the_figure(tmp_path, capsys):
    out = tmp_path / "out"
    result = zhou2021.main(["--out", str(out), "--repeats", "1", "--epsilons", "1", "--rounds", "2", "--clients", "1",
                            "--gaussian-epsilons", ""])
    plans = result["plans"]["laplace eps=1"]
    joint, per_b = plans[zhou2021.JOINT], plans["T*(b=1)"]
    # eps = 1 on digits: the bound is least with no training. T*(1) = 2.26 relaxed, but round robin (the default)
    # calibrates every client to ceil(T / 10) = 1 reply for T <= 10, 5 times the relaxation's bT/N = 0.2 at T = 2,
    # and U(0, 1) is the least
    assert (joint["clients_per_round"], joint["rounds"]) == (10, 0) and per_b["rounds"] == 0
    assert per_b["continuous_rounds"] == pytest.approx(2.26, abs=0.01) and per_b["replies"] == "round_robin"
    with open(out / "runs.csv") as file:
        runs = list(csv.DictReader(file))
    # three points: the grid's (b=1, T=2), the joint plan (b=10, T=0) and T*(b=1) = (1, 0)
    assert [(r["clients_per_round"], r["rounds"], r["sources"]) for r in runs] == [
        ("1", "2", zhou2021.GRID), ("10", "0", zhou2021.JOINT), ("1", "0", "T*(b=1)")]
    trained, initial, _ = runs
    assert 0 < float(trained["epsilon_spent"]) <= 1 + 1e-9 and float(initial["epsilon_spent"]) == 0
    assert 2.0 < float(initial["train_loss"]) < 2.6  # ln 10 = 2.30 near a small random initialisation
    stored = json.loads((out / "results.json").read_text())
    assert stored["runs"] == result["runs"] and len(stored["summary"]) == 3
    assert stored["constants"]["mu"] == pytest.approx(0.01, rel=1e-6)  # mu = the weight decay (no bias)
    assert "WITHOUT privacy" in stored["nonprivate"]
    table = (out / "table.md").read_text().splitlines()
    assert len(table) == 3 and table[2].startswith("| 1 | (10, 0) |")
    assert (out / "zhou2021.png").read_bytes()[:4] == b"\x89PNG"
    assert table[2] in capsys.readouterr().out

    # the same constants, reply count and plan through the CLI, from a config of the same setting (round robin)
    config = tmp_path / "digits.toml"
    setup = zhou2021.Setup()
    config.write_text(_toml([*setup.overrides(), f"algorithm.clip={setup.clip_laplace!r}", "privacy.epsilon=1.0",
                             "algorithm.rounds=2"]))
    assert dpfl_main(["plan", "queries-replies", str(config), "--solve", "rounds", "--b", "1", "--json"]) in (0, None)
    planned = json.loads(capsys.readouterr().out)
    assert planned["rounds"] == per_b["rounds"] and planned["continuous_rounds"] == pytest.approx(
        per_b["continuous_rounds"], rel=1e-6)
    assert (planned["replies"], planned["replies_per_client"]) == ("round_robin", 0.0)
    # the paper's count bT/N on request: T = 2 replies 0.2 times
    assert dpfl_main(["plan", "queries-replies", str(config), "--solve", "rounds", "--b", "1", "--replies",
                      "expected", "--json"]) in (0, None)
    paper = json.loads(capsys.readouterr().out)
    assert (paper["rounds"], paper["replies"], paper["replies_per_client"]) == (2, "expected", 0.2)


def test_the_distance_to_theta_star_starts_at_y0_and_the_clip_alone_leaves_a_floor():
    """In the b* = 1 regime (breast cancer, w = 2): a plan of T = 0 is at Y0 = ||theta_0 - theta*||^2, as the
    estimation says; without noise the unclipped run (Theorem 3's assumption) closes in on theta*, while xi_1 = 2
    stops at a clipping bias the bound does not have."""
    from dpfl.papers.zhou2021 import causes

    setup = zhou2021.B_STAR_ONE
    est, target = zhou2021.estimate(setup), zhou2021.optimum(setup)
    start = zhou2021.run_point(setup, zhou2021.Point("laplace", 5.0, 10, 0, ()), 0, est.lam, target=target)
    assert start["distance"] == pytest.approx(est.Y0, rel=1e-9)
    clipped = causes.measure(setup, causes.NOISELESS, 10, 30, 1, est.lam, target)
    unclipped = causes.measure(dataclasses.replace(setup, clip_laplace=causes.UNCLIPPED), causes.NOISELESS, 10, 30, 1,
                               est.lam, target)
    # measured: 0.060 with the clip, 0.0008 without, of Y0 = 0.76
    assert unclipped["distance"] < 0.1 * clipped["distance"] and clipped["distance"] > 0.05 * est.Y0


def test_the_causes_item_at_a_tiny_size(tmp_path):
    """zhou2021-causes at eps = 1 (plans of T*(1) = 40 and T*(10) = 4: cheap) and T = 2: a row per question, the
    bound's terms summing to U, the noise-free runs at or below the noisy ones, the table written."""
    from dpfl.papers.zhou2021.experiment import B_STAR_ONE
    from dpfl.papers.zhou2021.items import _causes

    settings = {"setup": dataclasses.asdict(B_STAR_ONE), "repeats": 1, "epsilons": [1.0], "rounds": [2]}
    result = _causes(settings, tmp_path)
    (part,) = result["shape"]
    assert (part["joint"]["clients_per_round"], part["joint"]["rounds"]) == (10, 4)
    assert [(r["clients_per_round"], r["rounds"], r["planned"]) for r in part["rows"]] == [
        (1, 2, False), (1, 40, True), (10, 2, False), (10, 4, True)]
    for r in part["rows"]:
        assert r["bound_optimisation"] + r["bound_noise"] == pytest.approx(r["bound"], rel=1e-12)
        assert r["noiseless_unclipped"] < r["noiseless_clipped"] < 0.77  # Y0 = 0.76
    assert result["replanned"][0]["rounds"]["as estimated"] == 40
    assert len(result["rows"]) == 2 * 3 + 3 and result["rows"][-1].sound.count(" against ") == 1
    assert "| 1 | 40 (T*) |" in (tmp_path / "causes.md").read_text()
