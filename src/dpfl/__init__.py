"""dpfl: differentially private federated learning.

A vectorised simulator for DP federated learning (clients are a tensor axis) and a privacy-accounting layer that
reports epsilon per observer (third party, server, other silos), built on google's dp_accounting.

The Python API is what ``__all__`` lists, nothing else is promised (every other module is private by convention and
may move):

* ``run(config, *, model=None, loss=None, data=None, out=None) -> Results``: a run, as `dpfl run`; ``config`` is a
  TOML path, a dict of sections or a ``load_config`` result; ``model`` any torch module, ``loss`` a per-example loss,
  ``data`` arrays (x, y[, client ids]) or a ``FederatedDataset``.
* ``build(...) -> Simulation``: the same run, to drive round by round.
* ``Results``: ``.final``, ``.rounds``, ``.privacy``, ``.epsilon``, ``.to_dict()`` (= results.json), and
  ``.epsilon_curve(rounds)``, epsilon after every round from the run's ledger; ``Results.load(run directory)``.
* ``account(...)``: epsilon of an event or of the Gaussian mechanism.
* ``calibrate(...)``: the noise for a target epsilon, in two forms told apart by the first argument:
  ``calibrate(config, *, target_epsilon, model=None, loss=None, data=None)`` solves a run's noise against its own
  ledger on its data and returns a ``Calibrated`` (``.config`` with the noise pinned, ``.epsilon`` per observer,
  ``.observers`` the target bounds; ``run`` takes it as its config); ``calibrate(target_epsilon, *, delta, steps,
  ...)`` returns the Gaussian mechanism's noise multiplier. A keyword of the other form is a ConfigError naming it.
* ``make_accountant(...)``: a dp_accounting accountant by name; ``PrivacyLedger``: per-observer composition.
* ``register_algorithm(...)``: a new algorithm family, known to configs and runs.
* ``load_config(path or dict, overrides)``: a config with every default filled in and every key checked.
* ``Simulation``, ``FederatedDataset``: the round loop and the federated data it runs on.
* ``ConfigError`` (a bad argument or key, named with what is allowed), ``DpflError`` (every dpfl error).

``import dpfl`` stays cheap: each name is imported (with torch) on first use.
"""

import importlib

__version__ = "0.1.0"

#: name -> the module that defines it
_EXPORTS = {
    "run": "dpfl.api",
    "build": "dpfl.api",
    "account": "dpfl.api",
    "calibrate": "dpfl.api",
    "make_accountant": "dpfl.api",
    "register_algorithm": "dpfl.api",
    "Results": "dpfl.results",
    "load_config": "dpfl.experiments.config",
    "Simulation": "dpfl.engine.simulator",
    "PrivacyLedger": "dpfl.accounting.ledger",
    "FederatedDataset": "dpfl.data.federated",
    "ConfigError": "dpfl.errors",
    "DpflError": "dpfl.errors",
}

__all__ = ["__version__", "run", "build", "account", "calibrate", "make_accountant", "register_algorithm", "Results",
           "load_config", "Simulation", "PrivacyLedger", "FederatedDataset", "ConfigError", "DpflError"]

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (type checkers read it as true)
if TYPE_CHECKING:  # for type checkers and IDEs; at run time each name is imported on first use
    from dpfl.accounting.ledger import PrivacyLedger
    from dpfl.api import account, build, calibrate, make_accountant, register_algorithm, run
    from dpfl.data.federated import FederatedDataset
    from dpfl.engine.simulator import Simulation
    from dpfl.errors import ConfigError, DpflError
    from dpfl.experiments.config import load_config
    from dpfl.results import Results


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dpfl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # imported once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
