"""The functions of ``import dpfl`` (the package docstring lists them): thin wrappers over the runner, the accountants
and the registry that take a notebook's objects (a dict, a torch module, a loss, numpy arrays) and check them at the
edge, naming the argument or key that is wrong."""

from __future__ import annotations

import copy
import json
import os
import signal
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from dp_accounting import dp_event

from dpfl.accounting import accountant as _accountant
from dpfl.accounting import accountants as _accountants
from dpfl.accounting.calibrate import calibrate_noise
from dpfl.algorithms import registry
from dpfl.errors import ConfigError, DpflError, RunInterrupted, check_range, check_target_epsilon
from dpfl.experiments.assembly import build_simulation
from dpfl.experiments.calibrated import Calibrated, calibrate_config
from dpfl.experiments.config import SCHEMA, SECTIONS, load_config, read_toml
from dpfl.experiments.reference import to_toml
from dpfl.experiments.runner import run_with_ledger
from dpfl.experiments.supplied import SECTION, Supplied
from dpfl.results import Results

#: What ``config`` may be.
CONFIG_FORMS = "a TOML file's path, a dict of sections ({'algorithm': {'name': 'dp-fedavg'}, ...}), a config " \
               "from dpfl.load_config, or dpfl.calibrate's answer"


def run(config=None, *, model=None, loss=None, data=None, out: str | Path | None = None, resume: bool = False,
        restart: bool = False, progress: bool = False, nproc: int = 1) -> Results:
    """Runs a config, as `dpfl run CONFIG --out OUT` does, and returns its results (results.json's content).

    Args:
      config: a TOML file's path, a dict of sections (``{"algorithm": {"name": "dp-fedavg", "rounds": 20}}``: the
        keys a TOML file would set, every other key at its default), or a config from ``dpfl.load_config``; None: all
        defaults.
      model: a torch.nn.Module mapping records [N, ...] to logits [N, classes], used as it is (its parameters are
        the initial model); the config's model.name becomes "custom". Trained by the same per-example-gradient engine
        as dpfl's own models: batch normalisation and active dropout are refused, as is any module whose per-example
        gradients torch.func cannot take (tried on two records before round 1).
      loss: a per-example loss ``loss(outputs [N, C], labels [N]) -> [N]`` (reduction 'none'); default cross-entropy.
      data: (x, y), (x, y, client ids) or a dict of the arrays 'x', 'y', optionally 'client' and 'split' (an npz
        file's arrays), partitioned and split by the config's [data] keys exactly as that file would be; or a
        ``FederatedDataset``, used as it is. The config's data.name becomes "arrays".
      out: the run directory (run.json, ledger.json, noise.key, checkpoints, results.json); None: none.
      resume, restart: as `dpfl run --resume / --restart`. A supplied module, loss or data is fingerprinted in the
        run's release config (``dpfl.experiments.supplied``), so a resume with another one is refused.
      progress: show the progress line.
      nproc: the ranks the cohort is split across, as `dpfl run --nproc N` (local processes on gloo,
        ``dpfl.engine.ranks``): above 1 it needs ``out`` (rank 0's run directory, where the results are read back
        from) and a config alone (a module, loss or data of this process cannot reach the ranks).

    The privacy accounting is the config's: it depends on the data's counts and the config, not on the module.
    """
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise ConfigError("out", out, "the run directory as a str or pathlib.Path, or None (no run directory)")
    check_range("nproc", nproc, 1, integer=True)
    supplied = Supplied.of(model, loss, data)
    if nproc > 1:
        return _run_on_ranks(resolve_config(config, supplied), nproc, out, supplied, resume=resume, restart=restart,
                             progress=progress)
    return Results(*run_with_ledger(resolve_config(config, supplied), out, progress=progress, resume=resume,
                                    restart=restart, supplied=supplied))


