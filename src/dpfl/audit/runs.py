"""The many-run audit: the real algorithm run N times with the Dirac canary and N times with its neighbour, one
round each, every trial a fresh draw of the run's randomness; each observer's score per trial; a lower bound on
epsilon (``dpfl.audit.bounds``) to compare with the epsilon the run's sound analysis claims for that round.

Trials on the client axis (the pattern of ``dpfl.algorithms.worst_case``): every (world, trial) draws its own cohort
with the run's client sampler (from its own seed, so client sampling is audited too), and every cohort member of
every trial becomes one row of ONE batched ``client_round`` call (chunked to ``run.memory_mb``), with its own client
id, (world * N + trial) * M + client, so that its record and noise streams (named by (seed, round, client id,
purpose), ``dpfl.engine.randomness``) are independent of every other row's. World 1 holds the canary (record
``canary_record`` of client ``canary_client`` marked ``CANARY``), world 0 its neighbour under the run's relation
(``dpfl.audit.canary.neighbour_mark``). The noise actually drawn is checked against the declared release, as the
simulator does.

The claimed epsilon is that of one round of the same configuration: the observer's event from the algorithm's
release, the boundary and the client sampler (``Simulation.round_privacy``), accounted by a fresh ledger with the
run's delta, analysis, neighbouring relation and accountants. A sound claim must satisfy lower_bound <= claim with
probability >= the confidence; a lower bound above the claim is a bug (in the mechanism, the accounting, or both).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.audit import bounds, canary, distinguisher
from dpfl.engine.boundary import Delivery
from dpfl.engine.protocol import ClientContext, ClientData
from dpfl.engine.simulator import check_drawn, noise_of
from dpfl.errors import ConfigError

#: The fewest trials per world the many-run bound accepts (half choose the test, half count its errors).
MIN_TRIALS = 20
#: Spawn-key tag of the trials' cohort seeds (distinct from the run's own streams).
_COHORT_KEY = 0xA0D17


@dataclass
class AuditResult:
    observer: str
    claimed_epsilon: float
    delta: float
    bound: bounds.LowerBound
    trials: int
    method: str
    seconds: float
    negatives: np.ndarray = field(repr=False)
    positives: np.ndarray = field(repr=False)

    def to_dict(self) -> dict:
        return {"observer": self.observer, "claimed_epsilon": self.claimed_epsilon, "delta": self.delta,
                "lower_bound": self.bound.epsilon, "confidence": self.bound.confidence, "trials": self.trials,
                "method": self.method, "canary": "dirac", "violated": self.bound.epsilon > self.claimed_epsilon,
                "test": {k: v for k, v in self.bound.to_dict().items() if k not in ("lower_bound", "confidence")},
                "seconds": self.seconds}


def claimed_epsilon(sim, observer: str, events: dict | None = None) -> float:
    """Epsilon of one round (round 0) towards ``observer`` under the run's accounting; ``events`` overrides the
    per-observer events (default: ``sim.round_privacy(0)``)."""
    events = sim.round_privacy(0) if events is None else events
    ledger = PrivacyLedger(sim.ledger.observers, sim.ledger.delta, None, sim.ledger.conversion, sim.ledger.analysis,
                           sim.ledger.neighboring, accountant=dict(sim.ledger.accountant_names))
    ledger.record(0, events)
    return ledger.epsilon()[observer]


def _cohorts(sim, world: int, trials: int) -> list[torch.Tensor]:
    seeds = np.random.SeedSequence(sim.seed, spawn_key=(_COHORT_KEY, world)).generate_state(trials, np.uint64) >> 1
    return [sim.clients.sample(0, int(s)) for s in seeds]


def run_trials(sim, observer: str, trials: int, *, scale: float = 1.0, canary_client: int = 0,
               canary_record: int = 0, silo: int | None = None,
               silo_weight: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """Scores of ``observer`` in ``trials`` runs of round 0 without (world 0) and with (world 1) the canary."""
    return run_trials_all(sim, (observer,), trials, scale=scale, canary_client=canary_client,
                          canary_record=canary_record, silo=silo, silo_weight=silo_weight)[observer]


def _auditable(sim):
    """(algorithm, train) of ``sim``, if its algorithm can carry a Dirac canary (a gradient-oracle canary: the
    LocalSGD family with a fixed clip)."""
    algorithm = sim.algorithm
    if not hasattr(algorithm, "noisy_gradient"):
        raise ConfigError("algorithm.name", type(algorithm).__name__,
                          "an algorithm of the LocalSGD family (the Dirac canary is a gradient-oracle canary)")
    if getattr(algorithm, "clip_heuristic", "fixed") != "fixed":
        raise ConfigError("algorithm.clip_heuristic", algorithm.clip_heuristic, "'fixed' to be audited")
    return algorithm, sim.train


def run_trials_all(sim, observers, trials: int, *, scale: float = 1.0, canary_client: int = 0,
                   canary_record: int = 0, silo: int | None = None,
                   silo_weight: float = 1.0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{observer: (scores without, scores with the canary)} from the same ``trials`` runs per world;
    ``silo_weight``: the other silo's weight on its own message (``distinguisher.scores``)."""
    algorithm, train = _auditable(sim)
    population = train.num_clients
    for observer in observers:
        distinguisher.check_view(observer, sim.boundary.name, population)
    silo = (1 if canary_client == 0 else 0) if silo is None else silo
    grads = canary.DiracCanaryGradients(sim.grads, scale)
    x0 = grads.initial_params()
    server = algorithm.init_state(x0, 1).server
    declared = [noise_of(e) for e in algorithm.release(0, sim.state, train).step_events]
    marks = (canary.neighbour_mark(algorithm.neighboring), canary.CANARY)
    fixed = sim.clients.scheme != "poisson"
    out: dict[str, list] = {observer: [] for observer in observers}
    for world, label in enumerate(marks):
        cohorts = _cohorts(sim, world, trials)
        clients = torch.cat(cohorts)
        trial_of_row = torch.repeat_interleave(torch.arange(trials), torch.tensor([c.numel() for c in cohorts]))
        ids = (world * trials + trial_of_row) * population + clients
        chunk = sim.chunk_size(max(int(clients.numel()), 1))
        messages: dict[str, list] = {}
        for start in range(0, clients.numel(), chunk):
            rows = clients[start:start + chunk]
            y = train.y[rows].clone()
            y[(rows == canary_client), canary_record] = label
            data = ClientData(train.x[rows], y, train.counts[rows])
            state = algorithm.init_state(x0, rows.numel())
            result = algorithm.client_round(0, server, state.rows(torch.arange(rows.numel())), data,
                                            ClientContext(grads, sim.seed, 0, ids[start:start + chunk]))
            check_drawn(0, result.events, declared)
            for name, value in result.messages.items():
                messages.setdefault(name, []).append(value)
        joined = {name: torch.cat(parts) for name, parts in messages.items()}
        for observer in observers:
            out[observer].append(distinguisher.scores(observer, sim.boundary.name, algorithm, server, trial_of_row,
                                                      clients, joined, trials, population, canary_client, silo,
                                                      fixed, grads.coordinate, silo_weight).numpy())
    return {observer: (scores[0], scores[1]) for observer, scores in out.items()}


