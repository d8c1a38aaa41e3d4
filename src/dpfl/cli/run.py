"""`dpfl run CONFIG.toml [--set key=value ...] [--out DIR] [--resume | --restart] [--nproc N] [--json]` and
`dpfl demo [--out DIR] [--json]`.

Exit statuses (``EXIT_STATUSES``): 0 the run finished its rounds; 2 an error (bad config, run directory, ...);
3 a privacy budget stopped it (BUDGET_STOPPED); 4 it diverged (DIVERGED: a non-finite model or train loss, or a train
loss above ``simulator.DIVERGED_LOSS``); 130 Ctrl-C and 143 SIGTERM (128 + the signal, as a shell reports a command
a signal ended): it stops after the current round (a second signal at once) and says how to resume, without a
traceback (``dpfl.engine.stop_signal``). With --json the summary is one JSON object on
stdout and nothing else goes there (progress and notes go to stderr).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import shlex
import signal
import sys
from pathlib import Path

from dpfl.cli.common import add_config_keys
from dpfl.engine.launch import NPROC
from dpfl.errors import ConfigError, DpflError, RunInterrupted, check_range

INTERRUPTED = 128 + signal.SIGINT  # 130: the shell's status for a command ended by SIGINT (Ctrl-C)
TERMINATED = 128 + signal.SIGTERM  # 143: by SIGTERM (kill PID)
BUDGET_STOPPED = 3  # a privacy budget (privacy.budget) stopped the run before its last round
DIVERGED = 4  # the model or the train loss stopped being finite; the run stopped there
EXIT_STATUSES = f"""exit status:
  0    the run finished all its rounds
  2    error (bad config or option, unusable run directory or one another run holds); nothing was run
  {BUDGET_STOPPED}    the privacy budget (privacy.budget) stopped the run early; results.json holds the rounds done
  {DIVERGED}    the run diverged (non-finite model or train loss, or a train loss above 1e4) and stopped; lower
       algorithm.lr
  {INTERRUPTED}  interrupted (Ctrl-C): it stops after the current round; the command to resume is printed
  {TERMINATED}  stopped by SIGTERM (kill PID), as by Ctrl-C"""
_STATUS_OF = {"budget": BUDGET_STOPPED, "diverged": DIVERGED, "interrupted": INTERRUPTED}


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
            lines.append(f"      {f.name} = {spec.default_of(f)!r}: {f.metadata.get('help', '')}{only}")
    return "\n".join(lines)


def _with_epilog(run) -> None:
    """`dpfl run --help`'s epilog: the exit statuses and the registered algorithms (whose registry imports torch, so
    it is read only when `dpfl run` is chosen)."""
    run.epilog = EXIT_STATUSES + "\n\n" + _algorithms_help()


def configure(commands) -> None:
    import argparse

    run = commands.add_parser("run", help="run one experiment from a TOML config",
                              description="Run one experiment; writes DIR/results.json, ledger.json, checkpoint.pt.",
                              formatter_class=argparse.RawDescriptionHelpFormatter, fill=_with_epilog)
    run.add_argument("config", help="path of the TOML config (see examples/)")
    add_config_keys(run, "override a config key, e.g. --set algorithm.lr=0.5 (repeatable)")
    run.add_argument("--out", default=None, help="run directory (default: runs/<config name>)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run in DIR (from checkpoint.pt, or from the first round without one, keeping "
                          "ledger.json); the config may differ only in algorithm.rounds (not for an algorithm whose "
                          "noise is calibrated to the rounds, e.g. fedsgd-dpc), privacy.budget, run.eval_every, "
                          "run.epsilon_every and run.checkpoint_every")
    run.add_argument("--restart", action="store_true",
                     help="move the run already in DIR to DIR/archive/<UTC time>/ and start over (without it, a new "
                          "run into a directory that holds one is refused)")
    run.add_argument("--nproc", type=int, default=None, metavar="N",
                     help="split each round's cohort across N local processes (ranks, on torch.distributed's gloo; "
                          "the README's \"Many GPUs and nodes\"); under torchrun leave it out: its ranks join the "
                          "group themselves")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument("--json", action="store_true",
                     help="print the summary (round, test_accuracy, train_loss, epsilon per observer, delta, results, "
                          "stopped_reason) as one JSON object on stdout, and nothing else there")
    run.set_defaults(handler=_run)

    demo = commands.add_parser("demo", help="DP-SCAFFOLD-warm vs DP-FedAvg on heterogeneous synthetic data (<1 min)",
                               epilog=EXIT_STATUSES.replace("the run", "a run"),
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    demo.add_argument("--out", default="dpfl-demo", help="where to write results and demo.png (default: dpfl-demo)")
    demo.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                      help="override a demo setting, e.g. --set algorithm.rounds=50")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    demo.add_argument("--json", action="store_true",
                      help="print {algorithm: the summary `dpfl run --json` prints} as one JSON object on stdout")
    demo.set_defaults(handler=_demo)


def _run(args) -> int | None:
    """`dpfl run`: in this process; as ``--nproc`` local ranks (``dpfl.engine.launch``); or, under torchrun
    (WORLD_SIZE set), as one of its ranks, where only rank 0 prints (another rank that rank 0's refusal stopped exits
    2 quietly: rank 0 says why)."""
    from dpfl.engine.ranks import Ranks, RankZeroError

    ranks = Ranks.from_environment()
    if args.nproc is not None:
        if ranks is not None:
            raise ConfigError("--nproc", args.nproc, "left out under torchrun (WORLD_SIZE is set: torchrun's "
                                                     "--nproc-per-node starts the ranks, and each joins the group)")
        check_range("--nproc", args.nproc, 1, integer=True)
        if args.nproc > 1:
            from dpfl.engine.launch import launch

            return launch([sys.executable, "-m", "dpfl.cli", *_rank_argv(args)], args.nproc)
    if ranks is None:
        return _run_here(args, None)
    try:
        if ranks.is_first:
            return _run_here(args, ranks)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return _run_here(args, ranks)
    except RankZeroError:
        return 2
    finally:
        ranks.leave()


def _rank_argv(args) -> list[str]:
    """The command line each rank of ``args.nproc`` runs: ``args`` without --nproc."""
    return ["run", args.config, *[a for o in args.overrides for a in ("--set", o)],
            *[a for key in args.unset for a in ("--unset", key)], *(["--out", args.out] if args.out else []),
            *(["--resume"] if args.resume else []), *(["--restart"] if args.restart else []),
            *(["--no-progress"] if args.no_progress else []), *(["--json"] if args.json else [])]


def _run_here(args, ranks) -> int | None:
    from dpfl.cli.common import collected_warnings, summarised
    from dpfl.experiments.config import defaults_in_use, load_config, read_toml
    from dpfl.experiments.runner import run_experiment

    if args.resume and args.restart:
        raise DpflError("--resume and --restart cannot be combined: --resume continues the run in the directory, "
                        "--restart archives it and starts over")
    config = load_config(args.config, args.overrides, args.unset)
    if not read_toml(args.config):
        print(f"dpfl run: {args.config} sets no keys, so this runs the defaults"
              f"{' with the --set keys' if args.overrides else ''}: {defaults_in_use(config)}; `dpfl run --help` "
              "lists the keys", file=sys.stderr)
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    resume = shlex.join(["dpfl", "run", args.config, *[a for o in args.overrides for a in ("--set", o)],
                         *[a for key in args.unset for a in ("--unset", key)], "--out", str(out), "--resume",
                         *(["--nproc", os.environ[NPROC]] if NPROC in os.environ else [])])
    try:
        with collected_warnings(python_warnings=False) as collected:  # dp_accounting's log lines, summarised
            results = run_experiment(config, out, progress=not args.no_progress, resume=args.resume,
                                     restart=args.restart, ranks=ranks)
        for line in summarised(collected):
            print(f"dpfl run: note: {line}", file=sys.stderr)
    except RunInterrupted as stop:
        print(f"interrupted after round {stop.rounds_done}; results so far: {out / 'results.json'}; resume with: "
              f"{resume}", file=sys.stderr)
        return signal_status(stop)
    except KeyboardInterrupt as stop:
        if (out / "ledger.json").exists():
            print(f"aborted; the privacy ledger in {out} is up to date; resume with: {resume}", file=sys.stderr)
        else:
            print("aborted before the first round", file=sys.stderr)
        return signal_status(stop)
    summary = summary_of(results, out / "results.json")
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        final = results["final"]
        not_private = "".join(f"; NOT covered by epsilon: {step}" for step in non_private_steps(results["data"]))
        print(f"round {final['round']}: test accuracy {final['test_accuracy']:.4f}, train loss "
              f"{final['train_loss']:.4f}, epsilon ({_epsilons(final['epsilon'])}) at delta "
              f"{final['delta']:.3g}{not_private}")
        for line in privacy_notes(results):
            print(line)
        print(f"results: {summary['results']}")
    if config["run"]["noise_seed"] is not None:
        print(f"dpfl run: note: noise: {results['privacy']['noise']}", file=sys.stderr)
    return _report_stop(results)


def signal_status(stop: KeyboardInterrupt) -> int:
    """The exit status of a run a signal stopped: 128 + the signal (``RunInterrupted``, ``RunAborted``; any other
    KeyboardInterrupt is Ctrl-C's)."""
    return 128 + getattr(stop, "signal_number", signal.SIGINT)


def _epsilons(epsilon: dict) -> str:
    return ", ".join(f"{o}={'inf' if e is None else f'{e:.3f}'}" for o, e in epsilon.items())


def non_private_steps(data: dict) -> list[str]:
    """The data's non-private preprocessing steps (results.json's data.preprocessing entries with private = false),
    as the config key that made each: what the run's epsilon does not cover."""
    steps = []
    for step in data.get("preprocessing", []):
        if not step.get("private", True):
            what = f"data.{step['step']} = {step['scope']!r}" if "scope" in step else step["step"]
            steps.append(f"{what} ({step.get('statistics', 'non-private preprocessing')})")
    return steps


def privacy_notes(results: dict) -> list[str]:
    """Lines the summary adds under the epsilon: observers a budget leaves unlimited, and the privacy the runs
    archived in the run directory (by --restart) spent, with the total by basic composition."""
    notes = []
    budget, epsilon = results["privacy"].get("budget") or {}, results["final"]["epsilon"]
    unlimited = [o for o in epsilon if o not in budget]
    if budget and unlimited:
        limited = ", ".join(f"{o} <= {b:g}" for o, b in budget.items())
        print_eps = ", ".join(f"{o} {'inf' if epsilon[o] is None else f'{epsilon[o]:.3f}'}" for o in unlimited)
        notes.append(f"budget: {limited} only; not limited: {print_eps} (privacy.budget = {{observer = epsilon, ...}} "
                     f"limits others too)")
    archived = results.get("archived")
    if archived:
        runs = archived["runs"]
        total = archived["with_this_run"]
        notes.append(f"archived: {len(runs)} earlier run(s) in this directory spent privacy too (--restart does not "
                     f"give it back); with this run, by basic composition: epsilon ({_epsilons(total['epsilon'])}) at "
                     f"delta {total['delta']:.3g}")
    return notes


def summary_of(results: dict, path: Path) -> dict:
    """What `dpfl run --json` prints: the final round's metrics, where the results are and why the run stopped."""
    final = results["final"]
    def finite(value):  # strict JSON has no NaN: a diverged loss is null
        return value if value is None or math.isfinite(value) else None

    return {"round": final["round"], "test_accuracy": finite(final["test_accuracy"]),
            "train_loss": finite(final["train_loss"]),
            "epsilon": dict(final["epsilon"]), "delta": final["delta"], "results": str(path),
            "stopped_reason": results["stopped_reason"], "budget": results["privacy"].get("budget") or {},
            "not_covered": non_private_steps(results["data"]),
            **({"with_archived_runs": results["archived"]["with_this_run"]} if results.get("archived") else {})}


def _report_stop(results: dict, label: str = "") -> int | None:
    """Says on stderr why a run stopped early; its exit status (None: it ran all its rounds)."""
    if not results["stopped_reason"]:
        return None
    why = {"budget": "stopped by the privacy budget", "diverged": "the run diverged and stopped"}.get(
        results.get("stopped_by"), "stopped early")
    where = f"after round {results['final']['round']} of {results['config']['algorithm']['rounds']}"
    print(f"{label}{why} {where}: {results['stopped_reason']}", file=sys.stderr)
    return _STATUS_OF.get(results.get("stopped_by"))


def _demo(args) -> int | None:
    from dpfl.experiments.demo import run_demo, table

    try:
        results = run_demo(args.out, progress=not args.no_progress, overrides=args.overrides)
    except KeyboardInterrupt as stop:
        print("demo interrupted", file=sys.stderr)
        return signal_status(stop)
    out = Path(args.out)
    if args.json:
        print(json.dumps({name: summary_of(r, out / name / "results.json") for name, r in results.items()}, indent=1))
    else:
        print(table(results))
        print(f"curves: {out / 'demo.png'}; results: {out}/<algorithm>/results.json")
    codes = [_report_stop(r, f"{name}: ") for name, r in results.items()]
    return max((c for c in codes if c), default=None)
