"""`dpfl account dp-scaffold`: epsilon of DP-SCAFFOLD / DP-FedAvg towards the third party and the server.

The accountant of the DP-SCAFFOLD paper (seed 000, App. B), see ``dpfl.accounting.dp_scaffold``.
"""

from __future__ import annotations

from dpfl.accounting.dp_scaffold import dp_scaffold_epsilon

NAME = "dp-scaffold"
HELP = "record-level epsilon of DP-SCAFFOLD / DP-FedAvg per observer (RDP, classic conversion; Noble et al. 2022)"


def configure(parser) -> None:
    parser.add_argument("--num-clients", type=int, required=True, help="M, the number of clients")
    parser.add_argument("--records-per-client", type=int, required=True, help="R, training records per client")
    parser.add_argument("--client-rate", type=float, required=True, help="l, fraction of clients sampled per round")
    parser.add_argument("--sample-rate", type=float, required=True, help="s, fraction of records per local step")
    parser.add_argument("--local-steps", type=int, required=True, help="K, local steps per round")
    parser.add_argument("--rounds", type=int, required=True, help="T, communication rounds")
    parser.add_argument("--noise-multiplier", type=float, required=True, help="sigma_g, per-step noise multiplier")
    parser.add_argument("--delta", type=float, default=None, help="target delta (default 1/(M R))")
    parser.add_argument("--subsampling-bound", choices=("paper", "tight"), default="paper",
                        help="paper: Wang et al.'s general bound as in the paper (reproduces its numbers); tight: the "
                             "same bound capped by the inner mechanism's curve (valid, smaller)")


def execute(args) -> dict:
    return dp_scaffold_epsilon(
        num_clients=args.num_clients,
        records_per_client=args.records_per_client,
        client_rate=args.client_rate,
        sample_rate=args.sample_rate,
        local_steps=args.local_steps,
        rounds=args.rounds,
        noise_multiplier=args.noise_multiplier,
        delta=args.delta,
        subsampling_bound=args.subsampling_bound,
    )
