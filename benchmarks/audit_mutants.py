"""Which privacy bugs the audit catches, with one round and with planned rounds (``dpfl audit --rounds auto``).

**Accounting bugs** leave the mechanism alone and lower the claim: the ledger's event for some observer says more
noise, less participation or fewer rounds than the run has. Each is planted in the claim only (every round's
per-observer events transformed, or the rounds' composition), the real runs are audited (Dirac canary, white-box
scores, ``dpfl.audit.runs.run_trials_all``) and the bound is planned at the mutant's claim, as the buggy code would
plan it; the rounds of the planned audit come from the mutant's per-round events too
(``dpfl.audit.plan.planned_rounds`` with ``round_events``). **Mechanism bugs** leave the claim alone and change the
runs (``MECHANISM``): the noise halved (every "noise" and "server_noise" draw of the streams), the noise shared by a
trial's clients (each draws its trial's first client's "noise", another silo scored at ``silo_weight`` = M), the clip
rule skipped (every weight of ``dpfl.engine.clipping.clip_weights`` 1, audited with a canary of norm 10 C before the
clip: ``dpfl audit --canary-norm 10``), or the server's noise reused across rounds (every round's "server_noise"
stream named as round 0's: DP-FTRL's tree nodes sharing one draw); the clip measured on each record's gradient of the
batch's mean loss (a record clipped at b C; audited with the mirror canary, ``dpfl audit --canary mirror``, whose
gradient goes through the engine's norms); replace-one charged zero-out's sensitivity (C / b, the noise halved);
the wrong denominator (each client's noise sized for the cohort's mean, 1 / M of it). A mutant whose patched code
never ran for a family at the planned R planted nothing, and its row says so instead of counting. "caught" = what
``dpfl audit`` reports as violated: its 95% bound (the larger of the rank tests' and the GDP fit's) exceeds the
claim, or a local randomiser was handed a vector outside the clip's ball (``randomiser_input``); "under-charge" = the
true epsilon over the claim at the planned R (accounting: the correct claim over the mutant's; mechanism: the claim of
the mechanism as run, its noise multipliers scaled by 0.5, 0.1, 1 / b or 1 / M, over the correct claim; "-" where
that event has no Gaussian scaling or no multiplier to scale; the shared noise: infinite towards another silo, which
then sees the canary noise-free, unknown towards the others).

    python benchmarks/audit_mutants.py                     # 2000 trials per world, every dp-fedsgd config
    python benchmarks/audit_mutants.py --trials 1000 sampled
    python benchmarks/audit_mutants.py --trials 1000 --families        # every private family, the example config
    python benchmarks/audit_mutants.py --trials 1000 --families dp-fed # families whose name contains a word
    python benchmarks/audit_mutants.py --trials 1000 --families --mutants mirror denominator   # some mutants only

Configs: ``example``, examples/audit_fedsgd.toml (dp-fedsgd, 10 clients all in every round, z = 1, plain boundary,
delta 1e-2); ``sampled``, the same with 5 of the 10 clients a round (client_rate 0.5); ``secagg``, the example
behind secure aggregation; ``sampled-secagg``, both. ``--families``: every private registered name on the same
example (benchmarks/audit_table.py's ``simulation``: K = 2 local steps but for FedSGD, privacy.epsilon = 2 for the
calibrated families, one row per mechanism). Each config's runs of R rounds are shared by its observers and mutants
(a comment line gives their seconds); the last lines count the caught mutants per config, and those that
under-charge by 2x or more.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import time
from pathlib import Path

import attr
import torch
from dp_accounting import dp_event
from dp_accounting.privacy_accountant import UnsupportedEventError

from dpfl.accounting.events import ParticipationDpEvent
from dpfl.accounting.observers import OTHER_SILO, SERVER, THIRD_PARTY, scale_noise
from dpfl.algorithms import registry
from dpfl.audit import canary, plan, runs
from dpfl.engine import clipping, ghost, grads, randomness, sampling
from dpfl.errors import ConfigError
from dpfl.experiments.config import load_config
from dpfl.experiments.runner import build_simulation

from audit_table import audited_observers, simulation, steps_of, variants  # beside this script

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
    aggregate = {THIRD_PARTY, OTHER_SILO} | ({SERVER} if events.get(SERVER) == events[THIRD_PARTY] else set())
    return {o: scale_noise(e, factor) if o in aggregate else e for o, e in events.items()}


#: name -> (events of a round -> the mutant's events); None: the composition mutant (one round however many)
MUTANTS = {
    "noise x1.5 in the ledger": lambda events, sim: {o: scale_noise(e, 1.5) for o, e in events.items()},
    "noise x2 in the ledger": lambda events, sim: {o: scale_noise(e, 2.0) for o, e in events.items()},
    "client sampling rate credited twice": lambda events, sim: {o: participation_squared(e)
                                                                for o, e in events.items()},
    "cohort's noise credited twice": lambda events, sim: cohort_credited_twice(events, sim.clients.cohort_size),
    "server charged the third party's event": lambda events, sim: {**events, SERVER: events[THIRD_PARTY]}
    if SERVER in events else events,
    "other silo charged the third party's event": lambda events, sim: {**events, OTHER_SILO: events[THIRD_PARTY]},
    "rounds composed once": None,
}


def events_function(sim, mutant: str | None):
    """t -> round t's events per observer under ``mutant`` (the composition mutant leaves them alone)."""
    transform = None if mutant is None else MUTANTS[mutant]
    return sim.round_privacy if transform is None else (lambda t: transform(sim.round_privacy(t), sim))


