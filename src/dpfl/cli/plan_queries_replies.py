"""`dpfl plan queries-replies`: the number of queries T and clients per query b of FedSGD-DPC that minimise
Zhou et al. (2021)'s convergence bound (``dpfl.planning.queries_replies``).

With CONFIG, the config's data and model are built (as ``dpfl run`` builds them) and the problem constants mu,
lambda, G, Gamma, Y0 (and Lambda_i for the Gaussian mechanism) are estimated from the training data WITHOUT privacy
(``dpfl.planning.constants``); every flag given overrides its estimate, and the output lists which constants are
non-private estimates. xi (the per-sample gradient bound) is the algorithm's clip (``algorithm.clip`` or --xi1/--xi2),
never the data's norms: the privacy of the run holds for the clip the algorithm applies. Without CONFIG every
constant is a flag.

Zhou et al.'s bounds need a mu-strongly convex loss (their Assumption 4, mu > 0). Without weight decay the loss of
every model here has mu = 0 (the softmax has a null direction), so a CONFIG with algorithm.weight_decay = 0 and no
--mu is refused before anything is estimated. The estimation runs on run.threads torch threads (default 1: its
operations are small and sequential, and threads that wait on a busy machine cost more than they give), reports each
stage on stderr (--no-progress hides it) and its work is bounded (``dpfl.planning.constants``; --max-iterations).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

from dpfl.errors import ConfigError
from dpfl.planning.constants import MAX_ITERATIONS
from dpfl.planning.queries_replies import (
    MECHANISMS, REPLIES, ROUNDINGS, SOLVES, Constants, GaussianBound, LaplaceBound, effective_c2, plan,
)

NAME = "queries-replies"
HELP = "rounds T and clients per round b minimising Zhou et al.'s FedSGD-DPC bound (Laplace or Gaussian)"

#: constant -> (flag, help); the estimable ones are estimated from CONFIG's data when not given
CONSTANT_FLAGS = {
    "mu": ("--mu", "strong convexity of the regularised loss F (Zhou et al.'s Assumption 4: mu > 0; the weight "
                   "decay gives it: mu >= algorithm.weight_decay)"),
    "lam": ("--lambda", "smoothness of F (gamma = 2 lambda / mu)"),
    "G": ("--G", "bound on ||grad F_i|| (Assumption 5: E||grad F_i||^2 <= G^2)"),
    "Gamma": ("--Gamma", "non-iid degree F* - sum_i (d_i/d) F_i*"),
    "Y0": ("--Y0", "||theta_0 - theta*||^2"),
}

#: how the output names a constant
PUBLIC_NAMES = {"lam": "lambda"}


def _numbers(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: expected a number or comma-separated numbers, "
                                         "e.g. 1.0 or 1,5,10") from None


def configure(parser) -> None:
    parser.add_argument("config", nargs="?", metavar="CONFIG",
                        help="a run config (TOML): its data and model give the constants, estimated WITHOUT privacy; "
                             "its algorithm.* and privacy.* keys the defaults of the flags below")
    parser.add_argument("--mechanism", choices=MECHANISMS,
                        help="Laplace (Theorem 3, pure DP) or Gaussian (Theorem 4); default algorithm.mechanism, "
                             "else laplace")
    parser.add_argument("--solve", choices=SOLVES, default="joint",
                        help="rounds: T for the fixed --b; clients: b for the fixed --T; joint: both (default)")
    parser.add_argument("--rounding", choices=ROUNDINGS, default="argmin",
                        help="argmin: the integer neighbour with the least bound (default); up: b rounded up and T "
                             "to the nearest, as the paper's Table I")
    parser.add_argument("--replies", choices=REPLIES,
                        help="Laplace: the replies m each client's noise is calibrated to, bT/N (expected, the "
                             "paper's) or ceil(bT/N) (round_robin, what the ledger charges under algorithm.selection "
                             "= 'round-robin'; default: round_robin for such a CONFIG, else expected)")
    parser.add_argument("--N", type=int, help="clients (default: the config's, or the length of --d)")
    parser.add_argument("--b", type=int, help="clients per round (default algorithm.clients_per_round, else "
                                              "client_rate x N)")
    parser.add_argument("--T", type=int, help="rounds, the number of queries (default algorithm.rounds)")
    parser.add_argument("--max-rounds", type=int, help="Gaussian: the largest practical T (default --T)")
    parser.add_argument("--epsilon", type=_numbers, help="eps_i: one budget, or one per client, comma-separated "
                                                         "(default privacy.epsilon)")
    parser.add_argument("--delta", type=_numbers, help="Gaussian: delta_i, one or one per client (default "
                                                       "privacy.delta, else 1 / d)")
    parser.add_argument("--d", type=_numbers, help="d_i: samples per client, one or one per client (default: the "
                                                   "config's training split)")
    parser.add_argument("--p", type=int, help="model parameters (default: the config's model)")
    parser.add_argument("--xi1", type=float, help="Laplace: l1 bound xi_1 on per-sample gradients, the algorithm's "
                                                  "clip (default algorithm.clip)")
    parser.add_argument("--xi2", type=float, help="Gaussian: l2 bound xi_2, the algorithm's clip (default "
                                                  "algorithm.clip)")
    for dest, (flag, text) in CONSTANT_FLAGS.items():
        parser.add_argument(flag, dest=dest, type=float, help=f"{text} (default: estimated from CONFIG's data)")
    parser.add_argument("--Lambda", type=_numbers, help="Gaussian: Lambda_i, within-client gradient std (Assumption "
                                                        "6), one or one per client (default: estimated)")
    parser.add_argument("--q", type=float, default=1.0, help="Gaussian: record sampling rate (default 1)")
    parser.add_argument("--c2", type=float, help="Gaussian: Theorem 2's constant (default: the one that the RDP "
                                                 "accountant's calibrated noise implies at the planned b and T)")
    parser.add_argument("--steps", type=int, default=20,
                        help="estimation: full-batch gradient steps of the non-private run (default 20)")
    parser.add_argument("--max-iterations", type=int, default=MAX_ITERATIONS,
                        help=f"estimation: L-BFGS-B iterations of each minimisation (theta*, the clients' optima; "
                             f"default {MAX_ITERATIONS}); one that stops there is reported under 'warnings'")
    parser.add_argument("--no-progress", action="store_true", help="estimation: hide the stages printed on stderr")
    parser.add_argument("--plot", metavar="FILE.png", help="write U(T, b) over a grid (log colour scale) with the "
                                                           "plan marked")


def execute(args) -> dict:
    config = None
    if args.config is not None:
        from dpfl.experiments.config import load_config

        config = load_config(args.config)
    mechanism = args.mechanism or _config(config, "algorithm", "mechanism") or "laplace"
    epsilon = args.epsilon if args.epsilon is not None else _as_tuple(_config(config, "privacy", "epsilon"))
    if epsilon is None:  # refused before any constant is estimated (a minute of training on CONFIG's data)
        raise ConfigError("--epsilon", None, "each client's budget eps_i (or privacy.epsilon in CONFIG)")
    known = {name: getattr(args, name) for name in CONSTANT_FLAGS}
    if mechanism == "gaussian" and args.Lambda is not None:
        known["Lambda"] = args.Lambda
    estimated, data_norms, p, d = {}, {}, args.p, args.d
    wanted = [n for n in (*CONSTANT_FLAGS, "Lambda") if known.get(n) is None and (n != "Lambda" or
                                                                                mechanism == "gaussian")]
    notes = []
    if config is not None and (wanted or p is None or d is None):
        if "mu" in wanted:
            _check_strongly_convex(config)
        estimates = _estimate(config, args, estimate_mu="mu" in wanted)
        estimated = {n: getattr(estimates, n) for n in wanted}
        if "mu" in estimated and estimated["mu"] <= 0:
            raise ConfigError("--mu", None, f"a value: the least Hessian eigenvalue of the loss is "
                                            f"{estimated['mu']:.3g} along the estimation's run, so the loss is not "
                                            "strongly convex there (model.name = 'mlp' is not convex), and Zhou et "
                                            "al.'s bound (Assumption 4) needs mu > 0")
        notes += [f"{what} stopped after {args.max_iterations} L-BFGS-B iterations without converging: those "
                  "constants are rough (raise --max-iterations)" for what in estimates.unconverged]
        data_norms = {"xi1": estimates.xi1, "xi2": estimates.xi2}
        p = p if p is not None else estimates.p
        d = d if d is not None else estimates.d
    values = {**known, **estimated}
    for name in wanted:
        if values.get(name) is None:
            flag = CONSTANT_FLAGS[name][0] if name in CONSTANT_FLAGS else "--Lambda"
            raise ConfigError(flag, None, "a value, or a CONFIG to estimate it from")
    N = args.N if args.N is not None else (len(d) if d is not None and len(d) > 1 else
                                           _config(config, "data", "num_clients"))
    if N is None or d is None or p is None:
        missing = "--N" if N is None else "--d" if d is None else "--p"
        raise ConfigError(missing, None, "a value, or a CONFIG to read it from")
    d = _spread("--d", d, N)
    xi_flag = "--xi1" if mechanism == "laplace" else "--xi2"
    xi = getattr(args, xi_flag[2:])
    xi = xi if xi is not None else _config(config, "algorithm", "clip")
    if xi is None:
        norm = f"; the data's largest per-sample gradient norm is {data_norms[xi_flag[2:]]:.6g} (non-private)" \
            if data_norms else ""
        raise ConfigError(xi_flag, None, f"the algorithm's clip (or algorithm.clip in CONFIG): the run's privacy "
                                         f"holds for the clip it applies{norm}")
    b = args.b if args.b is not None else _clients_per_round(config, N)
    T = args.T if args.T is not None else _config(config, "algorithm", "rounds")
    rounds = T if args.solve == "clients" else None
    clients = b if args.solve == "rounds" else None
    max_rounds = args.max_rounds if args.max_rounds is not None else T
    gaussian = {}
    if mechanism == "gaussian":
        delta = args.delta or _as_tuple(_config(config, "privacy", "delta")) or (1.0 / sum(d),)
        gaussian = dict(delta=delta, Lambda=values["Lambda"], q=args.q, c2=args.c2)
    constants = Constants(mu=values["mu"], lam=values["lam"], G=values["G"], Gamma=values["Gamma"], Y0=values["Y0"],
                          p=p, xi=xi, d=d, epsilon=epsilon, **gaussian)
    if mechanism == "gaussian" and args.c2 is None:
        at_T, at_b = (rounds, N) if args.solve == "clients" else (max_rounds, clients or N)
        if at_T is None:
            raise ConfigError("--max-rounds", None, "the largest practical T (or --T, or algorithm.rounds)")
        steps = max(1, math.ceil(at_b * at_T / N))
        constants = dataclasses.replace(constants, c2=effective_c2(args.q, steps, constants.epsilon, constants.delta))
    replies = args.replies or ("round_robin" if _config(config, "algorithm", "selection") == "round-robin"
                               else "expected")
    result = plan(constants, mechanism, args.solve, rounds=rounds, clients_per_round=clients,
                  max_rounds=max_rounds if mechanism == "gaussian" else None, rounding=args.rounding,
                  replies=replies)
    out = {**result.to_dict(), "constants": _constants_dict(constants, mechanism),
           "nonprivate_estimates": sorted(PUBLIC_NAMES.get(n, n) for n in estimated)}
    if notes:
        out["warnings"] = notes
    if estimated:
        out["warning"] = ("the constants in nonprivate_estimates were estimated from the training data WITHOUT "
                          "privacy; that leak is in no privacy accounting")
    if result.rounds == 0:
        out["note"] = ("T = 0: the bound is least without training (Zhou et al.'s Solution 3): the noise outweighs the "
                       "progress the bound credits, which is small when gamma = 2 lambda / mu is large")
    if data_norms:
        out["data_gradient_norms"] = {**data_norms, "note": "largest per-sample gradient norms of the data (non-"
                                      "private), for comparison only: xi is the algorithm's clip"}
    if mechanism == "gaussian" and args.c2 is None:
        out["c2_source"] = "rdp accountant: calibrated noise multipliers at the planned b and T"
    if args.plot:
        bound = LaplaceBound(constants, replies) if mechanism == "laplace" else GaussianBound(constants)
        plot_bound(bound, result, args.plot)
        out["plot"] = args.plot
    return out


def _config(config: dict | None, section: str, key: str):
    return None if config is None else config[section].get(key)


def _as_tuple(value) -> tuple | None:
    return None if value is None else (value,)


def _spread(flag: str, values: tuple, N: int) -> tuple:
    if len(values) == 1:
        return values * N
    if len(values) != N:
        raise ConfigError(flag, list(values), f"one value, or one per client ({N} clients)")
    return tuple(values)


def _clients_per_round(config: dict | None, N: int) -> int | None:
    """The config's b: its cohort (algorithm.clients_per_round, default N, or client_rate x N), as a run draws it."""
    if config is None:
        return None
    from dpfl.experiments.resolved import RunConfig

    return max(1, round(RunConfig.of(config).algorithm.cohort_sampling(N)[0] * N))


