"""Privacy events dp_accounting lacks, and JSON-safe (de)serialisation of every event.

``SkellamDpEvent`` is the Skellam mechanism of Agarwal, Kairouz, Liu (NeurIPS 2021), the infinitely divisible
integer noise used with secure aggregation in the joint-noise paper (Heikkilä 2024). Its RDP is
``dpfl.accounting.skellam.skellam_rdp``; of one coordinate, its exact PLD is ``dpfl.accounting.discrete_pld``.

``DiscreteGaussianDpEvent`` is dpfl's secure Gaussian mechanism (``run.secure_noise``, ``dpfl.noise``): the value
rounded to a grid, exact discrete Gaussian noise in grid units (Canonne, Kamath, Steinke 2020). Its RDP is
``dpfl.accounting.rdp.discrete_gaussian_rdp``.

``ParticipationDpEvent`` is one round of a client-sampled federated algorithm seen from one record: the record's owner
takes part with some probability, independently of the data, and then releases the inner event; otherwise the round
does not depend on the record (see its docstring for its RDP and PLD). ``LabelledMixtureDpEvent`` generalises it: a
data-independent label, shown to the observer, picks one of several events.

**One meaning of a noise multiplier.** Throughout dpfl a ``GaussianDpEvent(z)`` (``LaplaceDpEvent(b)``) means noise of
standard deviation (scale) z times the l2 (l1) sensitivity *under the neighbouring relation it is accounted under*:
the largest distance between the released statistic on two neighbouring datasets. Under replace-one neighbouring of
a batch mean of C-clipped gradients that distance is 2C/b, under add/remove C/b. dp_accounting's RDP accountant reads
events this way; its PLD accountant reads a replace-one Gaussian as two add/remove sensitivities apart, which
``dpfl.accounting.pld`` corrects, so that both accountants give the same event the same meaning.

``ProjectedStepDpEvent`` is one step of projected noisy SGD over disjoint batches (Asoodeh, Chen, Calmon, Ozgur 2021,
Algorithm 1) towards an observer who sees only the model the run finally releases: the last-iterate accountant
(``dpfl.accounting.accountants``, Theorem 2 / Corollary 3) composes a run's steps in order; it also carries what the
step would cost if its iterate were released too, for the composition baseline reported beside it.

``BinomialSumDpEvent`` is one run of Cheu et al.'s (2021) binomial vector summation seen by an observer of the
shuffled messages: approximately RDP (Bin(m, p) noise has finite support), see ``dpfl.accounting.binomial``; of
one coordinate with p = 1/2, its exact PLD is ``dpfl.accounting.discrete_pld``.

``event_to_dict`` / ``event_from_dict`` turn any event of ``dp_accounting.dp_event`` or of this module into plain
dicts (a ``"type"`` tag plus the fields, recursively) and back; the tag is looked up in a fixed registry, so a JSON
file can never make dpfl import arbitrary code.
"""

from __future__ import annotations

import inspect
import math

import attr
from dp_accounting import dp_event

from dpfl.errors import ConfigError, check_range


def skellam_l1_bound(l2_sensitivity: float, dimension: int) -> float:
    """l1 sensitivity bound D1 = D2 min(sqrt(d'), D2), d' = 2^ceil(log2 d) the rotation's padded dimension.

    After randomised rounding to integers ||x||_1 <= ||x||_2^2, and always ||x||_1 <= sqrt(d') ||x||_2 (Heikkilä 2024,
    the author's code, following Agarwal et al. 2021).
    """
    check_range("dimension", dimension, 1, integer=True)
    padded = 2 ** math.ceil(math.log2(dimension))
    return l2_sensitivity * min(math.sqrt(padded), l2_sensitivity)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class SkellamDpEvent(dp_event.DpEvent):
    """The (scaled) multidimensional Skellam mechanism, Agarwal et al. 2021 (Heikkilä 2024, Skellam base RDP).

    Attributes:
      l2_sensitivity: D2, the l2 sensitivity of the summed (unscaled) statistic.
      l1_sensitivity: D1, its l1 sensitivity (``skellam_l1_bound`` gives the usual bound from the dimension).
      variance: mu, the per-coordinate noise variance in the statistic's units (sigma^2 D2^2 for a noise multiplier
        sigma); the integer Skellam noise has variance s^2 mu.
      scale: s, the factor applied before rounding to integers.
      dimension: d, the coordinates noised, when declared (None: any). The RDP bound holds for any d through D1;
        the exact PLD (``dpfl.accounting.discrete_pld``) is built for d = 1 only.
    """

    l2_sensitivity: float
    l1_sensitivity: float
    variance: float
    scale: float = 1.0
    dimension: int | None = None


