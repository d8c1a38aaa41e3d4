"""The registry of algorithms: the only list of algorithm names, their config sections and their builders.

An algorithm module registers an ``AlgorithmSpec``: the names it answers to in ``algorithm.name``, a frozen dataclass
of its own ``[algorithm]`` keys (typed, with defaults that make a minimal config run; field metadata may give
"choices", "min", "help", and "private": True for keys that only the private names take), and a builder
(name, config section, ``Setting``) -> an instance of a ``dpfl.engine.protocol.Algorithm`` subclass. The setting
carries what a builder may need beyond its own section: the cohort's sampling, the data's shape, the rounds and the
privacy target an algorithm calibrates its noise to. An algorithm whose release depends on a run-only key (rounds,
when the noise is calibrated to a total budget) names it in ``release_keys``, so a resume cannot change it;
``noise_key`` names the ``[algorithm]`` key whose noise multiplier `dpfl calibrate run` solves for. Config
validation, ``dpfl run`` and ``dpfl run --help`` read the registry, so adding an algorithm touches its module, its
tests and its docs only.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from dataclasses import dataclass
from typing import Callable

from dpfl.engine.sampling import PARTITIONED, ClientSampler
from dpfl.errors import ConfigError
from dpfl.noise import DiscreteGaussianMechanism, GaussianMechanism

#: [algorithm] keys every algorithm has (the round loop's own): name, rounds, client sampling.
COMMON_KEYS = {
    "name": (str, "dp-scaffold-warm", None, "the algorithm (see `dpfl run --help`)"),
    "rounds": (int, 100, None, "T, communication rounds (a one-pass family, e.g. projected-noisy-sgd: one pass, "
                               "when data.num_clients is given)"),
    "client_rate": (float, 0.2, None, "l, fraction of clients per round"),
    "client_sampling": (str, "fixed", ("fixed", "poisson", "round_robin", "disjoint", "partitioned_poisson"),
                        "fixed size without replacement, Poisson, round robin, disjoint batches per epoch, or Poisson "
                        "within b public partitions taking turns (bandmf only: amplified BandMF)"),
}


@dataclass(frozen=True)
class Setting:
    """What a builder knows besides its own [algorithm] keys (validated by the caller)."""

    client_rate: float
    client_sampling: str = "fixed"
    num_clients: int | None = None
    #: n_i, each client's number of training records
    train_counts: tuple[int, ...] = ()
    rounds: int | None = None
    delta: float | None = None
    #: privacy.epsilon, the target a calibrating algorithm sets its noise for (None: the section's own noise)
    epsilon: float | None = None
    #: run.seed, public randomness (an algorithm that calibrates to its clients' reply counts draws the cohort
    #: schedule from it: the schedule is public)
    seed: int = 0
    #: the noise key of the party that builds the algorithm (``dpfl.engine.keys``), for a draw at build time whose
    #: secrecy the analysis assumes (a secret stopping time); None: not known here (a builder then draws a fresh
    #: key: calibration, a silo building the server's algorithm). Never sent to another party.
    secret: int | None = dataclasses.field(default=None, repr=False)
    #: privacy.analysis
    analysis: str = "sound"
    #: privacy.conversion (None: the analysis's)
    conversion: str | None = None
    #: privacy.release: which models a third party sees ("every_round" or "final")
    release: str = "every_round"
    #: the [model] section (name and options) and the data's number of classes, for an algorithm that checks
    #: properties of its loss (convexity, smoothness) before it relies on them
    model: dict = dataclasses.field(default_factory=dict, hash=False)
    num_classes: int | None = None
    #: the per-example loss: None for cross-entropy, else the name of a caller's loss (``dpfl.run(loss=...)``), whose
    #: convexity and smoothness dpfl cannot verify
    loss: str | None = None
    #: d, the model's number of parameters (None: not known), for an algorithm whose accounting depends on it (the
    #: rounding of dp-fedavg-joint's Skellam shares moves each of the d coordinates)
    dimension: int | None = None
    #: the noise level solved for privacy.epsilon against the run's ledger (``experiments.noise_level.
    #: noise_for_epsilon``), which a family with a ``Calibration`` maps onto its mechanisms; None: not solved
    noise: float | None = None
    #: k, the grid exponent of run.secure_noise (``gaussian``); None: the default mechanism. Only a family whose spec
    #: says ``secure_noise`` is given one (validation refuses the others)
    secure_noise_bits: int | None = None
    #: ((eps, level), ...): the level solved for each budget of a family whose clients have budgets of their own
    #: (``Calibration.budgets``), each as if every client had that budget
    levels: tuple[tuple[float, float], ...] = ()

    def level_for(self, epsilon: float) -> float:
        """The level solved for the clients' budget ``epsilon`` (``levels``)."""
        for budget, level in self.levels:
            if budget == epsilon:
                return level
        raise ValueError(f"no noise level was solved for the budget {epsilon}: build the algorithm through "
                         "dpfl.experiments.assembly, or with noise_level.calibrated_setting")

    def noise_multiplier(self, given: float | None, default: float) -> float:
        """z of a family whose noise key algorithm.noise_multiplier may be left to privacy.epsilon: the level solved
        for privacy.epsilon, else the key's value ``given``, else ``default``; both at once is refused."""
        z = self.calibrated_noise()
        if z is None:
            return default if given is None else given
        if given is not None:
            raise ConfigError("algorithm.noise_multiplier", given,
                              "None when privacy.epsilon is given (z is then calibrated to it)")
        return z

    def gaussian(self, noise_multiplier: float) -> GaussianMechanism | DiscreteGaussianMechanism:
        """The Gaussian mechanism at ``noise_multiplier``: the default one, or under run.secure_noise the rounded
        discrete Gaussian on the model's ``dimension`` coordinates (``dpfl.noise.DiscreteGaussianMechanism``)."""
        if self.secure_noise_bits is None or noise_multiplier == 0:
            return GaussianMechanism(noise_multiplier)
        if self.dimension is None:
            raise ValueError("run.secure_noise needs the model's number of parameters (Setting.dimension): build the "
                             "algorithm through dpfl.experiments.assembly")
        return DiscreteGaussianMechanism(noise_multiplier, self.secure_noise_bits, self.dimension)

    def calibrated_noise(self) -> float | None:
        """The noise level solved for privacy.epsilon, or None when privacy.epsilon is not set; a family with a
        ``Calibration`` maps it onto its mechanisms. A setting with privacy.epsilon and no solved level is a
        caller's error: only the runner solves it."""
        if self.epsilon is None:
            return None
        if self.noise is None:
            raise ValueError("privacy.epsilon is set but its noise level was not solved: build the algorithm through "
                             "dpfl.experiments.assembly, or solve it with noise_level.noise_for_epsilon")
        return self.noise


