"""`dpfl silo pin APP --counts N,N,... [--node-config FILE]` and `dpfl silo status STATE_DIR [--json]`: a silo
operator's two commands (``dpfl.flower.pin``, ``dpfl.flower.silo_state``). Need no flwr.

* ``pin``: the release config the Flower App ``APP`` (a folder written by `dpfl flower-app`, or its pyproject.toml)
  runs once the silos report these record counts (client 0's first), as its sha256: the node config's
  ``release-sha256``, without which a silo answers nothing. With ``--node-config FILE`` (a flat TOML node config,
  what ``flower-supernode --node-config FILE`` reads) the key is written into that file (created if missing).
* ``status``: what a silo's journal holds: its data's fingerprint and, per run, the rounds it answered with the
  run's epsilon per observer after the last one (computed by the silo), and its secure aggregations. The journal
  is verified first (a missing, truncated or edited one is refused, as the silo refuses it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dpfl.errors import ConfigError


def configure(commands) -> None:
    parser = commands.add_parser("silo", help="a silo operator's commands: pin a release, show a silo's journal",
                                 description=__doc__)
    subs = parser.add_subparsers(dest="silo_command", required=True, metavar="SUBCOMMAND")
    pin = subs.add_parser("pin", help="the release-sha256 of a Flower App for the federation's record counts")
    pin.add_argument("app", help="the Flower App's folder (dpfl flower-app --out) or its pyproject.toml")
    pin.add_argument("--counts", required=True, help="every client's number of training records, client 0 first, "
                                                     "comma-separated (the federation's public metadata)")
    pin.add_argument("--node-config", help="a flat TOML node config file to write release-sha256 into")
    pin.set_defaults(handler=_pin)
    status = subs.add_parser("status", help="what a silo's journal holds: its rounds and epsilon per run")
    status.add_argument("state_dir", help="the silo's state folder (node config state-dir; by default the silo "
                                          "file's path + .dpfl-state)")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(handler=_status)


def _pin(args) -> None:
    from dpfl.flower.pin import PIN, release_sha256

    pin = release_sha256(_carried(Path(args.app)), _counts(args.counts))
    if args.node_config:
        path = Path(args.node_config)
        node = _read_node_config(path) if path.exists() else {}
        node[PIN] = pin
        path.write_text("".join(f"{key} = {json.dumps(value)}\n" for key, value in node.items()))
        print(f"wrote {PIN} = {pin} into {path}", file=sys.stderr)
    print(pin)


def _carried(app: Path) -> dict:
    """The dpfl config a Flower App carries (its pyproject's [tool.flwr.app.config] dpfl-config)."""
    import tomllib

    path = app / "pyproject.toml" if app.is_dir() else app
    try:
        text = tomllib.loads(path.read_text())["tool"]["flwr"]["app"]["config"]["dpfl-config"]
        return json.loads(text)
    except (OSError, KeyError, ValueError) as err:
        raise ConfigError("APP", str(app), f"a Flower App written by dpfl flower-app (its pyproject.toml with "
                                           f"[tool.flwr.app.config] dpfl-config; {type(err).__name__}: {err})") \
            from None


def _counts(text: str) -> list[int]:
    try:
        counts = [int(n) for n in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ConfigError("--counts", text, "positive integers separated by commas, client 0's first, e.g. 30,30,40")
    return counts


def _read_node_config(path: Path) -> dict:
    import tomllib

    try:
        node = tomllib.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError("--node-config", str(path), f"a readable TOML file ({err})") from None
    if any(isinstance(value, dict) for value in node.values()):
        raise ConfigError("--node-config", str(path), "a flat TOML file of key = value lines (no tables)")
    return node


def _status(args) -> None:
    from dpfl.flower.silo_state import SiloState

    directory = Path(args.state_dir)
    if not directory.is_dir():
        raise ConfigError("STATE_DIR", str(directory), "a silo's state folder (it holds journal.jsonl)")
    status = silo_status(SiloState(directory))
    if args.json:
        print(json.dumps(status, indent=1))
        return
    print(f"silo state {directory}: data sha256 {str(status['data'])[:16]}...")
    for run in status["runs"]:
        epsilon = ", ".join(f"{o} {'inf' if e is None else f'{e:.4g}'}" for o, e in (run["epsilon"] or {}).items())
        print(f"  run {run['run_id'][:16]} (release {run['release'][:12]}...): {run['rounds']} rounds answered, "
              f"last round {run['last_round']}; epsilon through it: {epsilon or 'not recorded'}; secure aggregation "
              f"inputs sent in {run['secure_inputs']} rounds")


def silo_status(state) -> dict:
    """The journal of ``state`` (``SiloState``) summarised: its data fingerprint, and per run (in order of its first
    round) the rounds answered, the last one (numbered from 1) and the epsilon the silo recorded after it, and the
    rounds in which it sent a masked input to secure aggregation."""
    entries = state.journal.entries()
    data = next((e["sha256"] for e in entries if e["kind"] == "data"), None)
    runs: dict[str, dict] = {}
    for entry in entries:
        if entry["kind"] == "round":
            release, run_id = entry["run"].split("/", 1)
            run = runs.setdefault(run_id, {"run_id": run_id, "release": release, "rounds": 0, "last_round": 0,
                                           "epsilon": None, "secure_inputs": 0})
            run["rounds"] += 1
            if entry["round"] + 1 >= run["last_round"]:
                run["last_round"], run["epsilon"] = entry["round"] + 1, entry["epsilon"]
    from dpfl.protocols.session import Stage

    for entry in entries:  # the masked input's position in either variant's stages is its number, 2
        if entry["kind"] == "secagg-stage" and entry["answered"] == Stage.MASKED_INPUT and entry["run"] in runs:
            runs[entry["run"]]["secure_inputs"] += 1
    return {"data": data, "runs": list(runs.values())}
