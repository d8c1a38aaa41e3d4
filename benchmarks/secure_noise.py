"""Seconds taken to draw one round's Gaussian noise for 10 clients, d = 10^4 and 10^5 coordinates each: the default
streams (``dpfl.engine.randomness.ClientStreams.normal``: SeedSequence, torch's Mersenne twister, float32 N(0, 1))
against the secure ones (a ChaCha20 stream per client, ``dpfl.engine.secure_streams``, and the exact discrete
Gaussian of Canonne, Kamath, Steinke 2020, ``dpfl.exact_noise``, in grid units), and their ratio.

    python benchmarks/secure_noise.py            # sigma = 2^10 grid units (z = 1 on a grid of Delta / 2^10)
    python benchmarks/secure_noise.py 3 50       # other sigmas (grid units)

With ``--round``, one round of a whole run instead (``Simulation.step``: clipping, gradients, noise, the ledger),
run.secure_noise = false against true at the same noise key, for the tiny dp-fedavg run of
tests/privacy/test_secure_noise_run.py (d = 410, 3 clients x 2 local steps) and for dp-fedavg on digits with a
20-client cohort and K = 10 local steps (d = 650):

    python benchmarks/secure_noise.py --round

Each timing is the best of 3 in CPU seconds of this process (time.process_time: steadier than wall time on a
shared machine); torch runs on one thread so that both sides use one core.
"""

from __future__ import annotations

import sys
import time
from fractions import Fraction

import torch

from dpfl.engine.randomness import ClientStreams
from dpfl.engine.secure_streams import SecureStream
from dpfl.exact_noise import discrete_gaussian
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

CLIENTS, KEY, ROUND = 10, 2**255 + 12345, 3
#: The runs ``--round`` times: (name, overrides).
RUNS = (
    ("tiny dp-fedavg", ["algorithm.name='dp-fedavg'", "data.num_clients=6", "data.samples_per_client=40",
                        "algorithm.client_rate=0.5", "algorithm.local_steps=2", "algorithm.sample_rate=0.25",
                        "algorithm.noise_multiplier=1.0", "algorithm.weight_decay=0.0", "algorithm.lr=0.5"]),
    ("digits dp-fedavg", ["algorithm.name='dp-fedavg'", "data.name='digits'", "data.num_clients=40",
                          "algorithm.client_rate=0.5", "algorithm.local_steps=10", "algorithm.noise_multiplier=1.0"]),
)


def best_of_three(draw) -> float:
    times = []
    for _ in range(3):
        start = time.process_time()
        draw()
        times.append(time.process_time() - start)
    return min(times)


def default_streams(d: int) -> None:
    ClientStreams(KEY, ROUND, range(CLIENTS), "noise").normal((d,))


def secure_streams(d: int, sigma2: Fraction) -> None:
    for client in range(CLIENTS):
        discrete_gaussian(SecureStream(KEY, ROUND, client, "noise"), sigma2, d)


def round_seconds(overrides: list[str], secure: bool) -> float:
    """The best of 3 of one round (the next round of a fresh simulation each time: the same cohort and noise key)."""
    config = load_config(None, [*overrides, "algorithm.rounds=3", "run.threads=1", "run.noise_seed=3",
                                f"run.secure_noise={'true' if secure else 'false'}"])
    sims = [build_simulation(config, noise_key=3) for _ in range(3)]
    return best_of_three(lambda: sims.pop().step())


def rounds() -> None:
    torch.set_num_threads(1)
    print(f"{'run':>18} {'d':>6} {'default s':>10} {'secure s':>10} {'ratio':>8}")
    for name, overrides in RUNS:
        d = build_simulation(load_config(None, overrides), noise_key=3).model.numel()
        default, secure = round_seconds(overrides, False), round_seconds(overrides, True)
        print(f"{name:>18} {d:>6} {default:>10.4f} {secure:>10.4f} {secure / default:>8.2f}")


def main(sigmas: list[Fraction]) -> None:
    torch.set_num_threads(1)
    print(f"{'sigma':>8} {'d':>8} {'default s':>10} {'secure s':>10} {'ratio':>8}")
    for sigma in sigmas:
        for d in (10**4, 10**5):
            default = best_of_three(lambda: default_streams(d))
            secure = best_of_three(lambda: secure_streams(d, sigma * sigma))
            print(f"{str(sigma):>8} {d:>8} {default:>10.4f} {secure:>10.4f} {secure / default:>8.0f}")


if __name__ == "__main__":
    if sys.argv[1:] == ["--round"]:
        rounds()
    else:
        main([Fraction(a) for a in sys.argv[1:]] or [Fraction(2**10)])
