"""The noise level a run needs for privacy.epsilon, solved against the run's own ledger: the one calibration route of
every family that sets its noise from privacy.epsilon (``registry.Calibration``).

For a trial level z, the family's algorithm is built with ``Setting.noise = z``, every round is declared as the
simulator declares it (``engine.simulator.declare_round``: the release, the boundary's view of it for each observer
and the client sampler's participation where the family's guarantee credits it, from the initial state: no round is trained), and a ledger with the run's
delta, analysis and conversion and the algorithm's neighbouring relation and accountant says what the rounds spend
(``PrivacyLedger.epsilon_after``). The answer is the smallest z (relative precision ``NOISE_RTOL``, or the family's
``Calibration.rtol``) whose epsilon towards each observer the family names (behind the run's boundary, or the one the
family states its guarantee behind) is at most privacy.epsilon: ``accounting.calibrate.solve_noise``. A family whose
clients have budgets of their own gets one level per budget (``calibrated_setting``). So the noise
meets the target by the same accounting the run reports, and no family re-describes its release to calibrate it.
"""

from __future__ import annotations

import dataclasses

import torch

from dpfl.accounting.calibrate import solve_noise
from dpfl.accounting.ledger import PrivacyLedger
from dpfl.algorithms import registry
from dpfl.algorithms.registry import AlgorithmSpec, Setting
from dpfl.engine.boundary import Boundary
from dpfl.engine.sampling import ClientSampler
from dpfl.engine.simulator import declare_round
from dpfl.errors import check_range

#: Relative precision of a calibrated noise level (as `dpfl calibrate gaussian`).
NOISE_RTOL = 1e-4


def accounted_boundary(privacy) -> Boundary:
    """The boundary a run of the [privacy] section ``privacy`` (``resolved.PrivacyConfig``) accounts for, with which
    models a third party sees (privacy.release) and the shuffler (privacy.shuffler: the real one delivers sums)."""
    return Boundary(privacy.accounted_boundary, released=privacy.release, shuffle=privacy.shuffler,
                    cohort=privacy.cohort)


def noise_for_epsilon(spec: AlgorithmSpec, name: str, section, setting: Setting, boundary: Boundary) -> float:
    """The smallest noise level whose ``setting.rounds`` rounds of ``name`` (its config ``section``) spend at most
    ``setting.epsilon`` towards each observer of ``spec.calibration`` behind ``boundary`` (module docstring)."""
    calibration = spec.calibration
    target = check_range("privacy.epsilon", setting.epsilon, 0.0, low_open=True)
    check_range("algorithm.rounds", setting.rounds, 1, integer=True)
    rate = setting.client_rate if calibration.credits_client_sampling else 1.0
    clients = spec.client_sampler(name, section, setting.num_clients, rate, setting.client_sampling,
                                  public_seed=setting.seed if spec.public_cohorts else None)
    boundary, observers = calibration_target(spec, name, section, setting, boundary)
    searched = calibration.searched(name, section)

    def epsilon_of(level: float) -> float:
        algorithm = spec.build(name, searched, dataclasses.replace(setting, noise=level))
        return max(declared_epsilon(algorithm, setting, boundary, clients, observers).values())

    return solve_noise(epsilon_of, target, initial_noise=calibration.initial(name, section, setting),
                       rtol=calibration.rtol or NOISE_RTOL)


def calibration_target(spec: AlgorithmSpec, name: str, section, setting: Setting,
                       boundary: Boundary) -> tuple[Boundary, list[str]]:
    """(the boundary the family states its guarantee behind: ``Calibration.boundary``, else the run's ``boundary``;
    the observers of ``spec.calibration`` behind it): whose epsilon privacy.epsilon bounds."""
    calibration = spec.calibration
    stated = calibration.boundary(name, section, setting)
    if stated is not None:
        boundary = Boundary(stated, released=boundary.released, cohort=boundary.cohort)
    return boundary, [o for o in calibration.observers(name, section, setting) if o in boundary.observers]


def calibration_report(spec: AlgorithmSpec, name: str, section, setting: Setting, boundary: Boundary) -> dict | None:
    """What results.json says of a calibrated run (``setting`` as ``calibrated_setting`` returns it): the target, the
    observers it bounds and the boundary they stand behind (``calibration_target``), and the level solved (or one
    per client budget); None when the noise was not solved for privacy.epsilon."""
    if spec.calibration is None or setting.epsilon is None:
        return None
    stated, observers = calibration_target(spec, name, section, setting, boundary)
    levels = {str(eps): level for eps, level in setting.levels}
    return {"target_epsilon": setting.epsilon, "observers": observers, "boundary": stated.name,
            "noise_level": levels if levels else setting.noise}


def calibrated_setting(spec: AlgorithmSpec, name: str, section, setting: Setting, boundary: Boundary) -> Setting:
    """``setting`` with the noise level its family needs behind ``boundary``: for each of the clients' own budgets
    (``Calibration.budgets``: ``Setting.levels``), else for privacy.epsilon when it is set (``Setting.noise``); as
    it was for a family that does not calibrate."""
    calibration = spec.calibration
    if calibration is None:
        return setting
    budgets = calibration.budgets(name, section, setting)
    if budgets:
        return dataclasses.replace(setting, levels=tuple(
            (eps, noise_for_epsilon(spec, name, uniform, dataclasses.replace(setting, epsilon=eps), boundary))
            for eps, uniform in sorted(budgets.items())))
    if setting.epsilon is None:
        return setting
    return dataclasses.replace(setting, noise=noise_for_epsilon(spec, name, section, setting, boundary))


def declared_epsilon(algorithm, setting: Setting, boundary: Boundary, clients: ClientSampler,
                     observers=None) -> dict[str, float]:
    """Epsilon towards each of ``observers`` (default: the boundary's) of ``setting.rounds`` rounds of ``algorithm``,
    every round declared as the simulator declares it from the initial state (no round is trained), by a fresh ledger
    of the run's delta, analysis and conversion and the algorithm's neighbouring relation and accountant."""
    counts = torch.tensor(setting.train_counts, dtype=torch.long)
    state = algorithm.init_state(torch.zeros(setting.dimension or 1), setting.num_clients)
    events = [declare_round(algorithm, boundary, clients, setting.analysis, t, state, counts)[1]
              for t in range(setting.rounds)]
    ledger = PrivacyLedger(boundary.observers, setting.delta, None, setting.conversion, setting.analysis,
                           algorithm.neighboring, algorithm.accountant)
    return ledger.epsilon_after(events, observers)


def build_calibrated(name: str, section, setting: Setting, boundary: Boundary | None = None):
    """The registered algorithm ``name`` of ``section`` and ``setting``, its noise level solved first when the family
    calibrates (``calibrated_setting``, behind ``boundary``, default plain): a run's algorithm without its data
    (tests, the papers' tables)."""
    spec = registry.spec_of(name)
    return spec.build(name, section, calibrated_setting(spec, name, section, setting, boundary or Boundary()))


__all__ = ["NOISE_RTOL", "accounted_boundary", "noise_for_epsilon", "calibration_target", "calibration_report",
           "calibrated_setting", "declared_epsilon", "build_calibrated"]
