"""Shared helpers of the Flower tests that need no flwr: the run config `dpfl flower-app` writes, and a ledger's
spend without its fingerprints."""

import json

from dpfl.experiments.assembly import build_data
from dpfl.flower.app_dir import app_config
from dpfl.flower.federation import Federation


def app_run_config(config: dict, out, **extra) -> dict:
    """The run config of the Flower App `dpfl flower-app` writes for ``config`` in a rehearsal (the federation's
    metadata taken from the config's data), with the run directory ``out`` and the keys ``extra`` (e.g.
    ``**{"round-timeout": 5.0}``)."""
    federation = Federation.of_dataset(build_data(config["data"]))
    return {"dpfl-config": json.dumps(app_config(config, federation)), "out": str(out), **extra}


def spent(ledger: dict) -> dict:
    """ledger.json without its rounds' fingerprints: what was spent, round by round. A Flower run's fingerprints
    differ from `dpfl run`'s on the same data (they commit to the release config, whose [data] section is the
    federation's metadata there), its events and epsilons do not."""
    return {**ledger, "journal": [{k: v for k, v in entry.items() if k != "fingerprint"}
                                  for entry in ledger["journal"]]}


__all__ = ["app_run_config", "spent"]
