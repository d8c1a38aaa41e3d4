"""`dpfl account shuffle`: epsilon of n shuffled (eps0, delta0)-DP local reports (Feldman, McMillan, Talwar 2021)."""

from __future__ import annotations

from dpfl.accounting.shuffle import METHODS, shuffle_epsilon
from dpfl.errors import ConfigError

NAME = "shuffle"
HELP = "amplification by shuffling n (eps0, delta0)-DP local reports (FMT21: numerical or closed form)"


def configure(parser) -> None:
    parser.add_argument("--epsilon0", type=float, required=True, help="local randomizer epsilon")
    parser.add_argument("--delta0", type=float, default=0.0, help="local randomizer delta (default 0)")
    parser.add_argument("--n", type=int, required=True, help="number of shuffled reports")
    parser.add_argument("--delta", type=float, required=True, help="target delta of the shuffled output")
    parser.add_argument("--method", choices=METHODS, default="numerical", help="default: numerical")


def execute(args) -> dict:
    epsilon = shuffle_epsilon(args.epsilon0, args.n, args.delta, args.delta0, args.method)
    try:
        closed_form = shuffle_epsilon(args.epsilon0, args.n, args.delta, args.delta0, "closed_form")
    except ConfigError:  # outside the closed form's validity range: reported as JSON null
        closed_form = None
    return {
        "epsilon": epsilon,
        "delta": args.delta,
        "epsilon0": args.epsilon0,
        "delta0": args.delta0,
        "n": args.n,
        "method": args.method,
        "epsilon_closed_form": closed_form,
    }