def claim_function(sim, observer: str, mutant: str | None):
    """R -> the claim of R rounds towards ``observer`` under accounting mutant ``mutant`` (None: the correct
    accounting; the composition mutant: one round's claim, however many)."""
    if mutant is not None and MUTANTS[mutant] is None:
        return lambda rounds: _claims(sim, None, sim.round_privacy, 1)[observer]
    return lambda rounds: _claims(sim, mutant, events_function(sim, mutant), rounds)[observer]


def _claims(sim, name, of_round, rounds: int) -> dict[str, float]:
    """Every observer's claim of ``rounds`` rounds of events ``of_round`` (t -> round t's events), accounted once per
    simulation, ``name`` of those events (a mutant, or a noise factor) and R."""
    key = (id(sim), name, rounds)
    if key not in _CLAIMS:
        _CLAIMS[key] = runs.claims(sim, of_round, rounds)
    return _CLAIMS[key]


#: (id of a simulation kept for the whole benchmark, the events' name, R) -> every observer's claim
_CLAIMS: dict[tuple, dict[str, float]] = {}


@contextlib.contextmanager
def noise_halved(sim):
    """Every standard normal or exponential draw of a "noise" or "server_noise" stream halved (the declared events
    unchanged): the noise of every Gaussian and Laplace family at half its scale. Yields [draws it changed]."""
    hits = [0]

    def halved(method):
        def draw(self, shape):
            drawn = method(self, shape)
            if self._name[3] not in ("noise", "server_noise"):
                return drawn
            hits[0] += 1
            return drawn * 0.5
        return draw

    with _patched([(randomness.ClientStreams, "normal"), (randomness.ClientStreams, "exponential"),
                   (randomness.ServerStreams, "normal")], halved):
        yield hits


@contextlib.contextmanager
def noise_shared(sim):
    """Every client of an audited trial draws the noise of the trial's first client in its chunk (the "noise" stream
    named without the client: the audit's stream ids are (world * N + trial) * M + client, rows in trial order).
    Another silo that subtracts M copies of its own message (``silo_weight`` = M) then sees the canary noise-free.
    Yields [chunks where two rows shared a draw]."""
    hits, clients = [0], sim.train.num_clients

    def shared(method):
        def stacked(self, shapes, fill, draw):
            drawn = method(self, shapes, fill, draw)
            if self._name[3] != "noise" or len(shapes) < 2:
                return drawn
            base = torch.tensor(self._name[2]) // clients
            first = torch.searchsorted(base, base)  # each row's trial's first row (rows in trial order)
            hits[0] += int((first != torch.arange(len(base))).any())
            return drawn[first]
        return stacked

    with _patched([(randomness.ClientStreams, "_stacked")], shared):
        yield hits


@contextlib.contextmanager
def server_noise_reused(sim):
    """Every round's "server_noise" stream is round 0's (the same draws each round): DP-FTRL's tree nodes, BandMF's
    draws and a server's Gaussian all repeat one draw. Yields [streams it renamed]."""
    hits = [0]

    def from_round_0(method):
        def init(self, seed, round_index, rows, purpose, batched=False):
            if purpose == "server_noise" and round_index:
                hits[0] += 1
                round_index = 0
            method(self, seed, round_index, rows, purpose, batched)
        return init

    with _patched([(randomness.ServerStreams, "__init__")], from_round_0):
        yield hits


