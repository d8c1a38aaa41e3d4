"""A run directory: what it holds, the policy of a new run, a resume and a restart there, and the run's release
config.

A run directory holds

* run.json: the full resolved config, the sha256 of its release config and the run's public identity (run_id),
  written (atomically) before the first round (for a module, loss or records a Python caller supplied, the config's
  ``supplied`` section holds their fingerprint: ``dpfl.experiments.supplied``);
* noise.key: the secret key of the run's noise (``dpfl.engine.keys``; owner-only, written before the first round;
  absent in the research mode, ``run.noise_seed``): never share it, whoever has it can remove the noise;
* ledger.json: the privacy spent, written before each round draws noise (see dpfl.accounting.ledger);
* checkpoint.pt: the algorithm's state (its state_dict), the next round and the history, every run.checkpoint_every
  rounds (dpfl.engine.checkpoint);
* results.json (``dpfl.experiments.results_file``), and archive/ (the runs ``restart`` archived:
  ``dpfl.experiments.archive``).

The release config is everything that decides what a round releases: the config minus the run-only keys
(``RUN_ONLY_KEYS``: how many rounds, the budget, how often to evaluate, report epsilon and checkpoint, where
TensorBoard's events go, the device: a run resumes on another device, where its replayed rounds draw other noise and are
charged again, ``Simulation._fingerprint``), except those the algorithm's release depends on (its spec's
``release_keys``, and the rounds whenever its noise is solved for privacy.epsilon, a total budget over them). A resume
continues the run only with the same release config (``check_resumable``: so a replayed round can never draw the same
noise onto a different computation) and never forgets privacy already spent; a new run never overwrites a directory
that holds one (``check_free``; a restart archives it first).
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from pathlib import Path

from dpfl.accounting.ledger import PrivacyLedger
from dpfl.algorithms import registry
from dpfl.durable import write_text_atomically
from dpfl.engine.keys import KEY_FILE, fresh_key, load_key
from dpfl.errors import RunDirectoryError, json_problem

RUN_ONLY_KEYS = ("algorithm.rounds", "privacy.budget", "run.eval_every", "run.checkpoint_every", "run.device",
                 "run.tensorboard", "run.epsilon_every", "run.eval_clients")


def release_config(config: dict, spec: registry.AlgorithmSpec | None = None) -> dict:
    """The config minus the run-only keys (except those the algorithm's release depends on, its spec's
    ``release_keys``): what decides the data, the model and every round's release. ``spec``: the config's algorithm's
    (default: looked up by its name; none for a name not registered in this process)."""
    release = copy.deepcopy(config)
    if spec is None:
        name = config.get("algorithm", {}).get("name")
        spec = registry.spec_of(name) if name in registry.names() else None
    keep = () if spec is None else spec.release_keys
    if spec is not None and spec.calibration is not None and config.get("privacy", {}).get("epsilon") is not None:
        keep += ("algorithm.rounds",)  # the noise is solved for privacy.epsilon over all the rounds
    for key in (k for k in RUN_ONLY_KEYS if k not in keep):
        section, name = key.split(".")
        release.get(section, {}).pop(name, None)
    return release


def release_hash(config: dict, spec: registry.AlgorithmSpec | None = None) -> str:
    """sha256 of the release config (sorted keys; config values are canonical after loading: an integer given for a
    float key, e.g. clip = 1, is the float 1.0, so equal configs hash equally however they were written)."""
    return hashlib.sha256(json.dumps(release_config(config, spec), sort_keys=True).encode()).hexdigest()


def check_writable(out: Path) -> None:
    """Refuses a run directory that cannot be one, before anything is built: an existing file, a path through a file,
    or a directory (or, if it does not exist yet, the nearest existing folder it would be created in) that this
    process may not write to."""
    if out.exists() and not out.is_dir():
        raise RunDirectoryError(f"--out {out} is a file, not a directory: pass a directory for the run's files")
    existing = out
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise RunDirectoryError(f"--out {out} cannot be created: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise RunDirectoryError(f"--out {out}: {existing} is not writable (permission denied); pass a directory you "
                                "can write to")


def check_free(out: Path) -> None:
    """Refuses a new run into ``out`` if it holds a run's ledger (privacy already spent), its checkpoint, or its
    record (run.json, results.json) without either: nothing says that run spent no privacy."""
    ledger_path = out / "ledger.json"
    if ledger_path.exists():
        spent = PrivacyLedger.load(ledger_path)  # a corrupt ledger is refused too, naming the file
        raise RunDirectoryError(f"{out} already holds a run's privacy ledger ({spent.compositions} rounds spent); "
                                "continue it with --resume, or pass --restart to archive it and start over")
    if (out / "checkpoint.pt").exists():
        raise RunDirectoryError(f"{out} already holds a run's checkpoint.pt (without its ledger.json, so the privacy "
                                "that run spent is not on record); pass --restart to archive it and start over, or "
                                "use another run directory")
    records = [name for name in ("run.json", "results.json") if (out / name).exists()]
    if records:
        raise RunDirectoryError(_without_ledger(out, records))


def _without_ledger(out: Path, records: list[str]) -> str:
    """Why a directory that holds a run's record (run.json, results.json) but neither its ledger nor its checkpoint
    is refused: the rounds that run spent may have been recorded in a ledger.json since moved or deleted."""
    return (f"{out} holds a run's {' and '.join(records)} but neither its ledger.json nor its checkpoint.pt, so the "
            "privacy that run spent is not on record (moved or deleted?); restore them to continue it with --resume, "
            "pass --restart to archive what is left and start over, or use another run directory")


def check_resumable(out: Path, config: dict) -> dict:
    """Refuses to resume the run in ``out`` with ``config`` unless out/run.json is valid and has the same release
    config; the error names every key that differs, with the old and the new value. Reads only run.json (and checks
    that a ledger or checkpoint exists), so it runs before any data or model is built. Returns the run record."""
    if not (out / "ledger.json").exists() and not (out / "checkpoint.pt").exists():
        records = [name for name in ("run.json", "results.json") if (out / name).exists()]
        if records:
            raise RunDirectoryError(f"cannot resume: {_without_ledger(out, records)}")
        raise RunDirectoryError(f"cannot resume: {out} holds no ledger.json or checkpoint.pt (no round of a run was "
                                "started there); drop --resume to start a new run")
    path = out / "run.json"
    if not path.exists():
        raise RunDirectoryError(f"cannot resume: {out} has no run.json, so dpfl cannot check that this config is the "
                                "one the run was made with; pass --restart to archive the run and start over, or use "
                                "another run directory")
    stored = load_run_record(path)
    differences = _differences(release_config(stored["config"]), release_config(config))
    if differences:
        (key, old, new), *others = differences
        also = "; ".join(f"{k} = {o} -> {n}" for k, o, n in others)
        raise RunDirectoryError(
            f"cannot resume: the run in {out} was made with {key} = {old}, this config has {new}"
            + (f" (and {also})" if also else "")
            + f"; rerun with the original config, or start a new run directory (only {', '.join(RUN_ONLY_KEYS)} may "
            "change on resume)")
    return stored


def load_run_record(path: Path) -> dict:
    """Reads run.json; RunDirectoryError naming the file and the problem if it is unreadable, not JSON, lacks the
    config or its hash, or its hash does not match its config (edited by hand, or damaged)."""

    def invalid(problem: str) -> RunDirectoryError:
        return RunDirectoryError(
            f"{path} is not a valid run record ({problem}); it records the config the run's privacy was spent "
            "under, so dpfl will not resume without it: restore it, or pass --restart to archive the run and start "
            "over")

    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise invalid(getattr(err, "strerror", None) or str(err)) from None
    try:
        record = json.loads(text)
    except json.JSONDecodeError as err:
        raise invalid(json_problem(text, err)) from None
    if not isinstance(record, dict) or not isinstance(record.get("config"), dict) or \
            not all(isinstance(v, dict) for v in record["config"].values()):
        raise invalid("no config table of sections")
    if record.get("release_sha256") != release_hash(record["config"]):
        raise invalid("its release_sha256 does not match its config")
    return record


def _differences(old: dict, new: dict) -> list[tuple[str, str, str]]:
    """(section.key, old value, new value) for every key whose canonical value differs; "(not set)" where absent."""
    unset = object()
    found = []
    for section in sorted(set(old) | set(new)):
        a, b = old.get(section, {}), new.get(section, {})
        for key in sorted(set(a) | set(b)):
            va, vb = a.get(key, unset), b.get(key, unset)
            if va is unset or vb is unset or va != vb:
                found.append((f"{section}.{key}", *("(not set)" if v is unset else repr(v) for v in (va, vb))))
    return found


def run_key(noise_seed: int | None, out_dir: Path | None = None) -> int:
    """The noise key of the run (``dpfl.engine.keys``): ``run.noise_seed`` in the research mode; else the key of the
    run already in ``out_dir`` (it holds a ledger: a resume replays that run's noise), or a fresh one from the
    operating system's entropy."""
    if noise_seed is not None:
        return noise_seed
    if out_dir is not None and (Path(out_dir) / "ledger.json").exists():
        return load_key(Path(out_dir) / KEY_FILE)
    return fresh_key()


def recorded_threads(out: Path) -> int | None:
    """``run.threads`` of the run recorded in out/run.json (None: no valid record; ``check_resumable`` says why)."""
    try:
        threads = load_run_record(out / "run.json")["config"].get("run", {}).get("threads")
    except RunDirectoryError:
        return None
    return threads if isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1 else None


def write_run_record(out: Path, config: dict, release: str, run_id: str) -> None:
    """Writes out/run.json (atomically): the config, the sha256 of its release config and the run's identity."""
    write_text_atomically(out / "run.json", json.dumps({"config": config, "release_sha256": release,
                                                        "run_id": run_id}, indent=1), "the run record")


__all__ = ["RUN_ONLY_KEYS", "release_config", "release_hash", "run_key", "check_writable", "check_free",
           "check_resumable", "load_run_record", "recorded_threads", "write_run_record"]
