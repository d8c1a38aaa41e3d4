"""The parts of a run, each from its resolved config (``resolved.RunConfig``): data, model, clients, delta, algorithm,
boundary, ledger; and the run they make (``build_simulation``). Calibration builds those that decide the privacy, and
no more (``dpfl.experiments.calibration``).

The order of a build is the order of its refusals: the config's ranges before any data is built (``resolve``), the
data's memory before it is built (``footprint.check_data_memory``), the model's and the algorithm's state's memory
before they are built (``memory.check_run_memory``: estimated on a model of shapes only, torch's meta device).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from pathlib import Path

import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.algorithms import registry
from dpfl.data import FederatedDataset, build_dataset
from dpfl.data.footprint import check_data_memory
from dpfl.engine.boundary import Boundary, SecureAggregation
from dpfl.engine.device import chunk_budget_bytes, resolve_device
from dpfl.engine.grads import CohortGradients
from dpfl.engine.ranks import Ranks, RankWorkers
from dpfl.engine.sampling import ClientSampler
from dpfl.engine.simulator import Simulation
from dpfl.errors import ConfigError
from dpfl.experiments import doubtful
from dpfl.experiments.memory import check_run_memory, run_footprint
from dpfl.experiments.noise_level import accounted_boundary, calibrated_setting, calibration_report
from dpfl.experiments.resolved import DEFAULT_THREADS, PrivacyConfig, RunConfig, resolve
from dpfl.experiments.run_directory import release_hash, run_key
from dpfl.experiments.supplied import NOTHING, Supplied
from dpfl.experiments.validate import check_warm_rounds
from dpfl.models import build_model, token_records


def build_simulation(config: dict, out_dir: Path | None = None, workers=None, noise_key: int | None = None,
                     run_id: str = "", supplied: Supplied = NOTHING, dataset: FederatedDataset | None = None,
                     evaluator=None, ranks: Ranks | None = None) -> Simulation:
    """The run the loaded ``config`` describes, ready to run: ``assemble(resolve(config, supplied), ...)``, so
    refused before any data is built when the config does not name what was ``supplied`` or a value is out of its
    range. Arguments as for ``assemble``."""
    return assemble(resolve(config, supplied), out_dir, workers, noise_key, run_id, supplied, dataset, evaluator,
                    ranks)


def assemble(config: RunConfig, out_dir: Path | None = None, workers=None, noise_key: int | None = None,
             run_id: str = "", supplied: Supplied = NOTHING, dataset: FederatedDataset | None = None,
             evaluator=None, ranks: Ranks | None = None) -> Simulation:
    """The run ``config`` describes, ready to run; refused before the data is built when building it would not fit
    in the machine's memory, and before the model or any state is built when they would not fit in what is left
    (``memory.check_run_memory``) or one client's work does not fit in run.memory_mb.
    ``workers(config, dataset, delta)``, when given, builds where the cohort's client work runs
    (``Simulation.workers``; default: in this process). ``noise_key``: the secret of the run's DP randomness
    (``dpfl.engine.keys``; default: ``run_directory.run_key``). ``supplied``: a caller's module, loss or records,
    which the config names and fingerprints (``dpfl.experiments.supplied``); a caller's module or loss is tried on two
    records once the model is built, before the first round. ``dataset``: the data the run is built from (default:
    ``build_data(config.data, supplied)``; a Flower ServerApp passes its silos' public metadata,
    ``dpfl.flower.federation``), and ``evaluator`` where its model is evaluated (``Simulation.evaluator``; default:
    on that data). ``ranks``: the processes the cohort's client work is split across (``dpfl.engine.ranks``; this
    process joins their group here, on cuda:LOCAL_RANK for a CUDA run); every rank builds the same data description,
    model and initial state (each then keeps and reads only its own clients' rows), and the same ``noise_key`` must
    be given to each."""
    run = config.run
    if ranks is not None and workers is not None:
        raise ConfigError("--nproc", ranks.world_size, "1 for a run whose client work runs elsewhere (a Flower "
                                                       "deployment): its cohort is split across its nodes already")
    torch.set_num_threads(DEFAULT_THREADS if run.threads is None else run.threads)
    dataset = build_data(config.data, supplied) if dataset is None else dataset
    clients = build_clients(config, dataset)
    delta = run_delta(config, dataset)
    key = run_key(run.noise_seed, out_dir) if noise_key is None else noise_key
    shapes = build_initial_model(config, dataset, "meta", supplied)
    setting = build_setting(config, dataset, delta, secret=key, supplied=supplied, model_shapes=shapes)
    algorithm = config.algorithm.build(setting)
    check_warm_rounds(config.raw, algorithm)
    check_run_memory(config.raw, run_footprint(algorithm, shapes, dataset.train, clients.cohort_size,
                                               run.memory_budget_bytes, config.algorithm.rounds))
    model = build_initial_model(config, dataset, supplied=supplied)
    supplied.check_model(model, dataset)
    device = resolve_device(run.device) if ranks is None else ranks.join(resolve_device(run.device))
    train, test = dataset.train.to(device), dataset.test.to(device)
    boundary = build_boundary(config.privacy, algorithm, dataset.train.counts)
    records = int(dataset.train.counts.sum())
    doubtful.check_delta(config.privacy.delta, records, default_delta(records))
    doubtful.check_cohort(clients)
    doubtful.check_observers(boundary.observers, dataset.num_clients)
    ledger = build_ledger(config, boundary, delta, algorithm, budget=True)
    sim = Simulation(
        train, test, CohortGradients(model.to(device), loss=supplied.loss), algorithm, clients, ledger, seed=key,
        run_id=run_id, secret=run.noise_seed is None, boundary=boundary, eval_every=run.eval_every,
        memory_budget_bytes=chunk_budget_bytes(device, run.memory_budget_bytes), device=device,
        checkpoint_dir=out_dir, checkpoint_every=run.checkpoint_every, epsilon_every=run.epsilon_every,
        release=release_hash(config.raw, config.algorithm.spec), data=dataset.info,
        workers=where_clients_work(config, dataset, delta, workers, ranks), ranks=ranks, evaluator=evaluator,
        calibration=calibration_report(config.algorithm.spec, config.algorithm.name, config.algorithm.section,
                                       setting, accounted_boundary(config.privacy)),
        eval_clients=evaluated_clients(run.eval_clients, dataset.num_clients, run.seed, device),
    )
    doubtful.check_noise_to_signal(sim, calibrated=config.privacy.epsilon is not None)
    if config.privacy.epsilon is None or config.algorithm.spec.calibration is None:  # calibrated: epsilon is the target
        doubtful.check_smallest_client(sim, dataset.info.get("partition", {}).get("client_ids"))
    return sim


def evaluated_clients(count: int | None, num_clients: int, seed: int, device) -> torch.Tensor | None:
    """run.eval_clients: ``count`` of the ``num_clients`` clients, drawn once from the public ``seed`` (run.seed, not
    the noise key: which clients are measured reveals nothing of the data), sorted; None for every client."""
    if count is None or count >= num_clients:
        return None
    generator = torch.Generator().manual_seed(seed)
    return torch.randperm(num_clients, generator=generator)[:count].sort().values.to(device)


def where_clients_work(config: RunConfig, dataset: FederatedDataset, delta: float, workers=None,
                       ranks: Ranks | None = None):
    """``Simulation.workers``: the ranks' (``RankWorkers``), what ``workers`` builds, or None (this process)."""
    if ranks is not None:
        return RankWorkers(ranks)
    return None if workers is None else workers(config, dataset, delta)


def build_data(data: Mapping[str, object], supplied: Supplied = NOTHING) -> FederatedDataset:
    """The federated data set (train and test splits) of a config's [data] section (``RunConfig.data``, or a loaded
    config's ``config["data"]``), or the records a caller supplied (``supplied``); refused before it is built when
    building it would not fit in the machine's memory (``footprint.check_data_memory``), and if no record is left for
    testing."""
    if supplied.data is not None:
        dataset = supplied.dataset(data)
    else:
        check_data_memory(data)
        dataset = build_dataset(**data)
    if int(dataset.test.counts.sum()) == 0:
        raise ConfigError("data.test_fraction", data["test_fraction"],
                          f"a fraction that leaves test records ({dataset.train.counts.min().item()} training records "
                          "per client and none for testing); raise data.samples_per_client or data.test_fraction")
    return dataset


def build_initial_model(config: RunConfig, dataset: FederatedDataset, device: str | None = None,
                        supplied: Supplied = NOTHING) -> torch.nn.Module:
    """The config's model for ``dataset``, initialised from ``run.seed`` (the model a run starts from); on
    ``device`` "meta", its shapes only (nothing allocated: for its size and the memory estimate). A module a caller
    supplied is the model as it is, with its own initial parameters, on any ``device``."""
    if supplied.model is not None:
        return supplied.model
    torch.manual_seed(config.run.seed)  # model initialisation
    with torch.device(device) if device is not None else contextlib.nullcontext():
        return build_model(config.model.name, dataset.train.feature_shape, dataset.num_classes,
                           tokens=token_records(dataset.info), **config.model.options)


def build_clients(config: RunConfig, dataset: FederatedDataset) -> ClientSampler:
    """The cohort sampler: cohorts from the secret noise key, or from run.seed for a family whose analysis treats
    them as public (``registry.AlgorithmSpec.public_cohorts``)."""
    public = config.algorithm.spec.public_cohorts
    return config.algorithm.client_sampler(dataset.num_clients, public_seed=config.run.seed if public else None)


def run_delta(config: RunConfig, dataset: FederatedDataset) -> float:
    """``privacy.delta``, by default ``default_delta(N)`` for the N training records (an explicit delta above 1 / N
    is warned about by ``doubtful.check_delta``)."""
    if config.privacy.delta is None:
        return default_delta(int(dataset.train.counts.sum()))
    return config.privacy.delta


def default_delta(records: int) -> float:
    """The default delta for ``records`` training records: the largest power of ten at most 1 / (10 N), so well below
    1 / N (the convention users expect: delta = 1e-5 for N = 1,592 records, 1e-6 for 32,000). Papers reproduced with
    their own delta (Noble et al. 2022: 1 / N) set privacy.delta explicitly."""
    exponent = 1
    while 10 ** exponent < 10 * records:
        exponent += 1
    return 10.0 ** -exponent


def build_algorithm(config: RunConfig, dataset: FederatedDataset, delta: float, secret: int | None = None,
                    supplied: Supplied = NOTHING, model_shapes: torch.nn.Module | None = None):
    """The registered algorithm of ``algorithm.name``, built from its section and the run's ``registry.Setting``
    (``secret``: the noise key of the party that builds it, ``registry.Setting.secret``; ``model_shapes``: as for
    ``build_setting``)."""
    return config.algorithm.build(build_setting(config, dataset, delta, secret, supplied, model_shapes))


def build_setting(config: RunConfig, dataset: FederatedDataset, delta: float, secret: int | None = None,
                  supplied: Supplied = NOTHING, model_shapes: torch.nn.Module | None = None) -> registry.Setting:
    """What the algorithm's builder knows besides its [algorithm] keys (``registry.Setting``; with a caller's module,
    its number of parameters, and with a caller's loss, its name). ``model_shapes``: the run's initial model on the
    meta device, for its number of parameters (default: built here); refused (ConfigError naming algorithm.rounds)
    when a one-pass family is given more rounds than its clients allow. A family that sets its noise from
    privacy.epsilon (``registry.Calibration``) gets the level solved against the run's ledger
    (``noise_level.calibrated_setting``) as ``Setting.noise`` (or one per client budget, ``Setting.levels``)."""
    algorithm, privacy = config.algorithm, config.privacy
    algorithm.check_rounds(dataset.num_clients)
    client_rate, client_sampling = algorithm.cohort_sampling(dataset.num_clients)
    shapes = build_initial_model(config, dataset, "meta", supplied) if model_shapes is None else model_shapes
    setting = registry.Setting(
        client_rate=client_rate, client_sampling=client_sampling,
        num_clients=dataset.num_clients, train_counts=tuple(int(c) for c in dataset.train.counts),
        rounds=algorithm.rounds, delta=delta, epsilon=privacy.epsilon, seed=config.run.seed,
        secret=secret, analysis=privacy.analysis, conversion=privacy.conversion, release=privacy.release,
        model=dict(config.raw["model"]), num_classes=dataset.num_classes, loss=supplied.fingerprint.get("loss"),
        dimension=sum(p.numel() for p in shapes.parameters()), secure_noise_bits=config.run.grid_bits)
    return calibrated_setting(algorithm.spec, algorithm.name, algorithm.section, setting, accounted_boundary(privacy))


def build_boundary(privacy: PrivacyConfig, algorithm, counts: torch.Tensor) -> Boundary:
    """privacy.boundary, with the real secure aggregation behind it when privacy.secure_aggregation is true (then the
    boundary is 'secagg'; 'plain', the default, is read as 'secagg')."""
    name = privacy.boundary
    if not privacy.secure_aggregation:
        return Boundary(name, released=privacy.release, shuffle=privacy.shuffler, cohort=privacy.cohort)
    if name not in ("plain", "secagg"):
        raise ConfigError("privacy.boundary", name, "'secagg' (or the default) with privacy.secure_aggregation = true")
    bound = algorithm.message_bound(counts)
    if bound is None:
        raise ConfigError("privacy.secure_aggregation", True,
                          "false for this algorithm: secure aggregation encodes messages into a finite ring, which "
                          "needs an algorithm that bounds its messages (dp-fedavg-joint, dp-fedavg-user without "
                          "adaptive clipping)")
    return Boundary("secagg", SecureAggregation(bound, privacy.secagg_bits, algorithm.min_clients), privacy.release,
                    shuffle=privacy.shuffler, cohort=privacy.cohort)


def build_ledger(config: RunConfig, boundary: Boundary, delta: float, algorithm, budget: bool) -> PrivacyLedger:
    """The run's privacy ledger: the boundary's observers, the run's delta, analysis, conversion, the algorithm's
    neighbouring relation and accountant, if it names one (and ``privacy.budget`` when ``budget``)."""
    privacy = config.privacy
    return PrivacyLedger(boundary.observers, delta, privacy.budgets if budget else None,
                         privacy.conversion, privacy.analysis, algorithm.neighboring,
                         algorithm.accountant)


__all__ = ["build_simulation", "assemble", "where_clients_work", "build_data", "build_initial_model", "build_clients",
           "run_delta", "default_delta", "build_algorithm", "build_setting", "build_boundary", "build_ledger"]
