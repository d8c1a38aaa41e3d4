"""The per-algorithm audit table: every registered algorithm name audited (many runs of round 0, Dirac canary) on the
small example config, towards every observer, printed as a markdown table (docs/audit.md holds one run of it).

    python benchmarks/audit_table.py                      # 2000 trials per world, delta 1e-2, K = 2
    python benchmarks/audit_table.py --trials 200 dp-     # names containing any of the given words

Setting: examples/audit_fedsgd.toml (10 clients, all in every round, 20 records each, full batches, z = 1, plain
boundary; a name with privacy defaults keeps its own boundary: the sdp-* names the real shuffler, the
projected-noisy-sgd names a trusted aggregator) with algorithm.name set to each name, and of its keys only those the name has: algorithm.local_steps =
--local-steps for every name but the FedSGD ones (FedSGD takes one step); a name that calibrates its noise to
privacy.epsilon (FedSGD-DPC) gets privacy.epsilon = --epsilon, one row per algorithm.mechanism. The audit runs
--rounds rounds (default 1; 'auto': each observer's planned rounds, dpfl.audit.plan), except for the
*-scaffold-warm names, whose first round(4 / client_rate) rounds are
warm-up rounds (dy = 0, only dc carries the canary): they run one round past the warm-up, and the claim is that of all
those rounds.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import tomllib

from dpfl.algorithms import registry
from dpfl.audit import plan, runs
from dpfl.experiments.config import key_schema, load_config
from dpfl.experiments.runner import build_simulation

AUTO = "auto"
EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "audit_fedsgd.toml"


def overrides(name: str, steps: int, delta: float, epsilon: float, mechanism: str | None = None) -> list[str]:
    """The example config as overrides, for ``name``: only the [algorithm] keys it has (the non-private names take no
    clip or noise multiplier; a name calibrated to privacy.epsilon takes ``epsilon`` and ``mechanism``)."""
    example = tomllib.loads(EXAMPLE.read_text())
    keys = key_schema(name, example["model"]["name"])["algorithm"]
    example["algorithm"].update(name=name, local_steps=steps)
    example["privacy"]["delta"] = delta
    if name.endswith("scaffold-warm"):  # it needs more rounds than its warm-up
        example["algorithm"]["rounds"] = round(4 / example["algorithm"]["client_rate"]) + 1
    if not registry.spec_of(name).private(name):
        for key in ("clip", "noise_multiplier"):
            example["algorithm"].pop(key, None)
    if registry.spec_of(name).privacy_defaults:  # the family's own deployment (sdp-*: the real shuffler)
        example["privacy"].pop("boundary", None)
    if registry.spec_of(name).private(name) and "noise_multiplier" not in keys:
        example["privacy"]["epsilon"] = epsilon
    if mechanism is not None:
        example["algorithm"]["mechanism"] = mechanism
    example["algorithm"] = {key: value for key, value in example["algorithm"].items() if key in keys}
    return [f"{section}.{key}={value!r}" for section, keys in example.items() for key, value in keys.items()]


def variants(name: str) -> list[tuple[str, str | None]]:
    """(label, mechanism) of every row of ``name``: one per choice of algorithm.mechanism where it has one."""
    choices = key_schema(name, "logreg")["algorithm"].get("mechanism", (None, None, None))[2]
    return [(f"{name} ({m})", m) for m in choices] if choices else [(name, None)]


def rows(names, trials: int, local_steps: int, delta: float, rounds: int | str, canary: str, epsilon: float):
    for name in names:
        steps = 1 if name.endswith("fedsgd") or name.startswith("fedsgd") else local_steps
        for label, mechanism in variants(name):
            config = load_config(None, overrides(name, steps, delta, epsilon, mechanism) + ["run.noise_seed=0"])
            sim = build_simulation(config)
            fixed = config["algorithm"]["rounds"] if name.endswith("scaffold-warm") else rounds
            planned = {o: plan.planned_rounds(sim, o, trials) if rounds == AUTO else fixed
                       for o in sim.ledger.observers}
            for audited in sorted(set(planned.values())):
                started = time.perf_counter()
                results = runs.audit_all(sim, [o for o, r in planned.items() if r == audited], trials,
                                         rounds=audited, canary_kind=canary, release=config["privacy"]["release"])
                seconds = time.perf_counter() - started
                for observer, result in results.items():
                    yield (label, steps, observer, result.claimed_epsilon, result.bound.epsilon, audited,
                           result.trials, seconds)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("words", nargs="*", help="audit only names containing any of these")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--local-steps", type=int, default=2)
    parser.add_argument("--delta", type=float, default=1e-2)
    parser.add_argument("--rounds", type=lambda v: v if v == AUTO else int(v), default=1,
                        help="rounds per trial (*-scaffold-warm: past the warm-up); 'auto': planned per observer "
                             "(dpfl.audit.plan)")
    parser.add_argument("--canary", default="dirac", choices=runs.CANARIES)
    parser.add_argument("--epsilon", type=float, default=2.0,
                        help="privacy.epsilon of the names calibrated to it (FedSGD-DPC)")
    args = parser.parse_args(argv)
    names = [n for n in registry.names() if not args.words or any(w in n for w in args.words)]
    print("| algorithm | K | observer | claimed eps | lower bound (95%) | bound / claim | method | trials | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, steps, observer, claim, bound, rounds, trials, seconds in rows(names, args.trials, args.local_steps,
                                                                             args.delta, args.rounds, args.canary,
                                                                             args.epsilon):
        claim_text = "inf" if math.isinf(claim) else f"{claim:.3f}"
        ratio = "-" if math.isinf(claim) or claim == 0 else f"{bound / claim:.2f}"
        flag = " **above**" if bound > claim else ""
        method = f"runs ({args.canary}, R = {rounds})"
        print(f"| {name} | {steps} | {observer} | {claim_text} | {bound:.3f}{flag} | {ratio} | {method} | {trials} | "
              f"{seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