def _run_on_ranks(config: dict, nproc: int, out, supplied: Supplied, *, resume: bool, restart: bool,
                  progress: bool) -> Results:
    """``run`` as ``nproc`` local ranks: the config written as TOML for the ranks' `dpfl run ... --nproc` command
    (``dpfl.engine.launch``), the results read back from ``out``. A budget or a divergence stop returns its results, as
    in one process; a signal raises ``RunInterrupted``; any other failure a DpflError (the ranks' message is on
    standard error)."""
    from dpfl.engine.launch import launch

    if supplied.names():
        raise ConfigError("nproc", nproc, "1 when dpfl.run is given model=, loss= or data= (they live in this "
                                          "process; each rank is a process of its own): save the data to a file or "
                                          "folder the config's [data] names")
    if out is None:
        raise ConfigError("out", out, f"a run directory when nproc = {nproc} (rank 0 writes the results there)")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.toml"
        path.write_text(to_toml({section: values for section, values in config.items() if section != SECTION}))
        status = launch([sys.executable, "-m", "dpfl.cli", "run", str(path), "--out", str(out),
                         *(["--resume"] if resume else []), *(["--restart"] if restart else []),
                         *([] if progress else ["--no-progress"])], nproc)
    written = Path(out) / "results.json"
    results = json.loads(written.read_text()) if status and written.exists() else {}
    if status in (128 + signal.SIGINT, 128 + signal.SIGTERM):
        raise RunInterrupted(results["final"]["round"] if results else 0, status - 128)
    if status and results.get("stopped_by") not in ("budget", "diverged"):
        raise DpflError(f"the {nproc} ranks of the run stopped with exit status {status} (their message is above, "
                        "on standard error)")
    return Results.load(out)


def build(config=None, *, model=None, loss=None, data=None):
    """The run ``dpfl.run`` would make, as a ``dpfl.Simulation`` to drive round by round (``simulation.run(rounds)``
    returns the metrics of each evaluated round), without a run directory. Arguments as for ``run``."""
    supplied = Supplied.of(model, loss, data)
    return build_simulation(resolve_config(config, supplied), supplied=supplied)


def resolve_config(config, supplied: Supplied) -> dict:
    """``config`` loaded (a path or a dict of sections: with model.name "custom" and data.name "arrays" set for what
    was supplied; a ``Calibrated``: its config), with the fingerprint of what was supplied in its ``supplied``
    section."""
    names = supplied.names()
    if isinstance(config, Calibrated):
        config = config.config
    if isinstance(config, dict) and _is_loaded(config):
        resolved = copy.deepcopy(config)
        resolved.pop(SECTION, None)  # recomputed below, from what is supplied now
        for section, name in names.items():
            if resolved[section]["name"] != name:
                raise ConfigError(f"{section}.name", resolved[section]["name"],
                                  f"{name!r} when dpfl.run is given {section}=: load the config with "
                                  f"dpfl.load_config(path, ['{section}.name=\"{name}\"']), or pass the path or a dict "
                                  "of sections (dpfl.run then sets it)")
    elif config is None or isinstance(config, (dict, str, Path)):
        given = read_toml(config) if isinstance(config, (str, Path)) else config or {}
        for section, name in names.items():
            table = given.get(section)
            value = table.get("name", name) if isinstance(table, dict) else name
            if value != name:
                raise ConfigError(f"{section}.name", value, f"{name!r} (or unset) when dpfl.run is given {section}=")
        resolved = load_config(config, [f"{section}.name={json.dumps(name)}" for section, name in names.items()])
    else:
        raise ConfigError("config", type(config).__name__, CONFIG_FORMS)
    if supplied:
        resolved[SECTION] = supplied.fingerprint
    return resolved


def _is_loaded(config: dict) -> bool:
    """Whether ``config`` is a loaded config (every section, every [data] and [run] key filled in), not a dict of
    sections to load."""
    return all(isinstance(config.get(s), dict) for s in SECTIONS) and set(SCHEMA["data"]) <= set(config["data"]) \
        and set(SCHEMA["run"]) <= set(config["run"])


