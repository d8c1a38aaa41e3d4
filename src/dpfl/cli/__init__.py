"""The `dpfl` command line: run | demo | config | plot | audit | flower-app | write-silos | reproduce | account | calibrate |
plan
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
import contextlib
import decimal
import importlib
import json
import logging
import math
import os
import pkgutil
import sys
import warnings

from dpfl.errors import ConfigWarning, DpflError


def _subcommand_modules(prefix: str):
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith(prefix):
            yield importlib.import_module(f"{__name__}.{info.name}")


#: Printed results are rounded to 6 significant digits towards the safe side, since users copy them: noise, epsilon
#: and delta up; these keys (a largest admissible value) down. JSON prints every value at full precision.
ROUNDED_DOWN = ("epsilon0", "rounds")


def _print_result(result: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=False))
        return
    width = max((len(k) for k in result), default=0)
    for key, value in result.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={safe_round(v, down=key in ROUNDED_DOWN)}" for k, v in value.items())
        elif isinstance(value, list):
            value = "".join(f"\n  - {item}" for item in value)
        print(f"{key:<{width}}  {safe_round(value, down=key in ROUNDED_DOWN)}")


def safe_round(value, down: bool = False, digits: int = 6) -> str:
    """``value`` as text; a finite float is rounded to ``digits`` significant digits UP (or down), exactly (decimal
    arithmetic on the float's binary value), so that a printed noise or epsilon is never the unsafe side of the
    computed one. A float whose shortest representation already has at most ``digits`` digits prints as it is (it
    reads back as the same float)."""
    if not isinstance(value, float) or not math.isfinite(value) or value == 0:
        return str(value)
    shortest = decimal.Decimal(repr(value))
    if len(shortest.normalize().as_tuple().digits) <= digits:
        return repr(value)
    exact = decimal.Decimal(value)
    quantum = decimal.Decimal(1).scaleb(exact.adjusted() - digits + 1)
    rounded = exact.quantize(quantum, rounding=decimal.ROUND_FLOOR if down else decimal.ROUND_CEILING)
    return f"{rounded.normalize():f}" if -5 <= rounded.adjusted() < digits else f"{rounded.normalize():E}"


def _summarised(execute, args) -> dict:
    """``execute(args)``, with the warnings it raised summarised under ``warnings`` (one line per kind, counted)."""
    with _collected_warnings() as collected:
        result = execute(args)
    if collected:
        result = {**result, "warnings": summarised(collected)}
    return result


def summarised(collected: dict) -> list[str]:
    """One line per kind of collected warning, with how many more like it came."""
    return [text + (f" (and {n - 1} more like it)" if n > 1 else "") for text, n in collected.values()]


@contextlib.contextmanager
def _collected_warnings(python_warnings: bool = True):
    """Yields {kind: [first message, count]}, filled by absl's logger (dp_accounting logs through it) and, with
    ``python_warnings``, by Python warnings while the block runs; what is collected does not reach stderr."""
    collected: dict = {}

    def note(kind, text: str) -> None:
        collected.setdefault(kind, [text, 0])[1] += 1

    class Collect(logging.Handler):
        def emit(self, record):
            note(("absl", record.msg), f"dp_accounting: {record.getMessage()}")

    absl = logging.getLogger("absl")
    handler, propagate, level = Collect(logging.WARNING), absl.propagate, absl.level
    absl.addHandler(handler)
    absl.propagate = False
    absl.setLevel(logging.WARNING)  # collect them even where a caller has silenced absl
    try:
        if not python_warnings:
            yield collected
            return
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield collected
        for w in caught:
            note((w.category, str(w.message)), f"{w.category.__name__}: {w.message}")
    finally:
        absl.removeHandler(handler)
        absl.propagate = propagate
        absl.setLevel(level)


@contextlib.contextmanager
def _one_line_dpfl_warnings():
    """dpfl's own warnings (``ConfigWarning``) print as one line on stderr, "dpfl: warning: ...", not as Python's
    "file:line: category" with a source line; other warnings as Python prints them."""
    from dpfl.errors import ConfigWarning

    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, ConfigWarning):
            print(f"dpfl: warning: {message}", file=sys.stderr if file is None else file)
        else:
            shown(message, category, filename, lineno, file, line)

    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = shown


def with_default_accountant(compute, accountant: str | None, pld_cannot: str | None = None):
    """``(compute(accountant), note)``. With no accountant named, PLD (the tight default), or RDP where PLD cannot
    answer: ``pld_cannot`` says why before anything is computed (e.g. fixed-size sampling), and a PLD too large to
    build (``pld.PldTooLargeError``) says why when the search meets it; ``note`` (None for PLD) states the switch. A
    named accountant is used as it is (PLD then refuses such events with its own error)."""
    from dpfl.accounting.pld import PldTooLargeError

    if accountant is not None:
        return compute(accountant), None
    if pld_cannot is not None:
        return compute("rdp"), f"accountant rdp, not the default pld: {pld_cannot}"
    try:
        return compute("pld"), None
    except PldTooLargeError as err:
        return compute("rdp"), (
            f"accountant rdp, not the default pld: the PLD would span about {err.points:.2g} grid points (privacy "
            f"losses up to about {err.losses:.3g}), too many to build in seconds; RDP is an upper bound too, within a "
            "few per cent of PLD at such epsilons")


def add_config_keys(parser, set_help: str) -> None:
    """``--set KEY=VALUE`` and ``--unset KEY``: a config file's keys changed or dropped on the command line
    (``dpfl.experiments.config.load_config``)."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help=set_help)
    parser.add_argument("--unset", dest="unset", action="append", default=[], metavar="KEY",
                        help="drop a key the config file sets (it then takes its default, or is gone where it does "
                             "not apply), e.g. --set algorithm.name=\"'fedavg'\" --unset algorithm.noise_multiplier "
                             "--unset algorithm.clip for a private config's non-private twin (repeatable)")


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
            sub.set_defaults(handler=lambda args, m=module: _print_result(_summarised(m.execute, args), args.json))
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
