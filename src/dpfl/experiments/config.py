"""Run configurations: a TOML file plus `--set key=value` overrides, validated at the edge.

Every key has a type and a default; unknown keys, keys that do not apply to the chosen model or algorithm, and wrong
types are rejected with a message that names the key, the value and what is allowed. The ``[algorithm]`` section is
the round loop's keys (``registry.COMMON_KEYS``) plus the chosen algorithm's own (its registered config dataclass);
the ``[model]`` section the chosen model's (``MODEL_KEYS``). Values are canonical after loading (an integer given for
a float key is a float). Range checks live where the values are used (samplers, algorithms, data builders), which
name the same keys.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from pathlib import Path

from dpfl.algorithms import registry
from dpfl.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

_NUMBER = (int, float)
_OPTIONAL_NUMBER = (int, float, type(None))

# section -> key -> (allowed types, default, choices or None, help)
SCHEMA: dict[str, dict[str, tuple]] = {
    "data": {
        "name": (str, "synthetic", ("synthetic", "digits", "breast_cancer"), "the data source"),
        "alpha": (_NUMBER, 0.0, None, "synthetic: model heterogeneity"),
        "beta": (_NUMBER, 0.0, None, "synthetic: feature heterogeneity"),
        "num_clients": (int, 100, None, "M, the clients"),
        "samples_per_client": ((int, type(None)), None, None, "records per client (synthetic: default 5000)"),
        "partition": ((str, type(None)), None, None, "how records are split over clients (packaged data sets)"),
        "partition_param": (_OPTIONAL_NUMBER, None, None, "the partition's parameter"),
        "standardize": (str, "none", ("none", "client", "pooled"), "non-private preprocessing, if not 'none'"),
        "test_fraction": (_NUMBER, 0.2, None, "each client's test split"),
        "seed": (int, 0, None, "the data's seed"),
    },
    "privacy": {
        "delta": (_OPTIONAL_NUMBER, None, None, "delta (default 1 / (M R_train))"),
        "budget": ((dict, int, float, type(None)), None, None, "epsilon for the third party, or {observer: eps}"),
        "epsilon": (_OPTIONAL_NUMBER, None, None, "the target epsilon of algorithms that calibrate their noise to it "
                                                  "(None: the algorithm's own noise keys)"),
        "analysis": (str, "sound", ("sound", "paper"), "'paper': Noble et al. 2022's accountant (unproven)"),
        "conversion": ((str, type(None)), None, (None, "classic", "modern"), "RDP -> DP; default: the analysis's"),
        "boundary": (str, "plain", ("plain", "secagg", "shuffler", "trusted"), "what the server receives"),
        "release": (str, "every_round", ("every_round", "final"), "which models a third party sees"),
    },
    "run": {
        "seed": (int, 0, None, "the seed of every random draw (model init, cohorts, minibatches, noise)"),
        "eval_every": (int, 1, None, "evaluate every this many rounds"),
        "checkpoint_every": (int, 10, None, "checkpoint every this many rounds"),
        "memory_mb": (int, 512, None, "memory for one chunk of the cohort's work (results depend on it only through "
                                      "float rounding, and not at all with one thread)"),
        "threads": ((int, type(None)), None, None, "torch threads (default: the machine's cores; a busy machine "
                                                   "runs faster with fewer)"),
    },
}

#: [model] keys per model (besides name).
MODEL_KEYS: dict[str, dict[str, tuple]] = {
    "logreg": {},
    "mlp": {
        "hidden": (list, [200], None, "hidden layer widths"),
        "activation": (str, "relu", ("relu", "tanh", "sigmoid", "elu"), "hidden activation"),
    },
}
MODEL_DEFAULT = "logreg"

#: Keys that were removed, and what replaces them.
RETIRED = {
    "privacy.subsampling_bound": "privacy.analysis: 'sound' (the default) or 'paper' (Noble et al. 2022's accountant, "
                                 "to reproduce its numbers); the old 'tight' bound sampled clients with a record-level "
                                 "curve, which is not a valid bound",
}

SECTIONS = ("data", "model", "algorithm", "privacy", "run")


def defaults(algorithm: str | None = None, model: str = MODEL_DEFAULT) -> dict:
    """The full config of ``algorithm`` (default: the registry's default name) and ``model`` with default values."""
    name = algorithm or registry.COMMON_KEYS["name"][1]
    config = {section: {key: copy.deepcopy(spec[1]) for key, spec in SCHEMA[section].items()}
              for section in ("data", "privacy", "run")}
    config["model"] = {"name": model, **{k: copy.deepcopy(v[1]) for k, v in MODEL_KEYS[model].items()}}
    spec = registry.spec_of(name)
    config["algorithm"] = {**{k: v[1] for k, v in registry.COMMON_KEYS.items()}, "name": name,
                           **{k: f.default for k, f in spec.keys(name).items()}}
    return {section: config[section] for section in SECTIONS}


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> dict:
    """Defaults, updated by the TOML file at ``path``, then by ``overrides`` ("section.key=value"), validated."""
    given: dict = {}
    if path is not None:
        merge(given, read_toml(path))
    for item in overrides:
        key, value = parse_override(item)
        merge(given, _nested(key, value))
    return resolve(given)


def read_toml(path: str | Path) -> dict:
    """The tables of the TOML file at ``path``, as written (not validated, no defaults)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError("CONFIG", str(path), "the path of an existing TOML file")
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError("CONFIG", str(path), f"a readable UTF-8 file ({getattr(err, 'strerror', None) or err})") \
            from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError("CONFIG", str(path), f"valid TOML ({err})") from None


def defaults_in_use(config: dict) -> str:
    """One line naming what ``config`` runs: the algorithm, its rounds and noise, the data (for a config file that
    sets no keys, whose run is all defaults)."""
    algo, data = config["algorithm"], config["data"]
    noise = ", ".join(f"{key} {algo[key]}" for key in ("noise_multiplier", "clip") if key in algo) or "no noise"
    return (f"{algo['name']} for {algo['rounds']} rounds ({noise}, client_rate {algo['client_rate']}) on "
            f"{data['name']} data ({data['num_clients']} clients), model {config['model']['name']}")


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
    """Merges the sections of ``data`` into ``config`` (sections must be known and be tables)."""
    for section, values in data.items():
        if section not in SECTIONS:
            raise ConfigError(section, values, f"one of the sections {list(SECTIONS)}")
        if not isinstance(values, dict):
            raise ConfigError(section, values, "a table of keys")
        config.setdefault(section, {}).update(values)


def resolve(given: dict) -> dict:
    """The full, validated config: ``given`` (the keys a user set) over the defaults of its algorithm and model.
    Every given key must exist and apply to the chosen algorithm and model."""
    algorithm = given.get("algorithm", {}).get("name", registry.COMMON_KEYS["name"][1])
    _check("algorithm.name", algorithm, str, registry.names())
    model = given.get("model", {}).get("name", MODEL_DEFAULT)
    _check("model.name", model, str, list(MODEL_KEYS))
    config = defaults(algorithm, model)
    schema = key_schema(algorithm, model)
    for section, values in given.items():
        for key, value in values.items():
            name = f"{section}.{key}"
            if name in RETIRED:
                raise ConfigError(name, value, f"no value: this key was retired; use {RETIRED[name]}")
            if key not in schema[section]:
                raise ConfigError(name, value, _not_applicable(section, key, algorithm, model, schema[section]))
            types, _, choices, _ = schema[section][key]
            config[section][key] = _check(name, value, types, choices)
    return config


def key_schema(algorithm: str, model: str) -> dict[str, dict[str, tuple]]:
    """section -> key -> (types, default, choices, help) for this algorithm and model."""
    spec = registry.spec_of(algorithm)
    algo = {k: (v[0], v[1], v[2], v[3]) for k, v in registry.COMMON_KEYS.items()}
    for key, f in spec.keys(algorithm).items():
        algo[key] = (spec.key_type(key), f.default, f.metadata.get("choices"), f.metadata.get("help", ""))
    model_keys = {"name": (str, model, tuple(MODEL_KEYS), "the model"), **MODEL_KEYS[model]}
    return {"data": SCHEMA["data"], "model": model_keys, "algorithm": algo, "privacy": SCHEMA["privacy"],
            "run": SCHEMA["run"]}


def _not_applicable(section: str, key: str, algorithm: str, model: str, allowed: dict) -> str:
    if section == "model" and any(key in keys for keys in MODEL_KEYS.values()):
        users = [m for m, keys in MODEL_KEYS.items() if key in keys]
        return f"no value: model.{key} applies to model.name in {users}, not {model!r}"
    if section == "algorithm":
        spec = registry.spec_of(algorithm)
        if key in {f.name for f in dataclasses.fields(spec.config)}:
            private = [n for n in spec.names if spec.private(n)]
            return f"no value: algorithm.{key} applies only to the private names {private}, not {algorithm!r}"
        users = [s.names[0] + "..." for s in registry.specs() if key in {f.name for f in dataclasses.fields(s.config)}]
        if users:
            return f"no value: algorithm.{key} belongs to other algorithms ({', '.join(users)}), not {algorithm!r}"
    return f"one of the keys {list(allowed)}"


def _check(name: str, value, types, choices):
    """``value`` if it has one of ``types`` (an int is accepted, as a float, for a float key) and is in ``choices``."""
    allowed = types if isinstance(types, tuple) else (types,)
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) or not isinstance(value, allowed):
        raise ConfigError(name, value, f"a value of type {_type_names(allowed)}")
    if choices is not None and value not in choices:
        raise ConfigError(name, value, f"one of {list(choices)}")
    return value


def _type_names(types) -> str:
    names = [{"NoneType": "none"}.get(t.__name__, t.__name__) for t in types]
    return " or ".join(dict.fromkeys(names))


__all__ = ["SCHEMA", "MODEL_KEYS", "RETIRED", "SECTIONS", "defaults", "load_config", "read_toml", "defaults_in_use",
           "resolve", "key_schema", "merge", "parse_override"]
