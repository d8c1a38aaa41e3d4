"""A grid of runs of one config (`dpfl sweep`): every combination of the values given for some config keys, each run
as its own `dpfl run` process in a run directory of its own, ``jobs`` at a time over the devices given, and their
results gathered in one table (``sweep.json``, ``sweep.csv``; `dpfl plot --tradeoff DIR/points/*` draws them).

**What choosing among the runs costs.** Each run's epsilon is that of its own release. Publishing a model chosen by
looking at several runs publishes a function of all of them, so its privacy is that of their composition: every
run's ledger composed as one (``composed_epsilon``; the runs' noise comes from keys of their own, independent, which
is what composition needs). The sweep reports that epsilon per observer beside the table and names no best run unless
asked (``--select``); a selection says that the composed epsilon, not the chosen run's, is what the published model
costs, and that the score it is chosen by (test accuracy, train loss) reads records (the clients' test split, the
train records) that no ledger charges. Papernot and Steinke (2022) show that choosing by a private score among a
random number of runs costs little more than one run; that selection is not implemented, so the composed epsilon is
the sound statement. Runs that share a fixed noise key (``run.noise_seed``, the research mode) draw the same noise:
composition does not hold for them and no composed epsilon is given.

Resuming: a point whose run directory holds a finished run is read, not rerun; one that holds an unfinished run is
resumed (``dpfl run --resume``), so a sweep stopped half way picks up where it was.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from dpfl.errors import ConfigError

#: The metrics ``--select`` may choose by, and whether larger is better.
SELECTABLE = {"test_accuracy": True, "train_loss": False}


@dataclass(frozen=True)
class Point:
    """One run of the grid: its name (its run directory's) and the config keys it sets."""

    name: str
    settings: tuple[tuple[str, str], ...]

    @property
    def overrides(self) -> list[str]:
        """``--set`` arguments: key=value (the value as given, a TOML literal)."""
        return [f"{key}={value}" for key, value in self.settings]


def parse_grid(entries: list[str]) -> dict[str, list[str]]:
    """{key: [values]} of ``--grid key=v1,v2,...`` entries (each value a TOML literal, e.g. 0.1 or 'fixed'); a key
    given twice, an entry without '=' or with an empty value list is refused, naming the entry."""
    grid: dict[str, list[str]] = {}
    for entry in entries:
        key, sep, values = entry.partition("=")
        key = key.strip()
        listed = [v.strip() for v in values.split(",")] if sep else []
        if not key or not sep or not listed or any(not v for v in listed):
            raise ConfigError("--grid", entry, "KEY=V1,V2,... (a config key and one or more comma-separated values, "
                                               "e.g. algorithm.lr=0.05,0.1)")
        if key in grid:
            raise ConfigError("--grid", entry, f"each key once ({key} is given twice)")
        grid[key] = listed
    if not grid:
        raise ConfigError("--grid", None, "at least one KEY=V1,V2,... entry")
    return grid


def points(grid: dict[str, list[str]]) -> list[Point]:
    """Every combination of the grid's values, in the order the keys and values are given; each named by its
    values (``short_name``) and its position, so that names are unique and sort in grid order."""
    keys = list(grid)
    combos = list(itertools.product(*(grid[k] for k in keys)))
    width = len(str(len(combos) - 1))
    return [Point(f"{i:0{width}d}-" + "-".join(f"{short_name(k)}={_safe(v)}" for k, v in zip(keys, combo)),
                  tuple(zip(keys, combo))) for i, combo in enumerate(combos)]


def short_name(key: str) -> str:
    """The key's last part (``algorithm.lr`` -> ``lr``)."""
    return key.rsplit(".", 1)[-1]


def _safe(value: str) -> str:
    return "".join(c if c.isalnum() or c in ".+-" else "_" for c in value.strip("'\""))


def check_points(config_path: str, grid_points: list[Point], base_settings: list[str]) -> None:
    """Every point's config loads and validates (``dpfl.experiments.config.load_config``: keys, types, ranges the
    config alone decides) before any run starts, so such a mistake is refused at once, naming the point; what only a
    built run can check (e.g. an algorithm's own ranges) is its run's error, in the table's status."""
    from dpfl.experiments.config import load_config

    for point in grid_points:
        try:
            load_config(config_path, [*base_settings, *point.overrides])
        except ConfigError as err:
            raise ConfigError(f"--grid (point {point.name})", " ".join(point.overrides), str(err)) from None


def run_command(config_path: str, point: Point, out: Path, base_settings: list[str], device: str | None,
                threads: int | None) -> list[str]:
    """The `dpfl run` command line of ``point`` (resumed when its directory holds an unfinished run)."""
    command = [sys.executable, "-m", "dpfl.cli", "run", config_path, "--out", str(out / "points" / point.name),
               "--json", "--no-progress"]
    for setting in [*base_settings, *point.overrides]:
        command += ["--set", setting]
    if device is not None:
        command += ["--set", f"run.device='{device}'"]
    if threads is not None:
        command += ["--set", f"run.threads={threads}"]
    if status_of(out / "points" / point.name) == "running":
        command.append("--resume")
    return command


def status_of(directory: Path) -> str | None:
    """The results.json status of a run directory ("finished", "stopped", "running"), None without one."""
    path = directory / "results.json"
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("status")


def run_points(config_path: str, grid_points: list[Point], out: Path, base_settings: list[str], jobs: int = 1,
               devices: list[str] | None = None, threads: int | None = None, log=print) -> dict[str, int]:
    """Runs the points not yet finished, ``jobs`` at a time (each on the next of ``devices`` in turn, each with
    ``threads`` torch threads; default: the cores shared out among the jobs); each run's output goes to
    ``out/logs/<point>.log``. Returns {point: exit status} of the runs started (0 finished; ``dpfl run``'s statuses)."""
    if jobs < 1:
        raise ConfigError("--jobs", jobs, "an integer >= 1")
    threads = threads if threads is not None else max(1, (os.cpu_count() or 1) // jobs)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    todo = [p for p in grid_points if status_of(out / "points" / p.name) not in ("finished", "stopped")]
    for done in set(grid_points) - set(todo):
        log(f"{done.name}: already done, read from {out / 'points' / done.name}")
    running: dict[str, subprocess.Popen] = {}
    statuses: dict[str, int] = {}
    queue = list(todo)
    slot = 0
    while queue or running:
        while queue and len(running) < jobs:
            point = queue.pop(0)
            device = devices[slot % len(devices)] if devices else None
            slot += 1
            with open(out / "logs" / f"{point.name}.log", "w") as handle:
                running[point.name] = subprocess.Popen(
                    run_command(config_path, point, out, base_settings, device, threads), stdout=handle,
                    stderr=subprocess.STDOUT)
            log(f"{point.name}: started" + (f" on {device}" if device else ""))
        finished = _wait_any(running)
        statuses[finished] = running.pop(finished).returncode
        problem = f": {last_error(out, finished)}" if statuses[finished] == 2 else ""
        log(f"{finished}: exit status {statuses[finished]}{problem} (log: {out / 'logs' / (finished + '.log')})")
    return statuses


def last_error(out: Path, name: str) -> str:
    """The last line of the point's log that `dpfl run` wrote as an error ("dpfl run: error: ..."), or ""."""
    path = out / "logs" / f"{name}.log"
    lines = path.read_text().splitlines() if path.exists() else []
    errors = [line for line in lines if line.startswith("dpfl run: error: ")]
    return errors[-1].removeprefix("dpfl run: error: ") if errors else ""


def _wait_any(running: dict[str, subprocess.Popen]) -> str:
    """The name of a run that has ended (waits for one)."""
    import time

    while True:
        for name, process in running.items():
            if process.poll() is not None:
                return name
        time.sleep(0.2)


def table(grid_points: list[Point], out: Path) -> list[dict]:
    """One row per point: its settings, status, rounds done, final train loss and test accuracy, and epsilon per
    observer (results.json's ``final``); a point without results has status "error: ..." (`dpfl run` refused it) or
    "missing" (not run)."""
    rows = []
    for point in grid_points:
        path = out / "points" / point.name / "results.json"
        row = {"point": point.name, **{key: value for key, value in point.settings}}
        if not path.exists():  # never run, or refused by `dpfl run` (its error, from its log)
            error = last_error(out, point.name)
            rows.append({**row, "status": f"error: {error}" if error else "missing"})
            continue
        results = json.loads(path.read_text())
        final = results.get("final") or {}
        row.update(status=results.get("status"), rounds=final.get("round"), train_loss=final.get("train_loss"),
                   test_accuracy=final.get("test_accuracy"))
        row.update({f"epsilon.{o}": e for o, e in (final.get("epsilon") or {}).items()})
        rows.append(row)
    return rows


def composed_epsilon(directories: list[Path]) -> tuple[dict[str, float] | None, str]:
    """(epsilon per observer of releasing every run in ``directories`` together, a note): their ledgers' rounds
    composed as one ledger's (each run's after the previous, at the first run's delta and accountants), over the
    observers every run has. None, with the reason, when the runs' ledgers differ in delta, analysis or neighbouring
    relation, or when a run used a fixed noise key (``run.noise_seed``: runs sharing it draw the same noise)."""
    from dpfl.accounting.ledger import PrivacyLedger

    ledgers = []
    for directory in directories:
        results = json.loads((directory / "results.json").read_text())
        if (results.get("config", {}).get("run", {}) or {}).get("noise_seed") is not None:
            return None, (f"{directory.name} used run.noise_seed (a fixed noise key): runs that share it draw the same "
                          "noise, so their composition is not their privacy")
        ledgers.append(PrivacyLedger.load(directory / "ledger.json"))
    first = ledgers[0]
    for other, directory in zip(ledgers[1:], directories[1:]):
        for setting in ("delta", "analysis", "neighboring"):
            if getattr(other, setting) != getattr(first, setting):
                return None, (f"{directory.name}'s ledger has {setting} = {getattr(other, setting)!r}, "
                              f"{directories[0].name}'s {getattr(first, setting)!r}: no one composition covers both")
    observers = [o for o in first.observers if all(o in ledger.observers for ledger in ledgers)]
    combined = PrivacyLedger(observers, first.delta, conversion=first.conversion, analysis=first.analysis,
                             neighboring=first.neighboring,
                             accountant={o: first.accountant_names[o] for o in observers})
    offset = 0
    for ledger in ledgers:
        rounds = sorted({entry["round"] for entry in ledger.to_dict(summary=False)["journal"]})
        for round_index in rounds:  # each round's latest composition (a replay after a resume is one release)
            charged = ledger.charged(round_index)
            combined.record(offset + round_index, {o: charged[o] for o in observers})
        offset += max(rounds, default=0)
    return combined.epsilon(), f"{len(directories)} runs' ledgers composed ({offset} rounds)"


def select(rows: list[dict], metric: str) -> dict | None:
    """The row with the best final ``metric`` among the runs that finished or stopped with it measured."""
    if metric not in SELECTABLE:
        raise ConfigError("--select", metric, f"one of {list(SELECTABLE)}")
    scored = [r for r in rows if isinstance(r.get(metric), (int, float)) and math.isfinite(r[metric])]
    if not scored:
        return None
    return (max if SELECTABLE[metric] else min)(scored, key=lambda r: r[metric])


def write(rows: list[dict], summary: dict, out: Path) -> None:
    """``out/sweep.json`` (the rows and the summary) and ``out/sweep.csv`` (the rows)."""
    (out / "sweep.json").write_text(json.dumps({**summary, "points": rows}, indent=2) + "\n")
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(out / "sweep.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


__all__ = ["Point", "SELECTABLE", "parse_grid", "points", "check_points", "run_command", "run_points", "table",
           "composed_epsilon", "last_error", "select", "write"]