def _check_strongly_convex(config: dict) -> None:
    """Refuses a config whose loss has mu = 0 (no weight decay) before anything is estimated."""
    weight_decay = config["algorithm"].get("weight_decay")
    if weight_decay:
        return
    why = ("Zhou et al.'s bound needs a mu-strongly convex loss (Assumption 4, mu > 0), and without weight decay the "
           "cross-entropy of a softmax model has mu = 0: adding one vector to every class's weights leaves the "
           "softmax unchanged")
    if weight_decay is None:
        raise ConfigError("--mu", None, f"a value: {why}, and algorithm.name = "
                                        f"{config['algorithm']['name']!r} has no algorithm.weight_decay")
    raise ConfigError("algorithm.weight_decay", weight_decay,
                      f"a positive weight decay w, e.g. weight_decay = 0.01 in CONFIG's [algorithm] (F is then "
                      f"w-strongly convex: mu >= w; logistic regression: mu = w), "
                      f"or --mu: {why}")


def _estimate(config: dict, args, estimate_mu: bool):
    import torch

    from dpfl.experiments.assembly import build_data, build_initial_model
    from dpfl.experiments.resolved import RunConfig
    from dpfl.planning.constants import estimate_constants

    def stage(text: str) -> None:
        if not args.no_progress:
            print(f"dpfl plan: estimating the constants (non-private): {text}", file=sys.stderr, flush=True)

    threads = torch.get_num_threads()
    torch.set_num_threads(config["run"]["threads"] or 1)
    try:
        stage("building the data")
        dataset = build_data(config["data"])
        model = build_initial_model(RunConfig.of(config), dataset)
        return estimate_constants(dataset, model, config["algorithm"].get("weight_decay", 0.0), args.steps,
                                  args.max_iterations, estimate_mu, stage)
    finally:
        torch.set_num_threads(threads)