def audit(sim, observer: str, trials: int, *, confidence: float = 0.95, scale: float = 1.0,
          claim_events: dict | None = None, seed: int = 0, selection_fraction: float = 0.5,
          silo_weight: float = 1.0) -> AuditResult:
    """The many-run audit of one round of ``sim``'s configuration towards ``observer`` (module docstring).
    ``seed`` draws the split into selection and evaluation runs (``bounds.many_run_lower_bound``)."""
    return audit_all(sim, (observer,), trials, confidence=confidence, scale=scale, claim_events=claim_events,
                     seed=seed, selection_fraction=selection_fraction, silo_weight=silo_weight)[observer]


def audit_all(sim, observers, trials: int, *, confidence: float = 0.95, scale: float = 1.0,
              claim_events: dict | None = None, seed: int = 0,
              selection_fraction: float = 0.5, silo_weight: float = 1.0) -> dict[str, AuditResult]:
    """``audit`` of several observers from the same runs (each bound holds with ``confidence`` on its own)."""
    if trials < MIN_TRIALS:
        raise ConfigError("--trials", trials, f"at least {MIN_TRIALS} runs per world (half of them choose the "
                          "test, half count its errors; a useful bound needs thousands)")
    for observer in observers:
        distinguisher.check_view(observer, sim.boundary.name, sim.train.num_clients)
    started = time.perf_counter()
    scores = run_trials_all(sim, observers, trials, scale=scale, silo_weight=silo_weight)
    seconds = time.perf_counter() - started
    results = {}
    for observer in observers:
        negatives, positives = scores[observer]
        bound = bounds.many_run_lower_bound(negatives, positives, sim.ledger.delta, confidence,
                                            np.random.default_rng(seed), selection_fraction=selection_fraction)
        results[observer] = AuditResult(observer, claimed_epsilon(sim, observer, claim_events), sim.ledger.delta,
                                        bound, trials, "runs", seconds, negatives, positives)
    return results


