"""The functions of ``import dpfl`` (the package docstring lists them): thin wrappers over the runner, the accountants
and the registry that take a notebook's objects (a dict, a torch module, a loss, numpy arrays) and check them at the
edge, naming the argument or key that is wrong."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from dp_accounting import dp_event

from dpfl.accounting import accountant as _accountant
from dpfl.accounting import accountants as _accountants
from dpfl.accounting.calibrate import calibrate_noise
from dpfl.algorithms import registry
from dpfl.errors import ConfigError
from dpfl.experiments.assembly import build_simulation
from dpfl.experiments.config import SCHEMA, SECTIONS, load_config, read_toml
from dpfl.experiments.runner import run_with_ledger
from dpfl.experiments.supplied import SECTION, Supplied
from dpfl.results import Results

#: What ``config`` may be.
CONFIG_FORMS = "a TOML file's path, a dict of sections ({'algorithm': {'name': 'dp-fedavg'}, ...}), or a config " \
               "from dpfl.load_config"


def run(config=None, *, model=None, loss=None, data=None, out: str | Path | None = None, resume: bool = False,
        restart: bool = False, progress: bool = False) -> Results:
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

    The privacy accounting is the config's: it depends on the data's counts and the config, not on the module.
    """
    if out is not None and not isinstance(out, (str, os.PathLike)):
        raise ConfigError("out", out, "the run directory as a str or pathlib.Path, or None (no run directory)")
    supplied = Supplied.of(model, loss, data)
    return Results(*run_with_ledger(resolve_config(config, supplied), out, progress=progress, resume=resume,
                                    restart=restart, supplied=supplied))


def build(config=None, *, model=None, loss=None, data=None):
    """The run ``dpfl.run`` would make, as a ``dpfl.Simulation`` to drive round by round (``simulation.run(rounds)``
    returns the metrics of each evaluated round), without a run directory. Arguments as for ``run``."""
    supplied = Supplied.of(model, loss, data)
    return build_simulation(resolve_config(config, supplied), supplied=supplied)


def resolve_config(config, supplied: Supplied) -> dict:
    """``config`` loaded (a path or a dict of sections: with model.name "custom" and data.name "arrays" set for what
    was supplied), with the fingerprint of what was supplied in its ``supplied`` section."""
    names = supplied.names()
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


def calibrate(target_epsilon: float, *, delta: float, steps: int | None = None, sampling: str = "poisson",
              sampling_rate: float | None = None, dataset_size: int | None = None,
              event: Callable[[float], dp_event.DpEvent] | None = None, accountant: str = "pld",
              conversion: str = "classic", neighboring: str = "add_remove") -> float:
    """The smallest noise multiplier (to 1e-4 relative) meeting ``target_epsilon`` at ``delta``, for ``steps``
    steps of the Gaussian mechanism sampled as ``sampling`` at ``sampling_rate`` (`dpfl calibrate gaussian`), or for
    ``event(noise_multiplier)``, any event whose epsilon decreases as the noise grows
    (``dpfl.accounting.calibrate.calibrate_noise``). Other arguments as for ``account``."""
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
