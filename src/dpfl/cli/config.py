"""`dpfl config [CONFIG.toml] [--set key=value ...] [--json]` and `dpfl config --reference`.

The first prints the config a run would use, every default filled in, as TOML that `dpfl run` reads back to the same
config (an unset key, which TOML cannot write, is shown as a comment); the second prints the configuration reference
(docs/config.md, ``dpfl.experiments.reference``): every key, its type, default, allowed values and the algorithms or
models that use it.
"""

from __future__ import annotations

import json

from dpfl.cli.common import add_config_keys


def configure(commands) -> None:
    parser = commands.add_parser(
        "config", help="print a config with its defaults filled in, or the reference of every key",
        description="Print the config a run would use (every default filled in) as TOML, or, with --reference, the "
                    "reference of every config key (docs/config.md).")
    parser.add_argument("config", nargs="?", default=None,
                        help="path of a TOML config (default: none, i.e. every default)")
    add_config_keys(parser, "override a config key, as in `dpfl run` (repeatable)")
    parser.add_argument("--reference", action="store_true",
                        help="print the reference of every key (Markdown) instead of a config")
    parser.add_argument("--json", action="store_true", help="print the resolved config as JSON")
    parser.set_defaults(handler=_config)


def _config(args) -> None:
    from dpfl.errors import DpflError

    if args.reference:
        if args.config is not None or args.overrides or args.json:
            raise DpflError("--reference prints the reference of every key and takes no CONFIG, --set or --json")
        from dpfl.experiments.reference import reference

        print(reference(), end="")
        return
    from dpfl.experiments.config import load_config
    from dpfl.experiments.reference import to_toml

    config = load_config(args.config, args.overrides, args.unset)
    print(json.dumps(config, indent=1) if args.json else to_toml(config), end="" if not args.json else "\n")
