"""The audit's figure (dpfl.audit.roc_figure): the empirical ROC, its pointwise Clopper-Pearson band and the claimed
boundary, read back from the figure's artists, for the many-run and the one-run audit."""

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from scipy import stats  # noqa: E402

from dpfl.audit import runs  # noqa: E402
from dpfl.audit.bounds import LowerBound, roc_curve  # noqa: E402
from dpfl.audit.roc_figure import audit_figure, claimed_boundary, roc_band  # noqa: E402


def _exact(k: int, n: int, confidence: float) -> tuple[float, float]:
    ci = stats.binomtest(k, n).proportion_ci(confidence, method="exact")
    return ci.low, ci.high


def test_the_band_is_each_points_clopper_pearson_interval():
    """Negatives 0..3, positives 2.5, 3.5, 4, 5: at the threshold 2 one of the 4 negatives (3) and all 4 positives
    lie above it; at 3, none of the negatives and 3 positives."""
    band = roc_band([0, 1, 2, 3], [2.5, 3.5, 4, 5], confidence=0.9)
    points = list(zip(band["fpr"], band["tpr"]))
    at_two, at_three = points.index((0.25, 1.0)), points.index((0.0, 0.75))
    assert (band["fpr_low"][at_two], band["fpr_high"][at_two]) == pytest.approx(_exact(1, 4, 0.9), abs=1e-12)
    assert (band["tpr_low"][at_two], band["tpr_high"][at_two]) == pytest.approx(_exact(4, 4, 0.9), abs=1e-12)
    assert band["tpr_high"][at_two] == 1.0 and band["fpr_low"][at_three] == 0.0
    assert (band["tpr_low"][at_three], band["tpr_high"][at_three]) == pytest.approx(_exact(3, 4, 0.9), abs=1e-12)


def test_the_claimed_boundary_is_the_kairouz_region():
    """eps = ln 2, delta = 0.1: at FPR 0.2, min(2 (0.2) + 0.1, 1 - (1 - 0.1 - 0.2) / 2) = 0.5; at FPR 0.5,
    min(1.1, 1 - 0.4 / 2) = 0.8; at FPR 1, 1."""
    assert claimed_boundary(np.array([0.2, 0.5, 1.0]), math.log(2), 0.1) == pytest.approx([0.5, 0.8, 1.0])


def _many_run_result(negatives, positives, claim=2.318, delta=1e-2):
    bound = LowerBound(1.654, 0.95, "A", 10, 1.0, 3, 500, len(negatives), len(positives))
    return runs.AuditResult("server", claim, delta, bound, len(negatives), "runs", 1.0, np.asarray(negatives),
                            np.asarray(positives), rounds=3)


def _artists(fig):
    (ax,) = fig.axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    (band,) = ax.patches
    return ax, lines, band


def test_the_figure_draws_the_curve_its_band_and_the_claim_from_the_scores():
    rng = np.random.default_rng(0)
    negatives, positives = rng.normal(0, 1, 400), rng.normal(1, 1, 400)
    fig = audit_figure(_many_run_result(negatives, positives))
    fig.canvas.draw()
    ax, lines, band = _artists(fig)
    floor = 0.5 / 400
    fpr, tpr = roc_curve(negatives, positives)
    curve = lines["white-box score (dirac canary)"].get_xydata()
    assert np.array_equal(curve, np.column_stack([np.maximum(fpr, floor), np.maximum(tpr, floor)]))
    claim = lines["claimed eps = 2.32 (delta = 0.01)"].get_xydata()
    assert claim[0, 0] == pytest.approx(floor) and claim[-1, 0] == pytest.approx(1.0)
    assert claim[:, 1] == pytest.approx(claimed_boundary(claim[:, 0], 2.318, 1e-2))
    expected = roc_band(negatives, positives, 0.95)
    corners = band.get_xy()  # the optimistic corners, then the pessimistic ones backwards
    n = fpr.size
    assert np.allclose(corners[:n], np.column_stack([np.maximum(expected["fpr_low"], floor),
                                                     np.maximum(expected["tpr_high"], floor)]))
    assert np.allclose(corners[n:2 * n], np.column_stack([np.maximum(expected["fpr_high"], floor),
                                                          np.maximum(expected["tpr_low"], floor)])[::-1])
    assert band.get_label() == "95% Clopper-Pearson band (each point)"
    assert ax.get_title() == "server: lower bound 1.65 (95%)\n400 trials, 3 round(s)"
    (legend,) = fig.legends
    for box in (ax.title.get_window_extent(), legend.get_window_extent()):
        assert box.x0 >= 0 and box.y0 >= 0 and box.x1 <= fig.bbox.x1 and box.y1 <= fig.bbox.y1
    assert not legend.get_window_extent().overlaps(ax.get_window_extent())  # below the axes, over no data
    plt.close(fig)


def test_the_one_run_figure_pools_the_included_and_the_excluded_canaries(make_sim):
    """One run of 200 canaries on 300 records: positives are the included canaries' scores, negatives the excluded
    ones'; the title counts the guesses."""
    sim = make_sim(1.0, 1e-5, 1, "data.samples_per_client=300")
    result = runs.one_run_audit(sim, "server", 200)
    assert result.included.shape == result.scores.shape == (200,) and 0 < result.included.sum() < 200
    fig = audit_figure(result)
    ax, lines, _ = _artists(fig)
    fpr, tpr = roc_curve(result.scores[~result.included], result.scores[result.included])
    floor = 0.5 / max(int((~result.included).sum()), int(result.included.sum()))
    curve = lines["white-box score (200 dirac canaries, one run)"].get_xydata()
    assert np.array_equal(curve, np.column_stack([np.maximum(fpr, floor), np.maximum(tpr, floor)]))
    assert ax.get_title() == (f"server: one-run lower bound {result.lower_bound:.3g} (95%)\n"
                              f"{result.correct} of 20 guesses right, 200 canaries")
    assert f"claimed eps = {result.claimed_epsilon:.3g} (delta = 1e-05)" in lines
    plt.close(fig)


def test_a_world_without_scores_gets_the_whole_interval():
    """A one-run audit of few canaries can include all of them (2 canaries: probability 1/2): no negatives, so every
    FPR interval is [0, 1], and the figure still draws."""
    band = roc_band([], [0.5, 1.5], confidence=0.95)
    assert np.array_equal(band["fpr_low"], np.zeros(3)) and np.array_equal(band["fpr_high"], np.ones(3))
    fig = audit_figure(_many_run_result(np.array([]), np.array([0.5, 1.5])))
    plt.close(fig)
