"""Run configurations: a TOML file plus `--set key=value` overrides, validated at the edge.

Every key has a type and a default; unknown keys, keys that do not apply to the chosen model or algorithm, and wrong
types are rejected with a message that names the key, the value and what is allowed. The ``[algorithm]`` section is
the round loop's keys (``registry.COMMON_KEYS``) plus the chosen algorithm's own (its registered config dataclass);
the ``[model]`` section the chosen model's (``MODEL_KEYS``); the ``[data]`` keys of ``DATA_KEYS`` only the data
sources they name. Values are canonical after loading (an integer given for a float key is a float; a relative
``data.path`` is made absolute: against the config file's folder for a path written in the file, so that a config and
its data move together, and against the current directory for one given with ``--set``, as a shell path would be;
``data.num_clients`` and ``data.test_fraction`` left unset are 100 and 0.2 unless the data may bring its own clients
or split; ``data.scale`` left unset is the data set's public default, ``sources.default_scale``). Range checks live
where the values are used (samplers, algorithms, data builders), which name the same keys.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
from pathlib import Path

from dpfl.algorithms import registry
from dpfl.data.federated import NUM_CLIENTS, TEST_FRACTION
from dpfl.data.library import DATA_ENV, DEFAULT_ROOT
from dpfl.data.public import NATURAL, PUBLIC
from dpfl.data.sources import DATASETS, default_scale
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
        "name": (str, "synthetic", DATASETS,
                 "the data source: a generator, a packaged data set, the user's own npz / csv file, a public data "
                 "set read from its published files (docs/data.md), or 'arrays': records handed to "
                 "dpfl.run(config, data=...) in Python, federated as an npz file's"),
        "path": ((str, type(None)), None, None, "npz / csv: the file; clients: the folder dpfl.data.stacked.save "
                                                "wrote; a public data set: the folder holding its "
                                                f"files (none: ${DATA_ENV}/<data.name>, else {DEFAULT_ROOT}/"
                                                "<data.name>); relative: to the config file's folder, or to the "
                                                "current directory when given with --set"),
        "label_column": (str, "label", None, "csv: the column of labels"),
        "client_column": ((str, type(None)), None, None, "csv: the column of client ids (None: data.partition over "
                                                         "data.num_clients)"),
        "split_column": ((str, type(None)), None, None, "csv: the column marking each record 'train' or 'test' "
                                                        "(None: a random split by data.test_fraction)"),
        "alpha": (_NUMBER, 0.0, None, "synthetic: Li et al. 2020's alpha (as specified, it changes "
                                      "the draws but not their distribution: dpfl.data.synthetic)"),
        "beta": (_NUMBER, 0.0, None, "synthetic: feature heterogeneity"),
        "num_clients": ((int, type(None)), None, None, f"M, the clients (None: {NUM_CLIENTS}, or the data's own clients: "
                                                       "data.client_column, an npz 'client' array, the writers of "
                                                       f"{' and '.join(NATURAL)})"),
        "samples_per_client": ((int, type(None)), None, None, "records per client (synthetic: default 5000)"),
        "partition": ((str, type(None)), None, None, "how records are split over clients (None: 'iid', or the "
                                                     "data's own clients where it has them; 'natural': those)"),
        "partition_param": (_OPTIONAL_NUMBER, None, None, "the partition's parameter"),
        "labels": (str, "original", ("original", "parity"), "the classes as they are, or 'parity': the class "
                                                             "number's parity, even = 1 and odd = 0 (mapped after "
                                                             "data.partition)"),
        "standardize": (str, "none", ("none", "client", "pooled", "noble2022-minmax"),
                        "non-private preprocessing, if not 'none' ('noble2022-minmax': Noble et al. 2022's code's "
                        "per-client min-max: dpfl.data.preprocess)"),
        "scale": (_OPTIONAL_NUMBER, None, None, "a public constant multiplying every feature (e.g. 1/16 for digits' "
                                                "pixels 0..16): data-independent, so private (None: the data set's "
                                                "public default, 1e-3 for breast_cancer's raw features, documented up "
                                                "to 4254; 1 for every other source and for standardised features)"),
        "bounds": ((dict, list, type(None)), None, None, "npz / csv: public [low, high] per feature, known without "
                                                         "looking at the data ({column = [low, high], ...}, a list of "
                                                         "one pair per feature, or one pair for all): clipped, then "
                                                         "mapped onto [-1, 1]; private by construction"),
        "test_fraction": (_OPTIONAL_NUMBER, None, None, f"each client's test split (None: {TEST_FRACTION}, or the "
                                                        "data's own split: data.split_column, an npz 'split' array, "
                                                        "a public data set's test files)"),
        "seed": (int, 0, None, "the data's seed"),
        "vocabulary": (int, 10_000, None, "next-word: the tokens kept, besides pad, oov, bos and eos (TFF's "
                                          "StackOverflow: 10,000): the folder's vocabulary.txt's first ones, else the "
                                          "training text's most frequent (not private)"),
        "sequence_length": (int, 20, None, "next-word: the tokens before the predicted one that a record holds"),
    },
    "privacy": {
        "delta": (_OPTIONAL_NUMBER, None, None, "delta (None: the largest power of ten at most 1/(10 N), N the "
                                                "training records, e.g. 1e-5 for N = 1,592; a delta above 1/N is "
                                                "warned about)"),
        "budget": ((dict, int, float, type(None)), None, None, "epsilon for the third party, or {observer: eps}"),
        "epsilon": (_OPTIONAL_NUMBER, None, None, "the target epsilon of algorithms that calibrate their noise to it "
                                                  "(None: the algorithm's own noise keys)"),
        "analysis": (str, "sound", ("sound", "paper"), "'paper': a paper's own analysis: Noble et al. 2022's "
                                                       "accountant (unproven), or for dp-fedavg-user with server "
                                                       "noise McMahan et al. 2018's amplified epsilon (cohorts "
                                                       "secret from the third party)"),
        "conversion": ((str, type(None)), None, (None, "classic", "modern"), "RDP -> DP; default: the analysis's"),
        "boundary": (str, "plain", ("plain", "secagg", "shuffler", "trusted"), "what the server receives"),
        "secure_aggregation": (bool, False, None, "compute each round's sum by secure aggregation (Bonawitz et al. "
                                                  "2017: quantise, mask, sum mod 2^secagg_bits, decode); the boundary "
                                                  "is then 'secagg'"),
        "secagg_bits": (int, 32, None, "the ring Z_(2^bits) of privacy.secure_aggregation"),
        "shuffler": (str, "simulated", ("simulated", "real"), "boundary 'shuffler': permute whole messages "
                                                              "(simulated) or shuffle labelled bits for real (sdp-*; "
                                                              "d U (g + b) messages of 8 bytes a round)"),
        "release": (str, "every_round", ("every_round", "final"), "which models a third party sees"),
        "cohort": (str, "secret", ("secret", "members", "published"), "who learns who takes part in a round besides "
                                                                       "the server: nobody (secret), the members "
                                                                       "(a deployment that tells them; secure "
                                                                       "aggregation always does) or everyone; the "
                                                                       "server's noise is amplified by client "
                                                                       "sampling towards the observers it is secret "
                                                                       "from"),
    },
    "run": {
        "seed": (int, 0, None, "the seed of public randomness (model init, public schedules); the noise, cohorts and "
                               "minibatches come from a secret key (see run.noise_seed)"),
        "noise_seed": ((int, type(None)), None, None, "research mode: the noise key, so that noise, cohorts and "
                                                      "minibatches are reproducible; every epsilon then holds only "
                                                      "against observers who do not know it (None: a secret key from "
                                                      "the OS's entropy, kept in the run directory's noise.key)"),
        "eval_every": (int, 1, None, "evaluate every this many rounds"),
        "checkpoint_every": (int, 10, None, "checkpoint every this many rounds"),
        "memory_mb": (int, 512, None, "memory for one chunk of the cohort's work (results depend on it only through "
                                      "float rounding, and not at all with one thread)"),
        "threads": ((int, type(None)), None, None, "torch threads (None: 1, the cohort being one batched call; two "
                                                   "ran a round 7-30x slower on a busy 2-core machine, 1.5x faster on "
                                                   "an idle one for Noble et al.'s workload; a resume keeps the run's "
                                                   "count)"),
        "device": (str, "auto", None, "where the data, model, client state, gradients, noise and evaluation live: "
                                      "'auto' (a GPU when torch sees one, else the CPU), 'cpu', 'cuda' or 'cuda:N'; "
                                      "on a GPU a chunk of the cohort takes half its free memory, not run.memory_mb; "
                                      "the ledger and checkpoints are device-independent (a run resumes on another "
                                      "device; its noise streams differ by device, so a replayed round is charged "
                                      "again)"),
        "secure_noise": (bool, False, None, "draw the Gaussian noise exactly: the value rounded to a power-of-two "
                                            "grid, discrete Gaussian noise (Canonne et al. 2020) from ChaCha20 "
                                            "streams, no floating point (Mironov 2012); charged for the rounding. "
                                            "dp-fedavg, dp-fedsgd, dp-scaffold(-warm), dp-fedavg-user (noise_at "
                                            "'client' or 'server')"),
        "secure_noise_bits": (int, 9, None, "k of run.secure_noise: the grid step is 2^-k of the sensitivity "
                                             "(rounded up to a power of two); the noise multiplier charged is "
                                             "z 2^k / (2^k + sqrt(d)) for d parameters; z 2^k must stay below about "
                                             "3.9e4 (z <= 76 at k = 9, Noble et al.'s z = 60 included; "
                                             "z <= 2.4 at k = 14)"),
        "tensorboard": ((str, type(None)), None, None, "a directory for TensorBoard event files: each evaluated "
                                                       "round's test_accuracy, train_loss, epsilon/<observer> and, "
                                                       "where reported, clip (C_t), at step = the round (needs the "
                                                       "tensorboard package: pip install 'dpfl[tensorboard]'; None: "
                                                       "none)"),
        "epsilon_every": ((int, str), "auto", None, "the evaluated rounds whose results carry epsilon (each costs an "
                                                    "accounting per observer; the others carry null): 'auto' = "
                                                    "rounds 1, 2, 4, 8, ..., every checkpoint and the last; k = every "
                                                    "k-th round and the last (1: every round); the final epsilon is "
                                                    "always computed"),
        "eval_clients": ((int, type(None)), None, None, "evaluate the train loss and test accuracy on a fixed sample "
                                                        "of this many clients (drawn once from run.seed, the same "
                                                        "at every evaluation and on a resume), for a federation too "
                                                        "large to evaluate in full; None: every client"),
    },
}

#: [model] keys per model (besides name).
MODEL_KEYS: dict[str, dict[str, tuple]] = {
    "logreg": {"bias": (bool, True, None, "the intercept b (Zhou et al. 2021 use none)")},
    "femnist-cnn": {},
    "papernot-cnn": {},
    "mlp": {
        "hidden": (list, [200], None, "hidden layer widths"),
        "activation": (str, "relu", ("relu", "tanh", "sigmoid", "elu"), "hidden activation"),
    },
    "lstm": {
        "embedding": (int, 8, None, "lstm: the token embedding's width (McMahan et al. 2017: 8)"),
        "units": (int, 256, None, "lstm: each LSTM layer's units (McMahan et al. 2017: 256)"),
        "layers": (int, 2, None, "stacked layers: LSTM layers (McMahan et al. 2017: 2) or transformer blocks"),
    },
    "transformer": {
        "d_model": (int, 64, None, "transformer: the width of its embeddings and blocks"),
        "layers": (int, 2, None, "stacked layers: LSTM layers (McMahan et al. 2017: 2) or transformer blocks"),
        "heads": (int, 4, None, "transformer: attention heads per block (a divisor of d_model)"),
    },
    "custom": {},  # a torch module handed to dpfl.run(config, model=...): a config alone cannot name one
}
MODEL_DEFAULT = "logreg"

#: [data] keys that apply only to some data.name (every other [data] key applies to all of them).
DATA_KEYS: dict[str, tuple[str, ...]] = {
    "alpha": ("synthetic",),
    "beta": ("synthetic",),
    "path": ("npz", "csv", "clients", "next-word", *PUBLIC),
    "vocabulary": ("next-word",),
    "sequence_length": ("next-word",),
    "bounds": ("npz", "csv", "arrays"),
    "label_column": ("csv",),
    "client_column": ("csv",),
    "split_column": ("csv",),
    "partition": ("digits", "breast_cancer", "npz", "csv", *PUBLIC, "arrays"),
    "partition_param": ("digits", "breast_cancer", "npz", "csv", *PUBLIC, "arrays"),
    "labels": ("digits", "breast_cancer", "npz", "csv", *PUBLIC, "arrays"),
}

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
    config["privacy"].update(copy.deepcopy(spec.privacy_defaults))  # the family's own (e.g. release = "final")
    config["algorithm"] = {**{k: v[1] for k, v in spec.common_keys().items()}, "name": name,
                           **{k: spec.default_of(f) for k, f in spec.keys(name).items()}}
    return {section: config[section] for section in SECTIONS}


def load_config(path: str | Path | dict | None = None, overrides: list[str] | tuple[str, ...] = (),
                unset: list[str] | tuple[str, ...] = ()) -> dict:
    """Defaults, updated by the TOML file at ``path`` less its keys named in ``unset`` ("section.key": the key then
    takes its default, or is gone where it does not apply), then by ``overrides`` ("section.key=value"), validated.
    ``path`` may also be a dict of sections, ``{"algorithm": {"name": "dp-fedavg"}, ...}``, read as a TOML file's
    tables (a relative data.path against the current directory)."""
    given: dict = {}
    if isinstance(path, dict):
        merge(given, _anchored(copy.deepcopy(path), Path.cwd()))
        path = None
    elif path is not None:
        path = Path(path)
        merge(given, _anchored(read_toml(path), path.parent))
    for key in unset:
        ((section, values),) = _nested(key, None).items()
        (name,) = values
        if name not in given.get(section, {}):
            keys = ", ".join(f"{s}.{k}" for s, table in given.items() for k in table) or "none"
            raise ConfigError("--unset", key, f"a key that {path or 'the config'} sets, to drop (it sets {keys})")
        del given[section][name]
    for item in overrides:
        key, value = parse_override(item)
        merge(given, _anchored(_nested(key, value), Path.cwd()))
    return resolve(given)


def _anchored(data: dict, folder: Path) -> dict:
    """``data`` with a relative ``data.path`` made absolute against ``folder`` (``~`` expanded); other values as
    they are (a path of the wrong type is rejected by ``resolve``)."""
    path = data.get("data", {}).get("path") if isinstance(data.get("data"), dict) else None
    if not isinstance(path, str) or not path:
        return data
    return {**data, "data": {**data["data"], "path": os.path.abspath(folder / Path(path).expanduser())}}


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
    details = ", ".join(f"{key} {algo[key]}" for key in ("noise_multiplier", "clip", "client_rate") if key in algo)
    return (f"{algo['name']} for {algo['rounds']} rounds ({details or 'no noise'}) on "
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
                raise ConfigError(name, value, _not_applicable(section, key, algorithm, model, schema[section], given))
            types, _, choices, _ = schema[section][key]
            config[section][key] = _check(name, value, types, choices)
    _resolve_data(config["data"], given.get("data", {}))
    if "rounds" not in given.get("algorithm", {}):
        _one_pass_rounds(config)
    return config


def _one_pass_rounds(config: dict) -> None:
    """algorithm.rounds left unset for a one-pass family (its spec's ``max_rounds``): one pass over data.num_clients
    clients (unknown until the data is built when the data brings its own clients: then the common default)."""
    spec = registry.spec_of(config["algorithm"]["name"])
    num_clients = config["data"]["num_clients"]
    if spec.max_rounds is not None and num_clients is not None:
        config["algorithm"]["rounds"] = spec.max_rounds(spec.section(config["algorithm"]), num_clients)


def _resolve_data(data: dict, given: dict) -> None:
    """Checks that every given [data] key applies to data.name (``DATA_KEYS``) and that a file source has its
    path; fills ``num_clients`` (NUM_CLIENTS) and ``test_fraction`` (TEST_FRACTION) unless the data may bring its own
    clients or split: an npz file's 'client' and 'split' arrays, which only the file tells, a stacked clients
    folder, a csv's data.client_column and data.split_column (a split column decides every client's test records
    and leaves no room for a test_fraction), a public data set's test files (kept unless data.test_fraction is set) and the writers of
    those that have them (unless data.partition names a scheme); fills ``scale`` with the data set's public default
    (``sources.default_scale``: a constant of the config, not of the records)."""
    source = data["name"]
    for key, sources in DATA_KEYS.items():
        if key in given and source not in sources:
            raise ConfigError(f"data.{key}", given[key], f"no value: data.{key} applies to data.name in "
                                                         f"{list(sources)}, not {source!r}")
    if source in ("npz", "csv") and not data["path"]:
        raise ConfigError("data.path", data["path"], f"the path of the {source} file (data.name = {source!r})")
    if source == "clients" and not data["path"]:
        raise ConfigError("data.path", data["path"], "the folder of stacked client arrays (data.name = 'clients')")
    if source == "next-word" and not data["path"]:
        raise ConfigError("data.path", data["path"], "the .jsonl file, or the folder of them, of data.name = "
                                                     "'next-word'")
    own_clients = source in ("npz", "arrays", "clients", "next-word") or \
        (source == "csv" and data["client_column"] is not None) or \
        (source in NATURAL and data["partition"] in (None, "natural"))
    if data["num_clients"] is None and not own_clients:
        data["num_clients"] = NUM_CLIENTS
    own_split = source in ("npz", "arrays", "clients", *PUBLIC) or \
        (source == "csv" and data["split_column"] is not None)
    if source == "csv" and own_split and data["test_fraction"] is not None:
        raise ConfigError("data.test_fraction", data["test_fraction"],
                          f"no value: data.split_column = {data['split_column']!r} marks each record train or test, "
                          "and that split is kept as it is")
    if data["test_fraction"] is None and not own_split:
        data["test_fraction"] = TEST_FRACTION
    if data["scale"] is None:
        data["scale"] = default_scale(source, data["standardize"])


def key_schema(algorithm: str, model: str) -> dict[str, dict[str, tuple]]:
    """section -> key -> (types, default, choices, help) for this algorithm and model."""
    spec = registry.spec_of(algorithm)
    algo = {k: (v[0], v[1], v[2], v[3]) for k, v in spec.common_keys().items()}
    for key, f in spec.keys(algorithm).items():
        algo[key] = (spec.key_type(key), spec.default_of(f), f.metadata.get("choices"), f.metadata.get("help", ""))
    model_keys = {"name": (str, model, tuple(MODEL_KEYS), "the model"), **MODEL_KEYS[model]}
    privacy = {k: (v[0], spec.privacy_defaults.get(k, v[1]), *v[2:]) for k, v in SCHEMA["privacy"].items()}
    return {"data": SCHEMA["data"], "model": model_keys, "algorithm": algo, "privacy": privacy, "run": SCHEMA["run"]}


def _not_applicable(section: str, key: str, algorithm: str, model: str, allowed: dict, given: dict) -> str:
    if section == "model" and any(key in keys for keys in MODEL_KEYS.values()):
        users = [m for m, keys in MODEL_KEYS.items() if key in keys]
        return f"no value: model.{key} applies to model.name in {users}, not {model!r}"
    if section == "algorithm":
        spec = registry.spec_of(algorithm)
        if key in registry.COMMON_KEYS:
            return (f"no value: {algorithm!r} names its cohort with its own keys; algorithm.{key} does not apply (see "
                    f"`dpfl run --help`)")
        if key in {f.name for f in dataclasses.fields(spec.config)}:
            private = [n for n in spec.names if spec.private(n)]
            others = [k for k in given["algorithm"] if k not in allowed and k in spec.keys(private[0])]
            return (f"no value: algorithm.{key} applies only to the private names {private}, not {algorithm!r}; drop "
                    f"{'them' if len(others) > 1 else 'it'} from the config (on the command line: "
                    f"{' '.join(f'--unset algorithm.{k}' for k in others)})")
        users = [s.names[0] + "..." for s in registry.specs() if key in {f.name for f in dataclasses.fields(s.config)}]
        if users:
            return f"no value: algorithm.{key} belongs to other algorithms ({', '.join(users)}), not {algorithm!r}"
    return f"one of the keys {list(allowed)}"


def _check(name: str, value, types, choices):
    """``value`` if it has one of ``types`` (an int is accepted, as a float, for a float key) and is in ``choices``."""
    allowed = types if isinstance(types, tuple) else (types,)
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if (isinstance(value, bool) and bool not in allowed) or not isinstance(value, allowed):
        raise ConfigError(name, value, f"a value of type {_type_names(allowed)}")
    if choices is not None and value not in choices:
        raise ConfigError(name, value, f"one of {list(choices)}")
    return value


def _type_names(types) -> str:
    names = [{"NoneType": "none"}.get(t.__name__, t.__name__) for t in types]
    return " or ".join(dict.fromkeys(names))


__all__ = ["SCHEMA", "MODEL_KEYS", "DATA_KEYS", "RETIRED", "SECTIONS", "defaults", "load_config", "read_toml",
           "defaults_in_use", "resolve", "key_schema", "merge", "parse_override"]