@attr.s(frozen=True, slots=True, auto_attribs=True)
class DiscreteGaussianDpEvent(dp_event.DpEvent):
    """The rounded discrete Gaussian mechanism of ``run.secure_noise`` (``dpfl.noise.DiscreteGaussianMechanism``), in
    units of the value's l2 sensitivity Delta (under the relation it is accounted under, as a ``GaussianDpEvent``).

    The value x in R^d is rounded to the nearest point of the grid gamma Z^d, gamma = 2^-k times a power of two at
    least Delta (so Delta / gamma <= 2^k), and integer noise Y ~ N_Z(0, s)^d is added in grid units, s >= (z 2^k)^2
    (Canonne, Kamath, Steinke 2020: P(Y_j = y) proportional to exp(-y^2 / (2 s))).

    **Its sensitivity in grid units.** Rounding moves each coordinate by at most 1/2, so two neighbouring values'
    rounded vectors u, u' satisfy ||u - u'||_2 <= ||x - x'||_2 / gamma + ||r - r'||_2 <= 2^k + sqrt(d) =: Delta'
    (r, r' in [-1/2, 1/2]^d the rounding errors: ||r - r'||_2 <= sqrt(d)), an integer vector.

    **Its RDP.** For integer means mu, nu, D_a(N_Z(mu, s) || N_Z(nu, s)) <= a (mu - nu)^2 / (2 s) at every order
    a > 1 (Canonne, Kamath, Steinke 2020, Sec. 2: the discrete Gaussian with integer sensitivity Delta' is
    (Delta'^2 / (2 s))-zCDP; their Thm 14 for the multivariate mechanism); a product of independent coordinates adds
    the coordinates' Renyi divergences, so the d-dimensional mechanism has

        eps(a) = a ||u - u'||^2 / (2 s) <= a Delta'^2 / (2 s) <= a / (2 z_eff^2),     z_eff = z 2^k / (2^k + sqrt(d)),

    the curve of the continuous Gaussian at multiplier z_eff (``dpfl.accounting.rdp.discrete_gaussian_rdp``). It is
    the zCDP curve and nothing more: under subsampling only bounds valid for ANY mechanism with this curve apply
    (Wang, Balle, Kasiviswanathan 2019, Thm 9; Zhu, Wang 2019, Thm 6), never the continuous Gaussian's tight
    subsampled curve nor its PLD (the PLD accountant refuses the event: its privacy loss is not the Gaussian's).

    Attributes:
      noise_multiplier: z, the noise's std in units of Delta before the rounding is charged (s >= (z 2^k)^2).
      grid_bits: k, the grid's resolution below the sensitivity.
      dimension: d, the coordinates rounded and noised.
    """

    noise_multiplier: float
    grid_bits: int
    dimension: int

    @property
    def effective_multiplier(self) -> float:
        """z_eff = z 2^k / (2^k + sqrt(d)): the noise over the grid-unit sensitivity Delta' = 2^k + sqrt(d)."""
        return self.noise_multiplier * 2.0**self.grid_bits / (2.0**self.grid_bits + math.sqrt(self.dimension))


