"""`dpfl calibrate run`: the noise multiplier (or the number of rounds) of a run's config that meets a target epsilon
towards one observer, accounted exactly as the run will account it.

A run's privacy depends on its config only through what each round declares before drawing noise: the algorithm's
release (which depends on the data's counts: each client's record sampling), the boundary's view of it for each
observer and the client sampler's participation (``engine.simulator.declare_round``); the run's ledger composes those
with its accountant, delta, analysis, conversion and neighbouring relation (``experiments.assembly.build_ledger``). This
module builds the data once (it trains nothing), and for each trial builds the algorithm from the config with the
trial's noise (or rounds), declares every round as the simulator does, and asks a fresh ledger of the run's settings
what those rounds spend (``PrivacyLedger.epsilon_after``): one accounting path, the run's.

The searches are the bracket-and-bisection of ``accounting.calibrate``: ``solve_noise`` (epsilon decreases in the
noise) and ``largest_integer`` (epsilon grows with the rounds). Each answer is verified at its neighbour: the noise
meets the target and the noise / (1 + rtol) does not; the rounds meet it and one more round does not.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from dataclasses import dataclass, field
from typing import Callable

from dpfl.accounting.calibrate import largest_integer, solve_noise
from dpfl.accounting.observers import THIRD_PARTY
from dpfl.algorithms import registry
from dpfl.engine.boundary import Boundary
from dpfl.engine.grads import CohortGradients
from dpfl.engine.simulator import declare_round
from dpfl.errors import NOISE_MULTIPLIERS, ConfigError, DpflError, check_range
from dpfl.experiments import assembly
from dpfl.experiments.resolved import PrivacyConfig, RunConfig

#: Relative precision of a calibrated noise multiplier (as `dpfl calibrate gaussian`).
NOISE_RTOL = 1e-4
#: The most rounds ``max_rounds`` declares (each round is one release to build: about 0.4 ms).
MAX_ROUNDS = 100_000


@dataclass
class RunAccounting:
    """The privacy a run of ``config`` spends towards ``observer``, for any noise multiplier or number of rounds,
    without training (module docstring). Build it with ``of``."""

    config: dict
    observer: str
    noise_key: str
    dataset: object = field(repr=False)
    delta: float
    _memo: dict = field(default_factory=dict, repr=False)  # (noise, rounds) -> accounting
    _schedule: tuple | None = field(default=None, repr=False)  # (algorithm, round events) of the longest schedule

    @classmethod
    def of(cls, config: dict, observer: str = THIRD_PARTY) -> "RunAccounting":
        """Checks that ``config`` has a noise to calibrate and ``observer`` exists, then builds its data."""
        name = config["algorithm"]["name"]
        spec = registry.spec_of(name)
        if not spec.private(name):
            private = [n for n in spec.names if spec.private(n)]
            raise ConfigError("algorithm.name", name, f"a private algorithm: {name!r} adds no noise, so no epsilon "
                                                      f"holds for it (its private versions: {private})")
        if spec.noise_key is None:
            raise ConfigError("algorithm.name", name, f"an algorithm with a noise multiplier to calibrate; {name!r} "
                                                      "names none (its registry entry's noise_key is None)")
        if config["privacy"]["epsilon"] is not None:
            raise ConfigError("privacy.epsilon", config["privacy"]["epsilon"],
                              f"None: privacy.epsilon is the target of an algorithm that sets its own noise, while "
                              f"calibrate run finds algorithm.{spec.noise_key} for --target-epsilon; drop it")
        typed = RunConfig.of(config)
        observers = boundary_of(typed.privacy).observers
        if observer not in observers:
            raise ConfigError("--observer", observer, f"one of {list(observers)} (the observers of privacy.boundary "
                                                      f"= {config['privacy']['boundary']!r})")
        dataset = assembly.build_data(config["data"])
        return cls(config, observer, spec.noise_key, dataset, assembly.run_delta(typed, dataset))

    @property
    def noise(self) -> float:
        """The config's own noise multiplier."""
        return self.config["algorithm"][self.noise_key]

    @property
    def rounds(self) -> int:
        return self.config["algorithm"]["rounds"]

    def with_values(self, noise: float | None = None, rounds: int | None = None) -> RunConfig:
        """The config with the noise multiplier and the rounds replaced (None: the config's own)."""
        config = copy.deepcopy(self.config)
        if noise is not None:
            config["algorithm"][self.noise_key] = noise
        if rounds is not None:
            config["algorithm"]["rounds"] = rounds
        return RunConfig.of(config)

    def searched(self, noise: float | None = None, rounds: int | None = None) -> RunConfig:
        """``with_values`` with the section its family's search tries levels on (``registry.Calibration.searched``:
        charged as the config's own at every level, and refusing none); ``calibrate_noise`` and ``max_rounds`` build
        the config's own section at their answer."""
        config = self.with_values(noise, rounds)
        calibration = config.algorithm.spec.calibration
        if calibration is None:
            return config
        section = calibration.searched(config.algorithm.name, config.algorithm.section)
        return dataclasses.replace(config, algorithm=dataclasses.replace(config.algorithm, section=section))

    def declared(self, config: RunConfig) -> tuple[object, list[dict]]:
        """The algorithm of a run of ``config`` and each observer's event of every round, declared as the simulator
        declares them (from the algorithm's initial state: no round is trained)."""
        algorithm = assembly.build_algorithm(config, self.dataset, self.delta)
        boundary = boundary_of(config.privacy)
        clients = assembly.build_clients(config, self.dataset)
        x0 = CohortGradients(assembly.build_initial_model(config, self.dataset)).initial_params()
        state = algorithm.init_state(x0, self.dataset.num_clients)
        analysis = config.privacy.analysis
        counts = self.dataset.train.counts
        return algorithm, [declare_round(algorithm, boundary, clients, analysis, t, state, counts)[1]
                           for t in range(config.algorithm.rounds)]

    def accounting(self, noise: float | None = None, rounds: int | None = None) -> tuple[float, dict]:
        """(epsilon towards the observer, the ledger's settings: delta, analysis, conversion, neighbouring and the
        accountant that answered) of a run with this noise and these rounds (None: the config's)."""
        key = (self.noise if noise is None else noise, self.rounds if rounds is None else rounds)
        if key not in self._memo:
            config = self.searched(noise, rounds)
            algorithm, events = self._declared_rounds(config, noise, rounds)
            ledger = assembly.build_ledger(config, boundary_of(config.privacy), self.delta, algorithm, budget=False)
            epsilon = ledger.epsilon_after(events, [self.observer])[self.observer]
            self._memo[key] = epsilon, {
                "delta": ledger.delta, "analysis": ledger.analysis, "conversion": ledger.conversion,
                "neighboring": ledger.neighboring, "accountant": ledger.accountants_after(events)[self.observer]}
        return self._memo[key]

    def epsilon(self, noise: float | None = None, rounds: int | None = None) -> float:
        return self.accounting(noise, rounds)[0]

    def _declared_rounds(self, config: RunConfig, noise: float | None,
                         rounds: int | None) -> tuple[object, list[dict]]:
        """``declared``; when only the rounds vary and the release does not depend on them (the spec's
        release_keys), the first ``rounds`` rounds of the longest schedule declared so far."""
        if noise is not None or rounds is None or "algorithm.rounds" in config.algorithm.spec.release_keys:
            return self.declared(config)
        if self._schedule is None or len(self._schedule[1]) < rounds:
            self._schedule = self.declared(config)
        algorithm, events = self._schedule
        return algorithm, events[:rounds]


