"""`dpfl audit CONFIG --observer NAME --method runs|one-run --canary dirac|input [--score white-box|loss]
[--rounds R|auto [--max-rounds L]] [--trials N | --canaries M [--guesses R]] [--json] [--out DIR] [--roc FILE.png]`.

``--method runs``: runs R rounds (default 1; ``auto``: ``dpfl.audit.plan``) of the config's algorithm N times with a canary and N times with its
neighbour (``dpfl.audit.runs``), and prints the observer's claimed epsilon for those R rounds beside a lower bound on
epsilon that holds with the given confidence. A lower bound above the claim means the claim is wrong. Progress goes to
stderr for long audits. Where every audited round's event is Gaussian the bound is the larger of the (eps, delta)
rank test's and the Gaussian-DP fit's (``dpfl.audit.gdp``); ``strength`` = bound / claim says what a pass means (on
correct code, the fraction of the claim the audit certifies). A trial that raises (the algorithm broke under the
canary) is reported as a failed, violated audit naming the round and the error (``failure``), not a crash.
``--method one-run``: ONE run of round 0 with M Dirac canaries, each included with probability 1/2; R guesses (half
on the highest scores, half on the lowest) and the Steinke-Nasr-Jagielski bound.
Both write DIR/audit.json and the ROC curve with its Clopper-Pearson band beside the claim's boundary (DIR/roc.png, or
--roc FILE; ``dpfl.audit.roc_figure``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dpfl.cli.common import add_config_keys

METHODS = ("runs", "one-run")
#: An audit of at least this many client rounds (trials x rounds) reports its progress on stderr.
LONG_AUDIT = 5000


def configure(commands) -> None:
    commands.add_parser(
        "audit", help="empirical lower bound on epsilon towards one observer (many runs, or one run with many "
                      "canaries)",
        description="Run R rounds of CONFIG's algorithm TRIALS times with a canary and TRIALS times with its "
                    "neighbour; print the claimed epsilon of those rounds and a lower bound that holds with the given "
                    "confidence (a lower bound above the claim is a bug).", fill=_arguments)


def _arguments(audit) -> None:
    """`dpfl audit`'s arguments, added when the command is chosen (their choices come from dpfl.audit, with torch)."""
    from dpfl.audit.distinguisher import OBSERVERS, SCORES
    from dpfl.audit.plan import ROUND_LIMIT
    from dpfl.audit.runs import CANARIES

    audit.add_argument("config", help="path of the TOML config (any algorithm that takes its per-example gradients "
                                      "from the gradient oracle, with a fixed clip)")
    add_config_keys(audit, "override a config key (repeatable)")
    audit.add_argument("--observer", required=True, choices=OBSERVERS, help="whose view is audited")
    audit.add_argument("--method", default="runs", choices=METHODS,
                       help="runs: many independent runs; one-run: one run with --canaries canaries")
    audit.add_argument("--canary", default="dirac", choices=CANARIES,
                       help="dirac: a gradient C e along a coordinate no other record touches (white-box); flip: the "
                            "same, -C e at the initial model (it moves gradient differences between iterates); input: "
                            "a real record far from the data with a rare label, in one client's data; mirror: that "
                            "record against its mirror image (features negated), through the engine's own clip")
    audit.add_argument("--canary-norm", type=float, default=None, metavar="K",
                       help="dirac, flip: the canary's gradient is K C before the engine's clip rule weighs it (K > 1 "
                            "exercises the clip: a clip that lets it through moves the sum K times the claim's "
                            "shift; default: the clipped gradient C)")
    audit.add_argument("--score", default="white-box", choices=SCORES,
                       help="white-box: the observed updates against the canary's gradient; loss: minus the canary's "
                            "loss on the released model (third party, --canary input or mirror)")
    audit.add_argument("--rounds", type=_rounds, default=1,
                       help="runs: rounds per trial; the claim is the R-round epsilon (privacy.release decides whether "
                            "the third party sees every model or the last); 'auto': the R in 1..--max-rounds at which "
                            "the bound is expected to be the largest fraction of the claim (dpfl.audit.plan)")
    audit.add_argument("--max-rounds", type=int, default=ROUND_LIMIT,
                       help=f"runs, --rounds auto: the most rounds planned (default {ROUND_LIMIT})")
    audit.add_argument("--trials", type=int, default=1000, help="runs with, and as many without, the canary")
    audit.add_argument("--canaries", type=int, default=1000,
                       help="one-run: canaries, each included with probability 1/2 (each replaces one record)")
    audit.add_argument("--guesses", type=int, default=None,
                       help="one-run: guesses, half on the highest scores, half on the lowest (default canaries / 10)")
    audit.add_argument("--confidence", type=float, default=0.95, help="of the lower bound (default 0.95)")
    audit.add_argument("--out", default=None, help="where to write audit.json and roc.png (default: "
                                                   "runs/<config name>-audit-<observer>)")
    audit.add_argument("--roc", default=None, metavar="FILE.png", help="write the ROC curve here (default: roc.png in "
                                                                     "--out)")
    audit.add_argument("--progress", action="store_true", help="report every round of the trials on stderr (default: "
                       f"for audits of at least {LONG_AUDIT} trials x rounds)")
    audit.add_argument("--json", action="store_true", help="print the result as JSON")
    audit.set_defaults(handler=_audit)


