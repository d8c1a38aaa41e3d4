"""`dpfl --version`, `--json` summaries, exit statuses of stopped runs and `dpfl plot`, through `dpfl.cli.main`."""

import json

import pytest

from dpfl.cli import main
from dpfl.cli.run import BUDGET_STOPPED, DIVERGED

TINY = """
[data]
num_clients = 6
samples_per_client = 30

[algorithm]
name = "dp-fedavg"
rounds = 2
local_steps = 2
noise_multiplier = 2.0
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "tiny.toml"
    path.write_text(TINY)
    return path


@pytest.fixture(scope="module")
def two_runs(config, tmp_path_factory):
    """Two finished 2-round runs (the second with another seed), read-only."""
    root = tmp_path_factory.mktemp("runs")
    for name, seed in (("first", 0), ("second", 1)):
        assert main(["run", str(config), "--out", str(root / name), "--no-progress", "--set", f"run.seed={seed}"]) == 0
    return root / "first", root / "second"


def test_version(capsys):
    import dpfl

    assert main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("dpfl ") and out.split()[1] == dpfl.__version__


def test_run_json_prints_one_object_and_nothing_else(config, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["run", str(config), "--out", str(out), "--json"]) == 0  # progress on: it must go to stderr
    captured = capsys.readouterr()
    summary = json.loads(captured.out)
    assert set(summary) == {"round", "test_accuracy", "train_loss", "epsilon", "delta", "results", "stopped_reason",
                            "budget", "not_covered"}
    assert summary["round"] == 2 and summary["stopped_reason"] is None
    assert set(summary["epsilon"]) == {"third_party", "server", "other_silo"}
    assert summary["results"] == str(out / "results.json")
    assert summary["epsilon"] == json.loads((out / "results.json").read_text())["final"]["epsilon"]


def test_budget_stop_exits_3_and_says_so(config, tmp_path, capsys):
    code = main(["run", str(config), "--out", str(tmp_path / "b"), "--no-progress", "--json",
                 "--set", "privacy.budget=0.3"])
    captured = capsys.readouterr()
    assert code == BUDGET_STOPPED == 3
    assert "stopped by the privacy budget after round " in captured.err and "privacy.budget" in captured.err
    summary = json.loads(captured.out)
    assert "privacy.budget" in summary["stopped_reason"] and summary["epsilon"]["third_party"] <= 0.3


def test_divergence_exits_4_with_strict_json(config, tmp_path, capsys):
    code = main(["run", str(config), "--out", str(tmp_path / "d"), "--no-progress", "--json",
                 "--set", "algorithm.lr=1e200"])
    captured = capsys.readouterr()
    assert code == DIVERGED == 4
    assert "diverged" in captured.err and "Traceback" not in captured.err
    summary = json.loads(captured.out, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert "diverged" in summary["stopped_reason"]
    assert json.loads((tmp_path / "d" / "results.json").read_text())["stopped_by"] == "diverged"


def test_exit_statuses_are_documented(capsys):
    assert main(["run", "--help"]) == 0
    text = capsys.readouterr().out
    for line in ("3    the privacy budget", "4    the run diverged", "130  interrupted", "143  stopped by SIGTERM",
                 "2    error"):
        assert line in text


def test_run_help_prints_every_keys_default_as_a_value(capsys):
    """A list key's default (fedsgd-dpc's client_epsilons, a default_factory) printed as the dataclasses placeholder
    object."""
    assert main(["run", "--help"]) == 0
    text = capsys.readouterr().out
    assert "client_epsilons = []: eps_i per client" in text
    assert "object at 0x" not in text and "MISSING" not in text


def test_plot_two_runs_with_every_observer(two_runs, tmp_path, capsys):
    png = tmp_path / "figs" / "runs.png"
    assert main(["plot", *map(str, two_runs), "--out", str(png)]) == 0
    assert str(png) in capsys.readouterr().out
    assert png.stat().st_size > 10_000


def test_plot_draws_one_epsilon_panel_per_observer_each_run_in_its_own_style(two_runs):
    """Each observer's panel holds each run's epsilon per round as results.json has it; a run has one colour and
    marker in every panel, and two runs differ in both."""
    import matplotlib.pyplot as plt

    from dpfl.cli.plot import load_results
    from dpfl.experiments import plots

    results = {p.name: load_results(p) for p in two_runs}
    fig = plots.draw_runs(results)
    panels = {ax.get_title(): {line.get_label(): line for line in ax.get_lines()} for ax in fig.axes}
    delta = results["first"]["final"]["delta"]
    accuracy = panels["Test accuracy"]
    for observer in ("third_party", "server", "other_silo"):
        lines = panels[f"Epsilon: {observer.replace('_', ' ')} (delta = {delta:.2g})"]
        assert set(lines) == {"first", "second"}
        for run, result in results.items():
            assert list(lines[run].get_xdata()) == [1, 2]
            assert list(lines[run].get_ydata()) == [r["epsilon"][observer] for r in result["rounds"]]
            assert (lines[run].get_color(), lines[run].get_marker()) == \
                (accuracy[run].get_color(), accuracy[run].get_marker())
    assert accuracy["first"].get_color() != accuracy["second"].get_color()
    assert accuracy["first"].get_marker() != accuracy["second"].get_marker()
    plt.close(fig)


def _curves(rounds: int = 30) -> dict:
    """Two runs' results whose noisy curves fill each panel, corners included (as noisy DP runs' curves do)."""
    results = {}
    for name, shift in (("first", 0.0), ("second", 0.4)):
        wave = [(t * 7 % 11) / 10 for t in range(1, rounds + 1)]  # 0.7, 0.3, 0.0, 0.7, ... in [0, 1]
        entries = [{"round": t, "test_accuracy": 0.1 + 0.8 * abs(w - shift), "train_loss": 1 + 2 * abs(w - shift),
                    "epsilon": {"third_party": 1 + abs(w - shift), "server": 2 - abs(w - shift),
                                "other_silo": 1.5 + 0.5 * w}}
                   for t, w in zip(range(1, rounds + 1), wave)]
        results[name] = {"rounds": entries, "final": {**entries[-1], "delta": 1e-5},
                         "privacy": {"observers": ["third_party", "server", "other_silo"]}}
    return results


def _drawn(draw):
    """The figure ``draw()`` makes and closes, drawn (plt.close intercepted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    drawn, original = {}, plt.close
    plt.close = lambda fig: drawn.setdefault("fig", fig)
    try:
        draw()
    finally:
        plt.close = original
    fig = drawn["fig"]
    fig.canvas.draw()
    return fig


def _inside(inner, outer) -> bool:
    return inner.x0 >= outer.x0 - 1 and inner.y0 >= outer.y0 - 1 and inner.x1 <= outer.x1 + 1 and \
        inner.y1 <= outer.y1 + 1


def test_plot_legend_covers_no_data_and_stays_in_the_figure(tmp_path):
    """One legend of the runs, below every panel (the figure's, not an axis's)."""
    import matplotlib.pyplot as plt
    import numpy as np

    from dpfl.experiments import plots

    fig = _drawn(lambda: plots.plot_runs(_curves(), tmp_path / "curves.png"))
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["first", "second"]
    box = legend.get_window_extent()
    assert _inside(box, fig.bbox), "legend cut off"
    assert len(fig.axes) == 5 and all(ax.get_legend() is None for ax in fig.axes)
    for ax in fig.axes:
        assert _inside(ax.title.get_window_extent(), fig.bbox)
        for line in ax.get_lines():
            points = ax.transData.transform(line.get_xydata())
            covered = [(x, y) for x, y in points if np.isfinite(x) and np.isfinite(y) and box.contains(x, y)]
            assert covered == [], f"{ax.get_title()}: the legend covers {line.get_label()} at {covered[:3]}"
    plt.close(fig)


def test_plot_labels_name_the_runs(two_runs, tmp_path, capsys, monkeypatch):
    from dpfl.experiments import plots

    named = []
    monkeypatch.setattr(plots, "plot_runs", lambda results, out, title="": named.append(list(results)))
    assert main(["plot", *map(str, two_runs), "--labels", "DP-SCAFFOLD", "DP-FedAvg", "--out",
                 str(tmp_path / "x.png")]) == 0
    assert named == [["DP-SCAFFOLD", "DP-FedAvg"]]
    assert main(["plot", *map(str, two_runs), "--labels", "one", "--out", str(tmp_path / "x.png")]) == 2
    assert ("dpfl plot: error: --labels = ['one'] is not allowed: expected 2 distinct labels, one per RUN_DIR in "
            "order") in capsys.readouterr().err


@pytest.mark.parametrize("case, message", [
    ("missing", "is not a directory"),
    ("empty", "results.json does not exist"),
    ("truncated", "results.json is not valid JSON"),
])
def test_plot_errors_name_the_path_and_exit_2(two_runs, tmp_path, capsys, case, message):
    bad = tmp_path / case
    if case != "missing":
        bad.mkdir()
    if case == "truncated":
        text = (two_runs[0] / "results.json").read_text()
        (bad / "results.json").write_text(text[: len(text) // 2])
    code = main(["plot", str(two_runs[0]), str(bad), "--out", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("dpfl plot: error: ") and str(bad) in err and message in err
    assert "Traceback" not in err and not (tmp_path / "x.png").exists()


def test_demo_json_and_shared_plot(tmp_path, capsys):
    small = ["data.num_clients=5", "data.samples_per_client=40", "algorithm.rounds=6", "algorithm.client_rate=1.0",
             "algorithm.local_steps=2"]
    assert main(["demo", "--out", str(tmp_path), "--no-progress", "--json",
                 *[a for s in small for a in ("--set", s)]]) == 0
    summaries = json.loads(capsys.readouterr().out)
    assert set(summaries) == {"dp-scaffold-warm", "dp-fedavg"}
    assert all(s["round"] == 6 and s["stopped_reason"] is None for s in summaries.values())
    assert (tmp_path / "demo.png").stat().st_size > 10_000
