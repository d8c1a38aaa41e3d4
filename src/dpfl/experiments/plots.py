"""Figures regenerated from results (never edited): accuracy, loss and epsilon per round for one or more runs.

``plot_runs`` is what `dpfl plot` and `dpfl demo` draw (``draw_runs`` the figure). Each panel's legend sits below
it, outside the data. Runs differ by colour and marker (earlier runs drawn wider, underneath later ones); in the epsilon panel every observer in
the results (third party, server, other silo, ...) has its own line style, width and hollow marker, so curves that
coincide (e.g. the server's and the third party's epsilon of DP-SCAFFOLD) both stay visible."""

from __future__ import annotations

import math
from pathlib import Path

#: Observer -> (line style, line width, marker, marker size); wide solid lines under narrower dashed and dotted ones.
OBSERVER_STYLES = {
    "third_party": ("-", 3.2, "o", 9),
    "server": ("--", 2.0, "s", 6.5),
    "other_silo": (":", 1.6, "^", 4.5),
}
_MORE_STYLES = [("-.", 1.4, "D", 4.0), ((0, (1, 3)), 1.2, "v", 4.0), ((0, (5, 1)), 1.2, "x", 4.0)]
_RUN_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def observers_of(results: dict[str, dict]) -> list[str]:
    """Every observer that any run reports an epsilon for, in the order third party, server, other silo, others."""
    seen: list[str] = []
    for result in results.values():
        names = list(result.get("privacy", {}).get("observers", []))
        for entry in [*result["rounds"], result["final"]]:
            names += list(entry.get("epsilon", {}))
        seen += [n for n in names if n not in seen]
    known = [o for o in OBSERVER_STYLES if o in seen]
    return known + [o for o in seen if o not in OBSERVER_STYLES]


def _style(observer: str, others: list[str]):
    if observer in OBSERVER_STYLES:
        return OBSERVER_STYLES[observer]
    return _MORE_STYLES[others.index(observer) % len(_MORE_STYLES)]


def _measured(value: float | None) -> float:
    """A metric of results.json's rounds, NaN (not drawn) where it is null: not measured (a Flower run's server holds
    no training records, ``dpfl.flower.evaluation``)."""
    return math.nan if value is None else value


def _markevery(n: int, k: int, count: int):
    """About 10 markers per line, shifted per curve so the markers of coinciding curves do not sit on each other."""
    step = max(1, n // 10)
    return (min(k * max(1, step // max(count, 1)), max(n - 1, 0)), step)


def plot_runs(results: dict[str, dict], path: str | Path, title: str = "") -> Path:
    """One PNG with three panels (test accuracy, train loss, epsilon per observer) for runs {label: results}, and a
    fourth, the squared gradient mapping ||G_eta(w)||^2 (log scale), when a run reports it (a prox-step algorithm);
    the figure of ``draw_runs``."""
    import matplotlib.pyplot as plt

    fig = draw_runs(results, title)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")  # nothing cut off, whatever the legends hold
    plt.close(fig)
    return path


def draw_runs(results: dict[str, dict], title: str = ""):
    """The figure of ``plot_runs`` (each panel's legend below it, outside the data; a constrained layout keeps
    legends and titles inside the figure)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    observers = observers_of(results)
    others = [o for o in observers if o not in OBSERVER_STYLES]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    mapped = any("gradient_mapping" in r for result in results.values() for r in result["rounds"])
    fig, axes = plt.subplots(1, 4 if mapped else 3, figsize=(21 if mapped else 16, 6.0), layout="constrained")
    losses, never = [], []
    for i, (label, result) in enumerate(results.items()):
        color, marker = colors[i % len(colors)], _RUN_MARKERS[i % len(_RUN_MARKERS)]
        rounds = [r["round"] for r in result["rounds"]]
        wider = 1 + 1.0 * (len(results) - 1 - i) / max(len(results) - 1, 1)  # earlier runs wider, underneath
        common = {"color": color, "marker": marker, "markersize": 5, "markerfacecolor": "none",
                  "linewidth": 1.5 * wider, "markevery": _markevery(len(rounds), i, len(results)), "label": label}
        axes[0].plot(rounds, [_measured(r["test_accuracy"]) for r in result["rounds"]], **common)
        loss = [_measured(r["train_loss"]) for r in result["rounds"]]
        losses += loss
        axes[1].plot(rounds, loss, **common)
        if mapped and any("gradient_mapping" in r for r in result["rounds"]):
            axes[3].plot(rounds, [r.get("gradient_mapping", math.nan) for r in result["rounds"]], **common)
        for k, observer in enumerate(observers):
            eps = [r["epsilon"].get(observer) for r in result["rounds"]]
            name = f"{label}: {observer.replace('_', ' ')}"
            if not any(e is not None for e in eps):
                if observer in result["final"].get("epsilon", {}):
                    never.append(name)  # epsilon is infinite for this observer (no privacy towards it)
                continue
            style, width, obs_marker, size = _style(observer, others)
            wider = 1 + 0.7 * (len(results) - 1 - i) / max(len(results) - 1, 1)  # earlier runs wider, underneath
            axes[2].plot(rounds, [math.nan if e is None else e for e in eps], linestyle=style, linewidth=width * wider,
                         color=color, marker=obs_marker, markersize=size * wider, markerfacecolor="none",
                         markeredgewidth=1.3, label=name, alpha=0.9,
                         markevery=_markevery(len(rounds), k + i * len(observers), len(observers) * len(results)))
    axes[0].set_ylabel("test accuracy")
    axes[0].set_title("Test accuracy")
    axes[1].set_ylabel("train objective" + (" (log scale)" if losses and min(losses) > 0 else ""))
    axes[1].set_title("Train loss")
    if losses and all(math.isfinite(v) and v > 0 for v in losses):
        axes[1].set_yscale("log")
    deltas = sorted({r["final"].get("delta") for r in results.values() if r["final"].get("delta") is not None})
    delta = f"delta = {deltas[0]:.2g}" if len(deltas) == 1 else "delta: " + ", ".join(f"{d:.2g}" for d in deltas)
    if mapped:
        axes[3].set_ylabel("||G_eta(w)||^2 (log scale)")
        axes[3].set_title("Gradient mapping (train data)")
        axes[3].set_yscale("log")
    axes[2].set_ylabel("epsilon")
    axes[2].set_title(f"Epsilon per observer ({delta})" if deltas else "Epsilon per observer")
    if never:
        axes[2].text(0.02, 0.98, "infinite epsilon (not plotted):\n" + "\n".join(never), transform=axes[2].transAxes,
                     va="top", fontsize=8)
    for ax in axes:
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=10)
        ax.grid(alpha=0.3)
        entries = len(ax.get_legend_handles_labels()[0])
        if entries:  # below the panel, never over a curve
            ax.legend(fontsize=8, handlelength=3.5, loc="upper center", bbox_to_anchor=(0.5, -0.14),
                      ncol=2 if entries > 3 else 1, frameon=False)
    if title:
        fig.suptitle(title)
    return fig
