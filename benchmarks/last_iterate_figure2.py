"""Figure 2 of Asoodeh, Chen, Calmon, Ozgur (2021), regenerated from dpfl's last-iterate accountant: delta against
epsilon for the sampling rates q = m/n in {0.1, 0.2, 0.3}, n = 100 users, eta = 0.5, L = 1, rho = 1, sigma = 1.5, a
constant schedule over T = n/m steps (T = 10/3 for q = 0.3, as the paper evaluates it: no run has a third of a step),
beside composition over every iterate (dashed: the single-step theta_eps(2L / (sqrt(m) sigma))).

    python benchmarks/last_iterate_figure2.py [--out docs/figures/last_iterate_figure2.png]

The table in tests/accounting/test_last_iterate.py (FIG2_TABLE) pins delta at eps = 0.5, 1, 2 and eps at 1e-5.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from dpfl.accounting import last_iterate as li  # noqa: E402

N, LR, L, RHO, SIGMA = 100, 0.5, 1.0, 1.0, 1.5
RATES = (0.1, 0.2, 0.3)
OUT = Path(__file__).resolve().parents[1] / "docs" / "figures" / "last_iterate_figure2.png"


def curves(epsilons: np.ndarray) -> dict[float, tuple[np.ndarray, np.ndarray]]:
    """q -> (log10 delta of the last iterate, log10 delta of composition) at ``epsilons``."""
    found = {}
    for q in RATES:
        m = round(q * N)
        hidden = [li.log_delta_constant(e, LR, SIGMA, N, m, L, RHO, steps=N / m) for e in epsilons]
        composed = [li.log_theta(e, 2 * L / (math.sqrt(m) * SIGMA)) for e in epsilons]
        found[q] = np.array(hidden) / math.log(10), np.array(composed) / math.log(10)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the PNG to write")
    args = parser.parse_args()
    epsilons = np.linspace(0.05, 3.0, 60)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for (q, (hidden, composed)), color in zip(curves(epsilons).items(), ("C0", "C1", "C2")):
        ax.plot(epsilons, hidden, color=color, label=f"last iterate, q = {q}")
        ax.plot(epsilons, composed, color=color, linestyle="--", label=f"every iterate, q = {q}")
    ax.set_xlabel("epsilon")
    ax.set_ylabel("log10 delta")
    ax.set_title("Asoodeh et al. (2021), Fig. 2 (n = 100, eta = 0.5, sigma = 1.5)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
