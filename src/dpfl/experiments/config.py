"""Run configurations: a TOML file plus `--set key=value` overrides, validated at the edge.

Every key has a type and a default; unknown keys and wrong types are rejected with a message that names the key, the
value and what is allowed. Range checks live where the values are used (the samplers, the algorithm, the data
builders), which name the same keys.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

from dpfl.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_NUMBER = (int, float)
_OPTIONAL_NUMBER = (int, float, type(None))
_ANY = object

# section -> key -> (allowed types, default, choices or None)
SCHEMA: dict[str, dict[str, tuple]] = {
    "data": {
        "name": (str, "synthetic", ("synthetic", "digits", "breast_cancer")),
        "alpha": (_NUMBER, 0.0, None),
        "beta": (_NUMBER, 0.0, None),
        "num_clients": (int, 100, None),
        "samples_per_client": ((int, type(None)), None, None),
        "partition": ((str, type(None)), None, None),
        "partition_param": (_OPTIONAL_NUMBER, None, None),
        "standardize": (str, "none", ("none", "client", "pooled")),
        "test_fraction": (_NUMBER, 0.2, None),
        "seed": (int, 0, None),
    },
    "model": {
        "name": (str, "logreg", ("logreg", "mlp")),
        "hidden": (list, [200], None),
        "activation": (str, "relu", None),
    },
    "algorithm": {
        "name": (str, "dp-scaffold-warm", ("fedavg", "fedsgd", "scaffold", "scaffold-warm", "dp-fedavg", "dp-fedsgd",
                                            "dp-scaffold", "dp-scaffold-warm")),
        "rounds": (int, 100, None),
        "local_steps": (int, 50, None),
        "client_rate": (_NUMBER, 0.2, None),
        "sample_rate": (_NUMBER, 0.2, None),
        "client_sampling": (str, "fixed", ("fixed", "poisson")),
        "record_sampling": (str, "fixed", ("fixed", "poisson")),
        "lr": (_NUMBER, 1.0, None),
        "global_lr": (_NUMBER, 1.0, None),
        "clip": (_OPTIONAL_NUMBER, 1.0, None),
        "clip_heuristic": (str, "fixed", ("fixed", "median-nonprivate")),
        "noise_multiplier": (_NUMBER, 60.0, None),
        "weight_decay": (_NUMBER, 5e-3, None),
    },
    "privacy": {
        "delta": (_OPTIONAL_NUMBER, None, None),  # None: 1 / (M R_train), seed 000
        "budget": ((dict, int, float, type(None)), None, None),  # eps for the third party, or {observer: eps}
        "analysis": (str, "sound", ("sound", "paper")),
        "conversion": ((str, type(None)), None, (None, "classic", "modern")),  # None: the analysis's own
        "boundary": (str, "plain", ("plain", "secagg")),
    },
    "run": {
        "seed": (int, 0, None),
        "eval_every": (int, 1, None),
        "checkpoint_every": (int, 10, None),
        "memory_mb": (int, 512, None),
    },
}


#: Keys that were removed, and what replaces them.
RETIRED = {
    "privacy.subsampling_bound": "privacy.analysis: 'sound' (the default) or 'paper' (Noble et al. 2022's accountant, "
                                 "to reproduce its numbers); the old 'tight' bound sampled clients with a record-level "
                                 "curve, which is not a valid bound",
}


def defaults() -> dict:
    return {section: {key: copy.deepcopy(spec[1]) for key, spec in keys.items()} for section, keys in SCHEMA.items()}


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Defaults, updated by the TOML file at ``path``, then by ``overrides`` ("section.key=value"), validated."""
    config = defaults()
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise ConfigError("CONFIG", str(path), "the path of an existing TOML file")
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as err:
            raise ConfigError("CONFIG", str(path), f"valid TOML ({err})") from None
        merge(config, data)
    for item in overrides:
        key, value = parse_override(item)
        merge(config, _nested(key, value))
    return validate(config)


def parse_override(item: str) -> tuple[str, object]:
    """"algorithm.lr=0.5" -> ("algorithm.lr", 0.5); the value is read as TOML (numbers, booleans, lists, strings)."""
    if "=" not in item:
        raise ConfigError("--set", item, "section.key=value, e.g. algorithm.lr=0.5")
    key, raw = (part.strip() for part in item.split("=", 1))
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return key, value


def _nested(key: str, value) -> dict:
    parts = key.split(".")
    if len(parts) != 2:
        raise ConfigError("--set", key, "a key of the form section.key, e.g. algorithm.lr")
    return {parts[0]: {parts[1]: value}}


def merge(config: dict, data: dict) -> None:
    for section, values in data.items():
        if section not in SCHEMA:
            raise ConfigError(section, values, f"one of the sections {list(SCHEMA)}")
        if not isinstance(values, dict):
            raise ConfigError(section, values, "a table of keys")
        for key, value in values.items():
            if f"{section}.{key}" in RETIRED:
                raise ConfigError(f"{section}.{key}", value, f"no value: this key was retired; use {RETIRED[f'{section}.{key}']}")
            if key not in SCHEMA[section]:
                raise ConfigError(f"{section}.{key}", value, f"one of the keys {list(SCHEMA[section])}")
            config[section][key] = value


def validate(config: dict) -> dict:
    for section, keys in SCHEMA.items():
        for key, (types, _, choices) in keys.items():
            value = config[section][key]
            name = f"{section}.{key}"
            if isinstance(value, bool) or not isinstance(value, types):
                if isinstance(value, int) and not isinstance(value, bool) and float in _as_tuple(types):
                    continue
                raise ConfigError(name, value, f"a value of type {_type_names(types)}")
            if choices is not None and value not in choices:
                raise ConfigError(name, value, f"one of {list(choices)}")
    return config


def _as_tuple(types):
    return types if isinstance(types, tuple) else (types,)


def _type_names(types) -> str:
    names = [{"NoneType": "none"}.get(t.__name__, t.__name__) for t in _as_tuple(types)]
    return " or ".join(dict.fromkeys(names))
