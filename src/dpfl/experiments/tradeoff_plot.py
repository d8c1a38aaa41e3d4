"""The privacy-utility view of many runs (`dpfl plot --tradeoff`): each run's final test accuracy against the epsilon
it spent towards each observer, one panel per observer, one marker per run.

A run is one point per panel: its results.json's ``final`` entry (the model and the ledger after the last round
done, so a run stopped by its budget shows what it reached). Runs of one algorithm (``config.algorithm.name``) share a
colour and a marker, so that a sweep over noise multipliers reads as one algorithm's trade-off curve; each marker is
labelled with its run's name. What cannot be placed is said in the panel's title, not dropped silently: a run with
an infinite epsilon towards the observer (no privacy towards it) or no measured test accuracy (a Flower run whose
server holds no test records). The epsilon axis is logarithmic when the plotted epsilons span a factor of ten or more.
"""

from __future__ import annotations

import math
from pathlib import Path

from dpfl.experiments.plots import RUN_MARKERS, delta_text, observer_name, observers_of

#: The epsilon axis turns logarithmic when the largest plotted epsilon is at least this many times the smallest.
LOG_SPAN = 10.0


def algorithm_of(result: dict, label: str) -> str:
    """The run's algorithm name (results.json's config), or its label for results without a config."""
    return result.get("config", {}).get("algorithm", {}).get("name", label)


def tradeoff_points(results: dict[str, dict], observer: str) -> tuple[list[tuple[str, float, float]], list[str]]:
    """([(label, epsilon, final test accuracy)] of the runs placed in ``observer``'s panel, [the notes of the runs
    that cannot be: "label: infinite epsilon" or "label: no test accuracy"])."""
    points, notes = [], []
    for label, result in results.items():
        final = result["final"]
        if observer not in (final.get("epsilon") or {}):  # null: a running run off its epsilon schedule
            continue
        epsilon, accuracy = final["epsilon"][observer], final.get("test_accuracy")
        if epsilon is None:
            notes.append(f"{label}: infinite epsilon")
        elif accuracy is None:
            notes.append(f"{label}: no test accuracy")
        else:
            points.append((label, float(epsilon), float(accuracy)))
    return points, notes


def plot_tradeoff(results: dict[str, dict], path: str | Path, title: str = "") -> Path:
    """One PNG of runs {label: results}: the figure of ``draw_tradeoff``."""
    import matplotlib.pyplot as plt

    fig = draw_tradeoff(results, title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def draw_tradeoff(results: dict[str, dict], title: str = ""):
    """The figure (module docstring): one panel per observer titled "<observer> (<the runs' delta>)" (and a line of
    the runs not plotted), each run one marker (a scatter of one point, its artist labelled with the run); one
    legend of the algorithms below the panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    observers = observers_of(results)
    fig, axes = plt.subplots(1, max(len(observers), 1), figsize=(5.5 * max(len(observers), 1), 5.2),
                             layout="constrained", squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    algorithms = list(dict.fromkeys(algorithm_of(result, label) for label, result in results.items()))
    style = {name: (colors[i % len(colors)], RUN_MARKERS[i % len(RUN_MARKERS)]) for i, name in enumerate(algorithms)}
    delta = delta_text(results)
    for ax, observer in zip(axes[0], observers):
        points, notes = tradeoff_points(results, observer)
        for label, epsilon, accuracy in points:
            color, marker = style[algorithm_of(results[label], label)]
            ax.scatter([epsilon], [accuracy], color=color, marker=marker, s=50, label=label, zorder=3)
            ax.annotate(label, (epsilon, accuracy), xytext=(5, 4), textcoords="offset points", fontsize=7)
        plotted = [epsilon for _, epsilon, _ in points]
        if plotted and min(plotted) > 0 and max(plotted) >= LOG_SPAN * min(plotted):
            ax.set_xscale("log")
        ax.margins(x=0.2, y=0.1)  # room for the markers' names
        ax.set(xlabel=f"epsilon towards the {observer_name(observer)}", ylabel="final test accuracy")
        ax.set_title(observer_name(observer) + (f" ({delta})" if delta else "")
                     + ("\nnot plotted: " + ", ".join(notes) if notes else ""), fontsize=10)
        ax.grid(alpha=0.3)
    handles = [plt.Line2D([], [], linestyle="", color=style[name][0], marker=style[name][1], markersize=7)
               for name in algorithms]
    fig.legend(handles, algorithms, loc="outside lower center", ncol=min(len(algorithms), 4), fontsize=9,
               frameon=False)
    fig.suptitle(title or "Final test accuracy against epsilon, per observer")
    return fig


__all__ = ["LOG_SPAN", "algorithm_of", "tradeoff_points", "plot_tradeoff", "draw_tradeoff"]
