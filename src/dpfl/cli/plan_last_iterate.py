"""`dpfl plan last-iterate`: the least noise for a target (epsilon, delta) when only the last model of projected
noisy SGD is released (Asoodeh et al. 2021, Theorem 2 / Corollary 3), beside the least noise when every iterate is
(composition): ``dpfl.planning.last_iterate``."""

from __future__ import annotations

from dpfl.planning.last_iterate import plan_noise

NAME = "last-iterate"
HELP = "least noise sigma for a target epsilon, releasing only the last iterate vs every iterate (Asoodeh et al.)"


def configure(parser) -> None:
    parser.add_argument("--epsilon", type=float, required=True, help="target epsilon")
    parser.add_argument("--delta", type=float, required=True, help="target delta")
    parser.add_argument("--n", type=int, required=True, help="number of users (clients, or records with one per user)")
    parser.add_argument("--batch-size", type=int, default=1, help="users per step m (disjoint batches; default 1)")
    parser.add_argument("--lipschitz", type=float, required=True, help="L, the bound on a user's gradient norm")
    parser.add_argument("--radius", type=float, required=True, help="rho, the radius of the projection ball")
    parser.add_argument("--lr", type=float, required=True, help="eta, the constant step size")
    parser.add_argument("--random-stop", action="store_true", help="release W_tau, tau ~ U{1..T} (Corollary 3)")
    parser.add_argument("--nonconvex", action="store_true", help="diameter 2(rho + eta L): no convexity/smoothness")
    parser.add_argument("--smoothness", type=float, help="smoothness beta: checks eta <= 2/beta (Theorem 2)")


def execute(args) -> dict:
    plan = plan_noise(args.epsilon, args.delta, args.n, args.batch_size, args.lipschitz, args.radius, args.lr,
                      nonconvex=args.nonconvex, random_stop=args.random_stop, smoothness=args.smoothness)
    return {"epsilon": args.epsilon, "delta": args.delta, **plan.to_dict(args.lipschitz)}