@contextlib.contextmanager
def clip_skipped(sim):
    """The engine's clip rule (``dpfl.engine.clipping.clip_weights``, as the gradient strategies and the canary call
    it) keeps every weight at 1: no record is clipped. Yields [calls of the rule]."""
    hits = [0]

    def skipped(clip, norms, mask, nonfinite=True):
        hits[0] += 1
        return mask * torch.ones_like(norms)

    with _patched([(clipping, "clip_weights"), (grads, "clip_weights")], lambda original: skipped):
        yield hits


@contextlib.contextmanager
def clip_on_mean_loss(sim):
    """The clip measures each example's gradient of the batch's MEAN loss, g_j / b (the norm of the wrong tensor:
    ``_norms`` and the ghost strategy's ``sq_norms`` divided by the batch's width b), and weighs the sum of the g_j:
    a record is clipped at b C instead of C. The Dirac canary states its own clipped gradient and never meets these
    norms; the mirror canary's gradient is the model's, so it does. Yields [calls of the norms]."""
    hits = [0]

    def of_mean(norms):
        def measured(*args, **kwargs):
            hits[0] += 1
            values = norms(*args, **kwargs)
            return values / values.shape[-1] if values.dim() else values
        return measured

    def of_mean_squared(sq_norms):
        def measured(layers, clients):
            hits[0] += 1
            values = sq_norms(layers, clients)
            return values / values.shape[-1] ** 2
        return measured

    with _patched([(grads, "_norms")], of_mean), _patched([(ghost, "sq_norms")], of_mean_squared):
        yield hits


def zero_out_sensitivity(sim):
    """Fixed-size record batches (replace-one neighbours, sensitivity 2C / b) charged zero-out's sensitivity C / b:
    ``RecordSampler.mean_sensitivity`` counts one changed term where a replacement changes two, so the noise is half
    what the declared multiplier says. Yields [calls under fixed-size batches]."""
    return sensitivity_divided(lambda sampler: 2.0 if sampler.scheme == "fixed" else None)


def cohort_denominator(sim):
    """The wrong denominator: each client's noise sized for the cohort's mean, the mean's sensitivity divided by the
    cohort's size M (``RecordSampler.mean_sensitivity`` / M), where each client's own mean is what it releases.
    Yields [calls]."""
    return sensitivity_divided(lambda sampler: sim.clients.cohort_size)


@contextlib.contextmanager
def sensitivity_divided(divisor):
    """``RecordSampler.mean_sensitivity`` divided by ``divisor(sampler)`` (None: left alone), so the noise sized from
    it shrinks by that factor while the declared multiplier stays. Yields [calls it divided]."""
    hits = [0]

    def divided(method):
        def sensitivity(self, clip, counts):
            by = divisor(self)
            if by is None:
                return method(self, clip, counts)
            hits[0] += 1
            return method(self, clip, counts) / by
        return sensitivity

    with _patched([(sampling.RecordSampler, "mean_sensitivity")], divided):
        yield hits


@contextlib.contextmanager
def _patched(methods, wrap):
    """``methods`` ((owner, name) pairs: a class's method, a module's function) replaced by ``wrap(original)`` for
    the duration."""
    originals = [getattr(owner, name) for owner, name in methods]
    for (owner, name), method in zip(methods, originals):
        setattr(owner, name, wrap(method))
    try:
        yield
    finally:
        for (owner, name), method in zip(methods, originals):
            setattr(owner, name, method)


@dataclasses.dataclass(frozen=True)
class Mechanism:
    """A mechanism mutant: the runs' patch (a context manager of the simulation, yielding how often it acted: 0 means
    it planted nothing), the canary's norm before the clip in units of C (None: the stated C e), the weight of the
    other silo's own message (``run_trials_all``'s silo_weight; "clients": M), the claim of the mechanism as run
    towards an observer (None: unknown) and the canary audited (``dpfl audit --canary``)."""

    patch: object
    canary_norm: float | None
    silo_weight: str | float
    truth: object
    canary: str = "dirac"


