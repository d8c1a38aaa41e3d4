"""`dpfl calibrate gaussian`: the smallest noise multiplier of the (sampled) Gaussian mechanism composed over steps
that meets a target epsilon (``dpfl.accounting.calibrate.calibrate_noise``). The accountant is chosen as for
`dpfl account gaussian`; a search that runs longer than a few seconds reports its trials on stderr."""

from __future__ import annotations

from dpfl.accounting.accountant import account
from dpfl.accounting.calibrate import calibrate_noise
from dpfl.cli.account_gaussian import accounted, add_mechanism_arguments, event_maker, neighboring, sampling_of
from dpfl.engine.progress import Heartbeat

NAME = "gaussian"
HELP = "noise multiplier of the Gaussian mechanism (Poisson, fixed-size or no sampling) for a target epsilon"


def configure(parser) -> None:
    parser.add_argument("--target-epsilon", type=float, required=True, help="epsilon to meet, > 0")
    add_mechanism_arguments(parser)


def execute(args) -> dict:
    make_event = event_maker(args)
    progress = Heartbeat(lambda noise, eps: f"dpfl calibrate gaussian: noise_multiplier {noise:.6g} -> epsilon "
                                            f"{eps:.6g} (target {args.target_epsilon:g})")

    def calibrate(options):
        noise = calibrate_noise(make_event, args.target_epsilon, *options, progress=progress)
        return noise, account(make_event(noise), *options)

    (noise, result), note = accounted(args, calibrate)
    return {"noise_multiplier": noise, **result.to_dict(), "neighboring": neighboring(sampling_of(args)),
            **({"note": note} if note else {})}
