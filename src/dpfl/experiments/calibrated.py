"""``dpfl.calibrate(config, target_epsilon=...)``: a run's config with its noise solved for a target epsilon, and what
the run will spend towards each observer, from Python (no TOML file, no shell), before anything is trained.

The noise is solved by the one calibration route (``noise_level.calibrated_setting``: the family's ``Calibration``
names the observers the target bounds and the boundary its guarantee is stated behind; every round is declared as the
simulator declares it and composed by a ledger of the run's settings), on the run's own data, model shapes and
supplied arrays. The config handed back then pins that level where the family has a noise key that carries it
(``AlgorithmSpec.noise_key``: algorithm.noise_multiplier of dp-fedavg, dp-scaffold, dp-fedavg-user, ...), with
privacy.epsilon unset: the pin is kept only when the pinned algorithm declares exactly the events the calibrated one
does, so a run of the pinned config spends exactly what was solved. A family without such a key (its level is P_vec's
bits, a Laplace scale, a split between two streams) keeps privacy.epsilon = the target, and its run solves the same
level again (the route is deterministic). Either way ``Calibrated.epsilon`` is what the run of ``Calibrated.config``
reports after its last round, per observer of its boundary, by the same declaration and ledger.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

from dpfl.algorithms import registry
from dpfl.errors import ConfigError
from dpfl.experiments import assembly
from dpfl.experiments.noise_level import accounted_boundary, calibration_report, declared_epsilon
from dpfl.experiments.resolved import resolve
from dpfl.experiments.supplied import NOTHING, Supplied


@dataclass(frozen=True)
class Calibrated:
    """A config whose noise meets ``target_epsilon`` towards ``observers`` (behind ``boundary``), and what its run
    spends: ``epsilon`` per observer of the run's boundary after all its rounds. ``dpfl.run`` takes it as a config."""

    #: the loaded config (a dict of sections) to run: the noise key pinned to ``noise``, or privacy.epsilon set
    config: dict
    target_epsilon: float
    #: the observers whose epsilon the target bounds (the family's ``Calibration.observers``)
    observers: tuple[str, ...]
    #: the boundary they stand behind (the family's stated one, else the run's)
    boundary: str
    #: the level solved (``Setting.noise``), or {budget: level} for a family whose clients have budgets of their own
    noise: float | dict
    #: the [algorithm] key holding ``noise`` in ``config`` (None: privacy.epsilon carries it, solved again by the run)
    noise_key: str | None
    #: epsilon per observer of the run's boundary after all ``config``'s rounds (inf: not protected)
    epsilon: dict[str, float]

    def __str__(self) -> str:
        where = f"algorithm.{self.noise_key} = {self.noise:.6g}" if self.noise_key else \
            f"privacy.epsilon = {self.target_epsilon:g} (noise level {self.noise})"
        spent = ", ".join(f"{o} {e:.4g}" for o, e in self.epsilon.items())
        return (f"{self.config['algorithm']['name']}: {where}, target epsilon {self.target_epsilon:g} towards "
                f"{', '.join(self.observers)} ({self.boundary} boundary); epsilon after "
                f"{self.config['algorithm']['rounds']} rounds: {spent}")


def calibrate_config(config: dict, target_epsilon: float, supplied: Supplied = NOTHING) -> Calibrated:
    """``config`` (loaded, with what was ``supplied`` named and fingerprinted: ``api.resolve_config``) with its noise
    solved for ``target_epsilon`` (module docstring). A config that sets privacy.epsilon to another value, a name that
    adds no noise, a family that does not set its noise from privacy.epsilon, and a target no noise level meets are
    refused (ConfigError)."""
    name = config["algorithm"]["name"]
    spec = registry.spec_of(name)
    if spec.calibration is None:
        calibrating = [n for s in registry.specs() if s.calibration is not None for n in s.names if s.private(n)]
        raise ConfigError("algorithm.name", name, f"a family that sets its noise from a target epsilon: one of "
                                                  f"{calibrating}")
    if not spec.private(name):
        private = [n for n in spec.names if spec.private(n)]
        raise ConfigError("algorithm.name", name, f"a private algorithm: {name!r} adds no noise, so no epsilon holds "
                                                  f"for it (its private versions: {private})")
    given = config["privacy"]["epsilon"]
    if given is not None and given != target_epsilon:
        raise ConfigError("privacy.epsilon", given, f"None or the target_epsilon {target_epsilon!r} when "
                                                    "dpfl.calibrate is given target_epsilon")
    targeted = copy.deepcopy(config)
    targeted["privacy"]["epsilon"] = target_epsilon
    typed = resolve(targeted, supplied)
    dataset = assembly.build_data(typed.data, supplied)
    delta = assembly.run_delta(typed, dataset)
    shapes = assembly.build_initial_model(typed, dataset, "meta", supplied)
    setting = assembly.build_setting(typed, dataset, delta, supplied=supplied, model_shapes=shapes)
    boundary = accounted_boundary(typed.privacy)
    clients = assembly.build_clients(typed, dataset)
    section = typed.algorithm.section
    report = calibration_report(spec, name, section, setting, boundary)

    def spent(algorithm) -> dict[str, float]:
        return declared_epsilon(algorithm, setting, boundary, clients)

    epsilon = spent(spec.build(name, section, setting))
    result, noise_key = targeted, None
    if spec.noise_key is not None and not setting.levels:
        pinned = copy.deepcopy(targeted)
        pinned["privacy"]["epsilon"] = None
        pinned["algorithm"][spec.noise_key] = setting.noise
        plain = dataclasses.replace(setting, epsilon=None, noise=None)
        if spent(spec.build(name, resolve(pinned, supplied).algorithm.section, plain)) == epsilon:
            result, noise_key = pinned, spec.noise_key
    return Calibrated(result, target_epsilon, tuple(report["observers"]), report["boundary"],
                      report["noise_level"], noise_key, epsilon)


__all__ = ["Calibrated", "calibrate_config"]