@dataclass(frozen=True)
class Calibration:
    """How privacy.epsilon sets a family's noise: the runner solves the smallest noise level (``Setting.noise``) whose
    run spends at most privacy.epsilon towards each of ``observers`` by the run's own ledger
    (``experiments.noise_level.noise_for_epsilon``); the builder maps that level onto its mechanisms (e.g. one
    multiplier, or a fixed split between two streams). Epsilon must decrease as the level grows."""

    #: (name, config section, Setting) -> the observers whose epsilon privacy.epsilon bounds
    observers: Callable
    #: (name, config section, Setting) -> where the search starts (the noise level near the answer saves trials)
    initial: Callable = lambda name, section, setting: 1.0
    #: (name, config section, Setting) -> the boundary the guarantee is stated behind, whatever the run's (dp-fedavg-joint
    #: with trust = 'local' is local DP: against a server that sees each message); None: the run's boundary
    boundary: Callable = lambda name, section, setting: None
    #: whether the guarantee credits the client sampler's participation (False: every client is taken to take part in
    #: every round, as ISRL-DP's, which holds conditionally on who takes part: Lowy et al. 2023, Def. 2)
    credits_client_sampling: bool = True
    #: (name, config section, Setting) -> {eps: the section of a run in which every client has the budget eps}, for a
    #: family whose clients have budgets of their own (fedsgd-dpc's client_epsilons; empty when they have not): the
    #: runner solves the level of each (``Setting.levels``) instead of privacy.epsilon's (``Setting.noise``)
    budgets: Callable = lambda name, section, setting: {}
    #: the relative precision of the solved level; None: the runner's (``noise_level.NOISE_RTOL``). A family whose
    #: mechanism takes a whole number (P_vec's noise bits, ceil of the level) may take a coarser one: each of its
    #: trials accounts an expensive event, and b within 5% of the smallest is 2.5% more noise std at most
    rtol: float | None = None
    #: (name, config section) -> the section the search builds its trial levels from: one that the run's ledger
    #: charges as it charges ``section`` at every level, for a family whose section refuses levels the answer need
    #: not reach (dp-fedavg-user's count_noise, which must exceed the trial z); the run is built from its own section
    #: at the solved level (``noise_level.noise_for_epsilon``, ``calibration.calibrate_noise``)
    searched: Callable = lambda name, section: section


