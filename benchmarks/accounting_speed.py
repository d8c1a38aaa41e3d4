"""Seconds taken by accounting: calibrating the noise of 20,000 Poisson-sampled Gaussian steps (targets: < 1 s with
RDP, < 10 s with PLD, on 2 cores), one epsilon of the same, last-iterate accounting (Asoodeh et al.), the RDP
curves of Wang et al.'s Thm 27 and of Noble et al.'s round, and a run's ledger over 43 Poisson rounds (the timings
that used to be test assertions live here).

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


def thm27_all_orders():  # Wang et al.'s Thm 27 at every integer order up to 256, vectorised (target < 2 s)
    from dpfl.accounting.rdp import wang_gaussian_subsampled_rdp

    return float(wang_gaussian_subsampled_rdp(1 / 142, 4.27, 256)[-1])


def nested_dp_scaffold_curve():  # Noble et al.'s round: clients sampled around 50 record-sampled steps (target < 1 s)
    import math

    import numpy as np
    from dp_accounting import dp_event

    from dpfl.accounting.rdp import rdp_curve

    def wor(n, b, event):
        return dp_event.SampledWithoutReplacementDpEvent(n, b, event)

    inner = dp_event.SelfComposedDpEvent(wor(4000, 800, dp_event.GaussianDpEvent(59.5 * math.sqrt(20))), 50)
    return float(np.max(rdp_curve(wor(100, 20, inner), subsampling_bound="paper")))


def last_iterate_million_steps():  # a schedule and a random stop over 10^6 steps (target < 2 s)
    import numpy as np

    from dpfl.accounting import last_iterate as li

    steps = 10**6
    li.epsilon(1e-9, np.full(steps, 0.5), 4.0, steps, 1, 1.0, 1.0, random_stop=True)
    return li.epsilon(1e-9, np.repeat(0.5 * 0.9 ** np.arange(100), steps // 100), 4.0, steps, 1, 1.0, 1.0)


def ledger_poisson_rounds():  # budgeted_digits.toml's ledger: 43 rounds of 3 observers' Poisson events, PLD
    from dp_accounting import dp_event

    from dpfl.accounting.ledger import PrivacyLedger

    def round_event(z):
        return dp_event.SelfComposedDpEvent(dp_event.PoissonSampledDpEvent(0.2, dp_event.GaussianDpEvent(z)), 5)

    events = {"third_party": round_event(3.317142804471289), "server": round_event(1.5),
              "other_silo": round_event(2.9690195837922215)}
    ledger = PrivacyLedger(list(events), 1e-5, neighboring="zero_out")
    return [ledger.record(t, events) for t in range(43)][-1]["third_party"]


CASES = {
    **{f"calibrate rdp eps={t}": calibrate("rdp", t) for t in (1, 3, 8)},
    **{f"calibrate pld eps={t}": calibrate("pld", t) for t in (1, 3, 8)},
    "epsilon rdp sigma=1.1": epsilon("rdp", 1.1),
    "epsilon pld sigma=1.1": epsilon("pld", 1.1),
    "last-iterate epsilon": last_iterate,
    "last-iterate 10^6 steps": last_iterate_million_steps,
    "thm27 orders 2..256": thm27_all_orders,
    "dp-scaffold round curve": nested_dp_scaffold_curve,
    "ledger 43 poisson rounds": ledger_poisson_rounds,
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
