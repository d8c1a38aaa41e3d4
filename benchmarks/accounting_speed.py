"""Seconds taken by accounting: calibrating the noise of 20,000 Poisson-sampled Gaussian steps (targets: < 1 s with
RDP, < 10 s with PLD, on 2 cores), one epsilon of the same, and last-iterate accounting (Asoodeh et al.).

    python benchmarks/accounting_speed.py            # all cases
    python benchmarks/accounting_speed.py rdp pld    # cases whose name contains any of these words

Setting: N = 60,000, B = 256 (q = 0.00427), delta = 1e-5, targets epsilon 1, 3 and 8 (MNIST DP-SGD scale).
Cases run in order in one process; rdp_curve's cache only helps a case on events an earlier case already met.
"""

from __future__ import annotations

import logging
import sys
import time

from dpfl.accounting.accountant import account, gaussian_event
from dpfl.accounting.calibrate import calibrate_noise

STEPS, Q, DELTA = 20_000, 256 / 60_000, 1e-5


def make_event(noise: float):
    return gaussian_event(noise, STEPS, "poisson", Q)


def calibrate(accountant: str, target: float):
    return lambda: calibrate_noise(make_event, target, DELTA, accountant, "modern")


def epsilon(accountant: str, noise: float):
    return lambda: account(make_event(noise), DELTA, accountant, "modern").epsilon


def last_iterate():
    from dpfl.accounting import last_iterate as li

    # Constant schedule over T = n / batch = 20,000 disjoint batches (Theorem 2 of Asoodeh et al.).
    return li.epsilon(DELTA, 0.05, 1.0, 60_000, 3, 1.0, 10.0)


CASES = {
    **{f"calibrate rdp eps={t}": calibrate("rdp", t) for t in (1, 3, 8)},
    **{f"calibrate pld eps={t}": calibrate("pld", t) for t in (1, 3, 8)},
    "epsilon rdp sigma=1.1": epsilon("rdp", 1.1),
    "epsilon pld sigma=1.1": epsilon("pld", 1.1),
    "last-iterate epsilon": last_iterate,
}


def main(words: list[str]) -> None:
    logging.getLogger("absl").setLevel(logging.ERROR)  # dp_accounting's series warnings at small noise
    for name, case in CASES.items():
        if words and not any(word in name for word in words):
            continue
        start = time.perf_counter()
        value = case()
        print(f"{name:<26} {time.perf_counter() - start:7.3f} s   -> {value:.6g}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
