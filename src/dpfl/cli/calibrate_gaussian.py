"""`dpfl calibrate gaussian`: the smallest noise multiplier of the (sampled) Gaussian mechanism composed over steps
that meets a target epsilon (``dpfl.accounting.calibrate.calibrate_noise``)."""

from __future__ import annotations

from dpfl.accounting.accountant import account
from dpfl.accounting.calibrate import calibrate_noise
from dpfl.cli.account_gaussian import add_mechanism_arguments, event_maker, neighboring

NAME = "gaussian"
HELP = "noise multiplier of the Gaussian mechanism (Poisson, fixed-size or no sampling) for a target epsilon"


def configure(parser) -> None:
    parser.add_argument("--target-epsilon", type=float, required=True, help="epsilon to meet, > 0")
    add_mechanism_arguments(parser)


def execute(args) -> dict:
    make_event = event_maker(args)
    options = (args.delta, args.accountant, args.conversion, neighboring(args.sampling))
    noise = calibrate_noise(make_event, args.target_epsilon, *options)
    result = account(make_event(noise), *options)
    return {"noise_multiplier": noise, **result.to_dict(), "neighboring": neighboring(args.sampling)}
