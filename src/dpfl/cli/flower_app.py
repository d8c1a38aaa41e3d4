"""`dpfl flower-app CONFIG.toml [--set key=value ...] --out DIR [--run-out RUN_DIR]`: writes a Flower App running the
config's algorithm on real silos (``dpfl.flower.app_dir``); start it with `flwr run DIR <superlink>`."""

from __future__ import annotations

import sys

from dpfl.cli.common import add_config_keys


def configure(commands) -> None:
    parser = commands.add_parser("flower-app", help="write a Flower App (flwr run DIR) for a config",
                                 description=__doc__)
    parser.add_argument("config", help="the dpfl TOML config")
    parser.add_argument("--out", required=True, help="the Flower App's directory")
    add_config_keys(parser, "override a config key, as in dpfl run")
    parser.add_argument("--run-out", help="the ServerApp's run directory (default: DIR/run)")
    parser.set_defaults(handler=_flower_app)


def _flower_app(args) -> None:
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import with_threads
    from dpfl.experiments.validate import validate
    from dpfl.flower.app_dir import write_flower_app

    config = with_threads(load_config(args.config, args.overrides, args.unset))
    validate(config)
    out = write_flower_app(args.config, config, args.out, args.run_out)
    print(f"wrote the Flower App {out}; start it with: flwr run {out} <superlink>", file=sys.stderr)
