"""Figures regenerated from results (never edited): accuracy, loss and epsilon per observer per round for one or more
runs.

``plot_runs`` is what `dpfl plot` and `dpfl demo` draw (``draw_runs`` the figure). The top row holds the test
accuracy, the train loss and, when a run's rounds report them, the squared gradient mapping (a prox-step algorithm)
and the clip C_t (an adaptive clip, e.g. dp-fedavg-user's); the bottom row holds one epsilon panel per observer (third
party, server, other silo, ...). A panel per observer, not a line style per observer in one panel: the epsilons of
different observers, and of different runs towards one observer, are often equal or nearly so (the demo's two
algorithms spend the same privacy: six coinciding lines in one panel), and a panel each keeps every observer's
curves apart and on their own scale. A run has one colour and marker in every panel (earlier runs drawn wider,
underneath later ones, so coinciding curves both stay visible), named once in the legend below the figure. An
epsilon panel draws the rows that report epsilon (run.epsilon_every's schedule: a row off it has "epsilon": null).
``dpfl.experiments.tradeoff_plot`` draws the privacy-utility view of many runs."""

from __future__ import annotations

import math
from pathlib import Path

#: The observers drawn first, in this order; others follow in the order the results name them.
OBSERVER_ORDER = ("third_party", "server", "other_silo")
#: Optional per-round metrics, each drawn in its own top-row panel (log scale) when a run's rounds carry it:
#: key -> (panel title, y label).
OPTIONAL_PANELS = {
    "gradient_mapping": ("Gradient mapping (train data)", "||G_eta(w)||^2 (log scale)"),
    "clip": ("Clip norm C_t", "C_t (log scale)"),
}
RUN_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def observers_of(results: dict[str, dict]) -> list[str]:
    """Every observer that any run reports an epsilon for, in the order third party, server, other silo, others."""
    seen: list[str] = []
    for result in results.values():
        names = list(result.get("privacy", {}).get("observers", []))
        for entry in [*result["rounds"], result["final"]]:
            names += list(entry.get("epsilon") or {})  # null: a row off run.epsilon_every's schedule
        seen += [n for n in names if n not in seen]
    known = [o for o in OBSERVER_ORDER if o in seen]
    return known + [o for o in seen if o not in OBSERVER_ORDER]


def measured(value: float | None) -> float:
    """A metric of results.json, NaN (not drawn) where it is null: not measured (a Flower run's server holds no
    training records, ``dpfl.flower.evaluation``) or, for epsilon, infinite."""
    return math.nan if value is None else value


def delta_text(results: dict[str, dict]) -> str:
    """"delta = d" for the runs' common delta, "delta: d1, d2" when they differ, "" when none is reported."""
    deltas = sorted({r["final"].get("delta") for r in results.values() if r["final"].get("delta") is not None})
    if not deltas:
        return ""
    return f"delta = {deltas[0]:.2g}" if len(deltas) == 1 else "delta: " + ", ".join(f"{d:.2g}" for d in deltas)


def observer_name(observer: str) -> str:
    return observer.replace("_", " ")


def _markevery(n: int, k: int, count: int):
    """About 10 markers per line, shifted per curve so the markers of coinciding curves do not sit on each other."""
    step = max(1, n // 10)
    return (min(k * max(1, step // max(count, 1)), max(n - 1, 0)), step)


def plot_runs(results: dict[str, dict], path: str | Path, title: str = "") -> Path:
    """One PNG of runs {label: results}: the figure of ``draw_runs``."""
    import matplotlib.pyplot as plt

    fig = draw_runs(results, title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # nothing cut off, whatever the legend holds
    plt.close(fig)
    return path


def draw_runs(results: dict[str, dict], title: str = ""):
    """The figure of ``plot_runs`` (module docstring): the panels' axes are titled "Test accuracy", "Train loss",
    those of ``OPTIONAL_PANELS`` and "Epsilon: <observer>"; one legend of the runs below the figure (a constrained
    layout keeps it and the titles inside the figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    observers = observers_of(results)
    rows_of_all = [r for result in results.values() for r in result["rounds"]]
    optional = [key for key in OPTIONAL_PANELS if any(key in r for r in rows_of_all)]
    top = 2 + len(optional)
    fig = plt.figure(figsize=(5.3 * max(top, len(observers)), 9.5), layout="constrained")
    rows = fig.subfigures(2 if observers else 1, 1, squeeze=False)[:, 0]
    panels = list(rows[0].subplots(1, top, squeeze=False)[0])
    eps_axes = list(rows[1].subplots(1, len(observers), squeeze=False)[0]) if observers else []
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    losses, never = [], {o: [] for o in observers}
    for i, (label, result) in enumerate(results.items()):
        rounds = [r["round"] for r in result["rounds"]]
        wider = 1 + 1.0 * (len(results) - 1 - i) / max(len(results) - 1, 1)  # earlier runs wider, underneath
        style = {"color": colors[i % len(colors)], "marker": RUN_MARKERS[i % len(RUN_MARKERS)], "markersize": 5,
                 "markerfacecolor": "none", "linewidth": 1.5 * wider, "alpha": 0.9,
                 "markevery": _markevery(len(rounds), i, len(results)), "label": label}
        panels[0].plot(rounds, [measured(r["test_accuracy"]) for r in result["rounds"]], **style)
        loss = [measured(r["train_loss"]) for r in result["rounds"]]
        losses += loss
        panels[1].plot(rounds, loss, **style)
        for ax, key in zip(panels[2:], optional):
            if any(key in r for r in result["rounds"]):
                ax.plot(rounds, [measured(r.get(key)) for r in result["rounds"]], **style)
        reported = [r for r in result["rounds"] if r.get("epsilon") is not None]  # run.epsilon_every's rows
        eps_style = {**style, "markevery": _markevery(len(reported), i, len(results))}
        for ax, observer in zip(eps_axes, observers):
            eps = [r["epsilon"].get(observer) for r in reported]
            if any(e is not None for e in eps):
                ax.plot([r["round"] for r in reported], [measured(e) for e in eps], **eps_style)
            elif observer in (result["final"].get("epsilon") or {}):
                never[observer].append(label)  # epsilon is infinite towards this observer (no privacy towards it)
    panels[0].set(title="Test accuracy", ylabel="test accuracy")
    panels[1].set(title="Train loss", ylabel="train objective" + (" (log scale)" if losses and min(losses) > 0 else ""))
    if losses and all(math.isfinite(v) and v > 0 for v in losses):
        panels[1].set_yscale("log")
    for ax, key in zip(panels[2:], optional):
        ax.set(title=OPTIONAL_PANELS[key][0], ylabel=OPTIONAL_PANELS[key][1], yscale="log")
    delta = delta_text(results)
    for ax, observer in zip(eps_axes, observers):
        ax.set(title=f"Epsilon: {observer_name(observer)}" + (f" ({delta})" if delta else ""), ylabel="epsilon")
        if never[observer]:
            ax.text(0.02, 0.98, "infinite epsilon (not plotted):\n" + "\n".join(never[observer]),
                    transform=ax.transAxes, va="top", fontsize=8)
    for ax in panels + eps_axes:
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=10)
        ax.grid(alpha=0.3)
    handles, labels = panels[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 4), fontsize=9, handlelength=3.5,
               frameon=False)
    if title:
        fig.suptitle(title)
    return fig
