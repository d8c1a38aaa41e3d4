"""`dpfl account dp-fedavg-user`: user-level epsilon of DP-FedAvg (McMahan et al. 2018) towards each observer, without
data or training.

The algorithm is built by its registered builder (``dpfl.algorithms.dp_fedavg_user``) from the flags, its rounds
declared as the simulator declares them and composed by a ledger of the run's settings
(``experiments.noise_level.declared_epsilon``): the numbers a run of the same keys reports. Only the cohort enters
(a user-level release reads no record counts unless weighted, and then only through the bounded weight).
Server noise is amplified by client sampling towards the observers the cohort is secret from (``--cohort``,
privacy.cohort; ``dpfl.accounting.observers``), with what that assumes printed beside it. ``--analysis paper``:
McMahan et al.'s amplified epsilon towards the third party and the other silos whatever the boundary, Poisson only.
"""

from __future__ import annotations

NAME = "dp-fedavg-user"
HELP = "user-level epsilon of DP-FedAvg per observer (McMahan et al. 2018), noise at the server, in shares or at " \
       "each client, optionally with adaptive clipping (Andrew et al. 2021)"
#: the boundary each placement is stated behind unless --boundary says otherwise
DEFAULT_BOUNDARY = {"server": "trusted", "shares": "secagg", "client": "plain"}


def configure(parser) -> None:
    from dpfl.accounting.observers import COHORTS
    from dpfl.algorithms.dp_fedavg_user import CLIENT_SAMPLING, PLACEMENTS  # with torch: only for this subcommand

    parser.add_argument("--num-clients", type=int, required=True, help="M, the number of clients")
    parser.add_argument("--client-rate", type=float, required=True, help="q, the expected fraction of clients per round")
    parser.add_argument("--client-sampling", choices=CLIENT_SAMPLING, default="poisson",
                        help="poisson (default; zero-out one client) or fixed (n = floor(q M); replace one client)")
    parser.add_argument("--rounds", type=int, required=True, help="T, communication rounds (>= 1)")
    parser.add_argument("--noise-multiplier", type=float, required=True,
                        help="z, the summed update's noise std over its user-level sensitivity")
    parser.add_argument("--noise-at", choices=PLACEMENTS, default="server",
                        help="who adds the noise: server (default; central DP), shares (secure aggregation) or client "
                             "(local DP)")
    parser.add_argument("--boundary", choices=("plain", "secagg", "trusted"), default=None,
                        help="what the server sees (default: trusted for server noise, secagg for shares, plain for "
                             "client noise)")
    parser.add_argument("--target-quantile", type=float, default=None,
                        help="gamma: adaptive clipping, whose clipped-bit count takes part of the budget")
    parser.add_argument("--count-noise", type=float, default=None,
                        help="sigma_b, the count's noise std (with --target-quantile; default max(m / 20, s_b z / "
                             "sqrt(0.1)), m the expected cohort: docs/user-level.md)")
    parser.add_argument("--cohort", choices=COHORTS, default="secret",
                        help="who learns who takes part besides the server: nobody (secret, default: the server's "
                             "noise is amplified by client sampling towards the others), the members (secure "
                             "aggregation always tells them) or everyone (published)")
    parser.add_argument("--analysis", choices=("sound", "paper"), default="sound",
                        help="sound (default) or paper (McMahan et al. 2018's amplified epsilon towards the third "
                             "party and the other silos whatever the boundary: server noise, Poisson cohorts)")
    parser.add_argument("--delta", type=float, default=1e-5, help="target delta (default 1e-5)")


def execute(args) -> dict:
    from dpfl.algorithms.dp_fedavg_user import DpFedAvgUserConfig, build
    from dpfl.algorithms.registry import Setting
    from dpfl.engine.boundary import Boundary
    from dpfl.engine.sampling import ClientSampler
    from dpfl.errors import check_noise_multiplier, check_range
    from dpfl.experiments.noise_level import declared_epsilon
    from dpfl.experiments.results_file import cohort_knowledge

    num_clients = check_range("num_clients", args.num_clients, 1, integer=True)
    check_range("rounds", args.rounds, 1, integer=True)
    config = DpFedAvgUserConfig(noise_at=args.noise_at, target_quantile=args.target_quantile,
                                count_noise=args.count_noise,
                                noise_multiplier=check_noise_multiplier("noise_multiplier", args.noise_multiplier))
    setting = Setting(client_rate=args.client_rate, client_sampling=args.client_sampling, num_clients=num_clients,
                      train_counts=(1,) * num_clients, rounds=args.rounds, delta=args.delta,
                      analysis=args.analysis)
    algorithm = build(NAME, config, setting)
    boundary = Boundary(args.boundary or DEFAULT_BOUNDARY[args.noise_at], cohort=args.cohort)
    clients = ClientSampler(num_clients, args.client_rate, args.client_sampling)
    epsilon = declared_epsilon(algorithm, setting, boundary, clients)
    result = {"epsilon": epsilon, "delta": args.delta, "boundary": boundary.name, "noise_at": args.noise_at,
              "neighboring": algorithm.neighboring, "unit": algorithm.privacy_unit,
              "noise_multipliers": [m.noise_multiplier for m in algorithm.mechanisms()], "analysis": args.analysis,
              "cohort": cohort_knowledge(boundary, list(epsilon))}
    if algorithm.assumptions is not None:
        result["assumptions"] = algorithm.assumptions
    return result
