"""`dpfl run CONFIG.toml [--set key=value ...] [--out DIR] [--resume]` and `dpfl demo [--out DIR]`."""

from __future__ import annotations

import sys
from pathlib import Path


def configure(commands) -> None:
    run = commands.add_parser("run", help="run one experiment from a TOML config",
                              description="Run one experiment; writes DIR/results.json, ledger.json, checkpoint.pt.")
    run.add_argument("config", help="path of the TOML config (see examples/)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key, e.g. --set algorithm.lr=0.5 (repeatable)")
    run.add_argument("--out", default=None, help="run directory (default: runs/<config name>)")
    run.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint.pt and DIR/ledger.json")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.set_defaults(handler=_run)

    demo = commands.add_parser("demo", help="DP-SCAFFOLD-warm vs DP-FedAvg on heterogeneous synthetic data (<1 min)")
    demo.add_argument("--out", default="dpfl-demo", help="where to write results and demo.png (default: dpfl-demo)")
    demo.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a demo setting, e.g. --set algorithm.rounds=50")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    demo.set_defaults(handler=_demo)


def _run(args) -> None:
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import run_experiment

    config = load_config(args.config, args.overrides)
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    results = run_experiment(config, out, progress=not args.no_progress, resume=args.resume)
    final = results["final"]
    eps = ", ".join(f"{o}={'inf' if e is None else f'{e:.3f}'}" for o, e in final["epsilon"].items())
    print(f"round {final['round']}: test accuracy {final['test_accuracy']:.4f}, train loss {final['train_loss']:.4f}, "
          f"epsilon ({eps}) at delta {final['delta']:.3g}")
    if results["stopped_reason"]:
        print(f"stopped early: {results['stopped_reason']}", file=sys.stderr)
    print(f"results: {out / 'results.json'}")


def _demo(args) -> None:
    from dpfl.experiments.demo import run_demo, table

    results = run_demo(args.out, progress=not args.no_progress, overrides=args.overrides)
    print(table(results))
    print(f"curves: {Path(args.out) / 'demo.png'}; results: {Path(args.out)}/<algorithm>/results.json")
