"""The `dpfl` command line: run | demo | config | plot | audit | flower-app | write-silos | silo | reproduce | account |
calibrate | plan
(and `dpfl --version`).

`account` and `calibrate` have one subcommand per accountant, `plan` one per planner. Each lives in its own module
of this package named `account_<name>.py`, `calibrate_<name>.py` or `plan_<name>.py` and defines

    NAME: str                          # the subcommand, e.g. "gaussian" or "dp-scaffold"
    HELP: str                          # one line for `--help`
    configure(parser) -> None          # adds its arguments
    execute(args) -> dict              # computes the answer; the CLI prints it (as JSON with --json)

so adding an accountant or a planner to the CLI touches no other file. Warnings raised while a subcommand computes
(dp_accounting's absl log lines, e.g. a series that did not converge at some RDP order, and Python warnings) are
collected and summarised once, under ``warnings`` in its result, instead of leaking line by line.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
import warnings

from dpfl.cli.common import print_result, summarised_result
from dpfl.errors import ConfigWarning, DpflError


def _subcommand_modules(prefix: str):
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith(prefix):
            yield importlib.import_module(f"{__name__}.{info.name}")


def version() -> str:
    """The installed distribution's version (importlib.metadata), else the package's ``__version__``."""
    from importlib import metadata

    try:
        return metadata.version("dpfl")
    except metadata.PackageNotFoundError:
        import dpfl

        return getattr(dpfl, "__version__", "unknown")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dpfl", description="Differentially private federated learning.")
    parser.add_argument("--version", action="version", version=f"dpfl {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    from dpfl.cli import run as run_cmd  # local import: keeps `dpfl account` free of torch start-up cost

    run_cmd.configure(commands)
    from dpfl.cli import config as config_cmd

    config_cmd.configure(commands)
    from dpfl.cli import plot as plot_cmd

    plot_cmd.configure(commands)
    from dpfl.cli import audit as audit_cmd

    audit_cmd.configure(commands)
    from dpfl.cli import flower_app as flower_app_cmd

    flower_app_cmd.configure(commands)
    from dpfl.cli import write_silos as write_silos_cmd

    write_silos_cmd.configure(commands)
    from dpfl.cli import silo as silo_cmd

    silo_cmd.configure(commands)
    from dpfl.cli import reproduce as reproduce_cmd

    reproduce_cmd.configure(commands)
    for group, prefix, metavar, help_text in (
        ("account", "account_", "ACCOUNTANT", "epsilon of a mechanism or algorithm, without training"),
        ("calibrate", "calibrate_", "ACCOUNTANT", "the noise multiplier, number of rounds (run --solve rounds) or "
                                                  "local epsilon0 (shuffle) that meets a target epsilon"),
        ("plan", "plan_", "PLANNER", "hyperparameters that minimise a paper's convergence bound, before training"),
    ):
        group_parser = commands.add_parser(group, help=help_text, description=help_text)
        subs = group_parser.add_subparsers(dest="accountant", required=True, metavar=metavar)
        for module in _subcommand_modules(prefix):
            sub = subs.add_parser(module.NAME, help=module.HELP, description=module.HELP)
            module.configure(sub)
            sub.add_argument("--json", action="store_true", help="print the result as JSON")
            sub.set_defaults(handler=lambda args, m=module: print_result(summarised_result(m.execute, args), args.json))
    return parser


def _shown_as(command: str, show):
    """``warnings.showwarning`` that prints a ConfigWarning as "dpfl COMMAND: warning: ..." on stderr (its message
    names the key and why; the file and line of the code that raised it would only distract), others with ``show``."""
    def shown(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, ConfigWarning):
            print(f"dpfl {command}: warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    return shown


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:  # --help, --version (0) or a usage error (2, already printed): a status, not a raise
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 2)
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _shown_as(args.command, warnings.showwarning)
            code = args.handler(args)  # a handler returns None, or an exit status of its own (130: interrupted)
    except DpflError as err:
        print(f"dpfl {args.command}: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `dpfl ... | head`: the reader has gone; end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
