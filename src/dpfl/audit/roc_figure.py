"""The audit's figure (roc.png): the observer's empirical ROC curve, its Clopper-Pearson band, and the boundary of the
claimed (eps, delta) region, for the many-run audit and for the one-run audit alike.

The claim's boundary: an (eps, delta)-DP mechanism forces every test of D against D' to satisfy TPR <= e^eps FPR +
delta and TPR <= 1 - e^-eps (1 - delta - FPR) (Kairouz, Oh, Viswanath 2015), so a true ROC never crosses the dashed
curve. An empirical ROC is an estimate: at its lowest thresholds a handful of runs decide a point, and the curve
can step over the boundary by chance alone (at FPR = 1/n one false positive more or less moves it by a factor of
two). The band says how far chance reaches. At each threshold, with k0 of the n0 negatives and k1 of the n1
positives above it, the FPR lies in the two-sided Clopper-Pearson interval of k0 in n0 and the TPR in that of k1 in
n1 (``bounds.clopper_pearson``, each at the audit's confidence); the band is the region between the optimistic
corners (FPR low, TPR high) and the pessimistic ones (FPR high, TPR low). A point of the curve above the boundary
whose pessimistic corner stays below it is chance, not a violation.

The band holds point by point, not for the whole curve at once; what the audit certifies is its lower bound
(``bounds.many_run_lower_bound``: planned tests under a union bound; one run: ``bounds.one_run_lower_bound``), which
the title prints. The one-run figure pools the m canaries: positives are the scores of the included canaries,
negatives those of the excluded ones (Steinke, Nasr, Jagielski 2023: each canary's inclusion is a neighbouring pair,
so each canary's test meets the boundary, and so do their average rates, both constraints being linear in the
rates); its band treats the canaries as independent trials, which their scores from one run only approximate.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dpfl.audit.bounds import clopper_pearson, roc_curve
from dpfl.audit.runs import AuditResult, OneRunResult

#: Points on the claimed boundary (log-spaced FPRs).
BOUNDARY_POINTS = 200


def roc_band(negatives, positives, confidence: float) -> dict[str, np.ndarray]:
    """The empirical ROC (``bounds.roc_curve``) and each point's two-sided (``confidence``) Clopper-Pearson intervals:
    {"fpr", "tpr", "fpr_low", "fpr_high", "tpr_low", "tpr_high"}, from (1, 1) down to (0, 0)."""
    negatives, positives = np.asarray(negatives, float), np.asarray(positives, float)
    fpr, tpr = roc_curve(negatives, positives)
    alpha = 1 - confidence
    fpr_low, fpr_high = clopper_pearson(np.rint(fpr * negatives.size), negatives.size, alpha)
    tpr_low, tpr_high = clopper_pearson(np.rint(tpr * positives.size), positives.size, alpha)
    return {"fpr": fpr, "tpr": tpr, "fpr_low": fpr_low, "fpr_high": fpr_high, "tpr_low": tpr_low,
            "tpr_high": tpr_high}


def claimed_boundary(fpr: np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """The largest TPR an (``epsilon``, ``delta``)-DP mechanism allows at each FPR (module docstring)."""
    region = np.minimum(np.exp(epsilon) * fpr + delta, 1 - np.exp(-epsilon) * np.maximum(1 - delta - fpr, 0))
    return np.minimum(region, 1.0)


def roc_figure(negatives, positives, *, claimed_epsilon: float, delta: float, confidence: float, label: str,
               title: str):
    """The figure (module docstring) on log axes, each rate floored at half the smallest nonzero rate of either
    world so that zeros stay on the axes; the title (two lines) and the legend (below the axes) inside the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    band = roc_band(negatives, positives, confidence)
    floor = 0.5 / max(np.size(negatives), np.size(positives))
    fig, ax = plt.subplots(figsize=(5.5, 6.2), layout="constrained")
    low = np.maximum(band["fpr_low"], floor), np.maximum(band["tpr_high"], floor)  # optimistic corners
    high = np.maximum(band["fpr_high"], floor), np.maximum(band["tpr_low"], floor)  # pessimistic corners
    ax.fill(np.concatenate([low[0], high[0][::-1]]), np.concatenate([low[1], high[1][::-1]]), color="C0", alpha=0.2,
            linewidth=0, label=f"{confidence:.0%} Clopper-Pearson band (each point)")
    ax.plot(np.maximum(band["fpr"], floor), np.maximum(band["tpr"], floor), color="C0", label=label)
    grid = np.logspace(np.log10(floor), 0, BOUNDARY_POINTS)
    if np.isfinite(claimed_epsilon):
        ax.plot(grid, claimed_boundary(grid, claimed_epsilon, delta), "k--",
                label=f"claimed eps = {claimed_epsilon:.3g} (delta = {delta:.2g})")
    ax.plot(grid, grid, ":", color="grey", label="chance")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate")
    ax.set_title(title, fontsize=10)
    fig.legend(loc="outside lower center", fontsize=8, ncol=2, frameon=False)  # below the axes, over no data
    return fig


def audit_figure(result: AuditResult | OneRunResult):
    """``roc_figure`` of a many-run audit (its trials' scores without and with the canary) or of a one-run audit (the
    excluded and the included canaries' scores), titled with the lower bound."""
    if isinstance(result, OneRunResult):
        negatives, positives = result.scores[~result.included], result.scores[result.included]
        label = f"white-box score ({result.canaries} dirac canaries, one run)"
        title = (f"{result.observer}: one-run lower bound {result.lower_bound:.3g} ({result.confidence:.0%})\n"
                 f"{result.correct} of {result.guesses} guesses right, {result.canaries} canaries")
        return roc_figure(negatives, positives, claimed_epsilon=result.claimed_epsilon, delta=result.delta,
                          confidence=result.confidence, label=label, title=title)
    gdp = f", GDP mu >= {result.gdp.mu:.3g}" if result.gdp is not None else ""
    title = (f"{result.observer}: lower bound {result.lower_bound:.3g} ({result.bound.confidence:.0%}{gdp})\n"
             f"{result.trials} trials, {result.rounds} round(s)")
    return roc_figure(result.negatives, result.positives, claimed_epsilon=result.claimed_epsilon, delta=result.delta,
                      confidence=result.bound.confidence, label=f"{result.score} score ({result.canary} canary)",
                      title=title)


def write_audit_figure(result: AuditResult | OneRunResult, path: str | Path) -> Path:
    """``audit_figure`` of ``result``, written to ``path`` (its folder made)."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = audit_figure(result)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


__all__ = ["roc_band", "claimed_boundary", "roc_figure", "audit_figure", "write_audit_figure", "BOUNDARY_POINTS"]
