"""`dpfl calibrate run CONFIG --target-epsilon E`: the smallest noise multiplier (``--solve noise``, the default) or
the largest number of rounds (``--solve rounds``) whose run of CONFIG spends at most E towards one observer, accounted
as the run's own ledger accounts it (``dpfl.experiments.calibration``: the data is built, nothing is trained).

The other values a run's privacy depends on are held fixed at the config's (delta, rounds or noise, analysis,
conversion, boundary, client and record sampling, warm-start rounds) and printed beside the answer. A search that
runs longer than a few seconds reports its trials on stderr.
"""

from __future__ import annotations

from dpfl.accounting.observers import THIRD_PARTY
from dpfl.cli.common import add_config_keys

NAME = "run"
HELP = "noise multiplier (or rounds) of a run's TOML config for a target epsilon towards one observer"


def configure(parser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="the run's TOML config (as for `dpfl run`)")
    parser.add_argument("--target-epsilon", type=float, required=True, help="epsilon to meet, > 0")
    parser.add_argument("--observer", default=THIRD_PARTY,
                        help="whose epsilon: third_party (default), server or other_silo, among the observers of the "
                             "config's privacy.boundary")
    parser.add_argument("--solve", choices=("noise", "rounds"), default="noise",
                        help="noise (default): the smallest noise multiplier at the config's rounds; rounds: the "
                             "largest number of rounds at the config's noise multiplier")
    add_config_keys(parser, "override a config key, as for `dpfl run` (repeatable)")


def execute(args) -> dict:
    from dpfl.engine.progress import Heartbeat
    from dpfl.experiments import calibration
    from dpfl.experiments.config import load_config

    run = calibration.RunAccounting.of(load_config(args.config, args.overrides, args.unset), args.observer)
    what = "noise_multiplier" if args.solve == "noise" else "rounds"
    progress = Heartbeat(lambda value, eps: f"dpfl calibrate run: {what} {value:.6g} -> epsilon {eps:.6g} towards "
                                            f"{run.observer} (target {args.target_epsilon:g})")
    if args.solve == "noise":
        return calibration.calibrate_noise(run, args.target_epsilon, progress=progress)
    return calibration.max_rounds(run, args.target_epsilon, progress=progress)