def account(event: dp_event.DpEvent | None = None, *, delta: float, noise_multiplier: float | None = None,
            steps: int | None = None, sampling: str = "poisson", sampling_rate: float | None = None,
            dataset_size: int | None = None, accountant: str = "pld", conversion: str = "classic",
            neighboring: str = "add_remove") -> _accountant.AccountingResult:
    """Epsilon at ``delta`` of ``event`` (a dp_accounting event), or of ``steps`` steps of the Gaussian mechanism
    with ``noise_multiplier``, sampled as ``sampling`` at ``sampling_rate`` (`dpfl account gaussian`).

    ``accountant``: "pld" (tight up to its grid) or "rdp" (with ``conversion`` "classic" or "modern");
    ``neighboring``: "add_remove", "replace_one" or "zero_out". Returns ``.epsilon``, ``.delta``, ``.accountant``,
    ``.conversion``, ``.order`` (``dpfl.accounting.accountant.account``)."""
    gaussian = dict(noise_multiplier=noise_multiplier, steps=steps, sampling_rate=sampling_rate,
                    dataset_size=dataset_size)
    if event is None:
        event = _accountant.gaussian_event(noise_multiplier, steps, sampling, sampling_rate, dataset_size)
    else:
        _only_event(gaussian)
    return _accountant.account(event, delta, accountant, conversion, neighboring)


def calibrate(target=None, /, *, target_epsilon: float | None = None, model=None, loss=None, data=None,
              delta: float | None = None, steps: int | None = None, sampling: str = "poisson",
              sampling_rate: float | None = None, dataset_size: int | None = None,
              event: Callable[[float], dp_event.DpEvent] | None = None, accountant: str = "pld",
              conversion: str = "classic", neighboring: str = "add_remove"):
    """The noise for a target epsilon, in two forms told apart by the first argument.

    A run: ``calibrate(config, *, target_epsilon, model=None, loss=None, data=None) -> Calibrated``. ``config`` (as
    for ``run``: a TOML path, a dict of sections, a ``load_config`` result; None: all defaults) with its noise solved
    for ``target_epsilon`` against the run's own ledger, on the run's data (``model``, ``loss``, ``data`` as for
    ``run``), nothing trained: ``.config`` pins the noise key (e.g. algorithm.noise_multiplier) where the family has
    one, else sets privacy.epsilon; ``.epsilon`` is what its run spends per observer after all its rounds,
    ``.observers`` whose epsilon the target bounds (the family's: every observer of the boundary for dp-fedavg,
    dp-fedsgd, dp-scaffold(-warm), the one its noise placement protects for dp-fedavg-user and dp-fedavg-joint),
    ``.noise`` the level (``dpfl.experiments.calibrated``). ``run(calibrate(cfg, target_epsilon=3, model=m,
    data=d), model=m, data=d)`` is a run to a target.

    The Gaussian mechanism: ``calibrate(target_epsilon, *, delta, steps=None, ...) -> float``, the smallest noise
    multiplier (to 1e-4 relative) meeting ``target_epsilon`` at ``delta``, for ``steps`` steps sampled as
    ``sampling`` at ``sampling_rate`` (`dpfl calibrate gaussian`), or for ``event(noise_multiplier)``, any event whose
    epsilon decreases as the noise grows (``dpfl.accounting.calibrate.calibrate_noise``). Other arguments as for
    ``account``. ``calibrate(target_epsilon=..., delta=..., ...)`` is this form too.

    A keyword of one form with the other (``delta`` with a config, ``model`` with a number) is refused, naming it."""
    gaussian = dict(delta=delta, steps=steps, sampling_rate=sampling_rate, dataset_size=dataset_size, event=event)
    gaussian_defaults = dict(sampling="poisson", accountant="pld", conversion="classic", neighboring="add_remove")
    given = dict(sampling=sampling, accountant=accountant, conversion=conversion, neighboring=neighboring)
    if isinstance(target, (int, float)) and not isinstance(target, bool) or (target is None and delta is not None):
        if target is not None and target_epsilon is not None:
            raise ConfigError("target_epsilon", target_epsilon, f"None when the target is the first argument "
                                                                f"({target!r})")
        for key, value in dict(model=model, loss=loss, data=data).items():
            if value is not None:
                raise ConfigError(key, type(value).__name__, "None for the Gaussian mechanism's form "
                                                             "calibrate(target_epsilon, *, delta, ...): pass a config "
                                                             "first to calibrate a run")
        return _calibrate_gaussian(target if target is not None else target_epsilon, **gaussian, **given)
    if target is not None and not isinstance(target, (dict, str, Path)):
        raise ConfigError("config", type(target).__name__, "a target epsilon (a number), a TOML file's path, a dict of "
                                                           "sections or a config from dpfl.load_config")
    for key, value in {**gaussian, **{k: v for k, v in given.items() if v != gaussian_defaults[k]}}.items():
        if value is not None:
            raise ConfigError(key, value, "None with a config: a run's accounting comes from its config (set "
                                          "privacy.delta, privacy.conversion, ... there)")
    if target_epsilon is None:
        raise ConfigError("target_epsilon", None, "the epsilon to meet, > 0: calibrate(config, target_epsilon=3.0)")
    check_target_epsilon("target_epsilon", target_epsilon)
    supplied = Supplied.of(model, loss, data)
    return calibrate_config(resolve_config(target, supplied), target_epsilon, supplied)