@attr.s(frozen=True, slots=True, auto_attribs=True)
class DisjointUnionDpEvent(dp_event.DpEvent):
    """Mechanisms run on DISJOINT parts of the data (parallel composition, McSherry 2009, Thm 4).

    A record lies in exactly one part, so only that part's mechanism depends on it: the guarantee is the worst part's.
    For RDP this is the pointwise maximum of the parts' curves (each order separately: the record's part may differ
    between neighbours only through that part). Used for one-pass algorithms over disjoint batches (Asoodeh et al.
    2021; Lowy et al. 2023).

    Attributes:
      events: the parts' events (a tuple, so the event stays hashable).
    """

    events: tuple = attr.ib(converter=tuple)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class WorstOwnerDpEvent(dp_event.DpEvent):
    """A round that releases ``events[o]`` about a record of client o (one part per client id), and ``bound``, an
    event that dominates every part: the guarantee is the worst owner's, each owner's parts composed over the rounds
    (``dpfl.accounting.owners``).

    Attributes:
      events: per client id, the round's event for a record of that client (a tuple, so the event stays hashable).
      bound: one event at least as costly as every part, for every composition (the worst owner's noise at the
        largest sampling ratio of any client).
    """

    events: tuple = attr.ib(converter=tuple)
    bound: dp_event.DpEvent = attr.ib(factory=dp_event.NoOpDpEvent)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ParticipationDpEvent(dp_event.DpEvent):
    """The record's owner takes part with ``probability`` (drawn independently of the data) and then releases
    ``event``; when it does not take part, the output's distribution does not depend on the record.

    This is client sampling seen from one record (record-level DP in federated learning): the cohort is fixed-size
    without replacement (probability cohort / population) or Poisson (the client rate). Writing the output as
    P = (1 - p) Q + p P1 and P' = (1 - p) Q + p P1' (the same Q under both datasets), the joint convexity of
    exp((a - 1) D_a) gives

        eps(a) <= log(1 + p (exp((a - 1) eps_in(a)) - 1)) / (a - 1),

    with equality when Q is disjoint from P1 and P1' (an observer who learns whether the owner took part, like the
    server, which knows the cohort). The PLD counterpart is that same disjoint mixture, a dominating pair for any
    Q: with probability 1 - p the privacy loss is 0, else it follows the inner event's (``dpfl.accounting.pld``).
    Valid for any neighbouring relation of the inner event, fixed or Poisson cohorts, and an inner event that holds
    for every cohort containing the owner.

    Unlike Wang et al.'s subsampling bound, this needs no curve for replacing a whole client: the record-level inner
    curve is enough because the "owner absent" branch is the same under both datasets.

    Attributes:
      probability: p in [0, 1], the owner's chance of taking part in the round.
      event: what the owner's participation releases about the record (given any cohort that contains it).
    """

    probability: float
    event: dp_event.DpEvent


@attr.s(frozen=True, slots=True, auto_attribs=True)
class LabelledMixtureDpEvent(dp_event.DpEvent):
    """A label k drawn with probability ``weights[k]``, independently of the data and shown to the observer, then
    ``events[k]``: e.g. the number of other clients whose noise shares a Poisson cohort sums with the owner's
    (``dpfl.accounting.observers``).

    Given the label, the pair is the k-th event's; so the PLD is the mixture sum_k w_k PLD_k and the RDP is
    log(sum_k w_k exp((a - 1) eps_k(a))) / (a - 1), both exact for an observer that sees the label and, by the joint
    convexity of the hockey-stick divergence and of exp((a - 1) D_a), upper bounds for one that does not.
    ``ParticipationDpEvent(p, e)`` is the mixture of (1 - p, p) over (no event, e).

    Attributes:
      weights: the labels' probabilities (a tuple summing to 1).
      events: the event of each label (a tuple of the same length).
    """

    weights: tuple = attr.ib(converter=tuple)
    events: tuple = attr.ib(converter=tuple)

    def __attrs_post_init__(self):
        if len(self.weights) != len(self.events) or not self.events:
            raise ValueError(f"a labelled mixture needs one weight per event: {len(self.weights)} weights, "
                             f"{len(self.events)} events")
        if any(not 0 <= w <= 1 for w in self.weights) or abs(sum(self.weights) - 1) > 1e-9:
            raise ValueError(f"weights = {self.weights}: probabilities summing to 1")


