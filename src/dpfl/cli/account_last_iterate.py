"""`dpfl account last-iterate`: epsilon of Algorithm 1 of Asoodeh et al. (2021) releasing only the last iterate.

Constant schedule eta_t = lr, sigma_t = sigma over T = n // batch_size disjoint batches (n - T m records are left
out when batch_size does not divide n; reported as unused_records). epsilon_composition is the baseline that
releases every iterate (no contraction), so the gain from hiding iterates is visible.
"""

from __future__ import annotations

import math

from dpfl.accounting import last_iterate
from dpfl.errors import check_noise_multiplier, check_range

NAME = "last-iterate"
HELP = "epsilon when only the last model is released (Asoodeh et al., Theorem 2 / Corollary 3)"


def configure(parser) -> None:
    parser.add_argument("--n", type=int, required=True, help="number of records (users)")
    parser.add_argument("--batch-size", type=int, required=True, help="records per step m (disjoint batches)")
    parser.add_argument("--lipschitz", type=float, required=True, help="Lipschitz constant L of the loss")
    parser.add_argument("--radius", type=float, required=True, help="radius rho of the projection ball")
    parser.add_argument("--lr", type=float, required=True, help="learning rate eta")
    parser.add_argument("--sigma", type=float, required=True, help="noise multiplier sigma")
    parser.add_argument("--delta", type=float, required=True, help="target delta")
    parser.add_argument("--epsilon", type=float, help="also report log delta at this epsilon")
    parser.add_argument("--random-stop", action="store_true", help="release W_tau, tau ~ U{1..T} (Corollary 3)")
    parser.add_argument("--nonconvex", action="store_true", help="diameter 2(rho + eta L): no convexity/smoothness")
    parser.add_argument("--smoothness", type=float, help="smoothness beta: checks eta <= 2/beta (Theorem 2)")


def execute(args) -> dict:
    check_noise_multiplier("sigma", args.sigma)
    check_range("lipschitz", args.lipschitz, 0, float("inf"), low_open=True, high_open=True)
    check_noise_multiplier("sigma / lipschitz", args.sigma / args.lipschitz)  # sigma is in the units of L
    setting = (args.n, args.batch_size, args.lipschitz, args.radius)
    options = dict(nonconvex=args.nonconvex, random_stop=args.random_stop, smoothness=args.smoothness)
    eps = last_iterate.epsilon(args.delta, args.lr, args.sigma, *setting, **options)
    steps = args.n // args.batch_size
    result = {
        "epsilon": eps,
        "delta": args.delta,
        "epsilon_composition": last_iterate.composition_epsilon(
            args.delta, args.sigma, args.n, args.batch_size, args.lipschitz
        ),
        "steps": steps,
        "unused_records": args.n - steps * args.batch_size,
    }
    if args.epsilon is not None:
        log_delta = last_iterate.log_delta(args.epsilon, args.lr, args.sigma, *setting, **options)
        result["log_delta"] = log_delta
        result["log10_delta"] = log_delta / math.log(10)
    return result