MECHANISM = {
    "noise halved (event unchanged)": Mechanism(noise_halved, None, 1.0,
                                                lambda sim, o: true_claim(sim, o, 0.5)),
    "noise shared by a trial's clients": Mechanism(noise_shared, None, "clients",
                                                   lambda sim, o: (lambda r: math.inf) if o == OTHER_SILO else None),
    "clipping skipped (canary of norm 10 C)": Mechanism(clip_skipped, 10.0, 1.0,
                                                        lambda sim, o: true_claim(sim, o, 0.1)),
    "server noise reused across rounds": Mechanism(server_noise_reused, None, 1.0, lambda sim, o: None),
    "clip measured on the mean loss's gradient (mirror canary)": Mechanism(
        clip_on_mean_loss, None, 1.0, lambda sim, o: true_claim(sim, o, 1 / batch_width(sim)), "mirror"),
    "replace-one charged zero-out's sensitivity": Mechanism(zero_out_sensitivity, None, 1.0,
                                                            lambda sim, o: true_claim(sim, o, 0.5)),
    "noise sized for the cohort's mean (wrong denominator)": Mechanism(
        cohort_denominator, None, 1.0, lambda sim, o: true_claim(sim, o, 1 / sim.clients.cohort_size)),
}


def batch_width(sim) -> int:
    """The most records a client's batch can hold: what a clip at b C lets one record move the sum by, in units of C
    (the largest client's data: every configuration here takes whole-data batches, s = 1)."""
    return int(sim.train.counts.max())


def true_claim(sim, observer: str, factor: float):
    """R -> the claim of the mechanism as a mechanism mutant runs it (every noise multiplier times ``factor``), or
    None where an event has no Gaussian scaling (Laplace)."""
    def scaled(t):
        return {o: scale_noise(e, factor) for o, e in sim.round_privacy(t).items()}

    try:
        scaled(0)
    except ValueError:
        return None
    return lambda rounds: _claims(sim, f"noise x{factor}", scaled, rounds)[observer]


