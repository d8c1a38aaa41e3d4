"""A run's config as the code that builds the run reads it: typed sections, with the algorithm's registry entry and
its ``[algorithm]`` dataclass looked up once.

``resolve`` makes one from a loaded config (``dpfl.experiments.config``: every key present, of its type), refuses one
that does not name what a caller supplied (``Supplied.check``) and checks its ranges (``validate``) before any data is
built; every part of the run is then built from it (``dpfl.experiments.assembly``). ``RunConfig.raw`` is the loaded
dict itself, which run.json, results.json and the release hash keep verbatim (``dpfl.experiments.run_directory``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from dpfl.accounting.observers import THIRD_PARTY
from dpfl.algorithms import registry
from dpfl.experiments.supplied import NOTHING, Supplied
from dpfl.experiments.validate import validate

#: ``run.threads`` when a config leaves it unset. The cohort is one batched call (clients are a tensor axis), so a
#: second intra-op thread has little to share, and on a busy machine the threads wait for each other's time slices at
#: every op: alternated at the same moment on a shared 2-core machine (load 4-8, benchmarks/threads.py), the demo's
#: DP-FedAvg took 0.17 s a round with one thread and 5.2 s with two, Noble et al.'s (2022) synthetic workload 1.9 s
#: and 16.9 s. At load 1.5-2 the demo did not care (0.047 s against 0.045) and that workload took 0.34 s against 0.22:
#: two threads pay only on cores known to be free, which a config can say (run.threads). A fixed count (not one read
#: off the machine's load) also keeps a config's results the same wherever it runs.
DEFAULT_THREADS = 1


@dataclass(frozen=True)
class ModelConfig:
    """[model]: the model's name and its options (``dpfl.models.build_model``'s keyword arguments)."""

    name: str
    options: Mapping[str, object]


@dataclass(frozen=True)
class AlgorithmConfig:
    """[algorithm]: the round loop's keys (``registry.COMMON_KEYS``) and the family's own (``section``, its registered
    config dataclass), with its registry entry (``spec``)."""

    name: str
    rounds: int
    spec: registry.AlgorithmSpec = field(repr=False)
    section: object
    #: algorithm.client_rate and client_sampling; None for a family that names its cohort with its own keys
    client_rate: float | None
    client_sampling: str | None

    def cohort_sampling(self, num_clients: int) -> tuple[float, str]:
        """(client rate, scheme): algorithm.client_rate and client_sampling, or the family's own cohort keys."""
        if self.spec.cohort is None:
            return self.client_rate, self.client_sampling
        return self.spec.client_sampling(self.section, num_clients)

    def client_sampler(self, num_clients: int, public_seed: int | None = None):
        """The run's ``ClientSampler`` (``registry.AlgorithmSpec.client_sampler``: the family's partitions where it
        has them)."""
        rate, scheme = self.cohort_sampling(num_clients)
        return self.spec.client_sampler(self.name, self.section, num_clients, rate, scheme, public_seed)

    def check_rounds(self, num_clients: int) -> None:
        """ConfigError naming algorithm.rounds when a one-pass family has more rounds than its clients allow."""
        self.spec.check_rounds(self.section, num_clients, self.rounds, self.name)

    def build(self, setting: registry.Setting):
        """The registered family's algorithm for this section and ``setting``."""
        return self.spec.build(self.name, self.section, setting)


@dataclass(frozen=True)
class PrivacyConfig:
    """[privacy] (``config.SCHEMA``'s keys and meanings)."""

    delta: float | None
    budget: float | dict | None
    epsilon: float | None
    analysis: str
    conversion: str | None
    boundary: str
    secure_aggregation: bool
    secagg_bits: int
    shuffler: str
    release: str
    cohort: str = "secret"

    @property
    def budgets(self) -> dict | None:
        """privacy.budget as {observer: epsilon}: a number is the third party's budget."""
        if self.budget is None or isinstance(self.budget, dict):
            return self.budget
        return {THIRD_PARTY: self.budget}

    @property
    def accounted_boundary(self) -> str:
        """The boundary a run accounts for: privacy.boundary, or 'secagg' with privacy.secure_aggregation."""
        return "secagg" if self.secure_aggregation else self.boundary


@dataclass(frozen=True)
class RunOptions:
    """[run] (``config.SCHEMA``'s keys and meanings)."""

    seed: int
    noise_seed: int | None
    eval_every: int
    checkpoint_every: int
    memory_mb: int
    threads: int | None
    device: str = "auto"
    secure_noise: bool = False
    secure_noise_bits: int = 9
    tensorboard: str | None = None
    epsilon_every: int | str = "auto"
    eval_clients: int | None = None

    @property
    def grid_bits(self) -> int | None:
        """k of the secure mode (``registry.Setting.secure_noise_bits``), None without run.secure_noise."""
        return self.secure_noise_bits if self.secure_noise else None

    @property
    def memory_budget_bytes(self) -> int:
        return self.memory_mb * 2**20


@dataclass(frozen=True)
class RunConfig:
    """A loaded config's sections, typed; ``raw``: the loaded dict itself (build one with ``resolve``)."""

    raw: dict = field(repr=False)
    #: [data], read-only: ``dpfl.data.build_dataset``'s keyword arguments (its signature types them)
    data: Mapping[str, object]
    model: ModelConfig
    algorithm: AlgorithmConfig
    privacy: PrivacyConfig
    run: RunOptions

    @classmethod
    def of(cls, config: dict) -> RunConfig:
        """The typed sections of a loaded ``config`` (not range-checked: ``resolve`` checks them)."""
        algorithm, model = config["algorithm"], config["model"]
        spec = registry.spec_of(algorithm["name"])
        return cls(config, MappingProxyType(config["data"]),
                   ModelConfig(model["name"], MappingProxyType({k: v for k, v in model.items() if k != "name"})),
                   AlgorithmConfig(algorithm["name"], algorithm["rounds"], spec, spec.section(algorithm),
                                   algorithm.get("client_rate"), algorithm.get("client_sampling")),
                   PrivacyConfig(**config["privacy"]), RunOptions(**config["run"]))


def resolve(config: dict, supplied: Supplied = NOTHING) -> RunConfig:
    """The typed ``config`` (loaded by ``dpfl.experiments.config``), refused (ConfigError naming the key) unless it
    names what was ``supplied`` and every value is in its range (``validate``); builds no data."""
    supplied.check(config)
    resolved = RunConfig.of(config)
    validate(resolved)  # every range check that needs no data, before the data is built
    return resolved


def with_threads(config: dict, recorded: int | None = None) -> dict:
    """``config`` with ``run.threads`` resolved: as set, else ``recorded`` (the count of the run being resumed, so
    that a run started under an earlier default, the machine's cores, resumes with the count it was made with), else
    ``DEFAULT_THREADS``. The thread count changes float rounding in multi-threaded matrix products, so it is part of
    the release config: a resume that sets another count is refused."""
    if config["run"]["threads"] is not None:
        return config
    resolved = copy.deepcopy(config)
    resolved["run"]["threads"] = DEFAULT_THREADS if recorded is None else recorded
    return resolved


__all__ = ["DEFAULT_THREADS", "ModelConfig", "AlgorithmConfig", "PrivacyConfig", "RunOptions", "RunConfig", "resolve",
           "with_threads"]
