"""Which accounting bugs the audit catches, with one round and with planned rounds (``dpfl audit --rounds auto``).

An accounting bug leaves the mechanism alone and lowers the claim: the ledger's event for some observer says more
noise, less participation or fewer rounds than the run has. Each mutant below is planted in the claim only (every
round's per-observer events transformed, or the rounds' composition), the real runs are audited (Dirac canary,
white-box scores, ``dpfl.audit.runs.run_trials_all``) and the bound is planned at the mutant's claim, as the buggy
code would plan it. "caught" = the 95% lower bound exceeds the mutant's claim. The rounds of the planned audit come
from the mutant's per-round events too (``dpfl.audit.plan.planned_rounds`` with ``round_events``).

    python benchmarks/audit_mutants.py                     # 2000 trials per world, every config
    python benchmarks/audit_mutants.py --trials 1000 sampled

Configs: ``example``, examples/audit_fedsgd.toml (dp-fedsgd, 10 clients all in every round, z = 1, plain boundary,
delta 1e-2); ``sampled``, the same with 5 of the 10 clients a round (client_rate 0.5); ``secagg``, the example
behind secure aggregation; ``sampled-secagg``, both. Each config's runs of R rounds are shared by its observers and
mutants (a comment line gives their seconds); the last line counts the caught mutants per config.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import attr
from dp_accounting import dp_event

from dpfl.accounting.events import ParticipationDpEvent
from dpfl.accounting.observers import OTHER_SILO, SERVER, THIRD_PARTY, scale_noise
from dpfl.audit import bounds, plan, runs
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "audit_fedsgd.toml"
CONFIGS = {"example": [], "sampled": ["algorithm.client_rate=0.5"], "secagg": ["privacy.boundary='secagg'"],
           "sampled-secagg": ["algorithm.client_rate=0.5", "privacy.boundary='secagg'"]}


def participation_squared(event: dp_event.DpEvent) -> dp_event.DpEvent:
    """Every participation probability p charged as p^2 (the client sampling rate credited twice)."""
    if isinstance(event, ParticipationDpEvent):
        return attr.evolve(event, probability=event.probability ** 2)
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([participation_squared(e) for e in event.events])
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return dp_event.SelfComposedDpEvent(participation_squared(event.event), event.count)
    return event


def cohort_credited_twice(events: dict, cohort: int) -> dict:
    """The aggregate's observers (third party, other silo, a secure-aggregation server) credited twice the cohort's
    other shares: z sqrt(n) charged as z sqrt(2n - 1)."""
    factor = math.sqrt((2 * cohort - 1) / cohort)
    aggregate = {THIRD_PARTY, OTHER_SILO} | ({SERVER} if events[SERVER] == events[THIRD_PARTY] else set())
    return {o: scale_noise(e, factor) if o in aggregate else e for o, e in events.items()}


#: name -> (events of a round -> the mutant's events); None: the composition mutant (one round however many)
MUTANTS = {
    "noise x1.5 in the ledger": lambda events, sim: {o: scale_noise(e, 1.5) for o, e in events.items()},
    "client sampling rate credited twice": lambda events, sim: {o: participation_squared(e)
                                                                for o, e in events.items()},
    "cohort's noise credited twice": lambda events, sim: cohort_credited_twice(events, sim.clients.cohort_size),
    "server charged the third party's event": lambda events, sim: {**events, SERVER: events[THIRD_PARTY]},
    "other silo charged the third party's event": lambda events, sim: {**events, OTHER_SILO: events[THIRD_PARTY]},
    "rounds composed once": None,
}


def events_function(sim, mutant: str | None):
    """t -> round t's events per observer under ``mutant`` (the composition mutant leaves them alone)."""
    transform = None if mutant is None else MUTANTS[mutant]
    return sim.round_privacy if transform is None else (lambda t: transform(sim.round_privacy(t), sim))


def claim_function(sim, observer: str, mutant: str | None):
    """R -> the claim of R rounds towards ``observer`` under ``mutant`` (None: the correct accounting)."""
    if mutant is not None and MUTANTS[mutant] is None:
        return lambda rounds: runs.claimed_epsilon(sim, observer, rounds=1)
    events = events_function(sim, mutant)(0)  # every round of these configs declares the same events
    return lambda rounds: runs.claimed_epsilon(sim, observer, events, rounds)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", help=f"any of {list(CONFIGS)} (default: all)")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--max-rounds", type=int, default=plan.ROUND_LIMIT)
    args = parser.parse_args(argv)
    unknown = [name for name in args.configs if name not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}: expected any of {list(CONFIGS)}")
    print("| config | observer | mutant | true claim (R) | mutant claim (R) | R = 1: bound | planned R | bound "
          "(planned R) | caught: R = 1, planned |")
    print("|---|---|---|---|---|---|---|---|---|")
    tally: dict[str, list[int]] = {}  # config -> [mutants, caught at R = 1, caught at the planned R]
    for name in args.configs or CONFIGS:
        sim = build_simulation(load_config(str(EXAMPLE), ["run.noise_seed=0", *CONFIGS[name]]))
        delta, observers = sim.ledger.delta, tuple(sim.ledger.observers)
        cache: dict[int, dict] = {}

        def scores(rounds: int) -> dict:
            if rounds not in cache:
                started = time.perf_counter()
                cache[rounds] = runs.run_trials_all(sim, observers, args.trials, rounds=rounds)
                print(f"<!-- {name}: {rounds} rounds, {time.perf_counter() - started:.0f} s -->", flush=True)
            return cache[rounds]

        for observer in observers:
            for mutant in (None, *MUTANTS):
                claim = claim_function(sim, observer, mutant)
                correct = claim_function(sim, observer, None)
                if mutant is not None and claim(1) >= correct(1) and claim(args.max_rounds) >= correct(args.max_rounds):
                    continue  # the mutant does not lower this observer's claim here: nothing to catch
                planned = plan.planned_rounds(sim, observer, args.trials, limit=args.max_rounds,
                                              round_events=events_function(sim, mutant))
                found = []
                for rounds in (1, planned):
                    negatives, positives = scores(rounds)[observer]
                    found.append(bounds.many_run_lower_bound(negatives, positives, delta,
                                                             claimed_epsilon=claim(rounds)).epsilon)
                caught = ["yes" if b > claim(r) else "no" for b, r in zip(found, (1, planned))]
                if mutant is not None:
                    counts = tally.setdefault(name, [0, 0, 0])
                    counts[0] += 1
                    counts[1] += caught[0] == "yes"
                    counts[2] += caught[1] == "yes"
                print(f"| {name} | {observer} | {mutant or 'correct'} | {correct(1):.3f} ({correct(planned):.3f}) | "
                      f"{claim(1):.3f} ({claim(planned):.3f}) | {found[0]:.3f} | {planned} | {found[1]:.3f} | "
                      f"{', '.join(caught)} |", flush=True)

    print("\n| config | mutants | caught at R = 1 | caught at the planned R |\n|---|---|---|---|")
    for name, (mutants, at_one, at_planned) in tally.items():
        print(f"| {name} | {mutants} | {at_one} | {at_planned} |")
    total = [sum(counts[i] for counts in tally.values()) for i in range(3)]
    print(f"| all | {total[0]} | {total[1]} | {total[2]} |")


if __name__ == "__main__":
    main()