def family_configs(words: list[str]) -> dict:
    """label -> (simulation, the fewest rounds an audit runs) of every private registered name matching ``words``
    on the example config (benchmarks/audit_table.py)."""
    configs = {}
    for name in registry.names():
        if not registry.spec_of(name).private(name) or (words and not any(w in name for w in words)):
            continue
        for label, mechanism in variants(name):
            sim, _, least = simulation(name, mechanism, steps_of(name, 2), 1e-2, 2.0)
            configs[label] = (sim, least)
    return configs


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("configs", nargs="*", help=f"any of {list(CONFIGS)} (default: all); with --families, words "
                                                   "of the family names")
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--max-rounds", type=int, default=plan.ROUND_LIMIT)
    parser.add_argument("--families", action="store_true", help="every private family on the example config")
    parser.add_argument("--mutants", nargs="+", default=None, metavar="WORD",
                        help="only the mutants whose names contain one of these words (default: every one)")
    args = parser.parse_args(argv)
    if args.families:
        configs = family_configs(args.configs)
    else:
        unknown = [name for name in args.configs if name not in CONFIGS]
        if unknown:
            parser.error(f"unknown configs {unknown}: expected any of {list(CONFIGS)}")
        configs = {name: (build_simulation(load_config(str(EXAMPLE), ["run.noise_seed=0", *CONFIGS[name]])), 1)
                   for name in args.configs or CONFIGS}
    print("| config | observer | mutant | true claim (R) | mutant claim (R) | R = 1: bound | planned R | bound "
          "(planned R) | under-charge | caught: R = 1, planned |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    tally: dict[str, list[int]] = {}  # config -> [mutants, caught at R = 1, at the planned R, 2x ones, caught]
    for name, (sim, least) in configs.items():
        delta, observers = sim.ledger.delta, tuple(audited_observers(sim))
        cache: dict[tuple, dict] = {}
        outside: dict[tuple, bool] = {}  # (R, mechanism) -> a local randomiser got a vector outside the C-ball

        def scores(rounds: int, mechanism: str | None) -> dict:
            if (rounds, mechanism) not in cache:
                started = time.perf_counter()
                if mechanism is None:
                    target = runs.make_canary(sim, "dirac")
                    cache[rounds, None] = runs.run_trials_all(sim, observers, args.trials, rounds=rounds,
                                                              target=target)
                else:
                    planted = MECHANISM[mechanism]
                    target = runs.make_canary(sim, planted.canary, canary_norm=planted.canary_norm)
                    weight = sim.train.num_clients if planted.silo_weight == "clients" else planted.silo_weight
                    with planted.patch(sim) as hits:
                        try:
                            found = runs.run_trials_all(sim, observers, args.trials, rounds=rounds, target=target,
                                                        silo_weight=weight)
                        except ConfigError:
                            if planted.canary == "dirac":
                                raise
                            hits[0] = 0  # the family cannot carry this canary (a clip bound per client): nothing ran
                    # a patch that never acted, or a raw canary no clip rule weighed: the mutant planted nothing
                    raw_missed = planted.canary_norm is not None and not target.worlds[1].grads.raw_clipped
                    cache[rounds, mechanism] = None if not hits[0] or raw_missed else found
                outside[rounds, mechanism] = not canary.within_clip(target.largest_input)
                print(f"<!-- {name}: {rounds} rounds{f', {mechanism}' if mechanism else ''}, "
                      f"{time.perf_counter() - started:.1f} s -->", flush=True)
            return cache[rounds, mechanism]

        for observer in observers:
            correct = claim_function(sim, observer, None)
            chosen = [m for m in (*MUTANTS, *MECHANISM) if args.mutants is None or any(w in m for w in args.mutants)]
            for mutant in (None, *chosen):
                mechanism = mutant if mutant in MECHANISM else None
                try:
                    claim = correct if mutant is None or mechanism else claim_function(sim, observer, mutant)
                    if mechanism:
                        truth = MECHANISM[mechanism].truth(sim, observer)
                    elif mutant is not None and claim(1) >= correct(1) and \
                            claim(args.max_rounds) >= correct(args.max_rounds):
                        continue  # the accounting mutant does not lower this observer's claim: nothing to catch
                    else:
                        truth = correct
                except (ValueError, UnsupportedEventError):  # an event the mutant cannot transform or account
                    continue  # (Laplace noise scaled; a last-iterate step with a Gaussian inside changed)
                events = sim.round_privacy if mechanism else events_function(sim, mutant)
                planned = max(least, plan.planned_rounds(sim, observer, args.trials, limit=args.max_rounds,
                                                         round_events=events))
                if scores(planned, mechanism) is None:
                    print(f"| {name} | {observer} | {mutant} | not planted: the patched code never ran for this family "
                          "(or the raw canary met no clip rule, or the family cannot carry the canary) | | | | | | |",
                          flush=True)
                    continue
                found = []
                for rounds in sorted({max(least, 1), planned}):  # a patch that acts across rounds is the correct
                    run = mechanism if scores(rounds, mechanism) is not None else None  # run at R = 1
                    negatives, positives = scores(rounds, run)[observer]
                    bound, fit = runs.lower_bounds(negatives, positives, delta, 0.95, claim(rounds),
                                                   [events(t)[observer] for t in range(rounds)])
                    # caught as `dpfl audit` reports a violation: the bound above the claim, or a local randomiser
                    # handed a vector outside the clip's ball (the claim's premise broken)
                    found.append((rounds, max(bound.epsilon, fit.epsilon if fit else 0.0), outside[rounds, run]))
                (first, at_first, out_first), (_, at_planned, out_planned) = found[0], found[-1]
                caught = ["yes" if at_first > claim(first) or out_first else "no",
                          "yes" if at_planned > claim(planned) or out_planned else "no"]
                factor = None if truth is None or claim(planned) == 0 else truth(planned) / claim(planned)
                if mechanism and factor is not None and abs(factor - 1) < 1e-9:
                    factor = None  # the claim's event has no noise multiplier to scale (a last-iterate step)
                if mutant is not None:
                    counts = tally.setdefault(name, [0, 0, 0, 0, 0])
                    doubled = factor is not None and factor >= 2
                    for i, add in enumerate((1, caught[0] == "yes", caught[1] == "yes", doubled,
                                             doubled and caught[1] == "yes")):
                        counts[i] += add
                print(f"| {name} | {observer} | {mutant or 'correct'} | {correct(first):.3f} ({correct(planned):.3f})"
                      f" | {claim(first):.3f} ({claim(planned):.3f}) | {at_first:.3f} | {planned} | {at_planned:.3f}"
                      f" | {'-' if factor is None else f'{factor:.2f}x'} | {', '.join(caught)} |", flush=True)

    print("\n| config | mutants | caught at R = 1 | caught at the planned R | under-charging 2x or more | of those, "
          "caught at the planned R |\n|---|---|---|---|---|---|")
    for name, counts in tally.items():
        print(f"| {name} | " + " | ".join(str(c) for c in counts) + " |")
    total = [sum(counts[i] for counts in tally.values()) for i in range(5)]
    print("| all | " + " | ".join(str(c) for c in total) + " |")


if __name__ == "__main__":
    main()
