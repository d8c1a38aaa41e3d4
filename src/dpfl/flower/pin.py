"""The release a silo is enrolled in: a silo believes nothing the server sends about what it computes.

A train message carries the run's config and the ``registry.Setting`` the ServerApp built from it (the solved noise
multiplier, the clip, the cohort policy, delta). A malicious server could send another (half the noise, a cohort of
one, the research mode's public noise seed) and the silo would draw what it was told. So an operator enrols each silo
in ONE release config, before any run (``release_sha256``: `dpfl write-silos` writes it into each silo's node config
file, `dpfl silo pin APP --counts ...` into an existing one), and the silo (``admitted``)

* refuses every job whose release config (``dpfl.experiments.run_directory.release_config``: the config minus its
  run-only keys; its [data] section is the federation's public metadata with every client's record count,
  ``dpfl.flower.federation``) does not hash to the node config's ``release-sha256``;
* recomputes the ``Setting`` itself from that config, as the ServerApp does (``setting_of``), and refuses a job whose
  setting differs from it in any field (a forged noise level cannot pass);
* refuses a job whose config sets ``run.noise_seed`` (the research mode: every party, the server included, can
  regenerate the noise) unless its own node config opts in (``research-noise-seed = true``);
* refuses a train message whose ``secure`` flag is not the release config's ``privacy.secure_aggregation`` (the
  server cannot have the messages sent in the clear where the ledger charges their secure sum).

The secure aggregation policy's defaults (``SecAggPolicy.of_release``) come from the pinned config too, so a new run
id with a smaller ``min_clients`` is a different release, and refused. What a server still chooses: the run id (each
run draws from its own key; the silo's journal keeps every run's epsilon, ``silo_state``), the number of rounds (a
run-only key: the silo's journal records the epsilon through each round it answers), and which clients it asks.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass

from dpfl.errors import ConfigError
from dpfl.flower.silo_state import SiloStateError

#: The node config key of the release a silo is enrolled in (its sha256).
PIN = "release-sha256"
#: The node config key by which a silo opts in to the research mode's public noise seed.
RESEARCH_SEED = "research-noise-seed"


def release_of(carried: dict, counts: list[int]) -> dict:
    """The release config the ServerApp runs for the Flower App's config ``carried`` (``app_dir.app_config``, its
    ``dpfl-config``) once the silos report ``counts``: their counts in its [data] section and the threads resolved
    (``with_threads``), as ``serve`` and ``run_experiment`` do."""
    from dpfl.experiments.resolved import with_threads
    from dpfl.flower.federation import with_counts

    return with_counts(with_threads(carried), counts)


def release_sha256(carried: dict, counts: list[int]) -> str:
    """The pin of the release ``release_of(carried, counts)``: its release config's sha256, the value of a silo's
    ``release-sha256``."""
    from dpfl.experiments.run_directory import release_hash

    return release_hash(release_of(carried, counts))


@dataclass(frozen=True)
class Admitted:
    """A job the silo accepted: its config and its recomputed setting (as JSON text, the form the caches key on, and
    as dicts) and the release config's sha256."""

    config_json: str
    setting_json: str
    release: str
    config: dict
    setting: dict


def admitted(node_config: Mapping, config_json: str, setting_json: str, secure: bool) -> Admitted:
    """The job (its config and setting as sent) if the silo accepts it (module docstring); ``node_config``: the silo's
    own keys, never the run config the server sends. SiloStateError naming what differs."""
    from dpfl.experiments.run_directory import release_hash

    pin = node_config.get(PIN)
    if not pin:
        raise SiloStateError(
            f"this silo is enrolled in no release: its node config has no {PIN}, so it would compute whatever the "
            "server sends. Pin the release config the operators agreed on (dpfl write-silos writes it into each "
            f"silo's node config; dpfl silo pin APP --counts ... prints it) and restart the SuperNode")
    config = json.loads(config_json)
    release = release_hash(config)
    if release != str(pin):
        raise SiloStateError(
            f"the job's release config (sha256 {release[:12]}...) is not the one this silo is enrolled in ({PIN} = "
            f"{str(pin)[:12]}...): refused. A new release needs each silo's operator to pin it")
    seed = config["run"].get("noise_seed")
    if seed is not None and not _true(node_config.get(RESEARCH_SEED, False), RESEARCH_SEED):
        raise SiloStateError(
            f"the job sets run.noise_seed = {seed}: every party that knows it, the server included, can regenerate "
            f"this silo's noise. Refused: this silo draws from its own secret key unless its node config sets "
            f"{RESEARCH_SEED} = true (the research mode, for a test bed)")
    expected = setting_of(config_json)
    sent, setting = json.loads(setting_json), json.loads(expected)
    differing = sorted(k for k in sent.keys() | setting.keys() if sent.get(k, ...) != setting.get(k, ...))
    if differing:
        raise SiloStateError(
            f"the job's setting differs from the one this silo computes from the pinned release config in "
            f"{differing}: refused (the server cannot choose the noise, clip or cohort)")
    if bool(secure) != bool(config["privacy"]["secure_aggregation"]):
        raise SiloStateError(
            f"the train message asks for {'secure aggregation' if secure else 'messages in the clear'} where the "
            f"release config sets privacy.secure_aggregation = {config['privacy']['secure_aggregation']}: refused")
    return Admitted(config_json, expected, release, config, setting)


@functools.lru_cache(maxsize=4)
def setting_of(config_json: str) -> str:
    """The ``registry.Setting`` (as JSON, the form a train message carries) that the ServerApp builds for the release
    config ``config_json`` (``FlowerCohort.bind``): from the federation's metadata and counts in its [data]
    section, the run's delta and, where the family calibrates to privacy.epsilon, the noise solved against the run's
    ledger."""
    from dpfl.experiments.assembly import build_setting, run_delta
    from dpfl.experiments.resolved import resolve
    from dpfl.flower.federation import Federation

    config = json.loads(config_json)
    typed = resolve(config)
    counts = config["data"].get("train_counts")
    if counts is None:
        raise ConfigError("data.train_counts", None, "the clients' record counts in the release config's [data]")
    dataset = Federation.of_config(config).dataset([int(c) for c in counts], {})
    setting = build_setting(typed, dataset, run_delta(typed, dataset))
    return json.dumps(dataclasses.asdict(setting))


def _true(value, key: str) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "false"):
        return str(value).lower() == "true"
    raise ConfigError(key, value, "true or false")


__all__ = ["PIN", "RESEARCH_SEED", "Admitted", "admitted", "release_of", "release_sha256", "setting_of"]
