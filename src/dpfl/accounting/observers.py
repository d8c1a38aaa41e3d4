"""What each observer of a federated run sees, as privacy events (docs/accounting.md, section 1).

A record lives on one client, its *owner*. In a round the owner, if it is in the cohort, makes a sequence of noise
draws (e.g. K local steps, each a record-sampled Gaussian); ``Release`` declares them, one event per draw, before any
noise is drawn, and says which draws enter the aggregate *additively with nothing computed after them*, in this round
or a later one. Observers:

* ``server`` (honest but curious): knows the cohort. Plain boundary: it sees each client's message, so the owner's
  draws at their own noise. Secure aggregation: it sees only the cohort's sum (like the third party below).
* ``third_party``: sees released global models only.
* ``other_silo``: sees the global models and knows its own update, so it can subtract its own noise share.

**The sound analysis** (``analysis="sound"``, the default), for a record of client i:

1. *Client sampling.* Client i takes part with probability p, independently of the data; when it does not, the round
   does not depend on the record. So every observer's round is ``ParticipationDpEvent(p, inner)``: RDP
   log(1 + p (e^{(a-1) eps_in(a)} - 1)) / (a - 1), PLD (1 - p) identity + p PLD_in (joint convexity; exact when the
   observer knows the cohort, as the server does). p = cohort / population for fixed-size cohorts, the rate for
   Poisson. Another silo that knows it is in the cohort knows the owner's chance is (n - 1)/(M - 1), otherwise
   n/(M - 1): it is charged p = min(1, n/(M - 1)).
2. *Noise credit.* Another client's Gaussian share can be credited to a draw of the owner only if the share reaches
   the released aggregate additively and nothing computed afterwards (in this round or a later one) depends on it:
   otherwise that client's later computation can cancel it (a client whose per-example loss is
   (theta - a)^2 / (2 eta) jumps back to a after every local step, erasing its earlier noise). ``Release.additive``
   marks those draws: the last local step of FedAvg, every step of FedSGD (all gradients at the round's start
   point), none of SCAFFOLD (its c_i carries the noisy steps into later rounds). For an additive draw of the owner,
   the sum of n_c cohort members' shares has noise multiplier at least z sqrt(1 + (n_c - 1) r^2), r the min/max
   client sensitivity (client j's std is z Delta_j; ``Release.shares`` when clients' noise and sensitivity differ
   otherwise: the worst owner with the weakest n_c - 1 shares); every other draw keeps the owner's own multiplier z. The
   aggregate is post-processing of (the owner's non-additive draws, the additive sums) together with the other
   clients' data and non-credited noise, which do not depend on the record.
3. Poisson cohorts have a random size: a cohort may hold the owner alone. The number K of other members is
   Binomial(M - 1, q), independent of the owner's participation and of the data, so the round is the mixture over K
   of the owner's draws credited with K shares (``LabelledMixtureDpEvent``, binned by ``poisson_shares``: exact for
   an observer that learns K, an upper bound for one that does not).

**Hidden iterates** (``released="final"``): a third party that sees only the model the run finally releases, of an
algorithm whose rounds are steps of projected noisy SGD over disjoint batches (``Release.hidden``), is charged each
round as a ``ProjectedStepDpEvent`` for the last-iterate accountant (Asoodeh, Chen, Calmon, Ozgur 2021, Theorem 2),
which carries the round's composition event (above) for the baseline. Every other observer, and every run that
releases each round's model, is charged by composition.

The server (plain) gets 1 with the owner's own draws; the third party and the secure-aggregation server 1 and 2 with
the cohort's n - 1 other members; another silo 1 and 2 with n - 2 others (it removes its own share). A coalition of
silos that pools its updates is not modelled.

**The server's own noise** (``Release.server_events``: central DP, DP-FTRL): the server adds noise, from its own
secret streams, to what it computes from the delivery, and releases only that. Every observer that sees only what the
server releases (the third party, another silo) then sees a post-processing of the server's noisy output, since the
clients' noise does not depend on the record: it is charged the server's draws, ``ParticipationDpEvent(p, the draws
composed)`` (or, if it does not know the cohort, their secret-cohort amplification, below), in place of the clients' (the smaller of the two bounds would hold too; the engine does not compare
them). This needs two things of the family, stated where it declares its draws: the sensitivity behind its server
events holds whatever the clients' noise and messages (e.g. the clip bound of what each client sends), and nothing it
computes from the delivery without its noise is kept for a later round (later rounds read only what it released).
The server is charged as before (it knows its own noise): the owner's draws (plain), the cohort's sum (secagg), no
observer (trusted).

Two more facts a release may state (``Release.contributors``, ``Release.colluders``), for algorithms that size noise
shares to a trust setting (Heikkilä et al.'s joint noise): the fewest cohort members whose shares are sure to reach
the aggregate (secure aggregation goes on with as few as its threshold t of the n invited clients, so only t - 1
other shares are credited), and the size m of the coalition of clients that pool their updates and subtract their
own shares (the other-silo observer is then the coalition: credited with t - 1 - m others, participation
``Cohort.coalition_probability(m)``). The defaults (the whole cohort, m = 1) are the single other silo above.

**The paper analysis** (``analysis="paper"``) reproduces a paper's own numbers; ``Release.paper`` says whose:

* ``"noble"``: Noble, Bellet, Dieuleveut (AISTATS 2022), App. B: Wang et al.'s subsampling bound with ratio l around
  the record-level K-step curve (valid only for a curve that bounds replacing a whole client), and the cohort's noise
  sigma_g sqrt(lM) credited to every local step (valid only when every step is additive). Neither holds for general
  losses; ``PAPER_UNPROVEN`` says so in results.
* ``"heikkila"``: Heikkilä et al.'s joint noise (Thm 4.7 with Lemma 4.6): the sound derivation above with EVERY draw
  credited with the cohort's shares, i.e. each local step is a central subsampled Gaussian with the summed noise.
  Sound for one local step; for S > 1 it fails for general losses (other clients' later steps are computed at their
  own unreleased iterates and can cancel their earlier shares): ``JOINT_PAPER_UNPROVEN``.
* ``"asoodeh"``: Asoodeh, Chen, Calmon, Ozgur (2021), Theorem 2 alone for the hidden iterates (``Release.hidden``
  carries the analysis); every round is composed as under the sound analysis.
* ``"mcmahan"``: McMahan, Ramage, Talwar, Zhang (2018), Thm 1: the secret-cohort amplification below applied to the
  third party and every other silo whatever the boundary, under Poisson cohorts only (refused for fixed-size,
  scheduled or public cohorts, ``ConfigError``); the paper's own setting, kept to reproduce its numbers.

**Who knows the cohort** (``cohort_known_to``; privacy.cohort). The cohort is drawn from the server's secret key, so
by default only the server knows who takes part. Secure aggregation tells each member of a round who else takes part
(Bonawitz et al. 2017: the members exchange keys), so another silo knows the cohort there; privacy.cohort = "members"
says the same of a deployment that tells its members who, or how many, take part (a dpfl Flower job states the
cohort's size: with the other clients' updates free, the size and the sum of the others reveal the owner's
participation), and "published" that everyone knows it.

**The secret-cohort amplification** (``secret_cohort_event``), for the server's own noise towards an observer that
does not know the cohort. The server adds its draws to the sum of the cohort's messages, divided by a constant; a
client that does not take part and a null client (zero-out) or the owner's neighbour (replace-one) leave the same
sum apart from the owner's term. So, the other clients' participation independent of the owner's (Poisson) or the
cohort a uniform subset (fixed size), the released model is, in units of the sensitivity, (1 - p) N(m, s^2) +
p N(m + u, s^2) against N(m, s^2): the Poisson subsampled Gaussian ``PoissonSampledDpEvent(q, GaussianDpEvent(z))``
(McMahan et al. 2018, Thm 1), or, without replacement under replace-one, ``SampledWithoutReplacementDpEvent(M, n,
GaussianDpEvent(z))`` (Balle, Barthe, Gaboardi 2018, Thm 10: the same mixture pair dominates). Another silo that
knows its own participation (or a coalition of m that knows theirs) meets the same pair with p at most
n / (M - m) (fixed size; for Poisson the others' coins are independent of the owner's). The server's draws of a
round share the owner's one participation coin, so they are sampled together: Gaussians of multipliers z_k on the
same neighbours are the one Gaussian of multiplier (sum_k z_k^-2)^(-1/2) (Dong, Roth, Su 2022, Cor. 3.3), which the
mixture keeps (the pair with the larger shift post-processes to the smaller one). An observer that knows the cohort
keeps the participation mixture, which is exact for it. The clients' own noise is never amplified this way: an
absent client and a null one differ by the null client's noise share (or, record-level, by the owner's other
records), which an observer that does not know the cohort can still see.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import attr
import numpy as np
from dp_accounting import dp_event

from dpfl.accounting.events import (BinomialSumDpEvent, LabelledMixtureDpEvent, ParticipationDpEvent,
                                    ProjectedStepDpEvent, SkellamDpEvent, WorstOwnerDpEvent)
from dpfl.errors import ConfigError

THIRD_PARTY = "third_party"
SERVER = "server"
OTHER_SILO = "other_silo"
OBSERVERS = (THIRD_PARTY, SERVER, OTHER_SILO)

#: Trust boundaries: the server sees each message (plain), only their sum (secure aggregation), an unlabelled
#: multiset (a shuffler; charged as plain, since one record-level message is no more private without its sender), or
#: nothing, being trusted (a trusted aggregator: it is no observer).
BOUNDARIES = ("plain", "secagg", "shuffler", "trusted")
ANALYSES = ("sound", "paper")
#: Which models a third party sees: every round's, or only the run's final one (privacy.release).
RELEASES = ("every_round", "final")
#: Whose analysis ``analysis="paper"`` applies to a release (module docstring).
PAPERS = ("noble", "heikkila", "mcmahan", "asoodeh")
#: What the amplified epsilon of ``paper="mcmahan"`` assumes of the threat model (module docstring).
COHORT_SECRET = ("the cohort is secret from the third party and the other silos (McMahan et al. 2018, Thm 1): each "
                 "round's model is then a Poisson subsampled Gaussian to them; an observer that learns who took part "
                 "is charged the participation mixture (privacy.analysis = 'sound') instead")
#: privacy.cohort: who learns who takes part in a round besides the server, which draws it (module docstring).
COHORTS = ("secret", "members", "published")
#: What the default's amplified epsilon assumes, for the observers that do not know the cohort (results.json).
COHORT_UNKNOWN = ("the cohort is drawn from the server's secret key and neither published nor told to {observers} "
                  "(privacy.cohort = 'secret'): the server's noise is then amplified by client sampling towards them "
                  "(McMahan et al. 2018, Thm 1); set privacy.cohort = 'members' or 'published' if they can learn it")

#: What the paper analysis assumes that does not hold for general losses (reported in results.json).
PAPER_UNPROVEN = (
    "client sampling: Wang et al. 2019 Thm 9 applied with ratio l around the record-level curve of a round; it needs "
    "a curve for replacing a whole client, so it can under-state epsilon (sound: the participation mixture)",
    "noise credit: the cohort's noise sigma sqrt(lM) credited to every local step; other clients' later local steps "
    "can cancel their earlier noise, and SCAFFOLD's control variates carry it into later rounds (sound: only draws "
    "that enter the aggregate additively with nothing computed after them)",
)
#: What Heikkilä et al.'s analysis assumes for S > 1 local steps that does not hold for general losses.
JOINT_PAPER_UNPROVEN = (
    "noise credit: the cohort's summed noise shares credited to every one of the S local steps (Heikkilä et al., "
    "Thm 4.7 via Lemma 4.6); a client's step s is computed at its own unreleased iterate, which depends on its earlier "
    "noise, so other clients can cancel their earlier shares and only the last step's shares reach the sum intact "
    "(sound: the cohort's shares credited to the last step only)",
)


@dataclass(frozen=True)
class Cohort:
    """How the record owner's client takes part in one round, as the accounting needs it.

    Attributes:
      population: M, the clients the cohort is drawn from.
      size: n, the cohort (its expected size for Poisson).
      probability: the owner's chance of taking part, drawn independently of the data.
      silo_probability: the chance another silo can put on it, knowing whether itself takes part.
      min_size: the fewest clients a cohort that holds the owner can have (others' noise is credited for
        min_size - 1 of them); 1 for Poisson cohorts, whose size is random.
    """

    population: int
    size: int
    probability: float
    silo_probability: float
    min_size: int
    #: a cohort of exactly ``size`` drawn without replacement (``fixed``)
    without_replacement: bool = False
    #: drawn from public randomness (``registry.AlgorithmSpec.public_cohorts``): every observer may know it
    public: bool = False

    @classmethod
    def fixed(cls, population: int, size: int) -> "Cohort":
        """Exactly n of M without replacement: p = n/M; a silo in the cohort puts (n-1)/(M-1) on the owner, one
        outside it n/(M-1)."""
        silo = 1.0 if population <= 1 else min(1.0, size / (population - 1))
        return cls(population, size, size / population, silo, size, True)

    def coalition_probability(self, members: int) -> float:
        """The chance a coalition of ``members`` other clients can put on the owner taking part, knowing which of
        them take part: for a fixed-size cohort at most n/(M - m) (all of them outside it); Poisson and scheduled
        cohorts: the silo's (participation is independent of the others', or certain)."""
        if members <= 1 or not self.without_replacement:
            return self.silo_probability
        return 1.0 if self.population <= members else min(1.0, self.size / (self.population - members))

    @classmethod
    def poisson(cls, population: int, rate: float) -> "Cohort":
        return cls(population, round(rate * population), rate, rate, 1)

    @classmethod
    def scheduled(cls, population: int, size: int, min_size: int, takes_part: bool) -> "Cohort":
        """A deterministic schedule (round robin, disjoint batches): the owner takes part or not."""
        p = 1.0 if takes_part else 0.0
        return cls(population, size, p, p, min_size)


@dataclass(frozen=True)
class Release:
    """What one client's participation in a round releases about one of its records, declared before noise is drawn.

    Attributes:
      step_events: one record-level event per noise draw, in order (record sampling around the noise, in units of the
        owner's sensitivity, e.g. ``SampledWithoutReplacementDpEvent(n, b, GaussianDpEvent(z))``).
      additive: for each draw, whether it enters the released aggregate additively with nothing computed after it,
        in this round or a later one: the only draws another client's noise share may be credited to.
      sensitivity_ratio: min_j Delta_j / max_j Delta_j over the clients' sensitivities (1 when all are equal).
      shares: when clients' noise is not their sensitivity times one multiplier (Heikkilä et al.'s appendix:
        client-specific learning rates, clips and shares), or the server weights their messages (FedSGD-DPC's
        d_i), every client's (noise std s_j, sensitivity Delta_j) of an additive draw in the units of the released
        aggregate (a weight multiplies both); the declared draws are at z = min_j s_j / Delta_j. k other shares are
        credited as the worst owner o and the k smallest other shares: ``credited_variance``; empty: every share at
        ``sensitivity_ratio``.
      cohort: how the owner takes part in this round, when the algorithm fixes it: an algorithm that calibrates its
        noise to each client's number of replies under a data-independent schedule (drawn from the run's seed before
        the first round) accounts conditionally on that schedule, which is sound towards every observer (knowing the
        schedule only helps one); None: the client sampler's participation.
      contributors: the fewest cohort members whose noise shares are sure to reach the aggregate (secure
        aggregation's dropout threshold); None: the whole cohort.
      colluders: m, the clients of the other-silo coalition, which subtract their own shares (module docstring).
      paper: whose analysis ``analysis="paper"`` applies (``PAPERS``).
      hidden: the round as one step of projected noisy SGD over disjoint batches (a ``ProjectedStepDpEvent``,
        its ``composed`` left out), for an observer who sees only the final model; None: the round's iterate is
        accounted by composition only.
      assumes: what ``analysis="paper"`` assumes of this release beyond the paper's own assumptions (reported with
        ``unproven``).
      server_events: one record-level event per noise draw of the server's step in this round, in order, as the
        clients' (record sampling around the noise, in units of the record's sensitivity on what the server noises):
        what the observers of the server's output are charged instead of the clients' draws (module docstring); the
        simulator checks the server's draws against them. Empty: the server draws nothing.
      owner: the client whose record this release describes (its draws at its own noise, ``credited_variance`` for
        it alone); None: the worst owner over ``shares``.
      owners: per client id o, the release of a record of client o (``owner`` = o), when clients' sampling ratios or
        noise differ: every observer is then charged a ``WorstOwnerDpEvent`` of their events, this release's own
        (the worst owner's noise at the largest ratio) as its bound, and the ledger accounts each owner
        (``dpfl.accounting.owners``). Empty: this release holds for every owner.
    """

    step_events: tuple
    additive: tuple
    sensitivity_ratio: float = 1.0
    cohort: Cohort | None = None
    contributors: int | None = None
    colluders: int = 1
    paper: str = "noble"
    hidden: ProjectedStepDpEvent | None = None
    shares: tuple = ()
    assumes: tuple = ()
    server_events: tuple = ()
    owner: int | None = None
    owners: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "step_events", tuple(self.step_events))
        object.__setattr__(self, "server_events", tuple(self.server_events))
        object.__setattr__(self, "additive", tuple(bool(a) for a in self.additive))
        object.__setattr__(self, "shares", tuple((float(s), float(d)) for s, d in self.shares))
        object.__setattr__(self, "assumes", tuple(self.assumes))
        object.__setattr__(self, "owners", tuple(self.owners))
        if self.owners and (self.server_events or self.hidden is not None
                            or any(r.owner != o for o, r in enumerate(self.owners))):
            raise ValueError("per-owner releases are indexed by client id (owners[o].owner == o), for releases "
                             "without server noise or hidden iterates")
        if self.owner is not None and not 0 <= self.owner < len(self.shares):
            raise ValueError(f"owner = {self.owner}: a client id among the {len(self.shares)} shares")
        if any(not (s > 0 and d > 0) for s, d in self.shares):
            raise ValueError(f"shares = {self.shares}: noise stds and sensitivities are positive")
        if len(self.step_events) != len(self.additive):
            raise ValueError(f"a release needs one additive flag per noise draw: {len(self.step_events)} draws, "
                             f"{len(self.additive)} flags")
        if not 0 <= self.sensitivity_ratio <= 1:
            raise ValueError(f"sensitivity_ratio = {self.sensitivity_ratio} is not in [0, 1]")
        if self.contributors is not None and self.contributors < 1:
            raise ValueError(f"contributors = {self.contributors}: at least the owner's share reaches the aggregate")
        if self.colluders < 1:
            raise ValueError(f"colluders = {self.colluders}: the other-silo coalition has at least one client")
        if self.paper not in PAPERS:
            raise ValueError(f"paper = {self.paper!r} is not one of {PAPERS}")

    def others(self, cohort: Cohort) -> int:
        """How many other clients' shares are credited to an additive draw: min(cohort, contributors) - 1."""
        reach = cohort.min_size if self.contributors is None else min(cohort.min_size, self.contributors)
        return max(reach - 1, 0)

    @property
    def unproven(self) -> tuple[str, ...]:
        """What ``analysis="paper"`` assumes of this release that does not hold for general losses."""
        if self.paper == "noble":
            return PAPER_UNPROVEN
        if self.paper == "mcmahan":  # sound under its threat model, which the family states (``COHORT_SECRET``)
            return self.assumes
        return (() if all(self.additive) else JOINT_PAPER_UNPROVEN) + self.assumes

    def credited_variance(self, others: int) -> float:
        """The variance k = ``others`` more clients' shares add at least, in units of the owner's (z Delta)^2: k r^2,
        or with ``shares`` min_o (s_o^2 + the k smallest s_j^2 of j != o) / (z Delta_o)^2 - 1 (the worst owner, the
        weakest k others the cohort can hold), over o = ``owner`` alone where it is given (its draws at its own
        z = s_o / Delta_o)."""
        if not self.shares:
            return others * self.sensitivity_ratio**2
        if others >= len(self.shares):
            raise ValueError(f"{others} other shares credited, but only {len(self.shares)} clients")
        z = min(s / d for s, d in self.shares) if self.owner is None else \
            self.shares[self.owner][0] / self.shares[self.owner][1]
        variances = sorted(s * s for s, _ in self.shares)
        weakest, next_one = sum(variances[:others]), variances[others]

        def others_of(std: float) -> float:  # the k smallest variances without the owner's own
            return weakest - std * std + next_one if std * std <= variances[others - 1] else weakest

        candidates = self.shares if self.owner is None else self.shares[self.owner:self.owner + 1]
        return min((s * s + (others_of(s) if others else 0.0)) / (z * d) ** 2 for s, d in candidates) - 1

    def own(self) -> dp_event.DpEvent:
        """Every draw at the owner's own noise (what the owner's message alone releases)."""
        return _compose(self.step_events)

    def credited(self, others: int) -> dp_event.DpEvent:
        """The additive draws with ``others`` more clients' shares summed in, the rest at the owner's own noise."""
        factor = math.sqrt(1 + self.credited_variance(others))
        return _compose([_summed(e, factor) if additive and others > 0 else e
                         for e, additive in zip(self.step_events, self.additive)])


def local_steps_additive(local_steps: int, moves_locally: bool, carries_noise: bool) -> tuple[bool, ...]:
    """Which of K local steps' noise draws enter a round's aggregate additively with nothing computed after them.

    Steps that move the local model (FedAvg): only the last, since every later step is computed at an iterate that
    depends on the earlier noise. Steps all at the round's start point (FedSGD): all. A client state that carries the
    noisy steps into later rounds (SCAFFOLD's c_i): none.
    """
    if carries_noise:
        return (False,) * local_steps
    if not moves_locally:
        return (True,) * local_steps
    return (False,) * (local_steps - 1) + (True,)


def cohort_known_to(boundary: str, cohort: str = "secret") -> frozenset[str]:
    """The observers that know who takes part in each round (module docstring, "Who knows the cohort"): the server,
    which draws it; another silo behind secure aggregation or with privacy.cohort = "members"; everyone if the cohort
    is "published"."""
    if cohort not in COHORTS:
        raise ConfigError("privacy.cohort", cohort, f"one of {list(COHORTS)}")
    if cohort == "published":
        return frozenset(OBSERVERS)
    return frozenset((SERVER, OTHER_SILO) if cohort == "members" or boundary == "secagg" else (SERVER,))


def observer_events(
    release: Release,
    cohort: Cohort,
    boundary: str = "plain",
    analysis: str = "sound",
    released: str = "every_round",
    knows_cohort: frozenset[str] | None = None,
) -> dict[str, dp_event.DpEvent]:
    """Each observer's event of one round (see the module docstring); a trusted aggregator's server is no observer.
    ``released`` = "final": a third party sees only the run's final model (hidden iterates). ``knows_cohort``: the
    observers that know who takes part (default ``cohort_known_to(boundary)``: a secret cohort)."""
    if boundary not in BOUNDARIES:
        raise ConfigError("privacy.boundary", boundary, f"one of {list(BOUNDARIES)}")
    if analysis not in ANALYSES:
        raise ConfigError("privacy.analysis", analysis, f"one of {list(ANALYSES)}")
    if released not in RELEASES:
        raise ConfigError("privacy.release", released, f"one of {list(RELEASES)}")
    knows = cohort_known_to(boundary) if knows_cohort is None else frozenset(knows_cohort) | {SERVER}
    events = _composition_events(release, cohort, boundary, analysis)
    if release.owners and analysis == "sound":  # each owner's events, this release's as their bound
        # (``dpfl.accounting.owners``); the papers' accountants charge one event per round, this release's
        per_owner = [_composition_events(r, cohort, boundary, analysis) for r in release.owners]
        return {o: WorstOwnerDpEvent(tuple(owner[o] for owner in per_owner), bound) for o, bound in events.items()}
    if release.server_events:
        events.update(_server_noised(release, cohort, events, analysis == "paper" and release.paper == "mcmahan",
                                     knows))
    if released == "final" and release.hidden is not None:
        events[THIRD_PARTY] = attr.evolve(release.hidden, composed=events[THIRD_PARTY])
    return events


def _composition_events(release: Release, cohort: Cohort, boundary: str, analysis: str) -> dict:
    """Each observer's event when it composes every round it sees."""
    if analysis == "paper" and release.paper == "noble":
        events = _paper_events(release, cohort, boundary)
    else:
        if analysis == "paper" and release.paper == "heikkila":  # every draw credited (JOINT_PAPER_UNPROVEN)
            release = dataclasses.replace(release, additive=(True,) * len(release.step_events))
        own = release.own()
        aggregate = _participation(cohort.probability, _credited(release, cohort, 0))
        events = {
            THIRD_PARTY: aggregate,
            SERVER: aggregate if boundary == "secagg" else _participation(cohort.probability, own),
            OTHER_SILO: _participation(cohort.coalition_probability(release.colluders),
                                       _credited(release, cohort, release.colluders)),
        }
    return {o: e for o, e in events.items() if o in observers_of(boundary)}


#: K ~ Binomial below this lower tail mass is charged as no other share at all (``poisson_shares``)
SHARE_COUNT_TAIL = 1e-12
#: the largest ratio of the summed noise variances (1 + k_hi r^2) / (1 + k_lo r^2) within one bin of share counts
SHARE_BIN_RATIO = 1.05


def _credited(release: Release, cohort: Cohort, excluded: int) -> dp_event.DpEvent:
    """The owner's draws with the other clients' shares credited to its additive draws (module docstring, "Noise
    credit"), towards an observer that removes ``excluded`` clients' own shares: ``min_size - 1 - excluded`` others
    for a cohort of fixed size; for a Poisson cohort, whose size is random, ``poisson_shares``."""
    others = max(release.others(cohort) - excluded, 0)
    poisson = dataclasses.replace(cohort, public=False) == Cohort.poisson(cohort.population, cohort.probability)
    if not poisson or not 0 < cohort.probability < 1 or not any(release.additive):
        return release.credited(others)
    cap = None if release.contributors is None else max(release.contributors - 1 - excluded, 0)
    bins = poisson_shares(cohort.population - 1 - excluded, cohort.probability, cap, release.sensitivity_ratio)
    if len(bins) == 1:
        return release.credited(bins[0][1])
    return LabelledMixtureDpEvent(tuple(w for w, _ in bins), tuple(release.credited(k) for _, k in bins))


@functools.lru_cache(maxsize=64)
def poisson_shares(clients: int, rate: float, cap: int | None = None,
                   ratio: float = 1.0) -> tuple[tuple[float, int], ...]:
    """The other members' count K of a Poisson cohort that holds the owner, in bins: [(P(bin), the bin's smallest k)].

    The other ``clients`` each take part with probability ``rate``, independently of the owner and of the data, so
    K ~ Binomial(clients, rate), and the round is the mixture over K of the owner's draws credited with K shares
    (``LabelledMixtureDpEvent``, exact for an observer that learns K, an upper bound for one that does not). Each bin
    is charged its smallest k (fewer shares, less noise: a dominating pair for every k in it): k below the
    ``SHARE_COUNT_TAIL`` quantile as k = 0 (no share), then bins within which the credited variance 1 + k r^2 (r the
    sensitivity ratio) grows by at most ``SHARE_BIN_RATIO``, up to the upper ``SHARE_COUNT_TAIL`` quantile; k above
    ``cap`` (the shares sure to reach a secure sum with dropouts) counts as ``cap``."""
    from scipy import stats

    top = clients if cap is None else min(clients, cap)
    binomial = stats.binom(clients, rate)
    low = min(int(binomial.ppf(SHARE_COUNT_TAIL)) if binomial.cdf(0) < SHARE_COUNT_TAIL else 0, top)
    high = min(int(binomial.isf(SHARE_COUNT_TAIL)) + 1, top)
    edges = [0] if low > 0 else []
    k = low
    while True:
        edges.append(k)
        if k >= high:
            break
        step = 1 + k * ratio * ratio
        nxt = k + 1
        while nxt < high and 1 + (nxt + 1) * ratio * ratio <= SHARE_BIN_RATIO * step:
            nxt += 1
        k = nxt
    below = binomial.cdf(np.asarray(edges) - 1)  # P(K < edge)
    masses = np.diff(np.append(below, 1.0))
    return tuple((float(mass), edge) for mass, edge in zip(masses, edges))


def _server_noised(release: Release, cohort: Cohort, events: dict, mcmahan: bool = False,
                   knows: frozenset[str] = frozenset(OBSERVERS)) -> dict:
    """The events of the observers of the server's output (third party, other silo) when the server noises it: its
    draws composed, within the owner's participation (module docstring, "The server's own noise"), or their
    secret-cohort amplification towards an observer not in ``knows`` where it holds; ``mcmahan``: the Poisson
    subsampled Gaussian towards both, or a ConfigError (module docstring, ``"mcmahan"``)."""
    drawn = _compose(release.server_events)
    probability = {THIRD_PARTY: cohort.probability, OTHER_SILO: cohort.coalition_probability(release.colluders)}
    if mcmahan:
        sampled = poisson_sampled_gaussian(release.server_events, cohort)
        return {o: sampled for o in probability if o in events}
    out = {}
    for observer, p in probability.items():
        if observer in events:
            members = 0 if observer == THIRD_PARTY else release.colluders
            amplified = None if observer in knows else secret_cohort_event(release.server_events, cohort, members)
            out[observer] = _participation(p, drawn) if amplified is None else amplified
    return out


def secret_cohort_event(draws, cohort: Cohort, members: int = 0) -> dp_event.DpEvent | None:
    """One round of the server's Gaussian ``draws`` towards an observer that does not know the cohort and knows the
    participation of ``members`` clients other than the owner (module docstring, "The secret-cohort
    amplification"): the Poisson subsampled Gaussian, or sampling without replacement of n from the M - members
    clients it does not know about; None where the amplification does not hold (public or scheduled cohorts, noise
    other than Gaussian), and the caller charges the participation mixture."""
    if cohort.public or not draws or any(type(e) is not dp_event.GaussianDpEvent for e in draws):
        return None
    gaussian = dp_event.GaussianDpEvent(sum(e.noise_multiplier ** -2 for e in draws) ** -0.5)
    if cohort == Cohort.poisson(cohort.population, cohort.probability):
        return gaussian if cohort.probability >= 1 else dp_event.PoissonSampledDpEvent(cohort.probability, gaussian)
    if cohort != Cohort.fixed(cohort.population, cohort.size):
        return None
    unknown = cohort.population - members
    if cohort.size >= unknown:  # the owner is surely in when the members are out
        return gaussian
    return dp_event.SampledWithoutReplacementDpEvent(unknown, cohort.size, gaussian)


def poisson_sampled_gaussian(draws, cohort: Cohort) -> dp_event.DpEvent:
    """``PoissonSampledDpEvent(q, GaussianDpEvent(z))``: one round of Gaussian ``draws`` under the owner's one
    participation coin, for an observer that does not know the cohort (``secret_cohort_event``), as McMahan et al.
    state it (module docstring, ``"mcmahan"``). Refused where that cannot hold: a cohort of fixed size, a schedule,
    or public randomness."""
    if cohort.public:
        raise ConfigError("privacy.analysis", "paper",
                          "'sound' for a family whose cohorts are public (drawn from run.seed): McMahan et al.'s "
                          "amplification assumes the cohort is secret from the observers of the model")
    if cohort != Cohort.poisson(cohort.population, cohort.probability):
        raise ConfigError("algorithm.client_sampling", "not 'poisson'",
                          "'poisson' under privacy.analysis = 'paper' (McMahan et al.'s amplification needs each "
                          "client to take part independently, with a cohort secret from the observers); the sound "
                          "analysis covers the other schemes")
    sampled = secret_cohort_event(draws, cohort)
    if sampled is None:
        raise ValueError(f"McMahan et al.'s amplification is derived for the server's Gaussian draws, not {draws}")
    return sampled


def observers_of(boundary: str) -> tuple[str, ...]:
    """Who observes a run with this boundary: everyone, except the server behind a trusted aggregator."""
    return (THIRD_PARTY, OTHER_SILO) if boundary == "trusted" else OBSERVERS


def _paper_events(release: Release, cohort: Cohort, boundary: str):
    """Noble et al. 2022, App. B, extended to every observer as dpfl did before the sound analysis (see the module
    docstring): credit at every step, Wang et al.'s subsampling at the client level."""
    num_clients, cohort_size = cohort.population, cohort.size
    if cohort != Cohort.fixed(num_clients, cohort_size):
        raise ConfigError("algorithm.client_sampling", "not 'fixed'",
                          "'fixed' under privacy.analysis = 'paper' (the paper samples fixed-size cohorts); the sound "
                          "analysis covers the other schemes")
    if any(not isinstance(e, (dp_event.SampledWithoutReplacementDpEvent, dp_event.GaussianDpEvent,
                              dp_event.NonPrivateDpEvent)) for e in release.step_events):
        raise ConfigError("algorithm.record_sampling", "poisson",
                          "'fixed' under privacy.analysis = 'paper' (the paper samples fixed-size batches); the sound "
                          "analysis covers Poisson record sampling")
    every_step = dataclasses.replace(release, additive=(True,) * len(release.step_events))  # its shares' units kept
    aggregate = every_step.credited(cohort_size - 1)
    third_party = aggregate
    if cohort_size < num_clients:
        third_party = dp_event.SampledWithoutReplacementDpEvent(num_clients, cohort_size, aggregate)
    return {
        THIRD_PARTY: third_party,
        SERVER: aggregate if boundary == "secagg" else release.own(),
        OTHER_SILO: every_step.credited(max(cohort_size - 2, 0)),
    }


def scale_noise(event: dp_event.DpEvent, factor: float) -> dp_event.DpEvent:
    """Returns ``event`` with every Gaussian noise multiplier multiplied by ``factor``.

    Describes the sum of independent Gaussian noise shares (their variances add), and likewise of integer Skellam
    shares on one lattice (the ``SkellamDpEvent``'s variance times ``factor``^2; its scale and sensitivities are
    the owner's) and of binomial noise bits (Bin(m, p) + Bin(m', p) = Bin(m + m', p): a ``BinomialSumDpEvent``'s
    trials, the multiplier of its variance, times factor^2, rounded down). Other noise (Laplace, and the discrete
    Gaussian of run.secure_noise: a sum of discrete Gaussians is not one) does not sum to a mechanism of its family:
    a ValueError, so that the caller charges the owner's own message instead.
    """
    if isinstance(event, dp_event.GaussianDpEvent):
        return dp_event.GaussianDpEvent(event.noise_multiplier * factor)
    if isinstance(event, SkellamDpEvent):  # Sk(l1, l1) + Sk(l2, l2) = Sk(l1 + l2, l1 + l2): variances add
        return attr.evolve(event, variance=event.variance * factor**2)
    if isinstance(event, BinomialSumDpEvent):
        return attr.evolve(event, trials=math.floor(event.trials * factor**2 + 1e-9))
    if isinstance(event, (dp_event.NoOpDpEvent, dp_event.NonPrivateDpEvent)):
        return event
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([scale_noise(e, factor) for e in event.events])
    children = {
        field.name: getattr(event, field.name)
        for field in attr.fields(type(event))
        if isinstance(getattr(event, field.name), dp_event.DpEvent)
    }
    if not children:
        raise ValueError(
            f"cannot aggregate noise of {type(event).__name__} across clients: only Gaussian noise shares sum to a "
            "mechanism of the same family"
        )
    return attr.evolve(event, **{name: scale_noise(child, factor) for name, child in children.items()})


def _summed(event: dp_event.DpEvent, factor: float) -> dp_event.DpEvent:
    """The owner's draw with other clients' shares summed in; a draw whose noise does not sum (Laplace) keeps the
    owner's own noise."""
    try:
        return scale_noise(event, factor)
    except ValueError:
        return event


def _compose(events) -> dp_event.DpEvent:
    """Runs of equal events as ``SelfComposedDpEvent`` (cheap to account and to read), in order."""
    runs: list[list] = []
    for event in events:
        if runs and runs[-1][0] == event:
            runs[-1][1] += 1
        else:
            runs.append([event, 1])
    parts = [dp_event.SelfComposedDpEvent(e, n) for e, n in runs]
    if not parts:
        return dp_event.NoOpDpEvent()
    return parts[0] if len(parts) == 1 else dp_event.ComposedDpEvent(parts)


def _participation(probability: float, event: dp_event.DpEvent) -> dp_event.DpEvent:
    if probability <= 0:
        return dp_event.NoOpDpEvent()
    if isinstance(event, dp_event.NonPrivateDpEvent):
        return event
    return event if probability >= 1 else ParticipationDpEvent(probability, event)


__all__ = ["OBSERVERS", "THIRD_PARTY", "SERVER", "OTHER_SILO", "BOUNDARIES", "ANALYSES", "PAPERS", "RELEASES",
           "PAPER_UNPROVEN", "JOINT_PAPER_UNPROVEN", "COHORT_SECRET", "COHORTS", "COHORT_UNKNOWN", "Cohort", "Release",
           "cohort_known_to", "local_steps_additive", "observer_events", "observers_of", "poisson_sampled_gaussian",
           "poisson_shares", "secret_cohort_event", "scale_noise"]
