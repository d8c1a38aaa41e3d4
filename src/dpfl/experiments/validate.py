"""Every range check of a run's config that needs no data, done before any data is built (scikit-learn's "validate
at the edge"): a bad value is reported at once, by the code that will use it, naming the key, the value and what is
allowed, not after minutes of data generation.

The checks are the users' own: the sampler, the algorithm (built from its registered builder with what the config
alone says about the data), the trust boundary, the ledger and the model check their values on construction, and
``validate`` constructs them from the config. What depends on the data itself (the default delta, from the number of
training records, each client's number of records, the model's input width) is checked when the data is built; the
data's own keys are checked by ``dpfl.data.build_dataset`` before it generates or loads anything.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.algorithms import registry
from dpfl.engine.boundary import Boundary
from dpfl.engine.device import resolve_device
from dpfl.engine.epsilon_schedule import check_epsilon_every
from dpfl.errors import ConfigError, check_delta, check_range, check_target_epsilon
from dpfl.models import check_model_keys
from dpfl.experiments.tensorboard_log import check_tensorboard

if TYPE_CHECKING:
    from dpfl.experiments.resolved import RunConfig

#: A stand-in for privacy.delta when it is left to its data-dependent default: only the other ledger keys are checked.
_DELTA_STAND_IN = 0.5


def validate(config: RunConfig) -> None:
    """Raises ConfigError for the first value of ``config`` (``resolved.RunConfig``, of a config loaded by
    ``dpfl.experiments.config``) out of its range, without building any data."""
    algorithm, privacy, run = config.algorithm, config.privacy, config.run
    for key, value in (("eval_every", run.eval_every), ("checkpoint_every", run.checkpoint_every),
                       ("memory_mb", run.memory_mb)):
        check_range(f"run.{key}", value, 1, integer=True)
    check_epsilon_every(run.epsilon_every)
    if run.eval_clients is not None:
        check_range("run.eval_clients", run.eval_clients, 1, integer=True)
    if run.threads is not None:
        check_range("run.threads", run.threads, 1, integer=True)
    resolve_device(run.device)
    check_tensorboard(run.tensorboard)
    check_range("run.seed", run.seed, 0, integer=True)
    if run.noise_seed is not None:
        check_range("run.noise_seed", run.noise_seed, 0, integer=True)
    check_secure_noise(config)
    rounds = check_range("algorithm.rounds", algorithm.rounds, 1, integer=True)
    if privacy.epsilon is not None:
        check_target_epsilon("privacy.epsilon", privacy.epsilon)
    delta = privacy.delta
    if delta is not None:
        check_delta("privacy.delta", delta)  # below MAX_DELTA: values above 1 / N warn (dpfl.experiments.doubtful)
    algorithm.spec.check_sampling(algorithm.name, algorithm.client_sampling)  # a scheme the family cannot account
    num_clients = config.data["num_clients"]
    if num_clients is not None:  # None (data with its own clients): the sampler is checked once the data is built
        check_range("data.num_clients", num_clients, 1, integer=True)
        algorithm.client_sampler(num_clients)
        algorithm.check_rounds(num_clients)
    boundary = Boundary(privacy.boundary, released=privacy.release, shuffle=privacy.shuffler, cohort=privacy.cohort)
    # a family that sizes its cohort or calibrates its noise from the data (its Calibration, with privacy.epsilon),
    # and any family on data with its own clients (a cohort is sized on their number), is built (and checked) on it
    calibrated = privacy.epsilon is not None and algorithm.spec.calibration is not None
    if algorithm.spec.cohort is None and algorithm.spec.noise_key is not None and not calibrated \
            and num_clients is not None:
        built = algorithm.build(registry.Setting(  # dimension: a stand-in (the model is built on the data); the
            client_rate=algorithm.client_rate, client_sampling=algorithm.client_sampling, num_clients=num_clients,
            rounds=rounds, delta=privacy.delta, epsilon=privacy.epsilon, seed=run.seed, analysis=privacy.analysis,
            secure_noise_bits=run.grid_bits, dimension=1))  # algorithm is only checked here, never run
        check_warm_rounds(config.raw, built)
        delta = _DELTA_STAND_IN if privacy.delta is None else privacy.delta
        PrivacyLedger(boundary.observers, delta, privacy.budgets, privacy.conversion, privacy.analysis,
                      built.neighboring)
    check_model_keys(config.model.name, **{k: v for k, v in config.model.options.items() if k != "bias"})


def check_secure_noise(config: RunConfig) -> None:
    """run.secure_noise only where its accounting is sound (``dpfl.noise.DiscreteGaussianMechanism``,
    ``DiscreteGaussianDpEvent``): a family whose spec takes it (its builder refuses the options it does not cover),
    a private name, the sound analysis (the papers' accountants are the continuous Gaussian's), no secure aggregation
    (it sums the clients' rounded messages, whose noise would have to be summed shares)."""
    run, algorithm, privacy = config.run, config.algorithm, config.privacy
    if not run.secure_noise:
        return
    check_range("run.secure_noise_bits", run.secure_noise_bits, 1, 40, integer=True)
    if not (algorithm.spec.secure_noise and algorithm.spec.private(algorithm.name)):
        covered = [n for n in registry.names() if registry.spec_of(n).secure_noise and registry.spec_of(n).private(n)]
        raise ConfigError("run.secure_noise", True, f"false for algorithm.name = {algorithm.name!r}: the secure "
                                                    f"mechanism is implemented for {covered}")
    if privacy.analysis != "sound":
        raise ConfigError("privacy.analysis", privacy.analysis, "'sound' with run.secure_noise = true (the papers' "
                                                                "analyses are the continuous Gaussian's)")
    if privacy.secure_aggregation:
        raise ConfigError("privacy.secure_aggregation", True, "false with run.secure_noise = true (secure aggregation "
                                                              "sums rounded messages; its noise would be summed "
                                                              "shares, which the secure mode does not credit)")


def check_warm_rounds(config: dict, algorithm) -> None:
    """A run must go past the algorithm's warm-start rounds (which leave the model unchanged)."""
    warm_rounds = algorithm.warm_rounds
    rounds = config["algorithm"]["rounds"]
    if warm_rounds >= rounds:
        raise ConfigError("algorithm.rounds", rounds,
                          f"more than the {warm_rounds} warm-start rounds (round(4 / client_rate)) of "
                          f"{config['algorithm']['name']}")


__all__ = ["validate", "check_secure_noise", "check_warm_rounds"]