def boundary_of(privacy: PrivacyConfig) -> Boundary:
    """The boundary the run accounts for (``PrivacyConfig.accounted_boundary``), and which models a third party sees
    (privacy.release)."""
    return Boundary(privacy.accounted_boundary, released=privacy.release, cohort=privacy.cohort)


def calibrate_noise(run: RunAccounting, target_epsilon: float, *, rtol: float = NOISE_RTOL,
                    progress: Callable[[float, float], None] | None = None) -> dict:
    """The smallest noise multiplier (relative precision ``rtol``) whose run, with the config's rounds, spends at
    most ``target_epsilon`` towards ``run.observer``; verified: noise / (1 + rtol) spends more."""
    target_epsilon = check_range("--target-epsilon", target_epsilon, 0, low_open=True)
    _check_private(run)

    def epsilon_of(noise: float) -> float:
        low, high = NOISE_MULTIPLIERS
        if not low <= noise <= high:
            raise ConfigError("--target-epsilon", target_epsilon, f"a target that a noise multiplier in [{low:g}, "
                                                                  f"{high:g}] meets (the search reached {noise:.3g})")
        return run.epsilon(noise)

    start = 1.0 if run.noise is None else run.noise  # None: a key left to privacy.epsilon (dp-fedavg-joint, -user)
    noise = solve_noise(epsilon_of, target_epsilon, initial_noise=start, rtol=rtol, progress=progress)
    epsilon, settings = run.accounting(noise)
    less = noise / (1 + rtol)
    epsilon_less = run.epsilon(less)
    if not epsilon <= target_epsilon < epsilon_less:
        raise DpflError(f"calibration not verified: noise multiplier {noise!r} gives epsilon {epsilon!r} and "
                        f"{less!r} gives {epsilon_less!r}, against the target {target_epsilon!r}")
    assembly.build_algorithm(run.with_values(noise), run.dataset, run.delta)  # the config's own section at the answer
    return {"noise_multiplier": noise, "epsilon": epsilon, "observer": run.observer, "target_epsilon": target_epsilon,
            "rounds": run.rounds, **settings, "noise_key": f"algorithm.{run.noise_key}",
            "epsilon_with_less_noise": epsilon_less, "noise_rtol": rtol}


