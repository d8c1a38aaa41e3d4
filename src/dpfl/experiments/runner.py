"""Turns a validated config into a run: builds data, model, algorithm, samplers and ledger, runs, writes results.

Rounds are numbered from 1 wherever a user reads them: round r of T is the r-th round (the progress line "round r/T",
results.json's "round", ledger.json's journal, the stop and resume messages, `dpfl plot`'s axis).

results.json is written (atomically) after every evaluated round and when the run ends, so a crash or Ctrl-C leaves
the latest results. It holds "config", "data" (where the data came from and how it was made,
``FederatedDataset.info``: its source (for a file: path, format, sha256, columns or arrays), classes, partition,
split, preprocessing), "rounds" (one entry per evaluated round: round, test_accuracy, train_loss,
epsilon per observer as of that round, and gradient_mapping for an algorithm with a prox step: ``RoundMetrics``; a
round replayed after a resume reports its own epsilon), "final" (the same keys plus delta, for the model after the last
round done, with the epsilon of every round the ledger records: after a resume stopped mid-replay, also the rounds
recorded before the crash), "privacy"
(accountant, conversion, observers, what each sees, the budget per observer, how the boundary is "enforced" (real protocol, simulated, declared),
where the "noise" comes from (a secret key, or the research mode's run.noise_seed); "events_per_round": each
observer's event of round "events_round", the last round done as the ledger charged it, or the first round as it will
be charged when none is done: one round's events, not the run's, which an algorithm that charges a record once
(isrl-prox-sgd) spends in round 1), "status" ("running": the run has not ended, or its process died
(resume it); "finished": it ran all its rounds; "stopped": see "stopped_by"), "wall_seconds" (the time in the round
loop over the whole run, across resumes), "session_seconds" (this process's part of it), "stopped_reason" and
"stopped_by" (what stopped the run early: "budget", "diverged", "interrupted"; null when it did not) and, when the
directory holds runs archived by ``restart``, "archived" (their spend, and the total with this run:
``dpfl.experiments.archive``), and for a run evaluated elsewhere than on its own data (``Simulation.evaluator``),
"evaluation" (where its metrics come from, whether epsilon covers them; a metric not measured is null). A run
directory also holds

* run.json: the full resolved config, the sha256 of its release config and the run's public identity (run_id),
  written (atomically) before the first round (for a module, loss or records a Python caller supplied, the config's
  ``supplied`` section holds their fingerprint: ``dpfl.experiments.supplied``);
* noise.key: the secret key of the run's noise (``dpfl.engine.keys``; owner-only, written before the first round;
  absent in the research mode, ``run.noise_seed``): never share it, whoever has it can remove the noise;
* ledger.json: the privacy spent, written before each round draws noise (see dpfl.accounting.ledger);
* checkpoint.pt: the algorithm's state (its state_dict), the next round and the history, every run.checkpoint_every
  rounds (dpfl.engine.checkpoint).

The release config is everything that decides what a round releases: the config minus the run-only keys
(``RUN_ONLY_KEYS``: how many rounds, the budget, how often to evaluate and checkpoint), except those the algorithm's
release depends on (its spec's ``release_keys``, e.g. the rounds when its noise is calibrated to a total budget). ``resume=True`` continues the
run only with the same release config (so a replayed round can never draw the same noise onto a different
computation) and never forgets privacy already spent; a new run never overwrites a directory that holds one
(``restart=True`` archives it first).
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import math
import os
import secrets
import sys
from pathlib import Path

import torch

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.algorithms import registry
from dpfl.data import FederatedDataset, build_dataset
from dpfl.data.footprint import check_data_memory
from dpfl.engine.boundary import Boundary, SecureAggregation
from dpfl.engine.grads import CohortGradients
from dpfl.engine.keys import KEY_FILE, fresh_key, load_key
from dpfl.engine.sampling import ClientSampler
from dpfl.durable import write_text_atomically
from dpfl.engine.simulator import Simulation
from dpfl.errors import ConfigError, RunDirectoryError, RunInterrupted, json_problem
from dpfl.experiments import doubtful
from dpfl.experiments.archive import archive_run, archived_spend, with_archived
from dpfl.experiments.memory import check_run_memory, run_footprint
from dpfl.experiments.supplied import NOTHING, Supplied
from dpfl.experiments.validate import budget_of, check_warm_rounds, cohort_sampling, validate
from dpfl.models import build_model

RUN_ONLY_KEYS = ("algorithm.rounds", "privacy.budget", "run.eval_every", "run.checkpoint_every")
#: ``run.threads`` when a config leaves it unset. The cohort is one batched call (clients are a tensor axis), so a
#: second intra-op thread has little to share, and on a busy machine the threads wait for each other's time slices at
#: every op: alternated at the same moment on a shared 2-core machine (load 4-8, benchmarks/threads.py), the demo's
#: DP-FedAvg took 0.17 s a round with one thread and 5.2 s with two, Noble et al.'s (2022) synthetic workload 1.9 s
#: and 16.9 s. At load 1.5-2 the demo did not care (0.047 s against 0.045) and that workload took 0.34 s against 0.22:
#: two threads pay only on cores known to be free, which a config can say (run.threads). A fixed count (not one read
#: off the machine's load) also keeps a config's results the same wherever it runs.
DEFAULT_THREADS = 1
#: results.json's privacy.not_covered for a run evaluated on its own data (``Simulation.evaluate``).
NOT_COVERED = ("the reported metrics (train loss on all training records, test accuracy) are computed without noise "
               "for research evaluation; epsilon covers the models and messages only")


def build_simulation(config: dict, out_dir: Path | None = None, workers=None, noise_key: int | None = None,
                     run_id: str = "", supplied: Supplied = NOTHING, dataset: FederatedDataset | None = None,
                     evaluator=None) -> Simulation:
    """The run ``config`` describes, ready to run; refused before the data is built when building it would not fit
    in the machine's memory, and before the model or any state is built when they would not fit in what is left
    (``memory.check_run_memory``) or one client's work does not fit in run.memory_mb.
    ``workers(config, dataset, delta)``, when given, builds where the cohort's client work runs
    (``Simulation.workers``; default: in this process). ``noise_key``: the secret of the run's DP randomness
    (``dpfl.engine.keys``; default: ``run_key``). ``supplied``: a caller's module, loss or records, which the config
    names and fingerprints (``dpfl.experiments.supplied``); a caller's module or loss is tried on two records once the
    model is built, before the first round. ``dataset``: the data the run is built from (default:
    ``build_data(config, supplied)``; a Flower ServerApp passes its silos' public metadata, ``dpfl.flower.federation``),
    and ``evaluator`` where its model is evaluated (``Simulation.evaluator``; default: on that data)."""
    privacy_cfg, run_cfg = config["privacy"], config["run"]
    supplied.check(config)
    validate(config)  # every range check that needs no data, before the data is built
    torch.set_num_threads(DEFAULT_THREADS if run_cfg["threads"] is None else run_cfg["threads"])
    dataset = build_data(config, supplied) if dataset is None else dataset
    clients = build_clients(config, dataset)
    delta = run_delta(config, dataset)
    key = run_key(config, out_dir) if noise_key is None else noise_key
    algorithm = build_algorithm(config, dataset, delta, secret=key, supplied=supplied)
    check_warm_rounds(config, algorithm)
    check_run_memory(config, run_footprint(algorithm, build_initial_model(config, dataset, "meta", supplied),
                                           dataset.train, clients.cohort_size, run_cfg["memory_mb"] * 2**20))
    model = build_initial_model(config, dataset, supplied=supplied)
    supplied.check_model(model, dataset)
    boundary = build_boundary(privacy_cfg, algorithm, dataset.train.counts)
    records = int(dataset.train.counts.sum())
    doubtful.check_delta(privacy_cfg["delta"], records, default_delta(records))
    doubtful.check_cohort(clients)
    doubtful.check_observers(boundary.observers, dataset.num_clients)
    ledger = build_ledger(config, boundary, delta, algorithm, budget=True)
    sim = Simulation(
        dataset.train, dataset.test, CohortGradients(model, loss=supplied.loss), algorithm, clients, ledger, seed=key,
        run_id=run_id, secret=run_cfg["noise_seed"] is None,
        boundary=boundary, eval_every=run_cfg["eval_every"], memory_budget_bytes=run_cfg["memory_mb"] * 2**20,
        checkpoint_dir=out_dir, checkpoint_every=run_cfg["checkpoint_every"], release=release_hash(config),
        data=dataset.info, workers=None if workers is None else workers(config, dataset, delta), evaluator=evaluator,
    )
    return sim


# -- the parts of a run, each from the config (calibration builds those that decide the privacy, and no more) ------
def build_data(config: dict, supplied: Supplied = NOTHING) -> FederatedDataset:
    """The config's federated data set (train and test splits), or the records a caller supplied (``supplied``);
    refused before it is built when building it would not fit in the machine's memory
    (``footprint.check_data_memory``), and if no record is left for testing."""
    data_cfg = config["data"]
    if supplied.data is not None:
        dataset = supplied.dataset(config)
    else:
        check_data_memory(data_cfg)
        dataset = build_dataset(**data_cfg)
    if int(dataset.test.counts.sum()) == 0:
        raise ConfigError("data.test_fraction", data_cfg["test_fraction"],
                          f"a fraction that leaves test records ({dataset.train.counts.min().item()} training records "
                          "per client and none for testing); raise data.samples_per_client or data.test_fraction")
    return dataset


def build_initial_model(config: dict, dataset: FederatedDataset, device: str | None = None,
                        supplied: Supplied = NOTHING) -> torch.nn.Module:
    """The config's model for ``dataset``, initialised from ``run.seed`` (the model a run starts from); on
    ``device`` "meta", its shapes only (nothing allocated: for its size and the memory estimate). A module a caller
    supplied is the model as it is, with its own initial parameters, on any ``device``."""
    if supplied.model is not None:
        return supplied.model
    model_cfg = config["model"]
    torch.manual_seed(config["run"]["seed"])  # model initialisation
    with torch.device(device) if device is not None else contextlib.nullcontext():
        return build_model(model_cfg["name"], dataset.train.feature_shape, dataset.num_classes,
                           **{k: v for k, v in model_cfg.items() if k != "name"})


def build_clients(config: dict, dataset: FederatedDataset) -> ClientSampler:
    """The cohort sampler: cohorts from the secret noise key, or from run.seed for a family whose analysis treats
    them as public (``registry.AlgorithmSpec.public_cohorts``)."""
    public = registry.spec_of(config["algorithm"]["name"]).public_cohorts
    return ClientSampler(dataset.num_clients, *cohort_sampling(config, dataset.num_clients),
                         public_seed=config["run"]["seed"] if public else None)


def run_delta(config: dict, dataset: FederatedDataset) -> float:
    """``privacy.delta``, by default ``default_delta(N)`` for the N training records (an explicit delta above 1 / N
    is warned about by ``doubtful.check_delta``)."""
    delta, records = config["privacy"]["delta"], int(dataset.train.counts.sum())
    if delta is None:
        return default_delta(records)
    return delta


def default_delta(records: int) -> float:
    """The default delta for ``records`` training records: the largest power of ten at most 1 / (10 N), so well below
    1 / N (the convention users expect: delta = 1e-5 for N = 1,592 records, 1e-6 for 32,000). Papers reproduced with
    their own delta (Noble et al. 2022: 1 / N) set privacy.delta explicitly."""
    exponent = 1
    while 10 ** exponent < 10 * records:
        exponent += 1
    return 10.0 ** -exponent


def build_algorithm(config: dict, dataset: FederatedDataset, delta: float, secret: int | None = None,
                    supplied: Supplied = NOTHING):
    """The registered algorithm of ``algorithm.name``, built from its section and the run's ``registry.Setting``
    (``secret``: the noise key of the party that builds it, ``registry.Setting.secret``)."""
    algo_cfg = config["algorithm"]
    spec = registry.spec_of(algo_cfg["name"])
    section = spec.section(algo_cfg)
    spec.check_rounds(section, dataset.num_clients, algo_cfg["rounds"], algo_cfg["name"])
    return spec.build(algo_cfg["name"], section, build_setting(config, dataset, delta, secret, supplied))


def build_setting(config: dict, dataset: FederatedDataset, delta: float,
                  secret: int | None = None, supplied: Supplied = NOTHING) -> registry.Setting:
    """What the algorithm's builder knows besides its [algorithm] keys (``registry.Setting``; with a caller's module,
    its number of parameters, and with a caller's loss, its name)."""
    algo_cfg, privacy_cfg = config["algorithm"], config["privacy"]
    client_rate, client_sampling = cohort_sampling(config, dataset.num_clients)
    return registry.Setting(
        client_rate=client_rate, client_sampling=client_sampling,
        num_clients=dataset.num_clients, train_counts=tuple(int(c) for c in dataset.train.counts),
        rounds=algo_cfg["rounds"], delta=delta, epsilon=privacy_cfg["epsilon"], seed=config["run"]["seed"],
        secret=secret, analysis=privacy_cfg["analysis"], conversion=privacy_cfg["conversion"], release=privacy_cfg["release"],
        model=dict(config["model"]), num_classes=dataset.num_classes, loss=supplied.fingerprint.get("loss"),
        dimension=sum(p.numel() for p in build_initial_model(config, dataset, "meta", supplied).parameters()))


def boundary_name(privacy_cfg: dict) -> str:
    """The boundary a run accounts for: privacy.boundary, or 'secagg' with privacy.secure_aggregation."""
    return "secagg" if privacy_cfg["secure_aggregation"] else privacy_cfg["boundary"]


def build_boundary(privacy_cfg: dict, algorithm, counts: torch.Tensor) -> Boundary:
    """privacy.boundary, with the real secure aggregation behind it when privacy.secure_aggregation is true (then the
    boundary is 'secagg'; 'plain', the default, is read as 'secagg')."""
    name = privacy_cfg["boundary"]
    if not privacy_cfg["secure_aggregation"]:
        return Boundary(name, released=privacy_cfg["release"], shuffle=privacy_cfg["shuffler"])
    if name not in ("plain", "secagg"):
        raise ConfigError("privacy.boundary", name, "'secagg' (or the default) with privacy.secure_aggregation = true")
    bound = algorithm.message_bound(counts)
    if bound is None:
        raise ConfigError("privacy.secure_aggregation", True,
                          "false for this algorithm: secure aggregation encodes messages into a finite ring, which "
                          "needs an algorithm that bounds its messages (dp-fedavg-joint)")
    return Boundary("secagg", SecureAggregation(bound, privacy_cfg["secagg_bits"], algorithm.min_clients),
                    privacy_cfg["release"], shuffle=privacy_cfg["shuffler"])


def build_ledger(config: dict, boundary: Boundary, delta: float, algorithm, budget: bool) -> PrivacyLedger:
    """The run's privacy ledger: the boundary's observers, the run's delta, analysis, conversion, the algorithm's
    neighbouring relation and accountant, if it names one (and ``privacy.budget`` when ``budget``)."""
    privacy_cfg = config["privacy"]
    return PrivacyLedger(boundary.observers, delta, budget_of(privacy_cfg["budget"]) if budget else None,
                         privacy_cfg["conversion"], privacy_cfg["analysis"], algorithm.neighboring,
                         algorithm.accountant)


def run_key(config: dict, out_dir: Path | None = None) -> int:
    """The noise key of the run (``dpfl.engine.keys``): ``run.noise_seed`` in the research mode; else the key of the
    run already in ``out_dir`` (it holds a ledger: a resume replays that run's noise), or a fresh one from the
    operating system's entropy."""
    seed = config["run"]["noise_seed"]
    if seed is not None:
        return seed
    if out_dir is not None and (Path(out_dir) / "ledger.json").exists():
        return load_key(Path(out_dir) / KEY_FILE)
    return fresh_key()


def noise_of(config: dict) -> str:
    """What results.json and the CLI say of where the noise came from (``dpfl.engine.keys``)."""
    seed = config["run"]["noise_seed"]
    if seed is None:
        return "secret: a key from the OS's entropy, kept in the run directory's noise.key (never share that file)"
    return (f"research mode, run.noise_seed = {seed}: the noise is reproducible, and every epsilon holds only against "
            "observers who do not know that seed")


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


def recorded_threads(out: Path) -> int | None:
    """``run.threads`` of the run recorded in out/run.json (None: no valid record; ``check_resumable`` says why)."""
    try:
        threads = load_run_record(out / "run.json")["config"].get("run", {}).get("threads")
    except RunDirectoryError:
        return None
    return threads if isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1 else None


def run_experiment(config: dict, out_dir: str | Path | None = None, progress: bool = False,
                   resume: bool = False, restart: bool = False, workers=None, supplied: Supplied = NOTHING,
                   dataset: FederatedDataset | None = None, evaluator=None) -> dict:
    """Runs ``config`` and returns its results (also written to out_dir/results.json after every evaluated round and
    at the end, when out_dir is given).

    out_dir (``check_writable``, then ``check_resumable`` or ``check_free``) and the config's ranges (``validate``, in
    ``build_simulation``) are checked before any data is built. ``workers``, ``dataset``, ``evaluator``: as in
    ``build_simulation``.
    ``resume`` continues the run in out_dir (refused unless its run.json has the same release config); otherwise a
    directory that already holds a run is refused, unless ``restart`` archives that run first (``archive_run``). On
    Ctrl-C the run stops after its current round, checkpoints, writes results.json and raises RunInterrupted.
    ``supplied``: a caller's module, loss or records (``build_simulation``)."""
    out = Path(out_dir) if out_dir is not None else None
    config = with_threads(config, recorded_threads(out) if resume and out is not None else None)
    if resume and restart:
        raise ConfigError("--restart", True, "either --resume (continue the run) or --restart (archive it and start "
                                             "over), not both")
    if out is not None:
        check_writable(out)
    run_id, key = secrets.token_hex(16), None  # None: the run directory's key, or a fresh one (run_key)
    if resume:
        if out is None:
            raise ConfigError("--resume", None, "a run directory (--out DIR) to continue")
        run_id = check_resumable(out, config).get("run_id", "")
    elif out is not None and not restart:
        check_free(out)
    elif restart:  # never the archived run's key: its noise on another computation would cancel
        key = run_key(config)
    sim = build_simulation(config, out, workers, key, run_id, supplied=supplied, dataset=dataset,
                           evaluator=evaluator)  # builds data and model: only after the checks above
    rounds = config["algorithm"]["rounds"]
    if resume:
        sim.load_checkpoint(out)
        print(f"resuming the run in {out} " + (f"after round {sim.next_round} of {rounds}" if sim.next_round else
                                              f"from round 1 of {rounds} (no checkpoint yet)"), file=sys.stderr)
    elif out is not None and restart:
        archived = archive_run(out)
        if archived is not None:
            print(f"archived the previous run in {out} to {archived}", file=sys.stderr)
    if out is not None:
        write_text_atomically(out / "run.json", json.dumps({"config": config, "release_sha256": sim.release,
                                                            "run_id": run_id}, indent=1), "the run record")
    results_file = None if out is None else ResultsFile(out / "results.json")
    archived = archived_spend(out)  # a restart archives the run, not the privacy it spent
    sim.run(rounds, progress=progress, on_evaluated=None if results_file is None else
            lambda s: results_file.write(results_of(s, config, archived)))
    results = results_of(sim, config, archived)
    if results_file is not None:
        results_file.write(results)
    if sim.interrupted:
        raise RunInterrupted(sim.next_round)
    return results


# -- run directories ---------------------------------------------------------------------------------------------
def release_config(config: dict) -> dict:
    """The config minus the run-only keys (except those the algorithm's release depends on, its spec's
    ``release_keys``): what decides the data, the model and every round's release."""
    release = copy.deepcopy(config)
    name = config.get("algorithm", {}).get("name")
    keep = registry.spec_of(name).release_keys if name in registry.names() else ()
    for key in (k for k in RUN_ONLY_KEYS if k not in keep):
        section, name = key.split(".")
        release.get(section, {}).pop(name, None)
    return release


def release_hash(config: dict) -> str:
    """sha256 of the release config (sorted keys; config values are canonical after loading: an integer given for a
    float key, e.g. clip = 1, is the float 1.0, so equal configs hash equally however they were written)."""
    return hashlib.sha256(json.dumps(release_config(config), sort_keys=True).encode()).hexdigest()


def check_writable(out: Path) -> None:
    """Refuses a run directory that cannot be one, before anything is built: an existing file, a path through a file,
    or a directory (or, if it does not exist yet, the nearest existing folder it would be created in) that this
    process may not write to."""
    if out.exists() and not out.is_dir():
        raise RunDirectoryError(f"--out {out} is a file, not a directory: pass a directory for the run's files")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise RunDirectoryError(f"--out {out} cannot be created: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunDirectoryError(f"--out {out}: {existing} is not writable (permission denied); pass a directory you "
                                "can write to")


def check_free(out: Path) -> None:
    """Refuses a new run into ``out`` if it holds a run's ledger (privacy already spent), its checkpoint, or its
    record (run.json, results.json) without either: nothing says that run spent no privacy."""
    ledger_path = out / "ledger.json"
    if ledger_path.exists():
        spent = PrivacyLedger.load(ledger_path)  # a corrupt ledger is refused too, naming the file
        raise RunDirectoryError(f"{out} already holds a run's privacy ledger ({spent.compositions} rounds spent); "
                                "continue it with --resume, or pass --restart to archive it and start over")
    if (out / "checkpoint.pt").exists():
        raise RunDirectoryError(f"{out} already holds a run's checkpoint.pt (without its ledger.json, so the privacy "
                                "that run spent is not on record); pass --restart to archive it and start over, or "
                                "use another run directory")
    records = [name for name in ("run.json", "results.json") if (out / name).exists()]
    if records:
        raise RunDirectoryError(_without_ledger(out, records))


def _without_ledger(out: Path, records: list[str]) -> str:
    """Why a directory that holds a run's record (run.json, results.json) but neither its ledger nor its checkpoint
    is refused: the rounds that run spent may have been recorded in a ledger.json since moved or deleted."""
    return (f"{out} holds a run's {' and '.join(records)} but neither its ledger.json nor its checkpoint.pt, so the "
            "privacy that run spent is not on record (moved or deleted?); restore them to continue it with --resume, "
            "pass --restart to archive what is left and start over, or use another run directory")


def check_resumable(out: Path, config: dict) -> dict:
    """Refuses to resume the run in ``out`` with ``config`` unless out/run.json is valid and has the same release
    config; the error names every key that differs, with the old and the new value. Reads only run.json (and checks
    that a ledger or checkpoint exists), so it runs before any data or model is built. Returns the run record."""
    if not (out / "ledger.json").exists() and not (out / "checkpoint.pt").exists():
        records = [name for name in ("run.json", "results.json") if (out / name).exists()]
        if records:
            raise RunDirectoryError(f"cannot resume: {_without_ledger(out, records)}")
        raise RunDirectoryError(f"cannot resume: {out} holds no ledger.json or checkpoint.pt (no round of a run was "
                                "started there); drop --resume to start a new run")
    path = out / "run.json"
    if not path.exists():
        raise RunDirectoryError(f"cannot resume: {out} has no run.json, so dpfl cannot check that this config is the "
                                "one the run was made with; pass --restart to archive the run and start over, or use "
                                "another run directory")
    stored = load_run_record(path)
    differences = _differences(release_config(stored["config"]), release_config(config))
    if differences:
        (key, old, new), *others = differences
        also = "; ".join(f"{k} = {o} -> {n}" for k, o, n in others)
        raise RunDirectoryError(
            f"cannot resume: the run in {out} was made with {key} = {old}, this config has {new}"
            + (f" (and {also})" if also else "")
            + f"; rerun with the original config, or start a new run directory (only {', '.join(RUN_ONLY_KEYS)} may "
            "change on resume)")
    return stored


def load_run_record(path: Path) -> dict:
    """Reads run.json; RunDirectoryError naming the file and the problem if it is unreadable, not JSON, lacks the
    config or its hash, or its hash does not match its config (edited by hand, or damaged)."""

    def invalid(problem: str) -> RunDirectoryError:
        return RunDirectoryError(
            f"{path} is not a valid run record ({problem}); it records the config the run's privacy was spent "
            "under, so dpfl will not resume without it: restore it, or pass --restart to archive the run and start "
            "over")

    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise invalid(getattr(err, "strerror", None) or str(err)) from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise invalid(json_problem(text, err)) from None
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict) or \
            not all(isinstance(v, dict) for v in record["config"].values()):
        raise invalid("no config table of sections")
    if record.get("release_sha256") != release_hash(record["config"]):
        raise invalid("its release_sha256 does not match its config")
    return record