def _constants_dict(c: Constants, mechanism: str) -> dict:
    out = {"mu": c.mu, "lambda": c.lam, "gamma": c.gamma, "G": c.G, "Gamma": c.Gamma, "Y0": c.Y0, "p": c.p,
           ("xi1" if mechanism == "laplace" else "xi2"): c.xi, "N": c.N, "d": list(c.d), "epsilon": list(c.epsilon)}
    if mechanism == "gaussian":
        out.update(delta=list(c.delta), Lambda=list(c.Lambda), q=c.q, c2=c.c2)
    return out


def plot_bound(bound, result, path: str) -> None:
    """A PNG of U(T, b) for integer b in [1, N] and T in [0, max(10, 3 T_plan)] (log colour scale), the plan marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import LogNorm

    N = result.num_clients
    T_max = max(10, 3 * result.rounds, 3 * math.ceil(result.continuous_rounds))
    Ts = np.linspace(0, T_max, 200)
    bs = np.arange(1, N + 1)
    U = np.array([[bound(T, b) for T in Ts] for b in bs])
    positive = U[U > 0]
    fig, ax = plt.subplots(figsize=(6, 4))
    mesh = ax.pcolormesh(Ts, bs, np.where(U > 0, U, np.nan), shading="nearest",
                         norm=LogNorm(positive.min(), positive.max()) if positive.size else None)
    fig.colorbar(mesh, ax=ax, label="U(T, b), the bound on E||theta_T - theta*||^2")
    ax.plot(result.rounds, result.clients_per_round, "r*", markersize=14,
            label=f"plan T={result.rounds}, b={result.clients_per_round}")
    ax.set_xlabel("T (queries)")
    ax.set_ylabel("b (clients per query)")
    ax.set_title(f"Zhou et al. bound, {result.mechanism} mechanism")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["NAME", "HELP", "configure", "execute", "plot_bound"]
