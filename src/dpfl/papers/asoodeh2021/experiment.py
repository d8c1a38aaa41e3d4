"""Asoodeh, Chen, Calmon, Özgür (2021), "Differentially private federated learning: an information-theoretic
perspective": Figure 2 (delta against epsilon of the last iterate, from dpfl's last-iterate accountant) and the
utility of hiding the iterates (projected noisy SGD at equal epsilon, noise calibrated by the last-iterate
accountant or by composition). ``benchmarks/last_iterate_figure2.py`` and ``benchmarks/last_iterate_utility.py``
print them; ``dpfl reproduce asoodeh2021-fig2`` / ``asoodeh2021-utility`` compare them with the paper.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from dpfl.accounting import last_iterate as li

#: Figure 2: n = 100 users, eta = 0.5, L = 1, rho = 1, sigma = 1.5, q = m/n in {0.1, 0.2, 0.3}, T = n/m steps
#: (T = 10/3 for q = 0.3, as the paper evaluates it: no run has a third of a step).
N, LR, L, RHO, SIGMA = 100, 0.5, 1.0, 1.0, 1.5
RATES = (0.1, 0.2, 0.3)


def curves(epsilons: np.ndarray) -> dict[float, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """q -> log10 delta at ``epsilons`` of (the last iterate by Theorem 2 over T = n/m steps, as Figure 2 draws it;
    composition over every iterate; dpfl's sound claim for the last iterate, ``sound_log_delta``).

    Theorem 2 and composition coincide here (to 2e-4 in log10 delta): Theorem 2's delta = (m/n) b (1 - a^T) / (1 - a)
    differs from composition's (m/n) T b by the contractions a = theta_eps(2 rho sqrt(m) / (eta sigma)), within
    1e-4 of 1 when the step noise eta sigma / sqrt(m) <= 0.24 is small against the diameter 2 rho = 2."""
    found = {}
    for q in RATES:
        m = round(q * N)
        hidden = [li.log_delta_constant(e, LR, SIGMA, N, m, L, RHO, steps=N / m) for e in epsilons]
        composed = [li.log_theta(e, 2 * L / (math.sqrt(m) * SIGMA)) for e in epsilons]
        sound = [sound_log_delta(e, m) for e in epsilons]
        found[q] = tuple(np.array(v) / math.log(10) for v in (hidden, composed, sound))
    return found


def sound_log_delta(eps: float, m: int) -> float:
    """log delta(eps) of the last iterate as a run claims it (``privacy.analysis = "sound"``): per secret batch the
    smaller of Theorem 2's term and amplification by iteration's (Feldman et al. 2018), over the T = n // m steps a
    run has (3 for q = 0.3, where Figure 2 evaluates T = 10/3)."""
    return li.log_delta(eps, LR, SIGMA, N, m, L, RHO, analysis="sound")


def figure2_values(q: float, epsilons=(0.5, 1.0, 2.0), delta: float = 1e-5) -> dict:
    """delta at ``epsilons`` and eps at ``delta`` of Theorem 2's closed form for one q of Figure 2 ("delta",
    "epsilon"), and of dpfl's sound claim ("sound_delta", "sound_epsilon"; ``sound_log_delta``)."""
    m = round(q * N)

    def log_delta(eps: float) -> float:
        return li.log_delta_constant(eps, LR, SIGMA, N, m, L, RHO, steps=N / m)

    return {"delta": [math.exp(log_delta(e)) for e in epsilons], "epsilon": li.solve_epsilon(log_delta, delta),
            "sound_delta": [math.exp(sound_log_delta(e, m)) for e in epsilons],
            "sound_epsilon": li.solve_epsilon(lambda e: sound_log_delta(e, m), delta)}


def plot_figure2(path: Path, epsilons: np.ndarray | None = None) -> None:
    """delta (log10) against epsilon per q: Theorem 2 solid (the paper's curves), composition over every iterate as
    markers (they sit on Theorem 2's curves: ``curves``), dpfl's sound claim dotted."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epsilons = np.linspace(0.05, 3.0, 60) if epsilons is None else epsilons
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for (q, (hidden, composed, sound)), color in zip(curves(epsilons).items(), ("C0", "C1", "C2")):
        ax.plot(epsilons, hidden, color=color, label=f"last iterate, Theorem 2, q = {q}")
        ax.plot(epsilons[::6], composed[::6], color=color, linestyle="none", marker="x", ms=5,
                label=f"every iterate (on Theorem 2's curve), q = {q}")
        ax.plot(epsilons, sound, color=color, linestyle=":", label=f"last iterate, dpfl's sound claim, q = {q}")
    ax.set_xlabel("epsilon")
    ax.set_ylabel("log10 delta")
    ax.set_title(f"Asoodeh et al. (2021), Fig. 2 (n = {N}, eta = {LR}, sigma = {SIGMA}, rho = {RHO:g})", fontsize=9)
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -- utility at equal epsilon ----------------------------------------------------------------------------------------
#: Every client (user) holds about 5 records (4 train, 1 test); features standardised (pooled: non-private
#: preprocessing) and scaled to norm <= 1 on the client (algorithm.feature_clip = 1), so convexity is verified and
#: Theorem 2's diameter is 2 rho; clip L = 1 (2 for the 10 classes of the synthetic data, where the clip must never
#: bind), lambda = 0.01, eta = 1 <= 2/beta, delta = 1e-5.
UTILITY_DATA = {
    "breast_cancer": ("data.name='breast_cancer'", "data.num_clients=110", "data.standardize='pooled'",
                      "algorithm.clip=1.0"),
    "synthetic": ("data.name='synthetic'", "data.num_clients=200", "data.samples_per_client=5",
                  "data.standardize='pooled'", "algorithm.clip=2.0"),
}
UTILITY_COMMON = ("algorithm.name='projected-noisy-sgd'", "algorithm.lr=1.0", "algorithm.weight_decay=0.01",
                  "algorithm.convex=true", "algorithm.feature_clip=1.0", "privacy.delta=1e-5", "run.threads=1")


def users(data: str) -> int:
    return int(next(o for o in UTILITY_DATA[data] if o.startswith("data.num_clients=")).split("=")[1])


def utility_run(data: str, batch: int, epsilon: float | None, radius: float, release: str,
                seed: int) -> tuple[float, float]:
    """(test accuracy, noise multiplier) of one pass of projected noisy SGD with ``batch`` users per step; epsilon
    None: a reference run with almost no noise. Research mode (run.noise_seed = seed)."""
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import run_experiment

    rounds = users(data) // batch
    noise = "algorithm.noise_multiplier=1e-6" if epsilon is None else f"privacy.epsilon={epsilon}"
    # the paper's accountant (Theorem 2) calibrates the last iterate; composition stays dpfl's sound one
    analysis = "paper" if release == "final" else "sound"
    config = load_config(None, [*UTILITY_COMMON, *UTILITY_DATA[data], f"algorithm.clients_per_round={batch}",
                                f"algorithm.rounds={rounds}", f"algorithm.radius={radius}",
                                f"privacy.analysis='{analysis}'", noise, f"privacy.release='{release}'", f"run.seed={seed}",
                                f"run.noise_seed={seed}",  # research mode: reproducible repeats
                                f"data.seed={seed}", f"run.eval_every={rounds}", f"run.checkpoint_every={rounds}"])
    results = run_experiment(config)
    return results["final"]["test_accuracy"], results["privacy"]["assumptions"]["noise_multiplier"]