@attr.s(frozen=True, slots=True, auto_attribs=True)
class ProjectedStepDpEvent(dp_event.DpEvent):
    """Step t of Algorithm 1 of Asoodeh et al. (2021) seen by an observer of the released model only.

    W_t = proj_rho(W_{t-1} - (eta_t / m) sum_{j in B_t} (grad f_j(W_{t-1}) + sigma_t Z_j)), the n users split into
    disjoint batches B_t of m by a secret uniformly random partition. Theorem 2 charges the step an injection
    theta_eps(2L / (sqrt(m) sigma_t)) and a contraction theta_eps(D_t sqrt(m) / (eta_t sigma_t)), D_t = 2 rho for a
    convex, beta-smooth loss with eta_t <= 2/beta, else 2 (rho + eta_t L).

    Attributes:
      population: n, the users the batches partition.
      batch_size: m, users per step.
      lipschitz: L, the bound on one user's gradient norm (sensitivity 2L under replacing the user).
      radius: rho, the radius of the projection ball.
      lr: eta_t.
      sigma: sigma_t, the std of each user's Gaussian noise (in the units of L).
      nonconvex: whether this step uses the diameter 2 (rho + eta_t L).
      random_stop: the run releases W_tau, tau ~ U{1..horizon} (Corollary 3), not W_T.
      horizon: T, the steps the run is planned for (the range of tau).
      composed: what releasing this step's iterate costs in the composition over every iterate (any event).
      analysis: "sound" (per position the smaller of Theorem 2's bound and amplification by iteration's,
        ``dpfl.accounting.amplification_by_iteration``) or "paper" (Theorem 2 / Corollary 3 alone).
    """

    population: int
    batch_size: int
    lipschitz: float
    radius: float
    lr: float
    sigma: float
    nonconvex: bool
    random_stop: bool
    horizon: int
    composed: dp_event.DpEvent = dp_event.NoOpDpEvent()
    analysis: str = "sound"

    @property
    def setting(self) -> tuple:
        """The run's constants (every step of one run has the same)."""
        return (self.population, self.batch_size, self.lipschitz, self.radius, self.random_stop, self.horizon,
                self.analysis)


@attr.s(frozen=True, slots=True, auto_attribs=True)
class BinomialSumDpEvent(dp_event.DpEvent):
    """One shuffled binomial vector summation (Cheu et al. 2021, P_vec) under a change of one user's vector.

    The observer sees per-coordinate counts: the users' randomly rounded integers plus Bin(trials, probability) noise
    per coordinate. Its curve and its delta0 are ``dpfl.accounting.binomial.binomial_sum_rdp`` / ``_tail``.

    Attributes:
      trials: m = U b, the noise bits per coordinate the observer does not know (U users, b bits each).
      probability: p, each bit's chance of being 1.
      dimension: d, the coordinates.
      grid: g, the rounding grid (a coordinate in [-L, L] becomes an integer in 0..g).
      l2_shift: S = g D / (2L), the l2 distance of two neighbouring users' vectors in grid units (D = 2C for
        C-clipped vectors and L = C: S = g).
    """

    trials: int
    probability: float
    dimension: int
    grid: int
    l2_shift: float