@dataclass(frozen=True)
class AlgorithmSpec:
    """One registered family: its names, its config section, its builder, which names are private."""

    names: tuple[str, ...]
    config: type
    build: Callable
    private: Callable[[str], bool]
    help: str
    #: run-only keys (run_directory.RUN_ONLY_KEYS) that decide this family's release, e.g. "algorithm.rounds"
    release_keys: tuple[str, ...] = ()
    #: the [algorithm] key of the noise multiplier (epsilon decreases as it grows) that `dpfl calibrate run` solves
    #: for; None: the family has no such key (its noise cannot be calibrated from outside)
    noise_key: str | None = "noise_multiplier"
    #: (config section, number of clients) -> (client rate, client sampling scheme), for a family that names its
    #: cohort with keys of its own; then the common keys client_rate and client_sampling do not apply to it
    cohort: Callable | None = None
    #: (config section, number of clients) -> the most rounds a run may have, for a one-pass family (each client
    #: used once); None: any number
    max_rounds: Callable | None = None
    #: [privacy] defaults of this family that differ from the schema's, e.g. {"release": "final"}
    privacy_defaults: dict = dataclasses.field(default_factory=dict, hash=False)
    #: whether the family's analysis treats its cohorts as public (drawn from run.seed, e.g. a reply schedule its
    #: noise is calibrated to before the first round); False: cohorts come from the secret noise key
    public_cohorts: bool = False
    #: defaults of the round loop's keys (COMMON_KEYS) that differ for this family, e.g. {"client_rate": 1.0} for a
    #: cross-silo family (a few silos, every one in every round)
    common_defaults: dict = dataclasses.field(default_factory=dict, hash=False)
    #: how privacy.epsilon sets this family's noise (None: the family does not calibrate to privacy.epsilon)
    calibration: Calibration | None = None
    #: (config section, number of clients, client rate) -> b, the public partitions of the "partitioned_poisson"
    #: client sampler (``dpfl.engine.sampling``), for a family whose analysis uses them (amplified BandMF); None: the
    #: family refuses that scheme
    partitions: Callable | None = None
    #: whether the family's private names take run.secure_noise (their Gaussian mechanisms come from
    #: ``Setting.gaussian``, and the builder refuses the options it does not cover); False: validation refuses it
    secure_noise: bool = False

    def common_keys(self) -> dict[str, tuple]:
        """The round loop's keys that apply to this family, with this family's defaults."""
        own_cohort = ("client_rate", "client_sampling") if self.cohort is not None else ()
        return {k: (v[0], self.common_defaults.get(k, v[1]), *v[2:]) for k, v in COMMON_KEYS.items()
                if k not in own_cohort}

    def client_sampling(self, section, num_clients: int) -> tuple[float, str]:
        """(client rate, scheme) of the ClientSampler a run of this family uses."""
        if self.cohort is not None:
            return self.cohort(section, num_clients)
        raise TypeError("the cohort of a family without its own cohort keys comes from algorithm.client_rate and "
                        "algorithm.client_sampling")

    def client_sampler(self, name: str, section, num_clients: int, rate: float, scheme: str,
                       public_seed: int | None = None) -> ClientSampler:
        """The ClientSampler of a run of this family: with the family's partitions under "partitioned_poisson", which
        a family without ``partitions`` refuses (ConfigError naming algorithm.client_sampling)."""
        self.check_sampling(name, scheme)
        partitions = self.partitions(section, num_clients, rate) if scheme == PARTITIONED else 1
        return ClientSampler(num_clients, rate, scheme, public_seed=public_seed, partitions=partitions)

    def check_sampling(self, name: str, scheme: str) -> None:
        """ConfigError naming algorithm.client_sampling for "partitioned_poisson" in a family without ``partitions``."""
        if scheme == PARTITIONED and self.partitions is None:
            others = [n for s in specs() if s.partitions is not None for n in s.names]
            raise ConfigError("algorithm.client_sampling", scheme,
                              f"another scheme for {name!r}: {PARTITIONED!r} (Poisson within b public partitions "
                              f"taking turns) is accounted only for {others} (amplified BandMF)")

    def check_rounds(self, section, num_clients: int, rounds: int, name: str) -> None:
        """ConfigError naming algorithm.rounds when a one-pass family (``max_rounds``) is given more rounds than its
        clients allow."""
        if self.max_rounds is None:
            return
        most = self.max_rounds(section, num_clients)
        if rounds > most:
            raise ConfigError("algorithm.rounds", rounds, f"at most {most} for {name!r}: it makes one pass over the "
                                                          f"{num_clients} clients, each in exactly one round (left "
                                                          "unset, algorithm.rounds is one pass when data.num_clients "
                                                          "is given)")

    def section(self, algorithm: dict):
        """The config dataclass of a resolved [algorithm] table (its keys that apply to ``algorithm["name"]``)."""
        return self.config(**{k: algorithm[k] for k in self.keys(algorithm["name"])})

    def keys(self, name: str) -> dict[str, dataclasses.Field]:
        """The section's keys that apply to ``name`` (a private-only key does not apply to a non-private name)."""
        return {f.name: f for f in dataclasses.fields(self.config)
                if self.private(name) or not f.metadata.get("private", False)}

    def key_type(self, key: str) -> type | tuple[type, ...]:
        """The key's type, or a tuple of types for an optional key (``float | None``)."""
        hint = typing.get_type_hints(self.config)[key]
        args = typing.get_args(hint)
        return tuple(args) if type(None) in args else hint

    @staticmethod
    def default_of(f: dataclasses.Field):
        """A key's default (a fresh one for a mutable default, e.g. a list)."""
        return f.default_factory() if f.default is dataclasses.MISSING else f.default


