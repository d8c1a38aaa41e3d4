"""`dpfl plot RUN_DIR [RUN_DIR ...] --out FILE.png [--tradeoff] [--title T] [--labels L ...]`: accuracy, loss and
epsilon per observer per round, one line per run (drawn by ``dpfl.experiments.plots.plot_runs``, the code `dpfl demo`
uses); with ``--tradeoff``, each run's final test accuracy against its epsilon per observer, one marker per run
(``dpfl.experiments.tradeoff_plot``)."""

from __future__ import annotations

import json
from pathlib import Path

from dpfl.errors import ConfigError, RunDirectoryError, json_problem


def configure(commands) -> None:
    plot = commands.add_parser("plot", help="plot accuracy, loss and epsilon per round of one or more runs",
                               description="Plot test accuracy, train loss and epsilon per observer per round of "
                                           "runs (each RUN_DIR holds a results.json from `dpfl run`), one line per "
                                           "run, into one PNG; or, with --tradeoff, each run's final test accuracy "
                                           "against its epsilon per observer, one marker per run.")
    plot.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directory holding results.json")
    plot.add_argument("--out", required=True, metavar="FILE.png", help="the PNG to write")
    plot.add_argument("--tradeoff", action="store_true",
                      help="privacy-utility view: final test accuracy against epsilon, one panel per observer, one "
                           "marker per run (e.g. `dpfl plot --tradeoff runs/* --out tradeoff.png`)")
    plot.add_argument("--title", default="", help="a title over the panels")
    plot.add_argument("--labels", nargs="+", default=None, metavar="LABEL",
                      help="the runs' names in the legends, one per RUN_DIR in order (default: each directory's name)")
    plot.set_defaults(handler=_plot)


def load_results(run_dir: str | Path) -> dict:
    """RUN_DIR/results.json; RunDirectoryError naming the path when the directory or the file is missing, or the
    file is not a run's results (truncated, not JSON, no rounds)."""
    directory = Path(run_dir)
    if not directory.is_dir():
        raise RunDirectoryError(f"{directory} is not a directory (expected a run directory from `dpfl run --out`)")
    path = directory / "results.json"
    if not path.is_file():
        raise RunDirectoryError(f"{path} does not exist: {directory} holds no finished or stopped run's results")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise RunDirectoryError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    try:
        results = json.loads(text)
    except json.JSONDecodeError as err:
        raise RunDirectoryError(f"{path} is not valid JSON ({json_problem(text, err)}); truncated or damaged? "
                                "rerun or resume the run to rewrite it") from None
    if not isinstance(results, dict) or not isinstance(results.get("rounds"), list) or \
            not isinstance(results.get("final"), dict):
        raise RunDirectoryError(f"{path} is not a run's results (no 'rounds' list and 'final' entry)")
    return results


def _labels(paths: list[Path]) -> list[str]:
    """Each run's directory name, or its path where names repeat."""
    names = [p.resolve().name or str(p) for p in paths]
    return [name if names.count(name) == 1 else str(p) for name, p in zip(names, paths)]


def _plot(args) -> None:
    from dpfl.experiments.plots import plot_runs
    from dpfl.experiments.tradeoff_plot import plot_tradeoff

    paths = [Path(p) for p in args.runs]
    labels = _labels(paths) if args.labels is None else args.labels
    if len(labels) != len(paths) or len(set(labels)) < len(labels):
        raise ConfigError("--labels", args.labels, f"{len(paths)} distinct labels, one per RUN_DIR in order")
    results = {label: load_results(p) for label, p in zip(labels, paths)}
    if len(results) < len(paths):
        raise RunDirectoryError("the same run directory is given twice")
    out = Path(args.out)
    try:
        (plot_tradeoff if args.tradeoff else plot_runs)(results, out, title=args.title)
    except OSError as err:
        raise RunDirectoryError(f"cannot write {out}: {err.strerror or err}") from None
    print(f"plot: {out}")