def _differences(old: dict, new: dict) -> list[tuple[str, str, str]]:
    """(section.key, old value, new value) for every key whose canonical value differs; "(not set)" where absent."""
    unset = object()
    found = []
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section, {}), new.get(section, {})
        for key in sorted(set(a) | set(b)):
            va, vb = a.get(key, unset), b.get(key, unset)
            if va is unset or vb is unset or va != vb:
                found.append((f"{section}.{key}", *("(not set)" if v is unset else repr(v) for v in (va, vb))))
    return found


class ResultsFile:
    """results.json, rewritten atomically (``dpfl.durable``) after every evaluated round and when the run ends.

    Each evaluated round is one line, encoded once: during a run the rounds only grow, so a rewrite encodes the new
    rounds and the other keys, not the whole history again (at 400 rounds, a fraction of a millisecond instead of
    about 10 ms for an indented dump)."""

    def __init__(self, path: Path):
        self.path = path
        self._rounds: list[str] = []  # the encoded rounds so far

    def write(self, results: dict) -> None:
        rounds = results["rounds"]
        if len(rounds) < len(self._rounds):  # not the same run's history: encode it afresh
            self._rounds = []
        self._rounds += [json.dumps(r) for r in rounds[len(self._rounds):]]
        listed = "[\n" + ",\n".join(" " + line for line in self._rounds) + "\n]" if self._rounds else "[]"
        entries = [(k, listed if k == "rounds" else json.dumps(v, indent=1)) for k, v in results.items()]
        write_text_atomically(self.path, "{\n" + ",\n".join(f" {json.dumps(k)}: " + text.replace("\n", "\n ")
                                                            for k, text in entries) + "\n}", "the results")