_REGISTRY: dict[str, AlgorithmSpec] = {}


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Adds ``spec`` under each of its names (a name may be registered once)."""
    for name in spec.names:
        if name in _REGISTRY and _REGISTRY[name] is not spec:
            raise ValueError(f"algorithm name {name!r} is registered twice")
        _REGISTRY[name] = spec
    return spec


def spec_of(name: str) -> AlgorithmSpec:
    _load_builtin()
    if name not in _REGISTRY:
        raise ConfigError("algorithm.name", name, f"one of {names()}")
    return _REGISTRY[name]


def names() -> list[str]:
    """Every registered name, dpfl's own families first in ``BUILTIN`` order (whatever imported them first)."""
    return [name for spec in specs() for name in spec.names]


def specs() -> list[AlgorithmSpec]:
    """Every registered family once, dpfl's own first in ``BUILTIN`` order, then others as registered."""
    _load_builtin()

    def rank(spec: AlgorithmSpec) -> int:
        module = spec.build.__module__
        return BUILTIN.index(module) if module in BUILTIN else len(BUILTIN)

    return sorted(dict.fromkeys(_REGISTRY.values()), key=rank)


#: dpfl's own algorithm modules, in the order listings show them (the first is the default family)
BUILTIN = ("dpfl.algorithms.local_sgd", "dpfl.algorithms.fedsgd_dpc", "dpfl.algorithms.dp_fedavg_joint",
           "dpfl.algorithms.dp_fedavg_user",
           "dpfl.algorithms.projected_noisy_sgd", "dpfl.algorithms.isrl", "dpfl.algorithms.isrl_spider",
           "dpfl.algorithms.isrl_svrg", "dpfl.algorithms.sdp", "dpfl.algorithms.sdp_spider",
           "dpfl.algorithms.dp_ftrl", "dpfl.algorithms.bandmf")


def _load_builtin() -> None:
    """Imports dpfl's own algorithm modules, which register themselves."""
    for module in BUILTIN:
        importlib.import_module(module)


__all__ = ["COMMON_KEYS", "Setting", "Calibration", "AlgorithmSpec", "register", "spec_of", "names", "specs"]