def max_rounds(run: RunAccounting, target_epsilon: float, *,
               progress: Callable[[int, float], None] | None = None) -> dict:
    """The largest number of rounds whose run, with the config's noise, spends at most ``target_epsilon`` towards
    ``run.observer``; verified: one more round spends more. ConfigError when even the fewest rounds a run of the
    config takes (past its warm-start rounds) exceed the target, or when more than ``MAX_ROUNDS`` stay within it."""
    target_epsilon = check_range("--target-epsilon", target_epsilon, 0, low_open=True)
    _check_private(run)

    def epsilon_of(rounds: int) -> float:
        if rounds > MAX_ROUNDS:
            raise ConfigError("--target-epsilon", target_epsilon,
                              f"a budget that some number of rounds up to {MAX_ROUNDS} exceeds (calibrate run "
                              "declares at most that many rounds)")
        epsilon = run.epsilon(rounds=rounds)
        if progress is not None:
            progress(rounds, epsilon)
        return epsilon

    rounds = largest_integer(lambda r: epsilon_of(r) <= target_epsilon, max(1, run.rounds), max(1, run.rounds // 8),
                             target_epsilon)
    fewest = 1 + assembly.build_algorithm(run.with_values(), run.dataset, run.delta).warm_rounds
    if rounds < fewest:
        why = f" (its first {fewest - 1} are warm-start rounds)" if fewest > 1 else ""
        raise ConfigError("--target-epsilon", target_epsilon,
                          f"a budget that {fewest} round(s) meet, the fewest a run of this config takes{why}: they "
                          f"spend {epsilon_of(fewest):.6g} towards {run.observer} with algorithm.{run.noise_key} = "
                          f"{run.noise:g}")
    epsilon, settings = run.accounting(rounds=rounds)
    epsilon_more = run.epsilon(rounds=rounds + 1)
    if not epsilon <= target_epsilon < epsilon_more:
        raise DpflError(f"calibration not verified: {rounds} rounds give epsilon {epsilon!r} and {rounds + 1} give "
                        f"{epsilon_more!r}, against the target {target_epsilon!r}")
    return {"rounds": rounds, "epsilon": epsilon, "observer": run.observer, "target_epsilon": target_epsilon,
            "noise_multiplier": run.noise, **settings, "noise_key": f"algorithm.{run.noise_key}",
            "epsilon_with_one_more_round": epsilon_more}


def _check_private(run: RunAccounting) -> None:
    """Epsilon must be finite for some noise: a NonPrivate part (a data-dependent clip) is infinite whatever it is."""
    if math.isinf(run.epsilon()) and math.isinf(run.epsilon(NOISE_MULTIPLIERS[1])):
        raise ConfigError(f"algorithm.{run.noise_key}", run.noise,
                          "a config whose run is private: its epsilon is infinite whatever the noise (e.g. "
                          "algorithm.clip_heuristic = 'median-nonprivate' clips at a data-dependent bound)")


__all__ = ["NOISE_RTOL", "MAX_ROUNDS", "RunAccounting", "calibrate_noise", "max_rounds"]
