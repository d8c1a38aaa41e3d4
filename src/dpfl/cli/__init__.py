"""The `dpfl` command line: run | demo | sweep | config | plot | audit | flower-app | write-silos | silo | reproduce |
account | calibrate | plan
(and `dpfl --version`).

`account` and `calibrate` have one subcommand per accountant, `plan` one per planner. Each lives in its own module
of this package named `account_<name>.py`, `calibrate_<name>.py` or `plan_<name>.py` and defines

    NAME: str                          # the subcommand, e.g. "gaussian" or "dp-scaffold"
    HELP: str                          # one line for `--help`
    configure(parser) -> None          # adds its arguments
    execute(args) -> dict              # computes the answer; the CLI prints it (as JSON with --json)

so adding an accountant or a planner to the CLI touches no other file. A command's parser is filled in only when
the command line picks it (``LazySubParsers``): the group's modules are imported when `dpfl account`, `calibrate` or
`plan` is chosen, and a subcommand's ``configure`` runs when it is, so `dpfl --version` and `dpfl --help` import
nothing heavy and `dpfl account gaussian` no torch (a subcommand module imports torch only inside its functions).
Warnings raised while a subcommand computes
(dp_accounting's absl log lines, e.g. a series that did not converge at some RDP order, and Python warnings) are
collected and summarised once, under ``warnings`` in its result, instead of leaking line by line.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import pkgutil
import sys
import warnings

from dpfl.cli.common import print_result, summarised_result
from dpfl.errors import ConfigWarning, DpflError, check_delta


class LazySubParsers(argparse._SubParsersAction):
    """Subcommands whose parsers are filled in only when the command line picks them.

    ``add_parser(name, fill=f, help=...)`` makes the parser at once with what the command above lists in its
    ``--help`` (name, help, description) and runs ``f(parser)`` (arguments, epilog, handler) only when ``name`` is
    chosen, before the parser reads its own arguments: so ``NAME --help`` prints every argument, and what filling in a
    parser imports (torch for `dpfl run`'s list of algorithms, dp_accounting for `dpfl account`) is paid by that
    command alone, not by `dpfl --version` or another command."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._unfilled: dict = {}

    def add_parser(self, name, *, fill=None, **kwargs):
        parser = super().add_parser(name, **kwargs)
        if fill is not None:
            self._unfilled[name] = (fill, parser)
        return parser

    def __call__(self, parser, namespace, values, option_string=None):
        if values and values[0] in self._unfilled:
            fill, chosen = self._unfilled.pop(values[0])
            fill(chosen)
        super().__call__(parser, namespace, values, option_string)


class _Version(argparse.Action):
    """``--version``: prints "dpfl VERSION" and exits; the version is looked up only then."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS,
                         help="show program's version number and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"dpfl {version()}")  # on stdout, as argparse's own version action
        parser.exit()


def version() -> str:
    """The installed distribution's version (importlib.metadata), else the package's ``__version__``."""
    from importlib import metadata

    try:
        return metadata.version("dpfl")
    except metadata.PackageNotFoundError:
        import dpfl

        return getattr(dpfl, "__version__", "unknown")


#: The subcommand groups: (group, module prefix, metavar, help). Their modules are imported when the group is chosen.
GROUPS = (
    ("account", "account_", "ACCOUNTANT", "epsilon of a mechanism or algorithm, without training"),
    ("calibrate", "calibrate_", "ACCOUNTANT", "the noise multiplier, number of rounds (run --solve rounds) or local "
                                              "epsilon0 (shuffle) that meets a target epsilon"),
    ("plan", "plan_", "PLANNER", "hyperparameters that minimise a paper's convergence bound, before training"),
)


def build_parser() -> argparse.ArgumentParser:
    """The `dpfl` parser. Building it imports no command's dependencies: each command's parser is filled in when the
    command line picks it (``LazySubParsers``), so `dpfl --version` and `dpfl --help` start in a few tens of ms."""
    from dpfl.cli import audit, config, flower_app, plot, reproduce, run, silo, sweep, write_silos

    parser = argparse.ArgumentParser(prog="dpfl", description="Differentially private federated learning.")
    parser.add_argument("--version", action=_Version)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", action=LazySubParsers)
    for module in (run, sweep, config, plot, audit, flower_app, write_silos, silo, reproduce):
        module.configure(commands)
    for group, prefix, metavar, help_text in GROUPS:
        commands.add_parser(group, help=help_text, description=help_text,
                            fill=functools.partial(_fill_group, prefix=prefix, metavar=metavar))
    return parser


def _fill_group(group_parser: argparse.ArgumentParser, prefix: str, metavar: str) -> None:
    """The group's subcommands: one per module of this package named ``<prefix><name>.py``."""
    subs = group_parser.add_subparsers(dest="accountant", required=True, metavar=metavar, action=LazySubParsers)
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith(prefix):
            module = importlib.import_module(f"{__name__}.{info.name}")
            subs.add_parser(module.NAME, help=module.HELP, description=module.HELP,
                            fill=functools.partial(_fill_subcommand, module=module))


def _fill_subcommand(sub: argparse.ArgumentParser, module) -> None:
    module.configure(sub)
    sub.add_argument("--json", action="store_true", help="print the result as JSON")
    sub.set_defaults(handler=functools.partial(_answer, module))


def _answer(module, args) -> None:
    """Prints ``module.execute(args)``, once every ``--delta`` given (a number, or one per client) is checked as a
    run's privacy.delta is (``check_delta``: below ``MAX_DELTA``), so that no command answers for a delta a run
    refuses."""
    given = getattr(args, "delta", None)
    for delta in given if isinstance(given, tuple) else () if given is None else (given,):
        check_delta("delta", delta)
    print_result(summarised_result(module.execute, args), args.json)


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
