"""Figures regenerated from results (never edited): accuracy, loss and epsilon per round for one or more runs."""

from __future__ import annotations

from pathlib import Path


def plot_runs(results: dict[str, dict], path: str | Path, title: str = "") -> Path:
    """One PNG with three panels (test accuracy, train loss, epsilon per observer) for runs {label: results}."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for label, result in results.items():
        rounds = [r["round"] for r in result["rounds"]]
        line = axes[0].plot(rounds, [r["test_accuracy"] for r in result["rounds"]], label=label)[0]
        axes[1].plot(rounds, [r["train_loss"] for r in result["rounds"]], label=label, color=line.get_color())
        for observer, style in (("third_party", "-"), ("server", "--")):
            eps = [r["epsilon"].get(observer) for r in result["rounds"]]
            if any(e is not None for e in eps):
                axes[2].plot(rounds, eps, style, color=line.get_color(), label=f"{label}: {observer.replace('_', ' ')}")
    axes[0].set(xlabel="round", ylabel="test accuracy", title="Test accuracy")
    axes[1].set(xlabel="round", ylabel="train objective", title="Train loss", yscale="log")
    delta = next(iter(results.values()))["final"]["delta"]
    axes[2].set(xlabel="round", ylabel="epsilon", title=f"Epsilon per observer (delta = {delta:.2g})")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
