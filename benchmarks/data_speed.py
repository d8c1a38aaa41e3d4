"""Seconds to build data: Noble et al.'s synthetic (5,5) data at the paper's size (M = 100 users x R = 5000 records,
target < 2 s), and the refusal of a config whose data would not fit in memory (a million clients, target: at once,
< 0.5 s, from the config alone).

    python benchmarks/data_speed.py
"""

from __future__ import annotations

import time

from dpfl.data.synthetic import synthetic_dataset
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation


def refuse_a_million_clients() -> str:
    try:
        build_simulation(load_config(None, ["data.num_clients=1000000", "data.samples_per_client=60"]))
    except ConfigError as err:
        return err.field
    return "not refused"


CASES = {
    "synthetic (5,5), 100 x 5000": lambda: synthetic_dataset(100, 5000, 5.0, 5.0, seed=0).train.x.shape,
    "refuse 10^6 clients": refuse_a_million_clients,
}


def main() -> None:
    for name, case in CASES.items():
        best, value = float("inf"), None
        for _ in range(2):
            start = time.perf_counter()
            value = case()
            best = min(best, time.perf_counter() - start)
        print(f"{name:<30} {best:7.3f} s (best of 2)   -> {value}", flush=True)


if __name__ == "__main__":
    main()
