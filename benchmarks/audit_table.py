"""The per-algorithm audit table: every registered algorithm name audited (many runs, Dirac canary) on the small
example config, towards every observer, with one round and with planned rounds, printed as a markdown table
(docs/audit.md holds one run of it).

    python benchmarks/audit_table.py                      # 2000 trials per world, delta 1e-2, K = 2, R = 1 and auto
    python benchmarks/audit_table.py --trials 200 dp-     # names containing any of the given words
    python benchmarks/audit_table.py --rounds 3 --canary input dp-fedsgd

Setting: examples/audit_fedsgd.toml (10 clients, all in every round, 20 records each, full batches, z = 1, plain
boundary; a name with privacy defaults keeps its own boundary: the sdp-* names the real shuffler, the
projected-noisy-sgd names a trusted aggregator, whose server is no observer) with algorithm.name set to each name,
and of its keys only those the name has: algorithm.local_steps = --local-steps for every name but the FedSGD ones
(FedSGD takes one step); a name that calibrates its noise to privacy.epsilon (FedSGD-DPC, the ISRL-DP and shuffle-DP
families) gets privacy.epsilon = --epsilon, one row per algorithm.mechanism. Each group of columns is one --rounds
setting: a round count, or 'auto' (each observer's planned rounds, dpfl.audit.plan); the *-scaffold-warm names,
whose first round(4 / client_rate) rounds are warm-up rounds (dy = 0, only dc carries the canary), run at least one
round past the warm-up; the projected-noisy-sgd names (disjoint batches of one user, a user-level claim, audited with
the user-level canary: every record of the canary's client) run one pass over the 10 users (algorithm.rounds = 10). The claim is that of the audited rounds; "s": seconds of the runs at that R (shared by the
observers audited at the same R, and by the settings that audit the same R: one set of runs), one torch thread.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from pathlib import Path

import tomllib

from dpfl.algorithms import registry
from dpfl.accounting.observers import SERVER
from dpfl.audit import plan, runs
from dpfl.audit.distinguisher import NOTHING, server_view
from dpfl.errors import ConfigError
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


def simulation(name: str, mechanism: str | None, steps: int, delta: float, epsilon: float):
    """(the simulation of ``name`` on the example config (``overrides``), its config, the fewest rounds an audit of it
    runs): projected noisy SGD one pass over its disjoint batches of users (each trial draws its own secret
    partition, so the canary's user may be in any of its rounds), SCAFFOLD-warm one round past its warm-up, else 1."""
    keys = overrides(name, steps, delta, epsilon, mechanism) + ["run.noise_seed=0"]
    config = load_config(None, keys)
    sim, spec = build_simulation(config), registry.spec_of(name)
    if runs.user_level(sim.algorithm) and spec.max_rounds is not None:
        known = {f.name for f in dataclasses.fields(spec.config)}
        section = spec.config(**{k: v for k, v in config["algorithm"].items() if k in known})
        passes = spec.max_rounds(section, config["data"]["num_clients"])
        config = load_config(None, keys + [f"algorithm.rounds={passes}"])
        sim = build_simulation(config)
    least = config["algorithm"]["rounds"] if name.endswith("scaffold-warm") or spec.max_rounds is not None else 1
    return sim, config, least


def audited_observers(sim) -> list[str]:
    """The observers the audit has a view for (not the server behind a trusted aggregator)."""
    return [o for o in sim.ledger.observers if o != SERVER or server_view(sim.boundary) != NOTHING]


def rows(names, trials: int, local_steps: int, delta: float, settings, canary: str, epsilon: float):
    """(label, K, {observer: [(R, claim, bound, seconds) per setting]}) per row of ``names``; a setting is a round
    count or ``AUTO`` (each observer's planned rounds); the runs of one R are shared by the observers audited at it."""
    for name in names:
        steps = steps_of(name, local_steps)
        for label, mechanism in variants(name):
            sim, config, least = simulation(name, mechanism, steps, delta, epsilon)
            observers = audited_observers(sim)
            wanted = [{o: max(least, plan.planned_rounds(sim, o, trials) if setting == AUTO else setting)
                       for o in observers} for setting in settings]
            audited: dict[int, list[str]] = {}  # R -> the observers audited at R (one set of runs each)
            for planned in wanted:
                for observer, rounds in planned.items():
                    if observer not in audited.setdefault(rounds, []):
                        audited[rounds].append(observer)
            result: dict[tuple[str, int], tuple] = {}
            try:
                for rounds, at_rounds in sorted(audited.items()):
                    started = time.perf_counter()
                    results = runs.audit_all(sim, at_rounds, trials, rounds=rounds, canary_kind=canary,
                                             release=config["privacy"]["release"])
                    seconds = time.perf_counter() - started
                    for observer, found_at in results.items():
                        result[observer, rounds] = (found_at.claimed_epsilon, found_at.lower_bound, seconds)
            except ConfigError as error:  # the family cannot carry this canary (the input ones: one clip bound)
                if canary == "dirac":
                    raise
                yield label, steps, trials, str(error)
                continue
            found = {o: [(planned[o], *result[o, planned[o]]) for planned in wanted] for o in observers}
            yield label, steps, trials, found


def steps_of(name: str, local_steps: int) -> int:
    """K: one step for the FedSGD names, ``local_steps`` for the others."""
    return 1 if name.endswith("fedsgd") or name.startswith("fedsgd") else local_steps


def cells(rounds: int, claim: float, bound: float, seconds: float) -> str:
    """One setting's cells: R | claim | bound (95%) | bound / claim | seconds (a bound above its claim flagged)."""
    claim_text = "inf" if math.isinf(claim) else f"{claim:.3f}"
    ratio = "-" if math.isinf(claim) or claim == 0 else f"{bound / claim:.2f}"
    flag = " **above**" if bound > claim else ""
    return f"{rounds} | {claim_text} | {bound:.3f}{flag} | {ratio} | {seconds:.1f}"


def setting(text: str) -> int | str:
    return text if text == AUTO else int(text)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("words", nargs="*", help="audit only names containing any of these")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--local-steps", type=int, default=2)
    parser.add_argument("--delta", type=float, default=1e-2)
    parser.add_argument("--rounds", type=setting, nargs="+", default=[1, AUTO],
                        help="round settings, one group of columns each (default: 1 auto): rounds per trial "
                             "(*-scaffold-warm: at least one past the warm-up); 'auto': planned per observer "
                             "(dpfl.audit.plan)")
    parser.add_argument("--canary", default="dirac", choices=runs.CANARIES)
    parser.add_argument("--epsilon", type=float, default=2.0,
                        help="privacy.epsilon of the names calibrated to it (FedSGD-DPC, ISRL-DP, shuffle DP)")
    parser.add_argument("--no-header", action="store_true", help="print the rows only (to append to a table)")
    args = parser.parse_args(argv)
    names = [n for n in registry.names() if not args.words or any(w in n for w in args.words)]
    if not args.no_header:
        groups = [f"R = {s}" if s != AUTO else "R planned" for s in args.rounds]
        print("| algorithm | K | observer | trials | "
              + " | ".join(f"{g}: R | claim | bound (95%) | bound / claim | s" for g in groups) + " |")
        print("|---|---|---|---|" + "---|---|---|---|---|" * len(groups))
    for label, steps, trials, found in rows(names, args.trials, args.local_steps, args.delta, args.rounds,
                                            args.canary, args.epsilon):
        if isinstance(found, str):
            print(f"| {label} | {steps} | (cannot carry the {args.canary} canary: {found.split(': ')[-1]}) | {trials} |"
                  + " | | | | |" * len(args.rounds), flush=True)
            continue
        for observer, settings in found.items():
            print(f"| {label} | {steps} | {observer} | {trials} | "
                  + " | ".join(cells(*found_at) for found_at in settings) + " |", flush=True)


if __name__ == "__main__":
    main()
