"""The figures drawn from results.json (dpfl.experiments.plots, dpfl.experiments.tradeoff_plot), from hand-made
results: the clip panel, and `dpfl plot --tradeoff`'s privacy-utility view, read back from the figures' artists."""

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from dpfl.cli import main  # noqa: E402
from dpfl.experiments import plots, tradeoff_plot  # noqa: E402


def _run(algorithm: str, epsilons: list[dict], accuracies: list, clips: list | None = None) -> dict:
    """A run's results.json: one row per round, the last one its final entry, at delta 1e-5."""
    rows = [{"round": t + 1, "test_accuracy": a, "train_loss": 1.0 / (t + 1), "epsilon": e}
            for t, (e, a) in enumerate(zip(epsilons, accuracies))]
    for row, clip in zip(rows, clips or []):
        row["clip"] = clip
    return {"config": {"algorithm": {"name": algorithm}}, "rounds": rows, "final": {**rows[-1], "delta": 1e-5},
            "privacy": {"observers": sorted(epsilons[-1])}}


def _panels(fig) -> dict:
    return {ax.get_title(): ax for ax in fig.axes}


def test_rows_that_carry_the_clip_get_a_clip_panel():
    """dp-fedavg-user's rows carry C_t ("clip"): its panel holds that run's C_t per round on a log axis; a run without
    it draws nothing there, and results without any clip have no such panel."""
    eps = [{"third_party": 0.5}, {"third_party": 0.8}, {"third_party": 1.0}]
    adaptive = _run("dp-fedavg-user", eps, [0.3, 0.5, 0.6], clips=[1.0, 0.8, 0.64])
    fixed = _run("dp-fedavg", eps, [0.3, 0.4, 0.5])
    fig = plots.draw_runs({"adaptive": adaptive, "fixed": fixed})
    clip = _panels(fig)["Clip norm C_t"]
    (line,) = clip.get_lines()
    assert line.get_label() == "adaptive" and list(line.get_ydata()) == [1.0, 0.8, 0.64]
    assert list(line.get_xdata()) == [1, 2, 3] and clip.get_yscale() == "log"
    assert set(_panels(fig)) == {"Test accuracy", "Train loss", "Clip norm C_t", "Epsilon: third party (delta = 1e-05)"}
    plt.close(fig)
    fig = plots.draw_runs({"fixed": fixed})
    assert "Clip norm C_t" not in _panels(fig)
    plt.close(fig)


def _sweep() -> dict:
    """Three runs: two of dp-fedavg (the second with no privacy towards the server), one of dp-scaffold whose
    accuracy was not measured; epsilons towards the third party spanning 1 to 16."""
    return {
        "fedavg-z1": _run("dp-fedavg", [{"third_party": 0.5, "server": 1.0}, {"third_party": 16.0, "server": 20.0}],
                          [0.2, 0.81]),
        "fedavg-z4": _run("dp-fedavg", [{"third_party": 1.0, "server": None}], [0.55]),
        "scaffold-z1": _run("dp-scaffold", [{"third_party": 2.0, "server": 3.0}], [None]),
    }


def test_the_tradeoff_places_each_run_at_its_final_accuracy_and_epsilon():
    fig = tradeoff_plot.draw_tradeoff(_sweep())
    panels = _panels(fig)
    third = panels["third party (delta = 1e-05)\nnot plotted: scaffold-z1: no test accuracy"]
    server = panels["server (delta = 1e-05)\nnot plotted: fedavg-z4: infinite epsilon, scaffold-z1: no test accuracy"]
    assert len(panels) == 2
    points = {c.get_label(): c for c in third.collections}
    assert {k: tuple(c.get_offsets()[0]) for k, c in points.items()} == {"fedavg-z1": (16.0, 0.81),
                                                                         "fedavg-z4": (1.0, 0.55)}
    assert third.get_xscale() == "log"  # 1 to 16: a span of ten or more
    (only,) = server.collections
    assert (only.get_label(), tuple(only.get_offsets()[0])) == ("fedavg-z1", (20.0, 0.81))
    assert server.get_xscale() == "linear"
    assert np.array_equal(points["fedavg-z1"].get_facecolor(), points["fedavg-z4"].get_facecolor())  # one algorithm
    assert [t.get_text() for t in third.texts] == ["fedavg-z1", "fedavg-z4"]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["dp-fedavg", "dp-scaffold"]
    plt.close(fig)


def test_dpfl_plot_tradeoff_writes_the_figure_of_the_run_directories(tmp_path, capsys, monkeypatch):
    for label, result in _sweep().items():
        (tmp_path / label).mkdir()
        (tmp_path / label / "results.json").write_text(json.dumps(result))
    runs = [str(tmp_path / label) for label in _sweep()]
    drawn = []
    original = tradeoff_plot.plot_tradeoff
    monkeypatch.setattr(tradeoff_plot, "plot_tradeoff", lambda results, out, title="": drawn.append(results) or
                        original(results, out, title))
    png = tmp_path / "tradeoff.png"
    assert main(["plot", "--tradeoff", *runs, "--out", str(png)]) == 0
    assert drawn == [_sweep()] and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {png}" in capsys.readouterr().out


@pytest.mark.parametrize("spread, scale", [(9.9, "linear"), (10.0, "log")])
def test_the_epsilon_axis_turns_logarithmic_at_a_span_of_ten(spread, scale):
    results = {f"run{k}": _run("dp-fedavg", [{"third_party": e}], [0.5]) for k, e in enumerate((1.0, spread))}
    fig = tradeoff_plot.draw_tradeoff(results)
    (ax,) = fig.axes
    assert ax.get_xscale() == scale
    plt.close(fig)