def _audit(args) -> None:
    from dpfl.audit import runs
    from dpfl.audit.roc_figure import write_audit_figure
    from dpfl.cli.common import print_result
    from dpfl.errors import ConfigError
    from dpfl.experiments.config import load_config
    from dpfl.experiments.assembly import build_simulation

    if not 0 < args.confidence < 1:
        raise ConfigError("--confidence", args.confidence, "a number in (0, 1)")
    if args.method == "one-run" and (args.canary, args.score, args.rounds, args.canary_norm) != \
            ("dirac", "white-box", 1, None):
        raise ConfigError("--method", args.method, "'runs' for --canary input, --score loss, --rounds > 1 or "
                          "--canary-norm (the one-run audit carries Dirac canaries through round 0)")
    config = load_config(args.config, args.overrides, args.unset)
    run_cfg = config["run"]  # an audit is an experiment: its trials are reproducible from run.seed (or noise_seed)
    sim = build_simulation(config, noise_key=run_cfg["seed"] if run_cfg["noise_seed"] is None else run_cfg["noise_seed"])
    runs.check_audited_noise(sim)
    out = Path(args.out) if args.out else Path("runs") / f"{Path(args.config).stem}-audit-{args.observer}"
    if args.method == "one-run":
        result = runs.one_run_audit(sim, args.observer, args.canaries, args.guesses, confidence=args.confidence)
    else:
        rounds = args.rounds
        if rounds == AUTO:
            from dpfl.audit.plan import planned_rounds

            if args.max_rounds < 1:
                raise ConfigError("--max-rounds", args.max_rounds, "an integer >= 1")
            rounds = planned_rounds(sim, args.observer, args.trials, confidence=args.confidence,
                                    limit=args.max_rounds)
        result = runs.audit(sim, args.observer, args.trials, confidence=args.confidence, rounds=rounds,
                            canary_kind=args.canary, score=args.score, release=config["privacy"]["release"],
                            progress=args.progress or args.trials * rounds >= LONG_AUDIT, canary_norm=args.canary_norm)
    out.mkdir(parents=True, exist_ok=True)
    summary = result.to_dict()
    if summary.get("canary_norm_clipped") is False:
        print(f"dpfl audit: warning: --canary-norm {args.canary_norm:g} exercised nothing: "
              f"{config['algorithm']['name']} clipped no record with the engine's clip rule (it clips each client's "
              "update, or nothing), so the canary entered at its stated gradient C e", file=sys.stderr)
    if getattr(result, "failure", None) is None:  # a failed audit has no scores to draw
        summary["roc"] = str(write_audit_figure(result, Path(args.roc) if args.roc else out / "roc.png"))
    (out / "audit.json").write_text(json.dumps(summary, indent=2) + "\n")
    print_result(summary, args.json)


AUTO = "auto"


def _rounds(text: str) -> int | str:
    """--rounds: an integer (the audit refuses one below 1, naming the flag), or 'auto'."""
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer >= 1 or 'auto'") from None
