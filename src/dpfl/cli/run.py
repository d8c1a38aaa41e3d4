"""`dpfl run CONFIG.toml [--set key=value ...] [--out DIR] [--resume | --restart]` and `dpfl demo [--out DIR]`.

Ctrl-C during a run stops it after the current round (a second Ctrl-C at once); either way the command exits with
status 130 and says how to resume, without a traceback.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from dpfl.errors import DpflError, RunInterrupted

INTERRUPTED = 130  # the shell's status for a command ended by SIGINT


def _algorithms_help() -> str:
    """The registered algorithms and their [algorithm] keys (read from the registry, so it lists what exists)."""
    import dataclasses

    from dpfl.algorithms import registry

    lines = ["algorithms (algorithm.name) and their [algorithm] keys, besides "
             f"{', '.join(registry.COMMON_KEYS)}:"]
    for spec in registry.specs():
        lines.append(f"  {', '.join(spec.names)}")
        lines.append(f"      {spec.help}")
        for f in dataclasses.fields(spec.config):
            only = " (private names only)" if f.metadata.get("private") else ""
            lines.append(f"      {f.name} = {f.default!r}: {f.metadata.get('help', '')}{only}")
    return "\n".join(lines)


def configure(commands) -> None:
    import argparse

    run = commands.add_parser("run", help="run one experiment from a TOML config",
                              description="Run one experiment; writes DIR/results.json, ledger.json, checkpoint.pt.",
                              epilog=_algorithms_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("config", help="path of the TOML config (see examples/)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key, e.g. --set algorithm.lr=0.5 (repeatable)")
    run.add_argument("--out", default=None, help="run directory (default: runs/<config name>)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run in DIR (from checkpoint.pt, or from round 0 without one, keeping "
                          "ledger.json); the config may differ only in algorithm.rounds, privacy.budget, "
                          "run.eval_every and run.checkpoint_every")
    run.add_argument("--restart", action="store_true",
                     help="move the run already in DIR to DIR/archive/<UTC time>/ and start over (without it, a new "
                          "run into a directory that holds one is refused)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.set_defaults(handler=_run)

    demo = commands.add_parser("demo", help="DP-SCAFFOLD-warm vs DP-FedAvg on heterogeneous synthetic data (<1 min)")
    demo.add_argument("--out", default="dpfl-demo", help="where to write results and demo.png (default: dpfl-demo)")
    demo.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a demo setting, e.g. --set algorithm.rounds=50")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    demo.set_defaults(handler=_demo)


def _run(args) -> int | None:
    from dpfl.experiments.config import load_config
    from dpfl.experiments.runner import run_experiment

    if args.resume and args.restart:
        raise DpflError("--resume and --restart cannot be combined: --resume continues the run in the directory, "
                        "--restart archives it and starts over")
    config = load_config(args.config, args.overrides)
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    resume = shlex.join(["dpfl", "run", args.config, *[a for o in args.overrides for a in ("--set", o)],
                         "--out", str(out), "--resume"])
    try:
        results = run_experiment(config, out, progress=not args.no_progress, resume=args.resume,
                                 restart=args.restart)
    except RunInterrupted as stop:
        print(f"interrupted after round {stop.rounds_done}; results so far: {out / 'results.json'}; resume with: "
              f"{resume}", file=sys.stderr)
        return INTERRUPTED
    except KeyboardInterrupt:
        if (out / "ledger.json").exists():
            print(f"aborted; the privacy ledger in {out} is up to date; resume with: {resume}", file=sys.stderr)
        else:
            print("aborted before the first round", file=sys.stderr)
        return INTERRUPTED
    final = results["final"]
    eps = ", ".join(f"{o}={'inf' if e is None else f'{e:.3f}'}" for o, e in final["epsilon"].items())
    print(f"round {final['round']}: test accuracy {final['test_accuracy']:.4f}, train loss {final['train_loss']:.4f}, "
          f"epsilon ({eps}) at delta {final['delta']:.3g}")
    if results["stopped_reason"]:
        print(f"stopped early: {results['stopped_reason']}", file=sys.stderr)
    print(f"results: {out / 'results.json'}")


def _demo(args) -> int | None:
    from dpfl.experiments.demo import run_demo, table

    try:
        results = run_demo(args.out, progress=not args.no_progress, overrides=args.overrides)
    except KeyboardInterrupt:
        print("demo interrupted", file=sys.stderr)
        return INTERRUPTED
    print(table(results))
    print(f"curves: {Path(args.out) / 'demo.png'}; results: {Path(args.out)}/<algorithm>/results.json")
