"""`dpfl calibrate last-iterate`: the noise multiplier sigma that makes releasing only the last iterate of Asoodeh et al.'s
Algorithm 1 (constant schedule) (epsilon, delta)-DP."""

from __future__ import annotations

from dpfl.accounting.calibrate import last_iterate_sigma

NAME = "last-iterate"
HELP = "noise multiplier for a target epsilon when only the last model is released (Asoodeh et al., Theorem 2)"


def configure(parser) -> None:
    parser.add_argument("--target-epsilon", type=float, required=True, help="target epsilon")
    parser.add_argument("--delta", type=float, required=True, help="target delta")
    parser.add_argument("--n", type=int, required=True, help="number of records (users)")
    parser.add_argument("--batch-size", type=int, required=True, help="records per step m (disjoint batches)")
    parser.add_argument("--lipschitz", type=float, required=True, help="Lipschitz constant L of the loss")
    parser.add_argument("--radius", type=float, required=True, help="radius rho of the projection ball")
    parser.add_argument("--lr", type=float, required=True, help="learning rate eta")
    parser.add_argument("--random-stop", action="store_true", help="release W_tau, tau ~ U{1..T} (Corollary 3)")
    parser.add_argument("--nonconvex", action="store_true", help="diameter 2(rho + eta L): no convexity/smoothness")


def execute(args) -> dict:
    sigma = last_iterate_sigma(args.target_epsilon, args.delta, args.n, args.batch_size, args.lipschitz, args.radius,
                               args.lr, nonconvex=args.nonconvex, random_stop=args.random_stop)
    return {"sigma": sigma, "epsilon": args.target_epsilon, "delta": args.delta, "steps": args.n // args.batch_size}