def reported_events(sim: Simulation) -> tuple[int, dict]:
    """(round, each observer's event) for results.json: the last round done as the ledger charged it, or round 1 as
    it will be charged when no round is done (rounds numbered from 1, as the ledger's journal)."""
    done = sim.ledger.charged(sim.next_round) if sim.next_round else None
    if done is None:
        return sim.next_round + 1, sim.round_privacy()
    return sim.next_round, done


def results_of(sim: Simulation, config: dict, archived: list[dict] = ()) -> dict:
    """The run's results so far (the module docstring lists the keys); ``archived``: the spend of the runs archived
    in its directory (``archive.archived_spend``)."""
    done = sim.history[-1] if sim.history and sim.history[-1].round == sim.next_round else None
    final = (done or sim.evaluate()).to_dict()  # the model after the last round done
    final["epsilon"] = {o: None if math.isinf(e) else e for o, e in sim.ledger.epsilon().items()}  # all spent so far
    final["delta"] = sim.ledger.delta
    events_round, events = reported_events(sim)
    if sim.ledger.hides_iterates():  # beside the last-iterate epsilon: what releasing every iterate would cost
        final["epsilon_composition"] = {o: None if math.isinf(e) else e
                                        for o, e in sim.ledger.epsilon_composition().items()}
    archive = {"archived": {"runs": list(archived), "with_this_run": with_archived(final["epsilon"], final["delta"],
                                                                              list(archived))}} if archived else {}
    return {
        "config": config,
        "data": sim.data,
        "rounds": [m.to_dict() for m in sim.history],
        "final": final,
        "privacy": {
            "analysis": sim.ledger.analysis,
            "accountant": sim.ledger.accountants(),
            "conversion": sim.ledger.conversion,
            "subsampling_bound": sim.ledger.subsampling_bound,
            "neighboring": sim.ledger.neighboring,
            "boundary": sim.boundary.name,
            "enforced": sim.boundary.enforcement,
            "release": config["privacy"]["release"],
            "unproven": list(sim.algorithm.release(sim.next_round, sim.state, sim.train.counts).unproven)
            if sim.ledger.analysis == "paper" else [],
            "delta": sim.ledger.delta,
            "budget": sim.ledger.budget,
            "observers": list(sim.ledger.observers),
            "unit": sim.algorithm.privacy_unit,
            "noise": noise_of(config),
            "not_covered": NOT_COVERED if sim.evaluator is None else sim.evaluator.description["not_covered"],
            "events_round": events_round,
            "events_per_round": {o: str(e) for o, e in events.items()},
            **({"assumptions": sim.algorithm.assumptions} if sim.algorithm.assumptions is not None else {}),
        },
        "status": "stopped" if sim.stopped_by else
                  "finished" if sim.next_round >= config["algorithm"]["rounds"] else "running",
        "wall_seconds": sim.wall_seconds,
        "session_seconds": sim.session_seconds,
        "stopped_reason": sim.stopped_reason,
        "stopped_by": sim.stopped_by,
        **({"evaluation": sim.evaluator.description} if sim.evaluator is not None else {}),
        **archive,
    }
