"""`dpfl sweep CONFIG.toml --grid KEY=V1,V2,... [--grid ...] [--set KEY=VALUE ...] --out DIR [--jobs N]
[--devices D1,D2,...] [--select METRIC] [--json]`: every combination of the grid's values run as its own `dpfl run`
(``dpfl.experiments.sweep``), ``--jobs`` at a time, each on the next device; DIR/sweep.json and DIR/sweep.csv hold
one row per run and, beside them, the epsilon of releasing all the runs together (what a model chosen among them
costs). `dpfl plot --tradeoff DIR/points/*` draws them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dpfl.cli.common import add_config_keys


def configure(commands) -> None:
    sweep = commands.add_parser(
        "sweep", help="run a grid of configs (every combination of some keys' values) and gather their results",
        description="Run every combination of the values given for some config keys, each as its own `dpfl run` in "
                    "DIR/points/<point>, --jobs at a time; write DIR/sweep.json and DIR/sweep.csv (one row per run) "
                    "and report the epsilon of releasing every run together: a model chosen by looking at several "
                    "runs costs that, not its own run's epsilon. A sweep stopped half way is resumed by the same "
                    "command (finished points are read, unfinished ones resumed).")
    sweep.add_argument("config", help="path of the TOML config the grid varies")
    sweep.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="a config key and its values (TOML literals), e.g. --grid algorithm.lr=0.05,0.1 "
                            "--grid privacy.epsilon=2,4,8 (repeatable: every combination is run)")
    add_config_keys(sweep, "a config key every point sets, e.g. --set algorithm.rounds=20 (repeatable)")
    sweep.add_argument("--out", required=True, metavar="DIR", help="the sweep's directory")
    sweep.add_argument("--jobs", type=int, default=1, help="runs at a time (default 1)")
    sweep.add_argument("--devices", default=None, metavar="D1,D2,...",
                       help="run.device of each job in turn, e.g. cuda:0,cuda:1 (default: the config's)")
    sweep.add_argument("--threads", type=int, default=None,
                       help="torch threads per run (default: the CPU cores shared out among the jobs)")
    sweep.add_argument("--select", default=None, metavar="METRIC",
                       help="also name the run with the best final test_accuracy or train_loss; the model it "
                            "names costs the composed epsilon of all runs, and the score reads records no ledger "
                            "charges (say so wherever it is published)")
    sweep.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    sweep.set_defaults(handler=_sweep)


def _sweep(args) -> int:
    from dpfl.errors import ConfigError
    from dpfl.experiments import sweep

    if args.unset:
        raise ConfigError("--unset", args.unset, "no --unset in a sweep: write the config without those keys")
    if args.select is not None and args.select not in sweep.SELECTABLE:
        raise ConfigError("--select", args.select, f"one of {list(sweep.SELECTABLE)}")
    if args.threads is not None and args.threads < 1:
        raise ConfigError("--threads", args.threads, "an integer >= 1")
    grid = sweep.parse_grid(args.grid)
    grid_points = sweep.points(grid)
    sweep.check_points(args.config, grid_points, args.overrides)
    out = Path(args.out)
    devices = None if args.devices is None else [d.strip() for d in args.devices.split(",") if d.strip()]
    statuses = sweep.run_points(args.config, grid_points, out, args.overrides, args.jobs, devices, args.threads,
                                log=lambda line: print(line, file=sys.stderr, flush=True))
    rows = sweep.table(grid_points, out)
    done = [out / "points" / row["point"] for row in rows if row["status"] in ("finished", "stopped")]
    composed, note = sweep.composed_epsilon(done) if done else (None, "no run finished")
    summary = {"config": args.config, "grid": grid,
               "composed_epsilon": composed, "composed_note": note,
               "composed_meaning": "epsilon per observer of releasing every finished run together: what a model "
                                   "chosen by looking at several of them costs"}
    if args.select is not None:
        best = sweep.select(rows, args.select)
        summary["selected"] = None if best is None else best["point"]
        summary["selected_note"] = (
            f"chosen by its final {args.select}: publishing it costs the composed epsilon above, not its own run's; "
            f"the {args.select} reads records (the clients' {'test' if args.select == 'test_accuracy' else 'train'} "
            "records) that no ledger charges (Papernot and Steinke 2022's private selection is not implemented)")
    sweep.write(rows, summary, out)
    if args.json:
        print(json.dumps({**summary, "points": rows}, indent=2))
    else:
        _print_table(rows, summary)
    failed = [status for status in statuses.values() if status not in (0, 3, 4)]
    return failed[0] if failed else 0


def _print_table(rows: list[dict], summary: dict) -> None:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cells = [[_cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for r in cells:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths)))
    composed = summary["composed_epsilon"]
    print(f"\nreleasing every run together ({summary['composed_note']}): " +
          (", ".join(f"{o} {_cell(e)}" for o, e in composed.items()) if composed else "not stated"))
    if "selected" in summary:
        print(f"selected: {summary['selected']} ({summary['selected_note']})")


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)
