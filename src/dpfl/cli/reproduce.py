"""`dpfl reproduce --list | ITEM [--quick] [--out DIR] | --report [--quick] [--out DIR] [--to FILE]`: the papers'
headline tables and figures recomputed beside the paper's numbers (``dpfl.papers``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from dpfl.errors import ConfigError

DEFAULT_OUT = "reproduce-results"
DEFAULT_REPORT = "docs/reproduction.md"


def configure(commands) -> None:
    p = commands.add_parser(
        "reproduce", help="recompute a paper's table or figure beside the paper's numbers",
        description="Recompute the headline tables and figures of the papers dpfl implements, each beside the "
                    "paper's numbers. --list names them with their status; ITEM runs one (--quick: minutes, on data "
                    "that ships with dpfl); --report runs them all and writes the report. Runs are cached under "
                    "OUT/ITEM/<sha256 of the item's settings>/ and reused.")
    p.add_argument("item", nargs="?", metavar="ITEM", help="the item to run (see --list)")
    p.add_argument("--list", action="store_true", help="list every item and its status")
    p.add_argument("--report", action="store_true", help="run every item and write the report (--to)")
    p.add_argument("--quick", action="store_true",
                   help="the scaled-down run: minutes on 2 cores, on data that ships with dpfl")
    p.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"the cache and outputs (default {DEFAULT_OUT})")
    p.add_argument("--to", default=DEFAULT_REPORT, metavar="FILE",
                   help=f"the report --report writes (default {DEFAULT_REPORT}; figures beside it)")
    p.set_defaults(handler=_reproduce)


def listing() -> str:
    """Every item: its id, paper, what it is, its status and why, and whether its full run's data set is there."""
    from dpfl.papers import ITEMS
    from dpfl.reproduction.runner import data_folder

    lines = []
    for it in ITEMS.values():
        lines += [f"{it.id}  [{it.status}]", f"    {it.paper}: {it.what}", f"    {it.why}"]
        where = data_folder(it)
        if it.no_full_run:
            lines.append(f"    full run: none yet ({it.no_full_run})")
        elif where is not None:
            folder, absent = where
            lines.append(f"    full run: needs the data set {it.data} at {folder}" + (
                " (found)" if absent is None else f" (not there; --quick runs it on {it.substitute})"))
    return "\n".join(lines)


def _reproduce(args) -> int:
    from dpfl.papers import ITEMS, item
    from dpfl.reproduction import report as report_module
    from dpfl.reproduction.runner import reproduce, table

    chosen = sum(bool(x) for x in (args.list, args.report, args.item))
    if chosen != 1:
        raise ConfigError("dpfl reproduce", " ".join(sys.argv[2:]) or "(nothing)",
                          "exactly one of --list, --report or an ITEM")
    if args.list:
        print(listing())
        return 0
    if args.report:
        results = {}
        for it in ITEMS.values():
            results[it.id] = _run(reproduce, it, args)
        path = report_module.write(Path(args.to), list(ITEMS.values()), results, args.quick)
        print(f"report: {path}")
        return 0
    it = item(args.item)
    result = _run(reproduce, it, args)
    print(table(result["rows"]))
    print(f"\n{it.id}: {result['folder']}" + (" (cached: nothing recomputed)" if result["cached"] else ""))
    if result["research_mode"]:
        print(result["research_mode"])
    return 0


def _run(reproduce, it, args) -> dict:
    print(f"{it.id}: {'quick' if args.quick else 'full'} run ...", file=sys.stderr, flush=True)
    started = time.perf_counter()
    result = reproduce(it, args.quick, args.out)
    done = "cached" if result["cached"] else f"computed in {time.perf_counter() - started:.0f} s"
    print(f"{it.id}: {done}", file=sys.stderr, flush=True)
    return result
