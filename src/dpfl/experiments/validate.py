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


from dpfl.accounting.ledger import PrivacyLedger
from dpfl.accounting.observers import THIRD_PARTY
from dpfl.algorithms import registry
from dpfl.engine.boundary import Boundary
from dpfl.engine.sampling import ClientSampler
from dpfl.errors import ConfigError, check_range, check_target_epsilon
from dpfl.models import check_model_keys

#: A stand-in for privacy.delta when it is left to its data-dependent default: only the other ledger keys are checked.
_DELTA_STAND_IN = 0.5
#: privacy.delta must be below this: delta is the probability that the epsilon guarantee fails outright, and a delta
#: of 0.1 allows a mechanism that publishes a tenth of the records in full (values above 1 / N warn:
#: ``dpfl.experiments.doubtful``).
MAX_DELTA = 0.1


def validate(config: dict) -> None:
    """Raises ConfigError for the first value of ``config`` (loaded by ``dpfl.experiments.config``) out of its range,
    without building any data."""
    data_cfg, model_cfg, algo_cfg = config["data"], config["model"], config["algorithm"]
    privacy_cfg, run_cfg = config["privacy"], config["run"]
    for key in ("eval_every", "checkpoint_every", "memory_mb"):
        check_range(f"run.{key}", run_cfg[key], 1, integer=True)
    if run_cfg["threads"] is not None:
        check_range("run.threads", run_cfg["threads"], 1, integer=True)
    check_range("run.seed", run_cfg["seed"], 0, integer=True)
    if run_cfg["noise_seed"] is not None:
        check_range("run.noise_seed", run_cfg["noise_seed"], 0, integer=True)
    rounds = check_range("algorithm.rounds", algo_cfg["rounds"], 1, integer=True)
    if privacy_cfg["epsilon"] is not None:
        check_target_epsilon("privacy.epsilon", privacy_cfg["epsilon"])
    delta = privacy_cfg["delta"]
    if delta is not None and check_range("privacy.delta", delta, 0.0, 1.0, low_open=True, high_open=True) >= MAX_DELTA:
        raise ConfigError("privacy.delta", delta, f"a number in (0, {MAX_DELTA:g}): delta is the probability that the "
                                                  "epsilon guarantee fails outright, meant to be well below 1 / N "
                                                  "(N training records; the default is 1 / N)")
    num_clients = data_cfg["num_clients"]
    spec = registry.spec_of(algo_cfg["name"])
    section = spec.section(algo_cfg)
    if num_clients is not None:  # None (data with its own clients): the sampler is checked once the data is built
        check_range("data.num_clients", num_clients, 1, integer=True)
        ClientSampler(num_clients, *cohort_sampling(config, num_clients))
        spec.check_rounds(section, num_clients, rounds, algo_cfg["name"])
    boundary = Boundary(privacy_cfg["boundary"], released=privacy_cfg["release"], shuffle=privacy_cfg["shuffler"])
    # a family that sizes its cohort or calibrates its noise from the data is built (and checked) on the data
    if spec.cohort is None and spec.noise_key is not None:
        algorithm = spec.build(algo_cfg["name"], section, registry.Setting(
            client_rate=algo_cfg["client_rate"], client_sampling=algo_cfg["client_sampling"],
            num_clients=num_clients, rounds=rounds, delta=privacy_cfg["delta"],
            epsilon=privacy_cfg["epsilon"], seed=run_cfg["seed"], analysis=privacy_cfg["analysis"]))
        check_warm_rounds(config, algorithm)
        delta = _DELTA_STAND_IN if privacy_cfg["delta"] is None else privacy_cfg["delta"]
        PrivacyLedger(boundary.observers, delta, budget_of(privacy_cfg["budget"]), privacy_cfg["conversion"],
                      privacy_cfg["analysis"], algorithm.neighboring)
    check_model_keys(model_cfg["name"], **{k: v for k, v in model_cfg.items() if k not in ("name", "bias")})


def cohort_sampling(config: dict, num_clients: int) -> tuple[float, str]:
    """(client rate, scheme): algorithm.client_rate and client_sampling, or the family's own cohort keys."""
    algo_cfg = config["algorithm"]
    spec = registry.spec_of(algo_cfg["name"])
    if spec.cohort is None:
        return algo_cfg["client_rate"], algo_cfg["client_sampling"]
    return spec.client_sampling(spec.section(algo_cfg), num_clients)


def check_warm_rounds(config: dict, algorithm) -> None:
    """A run must go past the algorithm's warm-start rounds (which leave the model unchanged)."""
    warm_rounds = algorithm.warm_rounds
    rounds = config["algorithm"]["rounds"]
    if warm_rounds >= rounds:
        raise ConfigError("algorithm.rounds", rounds,
                          f"more than the {warm_rounds} warm-start rounds (round(4 / client_rate)) of "
                          f"{config['algorithm']['name']}")


def budget_of(budget) -> dict | None:
    """privacy.budget as {observer: epsilon}: a number is the third party's budget."""
    if budget is None or isinstance(budget, dict):
        return budget
    return {THIRD_PARTY: budget}


__all__ = ["validate", "cohort_sampling", "check_warm_rounds", "budget_of"]
