"""`dpfl calibrate shuffle`: the largest local epsilon0 whose n shuffled reports meet a central (epsilon, delta)."""

from __future__ import annotations

from dpfl.accounting.shuffle import shuffle_local_epsilon

NAME = "shuffle"
HELP = "largest local epsilon0 for a target central epsilon after shuffling n reports (Feldman et al. 2021)"


def configure(parser) -> None:
    parser.add_argument("--target-epsilon", type=float, required=True, help="target central epsilon")
    parser.add_argument("--n", type=int, required=True, help="number of shuffled reports")
    parser.add_argument("--delta", type=float, required=True, help="target delta")
    parser.add_argument("--delta0", type=float, default=0.0, help="delta0 of each local randomizer (default 0)")


def execute(args) -> dict:
    epsilon0 = shuffle_local_epsilon(args.target_epsilon, args.n, args.delta, args.delta0)
    return {"epsilon0": epsilon0, "epsilon": args.target_epsilon, "delta": args.delta, "n": args.n,
            "delta0": args.delta0, "method": "numerical"}
