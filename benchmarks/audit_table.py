"""The per-algorithm audit table: every registered algorithm name audited (many runs of round 0, Dirac canary) on the
small example config, towards every observer, printed as a markdown table (docs/audit.md holds one run of it).

    python benchmarks/audit_table.py                      # 2000 trials per world, delta 1e-2, K = 2
    python benchmarks/audit_table.py --trials 200 dp-     # names containing any of the given words

Setting: examples/audit_fedsgd.toml (10 clients, all in every round, 20 records each, full batches, z = 1, plain
boundary) with algorithm.name set to each name and algorithm.local_steps = --local-steps for every name but the
FedSGD ones (FedSGD takes one step). The audit runs --rounds rounds (default 1), except for the *-scaffold-warm names,
whose first round(4 / client_rate) rounds are warm-up rounds (dy = 0, only dc carries the canary): they run one round
past the warm-up, and the claim is that of all those rounds.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import tomllib

from dpfl.algorithms import registry
from dpfl.audit import runs
from dpfl.audit.distinguisher import OBSERVERS
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "audit_fedsgd.toml"


def overrides(name: str, steps: int, delta: float) -> list[str]:
    """The example config as overrides, for ``name`` (the non-private names take no clip or noise multiplier)."""
    example = tomllib.loads(EXAMPLE.read_text())
    example["algorithm"].update(name=name, local_steps=steps)
    example["privacy"]["delta"] = delta
    if name.endswith("scaffold-warm"):  # it needs more rounds than its warm-up
        example["algorithm"]["rounds"] = round(4 / example["algorithm"]["client_rate"]) + 1
    if not registry.spec_of(name).private(name):
        for key in ("clip", "noise_multiplier"):
            example["algorithm"].pop(key, None)
    return [f"{section}.{key}={value!r}" for section, keys in example.items() for key, value in keys.items()]


def rows(names, trials: int, local_steps: int, delta: float, rounds: int, canary: str):
    for name in names:
        steps = 1 if name.endswith("fedsgd") else local_steps
        config = load_config(None, overrides(name, steps, delta))
        sim = build_simulation(config)
        audited = config["algorithm"]["rounds"] if name.endswith("scaffold-warm") else rounds
        started = time.perf_counter()
        results = runs.audit_all(sim, OBSERVERS, trials, rounds=audited, canary_kind=canary,
                                 release=config["privacy"]["release"])
        seconds = time.perf_counter() - started
        for observer, result in results.items():
            yield name, steps, observer, result.claimed_epsilon, result.bound.epsilon, audited, result.trials, seconds


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("words", nargs="*", help="audit only names containing any of these")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--local-steps", type=int, default=2)
    parser.add_argument("--delta", type=float, default=1e-2)
    parser.add_argument("--rounds", type=int, default=1, help="rounds per trial (*-scaffold-warm: past the warm-up)")
    parser.add_argument("--canary", default="dirac", choices=runs.CANARIES)
    args = parser.parse_args(argv)
    names = [n for n in registry.names() if not args.words or any(w in n for w in args.words)]
    print("| algorithm | K | observer | claimed eps | lower bound (95%) | method | trials | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for name, steps, observer, claim, bound, rounds, trials, seconds in rows(names, args.trials, args.local_steps,
                                                                             args.delta, args.rounds, args.canary):
        claim_text = "inf" if math.isinf(claim) else f"{claim:.3f}"
        flag = " **above**" if bound > claim else ""
        method = f"runs ({args.canary}, R = {rounds})"
        print(f"| {name} | {steps} | {observer} | {claim_text} | {bound:.3f}{flag} | {method} | {trials} | {seconds:.1f} |",
              flush=True)


if __name__ == "__main__":
    main()
