"""The many-run audit: the real algorithm run N times with a canary and N times with its neighbour, R rounds each,
every trial a fresh draw of the run's randomness (``dpfl.audit.trials``); each observer's score per trial
(``dpfl.audit.distinguisher``, weighted by the canary's measured response, ``dpfl.audit.response``); a lower bound on
epsilon (``dpfl.audit.bounds``) to compare with the epsilon the run's sound analysis claims for those R rounds.

Any registered algorithm is audited through the protocol alone (``dpfl.engine.protocol``): the canaries wrap the
gradient oracle ``ctx.grads`` and mark the data, the scores read the messages the algorithm sends, and the trials are
rows with a leading trial axis on the server state. An algorithm that cannot carry a canary (it does not take its
per-example gradients from ``ctx.grads.clipped_sum``, asks the oracle for per-example norms, or sends no message with
the parameter axis) gets a ConfigError naming what is missing.

Canaries (``dpfl.audit.canary``), in the record ``canary_record`` of client ``canary_client``; the neighbour follows
the relation the accountant assumes (``canary.neighbour_mark``):

* ``dirac`` (white-box; Nasr et al. 2023): a gradient C e along an extra coordinate no other record touches; its
  neighbour -C e (replace-one) or a null record (zero-out). Its gradient at every model is C e. Where the algorithm's
  unit of privacy is a client's whole data (``privacy_unit``: projected noisy SGD, Asoodeh et al. 2021), every record
  of the canary's client is the canary (its neighbour: every record the opposite), which moves the client's mean
  gradient by the user-level sensitivity 2C; a single record would move it by 2C / n_i, far inside the claim.
* ``flip``: the Dirac canary whose gradient reverses once the model has left the initial point along e
  (``canary.DiracCanaryGradients``, flip): it carries the canary into a gradient difference between iterates
  (FedProx-SPIDER's difference stream), where a fixed gradient cancels.
* ``input``: a real record (``canary.input_canary``: far from the data, with a rare label) in place of the record
  (replace-one: the neighbour is the original record) or against a null record (zero-out); its gradient is the model's
  clipped gradient of that record at the round's model. Scored white-box or, towards the third party, black-box by
  minus its loss on the released model.
* ``mirror``: the input canary whose replace-one neighbour is its mirror image, the same features negated with the
  same label, in place of the original record. For a model linear in its input at the canary's inputs (logistic
  regression, and any model near 0) the two records' gradients are opposite in the weights, so the clipped sum moves
  by nearly the sensitivity 2C where the original record's own gradient leaves it at ||g(x) - g(x_0)|| < 2C; the
  score's direction is g(x) - g(-x), each clipped as the algorithm clips. Its gradient is the model's, computed by
  the engine's own per-example norms and clip, so a clip that measures the wrong tensor (the gradient of the batch's
  mean loss, a layer alone) or a wrong bound shows on it, where the Dirac canary states its clipped gradient. Under
  zero-out its neighbour is the null record, as for ``input``.

The claimed epsilon is that of R rounds of the same configuration: each round's observer events from the algorithm's
release, the boundary and the client sampler (``Simulation.round_privacy``), composed by a fresh ledger with the run's
delta, analysis, neighbouring relation and accountants. A sound claim must satisfy lower_bound <= claim with
probability >= the confidence; a lower bound above the claim is a bug (in the mechanism, the accounting, or both).

The randomiser's input: an algorithm that encodes every example with a local randomiser (the shuffle-DP families)
takes the vectors from the canary's oracle (``clipped_examples``), which keeps the largest ||x|| / C it handed out
(``canary.RandomiserInput``). The result reports it (``randomiser_input``); above 1 the claim's premise fails (its
event assumes the C-ball) and the audit counts as violated whatever its bound, since a skipped clip need not move
the canary's own (clipped by construction) message.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from dpfl.accounting.events import DiscreteGaussianDpEvent, innermost
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.units import USER_LEVEL
from dpfl.accounting.observers import THIRD_PARTY
from dpfl.audit import bounds, canary, distinguisher, likelihood_ratio, response
from dpfl.audit import gdp as gdp_bounds
from dpfl.audit.response import no_canary_path
from dpfl.audit.trials import TrialFailure, World, run_world
from dpfl.engine.cohort_round import CohortRows, Records, run_cohort
from dpfl.errors import ConfigError

#: the canaries whose gradient the canary states (Dirac), and those whose gradient is the model's (a real record)
DIRAC_CANARIES, INPUT_CANARIES = ("dirac", "flip"), ("input", "mirror")
CANARIES = DIRAC_CANARIES + INPUT_CANARIES
RELEASES = ("every_round", "final")


@dataclass
class AuditResult:
    observer: str
    claimed_epsilon: float
    delta: float
    bound: bounds.LowerBound | None  # None for a failed audit
    trials: int
    method: str
    seconds: float
    negatives: np.ndarray = field(repr=False)
    positives: np.ndarray = field(repr=False)
    canary: str = "dirac"
    score: str = "white-box"
    rounds: int = 1
    release: str = "every_round"
    randomiser_input: float | None = None
    gdp: gdp_bounds.GdpBound | None = None  # the GDP bound, where every audited round's event is Gaussian
    failure: str | None = None  # what a trial raised (``trials.TrialFailure``); the audit then has no scores
    #: the canary's norm before the clip in units of C (``make_canary``), and whether the clip rule weighed it (False:
    #: the algorithm clips no record with the engine's rule, so the option exercised nothing)
    canary_norm: float | None = None
    canary_norm_clipped: bool | None = None

    @property
    def lower_bound(self) -> float:
        """The audit's bound: the larger of the (eps, delta) rank test's and the GDP fit's (both from the same
        confidence events, ``dpfl.audit.gdp``); 0 for a failed audit (it has no scores)."""
        if self.failure is not None:
            return 0.0
        return max(self.bound.epsilon, self.gdp.epsilon if self.gdp is not None else 0.0)

    @property
    def strength(self) -> float | None:
        """bound / claim: on correct code, the fraction of the claim the audit certifies (what a pass means); None
        for a claim of 0 or infinity."""
        return self.lower_bound / self.claimed_epsilon if 0 < self.claimed_epsilon < math.inf else None

    @property
    def violated(self) -> bool:
        """The bound above the claim, a local randomiser's input outside the clip's ball (the claim's premise), or
        a trial that raised (the audited code broke under the canary)."""
        return (self.failure is not None or self.lower_bound > self.claimed_epsilon
                or not canary.within_clip(self.randomiser_input))

    def to_dict(self) -> dict:
        found = {"lower_bound": None, "failure": self.failure} if self.failure is not None else {
            "lower_bound": self.lower_bound, "strength": self.strength, "confidence": self.bound.confidence,
            "test": {k: v for k, v in self.bound.to_dict().items() if k != "confidence"},
            **({"gdp": self.gdp.to_dict()} if self.gdp is not None else {})}
        return {"observer": self.observer, "claimed_epsilon": self.claimed_epsilon, "delta": self.delta, **found,
                "trials": self.trials, "method": self.method, "canary": self.canary,
                **({"canary_norm": self.canary_norm, "canary_norm_clipped": self.canary_norm_clipped}
                   if self.canary_norm is not None else {}),
                "score": self.score, "rounds": self.rounds, "release": self.release, "violated": self.violated,
                **randomiser_input_summary(self.randomiser_input), "seconds": self.seconds}


def randomiser_input_summary(largest_input: float | None) -> dict:
    """{"randomiser_input": ...} for a run whose algorithm encodes examples with a local randomiser (none otherwise):
    the largest ||x|| / C it received, and whether that is within the clip's ball (``dpfl.audit.canary``)."""
    if largest_input is None:
        return {}
    return {"randomiser_input": {"largest_norm_over_clip": largest_input,
                                 "within_clip": canary.within_clip(largest_input)}}


def claims(sim, events: dict | Callable[[int], dict] | None = None, rounds: int = 1) -> dict[str, float]:
    """Epsilon of rounds 0..``rounds`` - 1 towards each observer under the run's accounting (the rounds' events
    composed after one another, as the run's ledger composes them, in order for an accountant that needs it);
    ``events`` overrides the per-observer events: every round's, or round t's (a function of t; default:
    ``sim.round_privacy``)."""
    ledger = PrivacyLedger(sim.ledger.observers, sim.ledger.delta, None, sim.ledger.conversion, sim.ledger.analysis,
                           sim.ledger.neighboring, accountant=dict(sim.ledger.accountant_names))
    of_round = sim.round_privacy if events is None else events if callable(events) else (lambda t: events)
    return ledger.epsilon_after([of_round(t) for t in range(rounds)])


def claimed_epsilon(sim, observer: str, events: dict | Callable[[int], dict] | None = None, rounds: int = 1) -> float:
    """``claims`` towards ``observer``."""
    return claims(sim, events, rounds)[observer]


def _neighbour_mark(algorithm) -> int:
    """The mark of the canary's neighbour under the relation ``algorithm`` is accounted under."""
    relation = algorithm.neighboring
    try:
        return canary.neighbour_mark(relation)
    except ValueError:
        raise no_canary_path(algorithm, f"its neighboring relation is {relation!r} (expected 'replace_one', "
                                        "'zero_out' or 'add_remove')") from None


@dataclass(frozen=True)
class Canary:
    """The audited record: its two worlds (0: the neighbour, 1: the canary), its gradient at models [trials, P]
    (the white-box direction) and, for an input canary, its loss there."""

    worlds: tuple[World, World]
    gradient: Callable[[torch.Tensor], torch.Tensor]
    loss: Callable[[torch.Tensor], torch.Tensor] | None
    neighbour_offset: float = -0.5

    @property
    def largest_input(self) -> float | None:
        """The largest ||x|| / C a local randomiser received in either world so far (``canary.RandomiserInput``)."""
        seen = [w.grads.largest_input for w in self.worlds if getattr(w.grads, "largest_input", None) is not None]
        return max(seen) if seen else None


def user_level(algorithm) -> bool:
    """Whether ``algorithm``'s unit of privacy is a client's whole data (``privacy_unit``; record-level otherwise)."""
    return algorithm.privacy_unit == USER_LEVEL


def make_canary(sim, kind: str, scale: float = 1.0, canary_client: int = 0, canary_record: int = 0,
                canary_norm: float | None = None) -> Canary:
    """The ``kind`` canary of ``sim``'s run (module docstring); ``scale`` (Dirac and flip only) multiplies its
    gradient; ``canary_norm`` K (Dirac and flip only): its gradient is K C before the engine's clip rule weighs it
    (``canary.DiracCanaryGradients``' ``raw``; default: the clipped gradient C stated)."""
    algorithm, train = sim.algorithm, sim.train
    if kind not in CANARIES:
        raise ConfigError("--canary", kind, f"one of {list(CANARIES)}")
    if not 0 <= canary_record < int(train.counts[canary_client]):
        raise ConfigError("canary_record", canary_record, f"a record of client {canary_client} "
                          f"(0..{int(train.counts[canary_client]) - 1})")
    if canary_norm is not None and (kind not in DIRAC_CANARIES or not canary_norm >= 1):
        raise ConfigError("--canary-norm", canary_norm, "a number >= 1 (the canary's gradient before the clip, in "
                          "units of C) with --canary dirac or flip")
    out_mark = _neighbour_mark(algorithm)
    # the neighbour's shift relative to the other records, in units of the canary's (mu_0 of the multiset score)
    offset = canary.SIGNS[out_mark] / (canary.SIGNS[canary.CANARY] - canary.SIGNS[out_mark])
    if kind in DIRAC_CANARIES:
        flip = kind == "flip"
        grads = canary.DiracCanaryGradients(sim.grads, scale, flip, canary_norm)
        # a user-level claim (the client's whole data replaced) is audited by marking every record of the client
        unit = slice(0, int(train.counts[canary_client])) if user_level(algorithm) else canary_record
        worlds = tuple(World(train.x, canary.mark(train.y, canary_client, unit, label), grads)
                       for label in (out_mark, canary.CANARY))
        e = torch.zeros(grads.num_params)
        e[grads.coordinate] = 1.0
        return Canary(worlds, lambda theta: e * canary.direction(theta, flip).to(e.dtype).unsqueeze(1), None, offset)
    if scale != 1.0:
        raise ConfigError("scale", scale, "1 for an input canary (its gradient is the model's)")
    features, label = canary.input_canary(train, sim.seed)
    grads = canary.NullRecordGradients(sim.grads)
    x_in, y_in = train.x.clone(), train.y.clone()
    x_in[canary_client, canary_record], y_in[canary_client, canary_record] = features, label
    mirrored = kind == "mirror" and out_mark == canary.OPPOSITE
    if mirrored:  # the neighbour: the canary's mirror image (module docstring)
        x_out, y_out = x_in.clone(), y_in
        x_out[canary_client, canary_record] = -features
    elif out_mark == canary.OPPOSITE:
        x_out, y_out = train.x, train.y
    else:
        x_out, y_out = train.x, canary.mark(train.y, canary_client, canary_record, canary.ABSENT)

    def record(n: int, sign: float = 1.0):
        return (sign * features).expand(n, *features.shape), torch.full((n,), label)

    def clipped(theta, sign: float = 1.0):  # clipped as the algorithm clips (the bound and norm of its calls)
        if grads.clipping is None:
            raise no_canary_path(algorithm, "it never called ctx.grads.clipped_sum")
        clip, options = grads.clipping
        if isinstance(clip, torch.Tensor) and clip.numel() > 1:
            raise no_canary_path(algorithm, "it clips at a bound per client (the input canary needs one bound)")
        x, y = record(theta.shape[0], sign)
        return sim.grads.clipped_sum(theta, x.unsqueeze(1), y.unsqueeze(1), torch.ones(theta.shape[0], 1), clip,
                                     **options)

    def gradient(theta):
        return clipped(theta) - clipped(theta, -1.0) if mirrored else clipped(theta)

    def loss(theta):
        return sim.grads.example_losses(theta, *record(theta.shape[0]))

    return Canary((World(x_out, y_out, grads), World(x_in, y_in, grads)), gradient, loss, offset)


def check_audited_noise(sim) -> None:
    """ConfigError naming run.secure_noise for a run that declares the secure mode's rounded discrete Gaussian
    (``DiscreteGaussianDpEvent``, drawn by ``dpfl.noise.DiscreteGaussianMechanism``): the audit's planned bounds
    model Gaussian noise, and its thousands of trials would each draw exact noise at about 2 microseconds a
    coordinate. Audit the default mode at the same noise multiplier instead (the secure mode's
    epsilon is at least the default mode's)."""
    release = sim.algorithm.release(sim.next_round, sim.state, sim.train.counts)
    if any(isinstance(innermost(e), DiscreteGaussianDpEvent) for e in (*release.step_events, *release.server_events)):
        raise ConfigError("run.secure_noise", True, "false for an audit (its trials and planned bounds model the "
                                                    "default Gaussian mechanism; audit the run without secure noise)")


def run_trials(sim, observer: str, trials: int, **options) -> tuple[np.ndarray, np.ndarray]:
    """Scores of ``observer`` in ``trials`` runs without (world 0) and with (world 1) the canary."""
    return run_trials_all(sim, (observer,), trials, **options)[observer]


def run_trials_all(sim, observers, trials: int, *, rounds: int = 1, canary_kind: str = "dirac",
                   score: str = "white-box", release: str = "every_round", scale: float = 1.0,
                   canary_client: int = 0, canary_record: int = 0, silo: int | None = None, silo_weight: float = 1.0,
                   progress: bool = False, target: Canary | None = None,
                   canary_norm: float | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{observer: (scores without, scores with the canary)} from the same ``trials`` runs of ``rounds`` rounds per
    world (``distinguisher``: the views and scores, each round's weighted by its likelihood-ratio factor,
    ``likelihood_ratio``; ``release``: which models the third party sees); ``target``:
    the canary (default ``make_canary`` of ``canary_kind``, ``scale``, ``canary_client``, ``canary_record``,
    ``canary_norm``)."""
    check_audited_noise(sim)
    train = sim.train
    seen_by_server = distinguisher.server_view(sim.boundary)
    for observer in observers:
        distinguisher.check_view(observer, seen_by_server, train.num_clients, score)
    if release not in RELEASES:
        raise ConfigError("privacy.release", release, f"one of {list(RELEASES)}")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ConfigError("--rounds", rounds, "an integer >= 1")
    if score == "loss" and canary_kind not in INPUT_CANARIES:
        raise ConfigError("--score", score, "'white-box' with --canary dirac (a Dirac canary has no loss; the "
                          "black-box score needs --canary input or mirror)")
    target = make_canary(sim, canary_kind, scale, canary_client, canary_record, canary_norm) if target is None \
        else target
    weights = response.round_weights(sim, target, rounds, canary_client)
    multiset = distinguisher.SERVER in observers and seen_by_server == distinguisher.MULTISET and score != "loss"
    laws = [response.row_law(sim, target, t, weights[t], canary_client) for t in range(rounds)] if multiset else []
    moves = [1.0 / w[response.MOVE] for w in weights if w[response.MOVE]]
    # x_R - x_0, the rounds' moves together: weighted by 1 / (the rounds' mean response), so that with equal rounds
    # the last model alone scores as the sum of every round's move does
    final_weight = {response.MOVE: len(moves) / sum(moves) if moves and sum(moves) else 0.0}
    silo = (1 if canary_client == 0 else 0) if silo is None else silo
    sums_seen = distinguisher.silo_recovers_sum(sim, rounds)
    declared = [sim.round_privacy(t) for t in range(rounds)]  # the run's own release, never the audited claim
    factors = {observer: likelihood_ratio.round_factors([events[observer] for events in declared])
               for observer in observers}
    encoder = sim.algorithm.noise_encoder(rounds)  # correlated rounds: scored together after the run

    def at_the_end(observer: str) -> bool:  # scored from the last model alone
        return score == "loss" or (observer == THIRD_PARTY and release == "final")

    out: dict[str, list] = {observer: [] for observer in observers}
    for index, world in enumerate(target.worlds):
        totals = {observer: torch.zeros(trials, dtype=torch.float64) for observer in observers}
        per_round: dict[str, list] = {observer: [] for observer in observers}  # moves of correlated rounds
        presence: list[torch.Tensor] = []  # whether the canary's client took part, per round

        def observe(view):
            g = target.gradient(view.before["x"])
            if encoder is not None:
                presence.append(view.holds(canary_client))
            for observer in observers:
                if observer == distinguisher.SERVER and multiset:
                    totals[observer] += distinguisher.multiset_score(view, canary_client, g, weights[view.round],
                                                                     laws[view.round], target.neighbour_offset)
                elif not at_the_end(observer):
                    seen = distinguisher.observed_updates(observer, seen_by_server, view, canary_client, silo,
                                                          sums_seen, silo_weight)
                    round_score = distinguisher.white_box_score(seen, g, weights[view.round])
                    if encoder is not None and set(seen) == {response.MOVE}:
                        per_round[observer].append(round_score)
                    else:
                        totals[observer] += factors[observer][view.round] * round_score

        final = run_world(sim, world, index, trials, rounds, observe, progress)["x"]
        x0 = world.grads.initial_params().expand(trials, -1)
        for observer in observers:
            if per_round[observer]:  # the moves of a matrix-factorization release, read through its encoder
                known = torch.stack(presence, 1) if observer in sim.boundary.knows_cohort else None
                totals[observer] = likelihood_ratio.encoded_scores(encoder, torch.stack(per_round[observer], 1),
                                                                   known)
            if score == "loss":
                totals[observer] = -target.loss(final).double()
            elif at_the_end(observer):
                totals[observer] = distinguisher.white_box_score({"x": final - x0}, target.gradient(x0),
                                                                 final_weight)
            out[observer].append(totals[observer].detach().numpy())
    return {observer: (scores[0], scores[1]) for observer, scores in out.items()}


def audit(sim, observer: str, trials: int, **options) -> AuditResult:
    """The many-run audit of ``sim``'s configuration towards ``observer`` (module docstring; ``audit_all``)."""
    return audit_all(sim, (observer,), trials, **options)[observer]


def audit_all(sim, observers, trials: int, *, confidence: float = 0.95, rounds: int = 1, canary_kind: str = "dirac",
              score: str = "white-box", release: str = "every_round", scale: float = 1.0,
              claim_events: dict | None = None, silo_weight: float = 1.0,
              progress: bool = False, canary_norm: float | None = None) -> dict[str, AuditResult]:
    """``audit`` of several observers from the same runs (each bound holds with ``confidence`` on its own), each
    bound's rank test planned at that observer's claim (``bounds.many_run_lower_bound``); ``canary_norm``: as
    ``make_canary``'s."""
    if not 0 < confidence < 1:
        raise ConfigError("--confidence", confidence, "a number in (0, 1)")
    needed = bounds.fewest_runs(sim.ledger.delta, confidence)
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < needed:
        raise ConfigError("--trials", trials, f"at least {needed} runs per world at confidence {confidence:g}: with "
                          "fewer, even a perfect distinguisher certifies no epsilon > 0 (a useful bound needs "
                          "thousands)")
    started = time.perf_counter()
    target = make_canary(sim, canary_kind, scale, canary_norm=canary_norm)
    results, claimed, delta = {}, claims(sim, claim_events, rounds), sim.ledger.delta
    claimed_rounds = [sim.round_privacy(t) if claim_events is None else claim_events for t in range(rounds)]
    try:
        scores = run_trials_all(sim, observers, trials, rounds=rounds, canary_kind=canary_kind, score=score,
                                release=release, scale=scale, silo_weight=silo_weight, progress=progress,
                                target=target)
    except TrialFailure as failure:  # reported as a failed (violated) audit, not a crash
        none = np.zeros(0)
        return {o: AuditResult(o, claimed[o], delta, None, trials, "runs", time.perf_counter() - started, none, none,
                               canary_kind, score, rounds, release, target.largest_input, failure=str(failure))
                for o in observers}
    seconds = time.perf_counter() - started
    clipped = None if canary_norm is None else target.worlds[1].grads.raw_clipped
    for observer in observers:
        negatives, positives = scores[observer]
        claim = claimed[observer]
        bound, fit = lower_bounds(negatives, positives, delta, confidence, claim,
                                  [events[observer] for events in claimed_rounds])
        results[observer] = AuditResult(observer, claim, delta, bound, trials, "runs", seconds, negatives, positives,
                                        canary_kind, score, rounds, release, target.largest_input, fit,
                                        canary_norm=canary_norm, canary_norm_clipped=clipped)
    return results


def lower_bounds(negatives, positives, delta: float, confidence: float, claim: float, claimed_rounds: list):
    """(the rank tests' bound, the GDP fit or None) of scores ``negatives`` / ``positives`` planned at ``claim``: the
    fit only where every claimed round's event (``claimed_rounds``, towards the observer) is a composition of
    Gaussian events (``gdp.claimed_gdp_mu``); the audit's bound is the larger."""
    bound = bounds.many_run_lower_bound(negatives, positives, delta, confidence, claimed_epsilon=claim)
    gaussian = gdp_bounds.claimed_gdp_mu(claimed_rounds) is not None
    fit = gdp_bounds.gdp_lower_bound(negatives, positives, delta, confidence, claimed_epsilon=claim) \
        if gaussian else None
    return bound, fit


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
    included: np.ndarray = field(repr=False)  # [m] bools: which canaries the run included
    scores: np.ndarray = field(repr=False)  # [m]: each canary's score (``one_run_scores``)

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
    other silo's own clients excluded when it is the observer). The score of canary i is the observer's view along
    e_i, weighted as in the many-run audit (``dpfl.audit.response``, probed with one Dirac canary in round 0): the
    views of ``dpfl.audit.distinguisher``, read per canary (the plain server reads canary i's owner's messages)."""
    check_audited_noise(sim)
    algorithm, train = sim.algorithm, sim.train
    population = train.num_clients
    seen_by_server = distinguisher.server_view(sim.boundary)
    distinguisher.check_view(observer, seen_by_server, population)
    if observer == distinguisher.SERVER and seen_by_server == distinguisher.MULTISET:
        raise ConfigError("--method", "one-run", "'runs' for the server behind the simulated shuffler (its multiset "
                          "score reads one canary's owner among the rows; the one-run audit has many owners)")
    hosts = [c for c in range(population) if not (observer == distinguisher.OTHER_SILO and c == silo)]
    slots = [(c, r) for r in range(int(train.counts.max())) for c in hosts if r < int(train.counts[c])]
    if canaries < 2 or canaries > len(slots):
        raise ConfigError("--canaries", canaries, f"between 2 and the {len(slots)} records the canaries can replace")
    weights = response.round_weights(sim, make_canary(sim, "dirac", canary_client=hosts[0]), 1, hosts[0])[0]
    rng = np.random.default_rng(np.random.SeedSequence(sim.seed, spawn_key=(_ONE_RUN_KEY, seed)))
    included = rng.integers(0, 2, canaries).astype(bool)
    out_sign = canary.SIGNS[_neighbour_mark(algorithm)]
    signs = torch.tensor(np.where(included, 1.0, out_sign) * scale)
    grads = canary.ManyDiracCanaryGradients(sim.grads, signs)
    owner = torch.tensor([c for c, _ in slots[:canaries]])
    y_all = train.y.clone()
    for i, (c, r) in enumerate(slots[:canaries]):
        y_all[c, r] = canary.FIRST_OF_MANY - i
    x0 = grads.initial_params()
    initial = algorithm.init_state(x0, 1)
    release = algorithm.release(0, initial, train.counts)  # the canaries' model (m extra coordinates)
    cohort_seed = int(rng.integers(0, 2**62))
    cohort = sim.clients.sample(0, sim.seed if release.cohort is not None else cohort_seed)  # a fixed schedule: the run's
    outcome = run_cohort(algorithm, sim.boundary, release, 0, sim.seed, population, initial.server,
                         algorithm.init_state(x0, population).clients, CohortRows(cohort),
                         Records(train.x, y_all, train.counts, grads), sim.chunk_size(max(int(cohort.numel()), 1)))
    messages = outcome.messages
    coords = grads.base_params + torch.arange(canaries)
    row_of = {int(c): i for i, c in enumerate(cohort)}

    def own(name: str, client: int) -> torch.Tensor:
        value = messages[name].double()
        return value[row_of[client]] if client in row_of else torch.zeros_like(value[0])

    def summed(name: str) -> torch.Tensor:  # the cohort's sum as delivered (a simulated stage's: the rows' sum)
        return (outcome.sums[name] if sim.boundary.real else messages[name].double().sum(0)).double()

    def weighted(view_of) -> torch.Tensor:  # sum over the messages u the canary moves of w_u x (the view of u)
        return sum(w * view_of(name) for name, w in weights.items() if w and name != response.MOVE)

    if observer == distinguisher.SERVER and seen_by_server == distinguisher.SUM:
        view = weighted(lambda name: summed(name)[coords])
    elif observer == distinguisher.SERVER:
        view = weighted(lambda name: torch.stack([own(name, int(c))[int(k)] for c, k in zip(owner, coords)]))
    elif observer == distinguisher.OTHER_SILO and distinguisher.silo_recovers_sum(sim, 1):
        view = weighted(lambda name: (summed(name) - silo_weight * own(name, silo))[coords])
    else:
        moved = outcome.server[response.MOVE] - initial.server[response.MOVE]
        view = weights[response.MOVE] * moved[coords].double()
    return included, view.numpy()


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
                        canaries, guesses, correct, time.perf_counter() - started, included, score)


__all__ = ["CANARIES", "RELEASES", "AuditResult", "Canary", "OneRunResult", "claims", "claimed_epsilon", "make_canary",
           "check_audited_noise", "run_trials", "run_trials_all", "audit", "audit_all", "one_run_scores", "one_run_audit"]
