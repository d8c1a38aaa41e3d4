"""`dpfl flower-app CONFIG.toml [--set key=value ...] --out DIR [--run-out RUN_DIR] [--classes C --features SHAPE]
[--evaluation none|federated|FILE]`: writes a Flower App running the config's algorithm on real silos
(``dpfl.flower.app_dir``); start it with `flwr run DIR <superlink>`.

The app carries the federation's public metadata, not a path to data: the number of clients (data.num_clients), of
classes and the features' shape. Given --classes and --features, no data is read; without them they are taken from
the config's data on this machine (a rehearsal, e.g. with `dpfl write-silos`). The ServerApp asks the silos for
their record counts. Where the config leaves run.secure_noise unset and the algorithm supports it, the app sets it
(``dpfl.flower.app_dir.flower_config``: the default on Flower)."""

from __future__ import annotations

import sys

from dpfl.cli.common import add_config_keys
from dpfl.errors import ConfigError


def configure(commands) -> None:
    parser = commands.add_parser("flower-app", help="write a Flower App (flwr run DIR) for a config",
                                 description=__doc__)
    parser.add_argument("config", help="the dpfl TOML config")
    parser.add_argument("--out", required=True, help="the Flower App's directory")
    add_config_keys(parser, "override a config key, as in dpfl run")
    parser.add_argument("--run-out", help="the ServerApp's run directory (default: DIR/run)")
    parser.add_argument("--classes", type=int, help="the federation's number of classes (labels 0..C-1)")
    parser.add_argument("--features", help="the shape of a record's features, e.g. 60 or 1,28,28")
    parser.add_argument("--evaluation", default="none",
                        help="where the model is evaluated: none (default); the path of an .npz / .csv evaluation set "
                             "on the SuperLink's machine that the server may hold; or federated: the silos' own "
                             "metrics, sent in the clear, NOT covered by epsilon")
    parser.set_defaults(handler=_flower_app)


def _flower_app(args) -> None:
    from dpfl.experiments.assembly import build_data
    from dpfl.flower.app_dir import flower_config, write_flower_app
    from dpfl.flower.federation import Federation

    config, secure_note = flower_config(args.config, args.overrides, args.unset)
    if (args.classes is None) != (args.features is None):
        raise ConfigError("--classes" if args.classes is None else "--features", None,
                          "both --classes and --features (the federation's metadata), or neither (taken from the "
                          "config's data on this machine)")
    if args.classes is None:
        federation, source = Federation.of_dataset(build_data(config["data"])), "the config's data on this machine"
    else:
        federation, source = _given(config, args.classes, args.features), "--classes and --features"
    out = write_flower_app(args.config, config, args.out, federation, args.run_out, args.evaluation)
    print(f"wrote the Flower App {out} for {federation.num_clients} clients, {federation.num_classes} classes, "
          f"features {list(federation.feature_shape)} (from {source}; the app holds no path to data); start it with: "
          f"flwr run {out} <superlink>", file=sys.stderr)
    if secure_note:
        print(secure_note, file=sys.stderr)


def _given(config: dict, classes: int, features: str):
    from dpfl.flower.federation import Federation

    clients = config["data"]["num_clients"]
    if clients is None:
        raise ConfigError("data.num_clients", None, "the number of silos (set it, e.g. --set data.num_clients=3)")
    if classes < 2:
        raise ConfigError("--classes", classes, "at least 2")
    try:
        shape = tuple(int(n) for n in features.split(","))
    except ValueError:
        shape = ()
    if not shape or min(shape) < 1:
        raise ConfigError("--features", features, "positive integers separated by commas, e.g. 60 or 1,28,28")
    return Federation(clients, classes, shape)