# -- one run (Steinke, Nasr, Jagielski 2023) ---------------------------------------------------------------------
#: Spawn-key tag of the one-run audit's inclusion and cohort draws.
_ONE_RUN_KEY = 0x0E1


@dataclass
class OneRunResult:
    observer: str
    claimed_epsilon: float
    delta: float
    lower_bound: float
    confidence: float
    canaries: int
    guesses: int
    correct: int
    seconds: float

    def to_dict(self) -> dict:
        return {"observer": self.observer, "claimed_epsilon": self.claimed_epsilon, "delta": self.delta,
                "lower_bound": self.lower_bound, "confidence": self.confidence, "trials": 1, "method": "one-run",
                "canary": "dirac", "violated": self.lower_bound > self.claimed_epsilon, "canaries": self.canaries,
                "guesses": self.guesses, "correct": self.correct, "seconds": self.seconds}


def one_run_scores(sim, observer: str, canaries: int, *, scale: float = 1.0, seed: int = 0, silo: int = 0,
                   silo_weight: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(included [m] bools, scores [m]) of ONE run of round 0 with ``canaries`` Dirac canaries, each included with
    probability 1/2 (else its neighbour under the run's relation), on coordinates of their own
    (``canary.ManyDiracCanaryGradients``). Canary i replaces one record, spread round-robin over the clients (the
    other silo's own clients excluded when it is the observer). The score of canary i is minus the observer's view
    along e_i (a gradient step moves the model against the canary's gradient): the views of
    ``dpfl.audit.distinguisher``, read per canary (the plain server reads canary i's owner's message)."""
    algorithm, train = _auditable(sim)
    population = train.num_clients
    distinguisher.check_view(observer, sim.boundary.name, population)
    hosts = [c for c in range(population) if not (observer == distinguisher.OTHER_SILO and c == silo)]
    slots = [(c, r) for r in range(int(train.counts.max())) for c in hosts if r < int(train.counts[c])]
    if canaries < 2 or canaries > len(slots):
        raise ConfigError("--canaries", canaries, f"between 2 and the {len(slots)} records the canaries can replace")
    rng = np.random.default_rng(np.random.SeedSequence(sim.seed, spawn_key=(_ONE_RUN_KEY, seed)))
    included = rng.integers(0, 2, canaries).astype(bool)
    out_sign = canary.SIGNS[canary.neighbour_mark(algorithm.neighboring)]
    signs = torch.tensor(np.where(included, 1.0, out_sign) * scale)
    grads = canary.ManyDiracCanaryGradients(sim.grads, signs)
    owner = torch.tensor([c for c, _ in slots[:canaries]])
    y_all = train.y.clone()
    for i, (c, r) in enumerate(slots[:canaries]):
        y_all[c, r] = canary.FIRST_OF_MANY - i
    x0 = grads.initial_params()
    server = algorithm.init_state(x0, 1).server
    declared = [noise_of(e) for e in algorithm.release(0, sim.state, train).step_events]
    cohort = sim.clients.sample(0, int(rng.integers(0, 2**62)))
    chunk = sim.chunk_size(max(int(cohort.numel()), 1))
    parts: dict[str, list] = {}
    for start in range(0, cohort.numel(), chunk):
        rows = cohort[start:start + chunk]
        state = algorithm.init_state(x0, rows.numel())
        result = algorithm.client_round(0, server, state.rows(torch.arange(rows.numel())),
                                        ClientData(train.x[rows], y_all[rows], train.counts[rows]),
                                        ClientContext(grads, sim.seed, 0, rows))
        check_drawn(0, result.events, declared)
        for name, value in result.messages.items():
            parts.setdefault(name, []).append(value)
    messages = {name: torch.cat(value) for name, value in parts.items()}
    coords = grads.base_params + torch.arange(canaries)
    dy = messages["dy"].double()
    total = dy.sum(0)
    row_of = {int(c): i for i, c in enumerate(cohort)}

    def own(client: int) -> torch.Tensor:
        return dy[row_of[client]] if client in row_of else torch.zeros_like(total)

    if observer == distinguisher.SERVER and sim.boundary.name == "secagg":
        view = total[coords]
    elif observer == distinguisher.SERVER:
        view = torch.stack([own(int(c))[int(k)] for c, k in zip(owner, coords)])
    elif observer == distinguisher.OTHER_SILO and sim.clients.scheme != "poisson":
        view = (total - silo_weight * own(silo))[coords]
    else:
        delivery = Delivery({name: value.sum(0) for name, value in messages.items()}, int(cohort.numel()), population)
        view = (algorithm.server_update(0, server, delivery)["x"] - server["x"])[coords].double()
    return included, -view.numpy()


def one_run_audit(sim, observer: str, canaries: int = 1000, guesses: int | None = None, *,
                  confidence: float = 0.95, scale: float = 1.0, seed: int = 0, silo_weight: float = 1.0,
                  claim_events: dict | None = None) -> OneRunResult:
    """The one-run audit (``bounds.one_run_lower_bound``): ``guesses`` r (default m / 10) fixed in advance, half
    "included" on the highest scores and half "excluded" on the lowest; v of them right."""
    guesses = max(2, canaries // 10) if guesses is None else guesses
    if not 2 <= guesses <= canaries:
        raise ConfigError("--guesses", guesses, f"between 2 and --canaries = {canaries}")
    if not 0 < confidence < 1:
        raise ConfigError("--confidence", confidence, "a number in (0, 1)")
    started = time.perf_counter()
    included, score = one_run_scores(sim, observer, canaries, scale=scale, seed=seed, silo_weight=silo_weight)
    order = np.argsort(score, kind="stable")
    high = guesses // 2
    correct = int(included[order[canaries - high:]].sum() + (~included[order[:guesses - high]]).sum())
    bound = bounds.one_run_lower_bound(canaries, guesses, correct, sim.ledger.delta, confidence)
    return OneRunResult(observer, claimed_epsilon(sim, observer, claim_events), sim.ledger.delta, bound, confidence,
                        canaries, guesses, correct, time.perf_counter() - started)


__all__ = ["MIN_TRIALS", "AuditResult", "OneRunResult", "claimed_epsilon", "run_trials", "run_trials_all", "audit",
           "audit_all", "one_run_scores", "one_run_audit"]
