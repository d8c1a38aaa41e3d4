"""Seconds per secure aggregation round (Bonawitz et al. 2017, dpfl.protocols.secagg), all parties in one process.

    python benchmarks/secagg_round.py                 # 50 clients x 10,000 parameters, 32 bits (target: < 5 s)
    python benchmarks/secagg_round.py 100 100000 3    # clients, parameters, repeats

Cases: no dropouts, and 10 of the clients dropping out after ShareKeys (the server then reconstructs their mask keys
and removes their pair masks with every survivor: the costliest recovery). The threshold is a bare majority.
Keys come from os.urandom, as in a deployment. Prints the median of the repeats.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np
import torch

from dpfl.protocols.secagg import simulate_round


def seconds(inputs: torch.Tensor, dropouts: dict, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        simulate_round(inputs, inputs.shape[0] // 2 + 1, dropouts, bits=32)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str]) -> None:
    clients, parameters, repeats = (int(a) for a in (argv + ["50", "10000", "3"][len(argv):]))
    values = np.random.default_rng(0).integers(0, 2**32, (clients, parameters), dtype=np.int64)
    inputs = torch.from_numpy(values)
    dropped = {c: "masked_input" for c in range(0, clients, 5)}
    cases = {"no dropouts": {}, f"{len(dropped)} drop after ShareKeys": dropped}
    print(f"{clients} clients x {parameters} parameters, 32 bits, threshold {clients // 2 + 1}, torch threads "
          f"{torch.get_num_threads()}")
    for name, dropouts in cases.items():
        print(f"{name:<28} {seconds(inputs, dropouts, repeats):7.3f} s per round")


if __name__ == "__main__":
    main(sys.argv[1:])
