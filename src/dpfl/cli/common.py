"""What the `dpfl` subcommands share: printing a result (rounded to the safe side), collecting the warnings a
computation raises into one summary line each, the default accountant's choice, and the ``--set`` / ``--unset`` keys."""

from __future__ import annotations

import contextlib
import decimal
import json
import logging
import math
import warnings


#: Printed results are rounded to 6 significant digits towards the safe side, since users copy them: noise, epsilon
#: and delta up; these keys (a largest admissible value) down. JSON prints every value at full precision.
ROUNDED_DOWN = ("epsilon0", "rounds")


def print_result(result: dict, as_json: bool) -> None:
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


def summarised_result(execute, args) -> dict:
    """``execute(args)``, with the warnings it raised summarised under ``warnings`` (one line per kind, counted)."""
    with collected_warnings() as collected:
        result = execute(args)
    if collected:
        result = {**result, "warnings": summarised(collected)}
    return result


def summarised(collected: dict) -> list[str]:
    """One line per kind of collected warning, with how many more like it came."""
    return [text + (f" (and {n - 1} more like it)" if n > 1 else "") for text, n in collected.values()]


@contextlib.contextmanager
def collected_warnings(python_warnings: bool = True):
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


def with_default_accountant(compute, accountant: str | None):
    """``(compute(accountant), note)``. With no accountant named, PLD (the tight default), or RDP where PLD cannot
    answer: a PLD too large to build (``pld.PldTooLargeError``) says why when the search meets it; ``note`` (None for
    PLD) states the switch. A named accountant is used as it is (PLD then refuses such events with its own error)."""
    from dpfl.accounting.pld import PldTooLargeError

    if accountant is not None:
        return compute(accountant), None
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
