"""`dpfl account gaussian`: epsilon of the (sampled) Gaussian mechanism composed over steps (DP-SGD, DP-FedAvg).

``--sampling fixed`` (a batch of exactly rate x dataset records, without replacement) is analysed under replace-one
neighbouring, ``poisson`` and ``none`` under add/remove; the output says which. Without ``--sampling`` it is
``poisson`` when a ``--sampling-rate`` is given and ``none`` (the plain Gaussian mechanism, every record in every step)
when not.
Without ``--accountant`` the answer is PLD's, as a run's ledger computes it: for fixed-size batches the pair that
dominates a Gaussian sampled without replacement (Balle, Barthe, Gaboardi 2018, Thm 10;
``pld.without_replacement_as_poisson``); RDP's (Wang et al. 2019 for fixed-size batches) with ``--accountant rdp``, or
where the PLD would be too large to build in seconds, with a ``note`` saying so.
"""

from __future__ import annotations

from dpfl.accounting.accountant import ACCOUNTANTS, SAMPLINGS, account, gaussian_event
from dpfl.accounting.conversion import CONVERSIONS
from dpfl.cli.common import with_default_accountant
from dpfl.errors import check_noise_multiplier

NAME = "gaussian"
HELP = "epsilon of the Gaussian mechanism with Poisson, fixed-size or no sampling, composed over steps"


def add_mechanism_arguments(parser) -> None:
    """Arguments shared with `dpfl calibrate gaussian`: sampling, steps, delta, accountant, conversion."""
    parser.add_argument("--sampling", choices=SAMPLINGS, default=None,
                        help="record sampling (default: poisson with --sampling-rate; none without it, the plain "
                             "Gaussian mechanism on every record)")
    parser.add_argument("--sampling-rate", type=float, help="sampling rate q in (0, 1] (poisson, fixed)")
    parser.add_argument("--dataset-size", type=int, help="records to sample from (fixed only; default 10^9)")
    parser.add_argument("--steps", type=int, required=True, help="number of compositions (steps or rounds)")
    parser.add_argument("--delta", type=float, required=True, help="target delta in (0, 1)")
    parser.add_argument("--accountant", choices=ACCOUNTANTS, default=None,
                        help="default pld (tight, as a run's ledger), or rdp where pld cannot answer (epsilons so "
                             "large that the PLD would take minutes): the output's note says so")
    parser.add_argument("--conversion", choices=CONVERSIONS, default="classic", help="RDP -> DP conversion (rdp)")


def sampling_of(args) -> str:
    """``--sampling``, by default poisson when ``--sampling-rate`` is given and none (every record) when not."""
    if args.sampling is not None:
        return args.sampling
    return "none" if args.sampling_rate is None else "poisson"


def neighboring(sampling: str) -> str:
    """The neighbouring relation the analysis of ``sampling`` holds under."""
    return "replace_one" if sampling == "fixed" else "add_remove"


def event_maker(args):
    """noise multiplier -> the event described by ``args``."""
    return lambda noise: gaussian_event(noise, args.steps, sampling_of(args), args.sampling_rate, args.dataset_size)


def accounted(args, compute):
    """``with_default_accountant`` for these arguments: ``compute(accountant, options)`` with options the
    (delta, accountant, conversion, neighbouring) of ``account``."""
    def run(accountant):
        return compute((args.delta, accountant, args.conversion, neighboring(sampling_of(args))))

    return with_default_accountant(run, args.accountant)


def configure(parser) -> None:
    parser.add_argument("--noise-multiplier", type=float, required=True, help="noise std / l2 sensitivity")
    add_mechanism_arguments(parser)


def execute(args) -> dict:
    event = event_maker(args)(check_noise_multiplier("noise_multiplier", args.noise_multiplier))
    result, note = accounted(args, lambda options: account(event, *options))
    return {**result.to_dict(), "neighboring": neighboring(sampling_of(args)), **({"note": note} if note else {})}