def unsupported_part(event: dp_event.DpEvent, supports) -> dp_event.DpEvent:
    """The innermost part of ``event`` that ``supports`` (an accountant's test of one event) refuses, looking through
    compositions: what dp_accounting's accountant contract names as ``CompositionErrorDetails.invalid_event``."""
    if isinstance(event, dp_event.ComposedDpEvent):
        refused = [e for e in event.events if not supports(e)]
        return unsupported_part(refused[0], supports) if refused else event
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return unsupported_part(event.event, supports)
    return event


def innermost(event: dp_event.DpEvent) -> dp_event.DpEvent:
    """The noise event inside the wrappers of one event (sampling, self-composition, participation): the event
    itself once it holds no event or several (a composition)."""
    children = [getattr(event, f.name) for f in attr.fields(type(event))
                if isinstance(getattr(event, f.name), dp_event.DpEvent)]
    return innermost(children[0]) if len(children) == 1 else event


def non_private(event: dp_event.DpEvent) -> bool:
    """Whether ``event`` releases something without privacy (a ``NonPrivateDpEvent``, also inside compositions)."""
    if isinstance(event, dp_event.ComposedDpEvent):
        return any(non_private(e) for e in event.events)
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return non_private(event.event)
    if isinstance(event, LabelledMixtureDpEvent):
        return any(w > 0 and non_private(e) for w, e in zip(event.weights, event.events))
    return isinstance(event, dp_event.NonPrivateDpEvent)


def _registry() -> dict[str, type]:
    classes = {
        name: cls
        for name, cls in inspect.getmembers(dp_event, inspect.isclass)
        if issubclass(cls, dp_event.DpEvent) and cls is not dp_event.DpEvent
    }
    classes[SkellamDpEvent.__name__] = SkellamDpEvent
    classes[DiscreteGaussianDpEvent.__name__] = DiscreteGaussianDpEvent
    classes[DisjointUnionDpEvent.__name__] = DisjointUnionDpEvent
    classes[ParticipationDpEvent.__name__] = ParticipationDpEvent
    classes[LabelledMixtureDpEvent.__name__] = LabelledMixtureDpEvent
    classes[ProjectedStepDpEvent.__name__] = ProjectedStepDpEvent
    classes[BinomialSumDpEvent.__name__] = BinomialSumDpEvent
    classes[WorstOwnerDpEvent.__name__] = WorstOwnerDpEvent
    return classes


EVENT_TYPES = _registry()


def _to_plain(value):
    if isinstance(value, dp_event.DpEvent):
        return event_to_dict(value)
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    return value


def _from_plain(value):
    if isinstance(value, dict):
        return event_from_dict(value)
    if isinstance(value, list):
        return [_from_plain(v) for v in value]
    return value


def event_to_dict(event: dp_event.DpEvent) -> dict:
    """``{"type": class name, field: value, ...}`` with nested events turned into dicts too (JSON safe)."""
    name = type(event).__name__
    if EVENT_TYPES.get(name) is not type(event):
        raise ConfigError("event", event, f"an event of one of the types {sorted(EVENT_TYPES)}")
    fields = {field.name: _to_plain(getattr(event, field.name)) for field in attr.fields(type(event))}
    return {"type": name, **fields}


def event_from_dict(d: dict) -> dp_event.DpEvent:
    """Inverse of ``event_to_dict`` (sequence fields come back as lists)."""
    if not isinstance(d, dict) or d.get("type") not in EVENT_TYPES:
        raise ConfigError("event type", d.get("type") if isinstance(d, dict) else d, f"one of {sorted(EVENT_TYPES)}")
    fields = {key: _from_plain(value) for key, value in d.items() if key != "type"}
    return EVENT_TYPES[d["type"]](**fields)


__all__ = ["SkellamDpEvent", "DiscreteGaussianDpEvent", "BinomialSumDpEvent", "DisjointUnionDpEvent",
           "ParticipationDpEvent", "LabelledMixtureDpEvent", "ProjectedStepDpEvent", "WorstOwnerDpEvent",
           "skellam_l1_bound", "innermost",
           "EVENT_TYPES", "event_to_dict", "event_from_dict"]
