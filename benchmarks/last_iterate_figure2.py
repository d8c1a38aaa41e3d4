"""Figure 2 of Asoodeh, Chen, Calmon, Ozgur (2021), regenerated from dpfl's last-iterate accountant: delta against
epsilon for the sampling rates q = m/n in {0.1, 0.2, 0.3}, n = 100 users, eta = 0.5, L = 1, rho = 1, sigma = 1.5, a
constant schedule over T = n/m steps (T = 10/3 for q = 0.3, as the paper evaluates it: no run has a third of a step),
beside composition over every iterate (dashed: the single-step theta_eps(2L / (sqrt(m) sigma))).

    python benchmarks/last_iterate_figure2.py [--out docs/figures/last_iterate_figure2.png]

The curves are ``dpfl.papers.asoodeh2021.experiment``'s (also `dpfl reproduce asoodeh2021-fig2`). The table in
tests/accounting/test_last_iterate.py (FIG2_TABLE) pins delta at eps = 0.5, 1, 2 and eps at 1e-5.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from dpfl.papers.asoodeh2021.experiment import plot_figure2

OUT = Path(__file__).resolve().parents[1] / "docs" / "figures" / "last_iterate_figure2.png"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="the PNG to write")
    args = parser.parse_args()
    plot_figure2(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