def _calibrate_gaussian(target_epsilon: float, *, delta: float, steps: int | None, sampling: str,
                        sampling_rate: float | None, dataset_size: int | None,
                        event: Callable[[float], dp_event.DpEvent] | None, accountant: str, conversion: str,
                        neighboring: str) -> float:
    """``calibrate``'s Gaussian form."""
    if delta is None:
        raise ConfigError("delta", None, "a delta in (0, 1) for the Gaussian mechanism's form")
    if event is None:
        _accountant.gaussian_event(1.0, steps, sampling, sampling_rate, dataset_size)  # refuses bad values now

        def event(z: float) -> dp_event.DpEvent:
            return _accountant.gaussian_event(z, steps, sampling, sampling_rate, dataset_size)
    else:
        _only_event(dict(steps=steps, sampling_rate=sampling_rate, dataset_size=dataset_size))
    return calibrate_noise(event, target_epsilon, delta, accountant, conversion, neighboring)


def _only_event(gaussian: dict) -> None:
    """An event is the whole description: the Gaussian mechanism's arguments must not come with it."""
    for key, value in gaussian.items():
        if value is not None:
            raise ConfigError(key, value, "None when an event is given (the event describes the mechanism)")


def make_accountant(name: str = "tightest", *, neighboring: str = "add_remove", conversion: str = "modern",
                    subsampling_bound: str = "tight"):
    """A fresh dp_accounting ``PrivacyAccountant`` by name ("tightest": PLD where it supports the events, else RDP;
    "pld", "rdp", "pure", "last_iterate"): ``.compose(event)``, then ``.get_epsilon(delta)``
    (``dpfl.accounting.accountants.make``). ``conversion``: RDP's ("modern", as the run ledger's default, or
    "classic")."""
    if neighboring not in _accountant.NEIGHBORING:
        raise ConfigError("neighboring", neighboring, f"one of {list(_accountant.NEIGHBORING)}")
    return _accountants.make(name, _accountant.NEIGHBORING[neighboring], conversion, subsampling_bound)


def register_algorithm(names: str | Sequence[str], config: type, build: Callable, *,
                       private: Callable[[str], bool] | None = None, help: str = "", **options):
    """Registers an algorithm family, as dpfl's own families register themselves (docs/architecture.md, "Add an
    algorithm"): ``names`` for algorithm.name, ``config`` its frozen dataclass of [algorithm] keys, ``build(name,
    section, setting)`` returning an object of the ``dpfl.engine.protocol.Algorithm`` protocol; ``private(name)``
    says which names add noise (default: those starting with "dp-"); ``options``: the other fields of
    ``dpfl.algorithms.registry.AlgorithmSpec``. Configs loaded afterwards in this process know the names and keys.
    Returns the spec."""
    names = (names,) if isinstance(names, str) else tuple(names)
    spec = registry.AlgorithmSpec(names=names, config=config, build=build,
                                  private=private or (lambda name: name.startswith("dp-")), help=help, **options)
    return registry.register(spec)


__all__ = ["run", "build", "resolve_config", "account", "calibrate", "make_accountant", "register_algorithm"]
