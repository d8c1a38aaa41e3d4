"""Shared helpers of the Flower tests that need no flwr: the run config `dpfl flower-app` writes, and a ledger's
spend without its fingerprints."""

import json

from dpfl.experiments.assembly import build_data
from dpfl.flower.app_dir import app_config
from dpfl.flower.federation import Federation
from dpfl.flower.pin import PIN, RESEARCH_SEED, release_sha256


def app_run_config(config: dict, out, **extra) -> dict:
    """The run config of the Flower App `dpfl flower-app` writes for ``config`` in a rehearsal (the federation's
    metadata taken from the config's data), with the run directory ``out`` and the keys ``extra`` (e.g.
    ``**{"round-timeout": 5.0}``)."""
    federation = Federation.of_dataset(build_data(config["data"]))
    return {"dpfl-config": json.dumps(app_config(config, federation)), "out": str(out), **extra}


def silo_pin(config: dict, **extra) -> dict:
    """The node config keys that enrol a silo in the release the ServerApp runs for ``config`` in a rehearsal (its
    ``release-sha256``, ``dpfl.flower.pin``), opting in to the research mode where ``config`` uses it (a test bed
    whose operators run the config's run.noise_seed on purpose), with the keys ``extra``."""
    dataset = build_data(config["data"])
    carried = app_config(config, Federation.of_dataset(dataset))
    research = {RESEARCH_SEED: True} if config["run"]["noise_seed"] is not None else {}
    return {PIN: release_sha256(carried, [int(n) for n in dataset.train.counts]), **research, **extra}


def spent(ledger: dict) -> dict:
    """ledger.json without its rounds' fingerprints: what was spent, round by round. A Flower run's fingerprints
    differ from `dpfl run`'s on the same data (they commit to the release config, whose [data] section is the
    federation's metadata there), its events and epsilons do not."""
    return {**ledger, "journal": [{k: v for k, v in entry.items() if k != "fingerprint"}
                                  for entry in ledger["journal"]]}


__all__ = ["app_run_config", "silo_pin", "spent"]
