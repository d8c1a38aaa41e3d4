"""`dpfl account dp-scaffold`: record-level epsilon of DP-SCAFFOLD / DP-FedAvg / DP-FedSGD towards each observer.

See ``dpfl.accounting.dp_scaffold``: the sound analysis by default, Noble et al. (2022)'s own accountant with
``--analysis paper``.
"""

from __future__ import annotations

from dpfl.accounting.dp_scaffold import ALGORITHMS, dp_scaffold_epsilon
from dpfl.errors import check_noise_multiplier

NAME = "dp-scaffold"
HELP = "record-level epsilon of DP-SCAFFOLD / DP-FedAvg per observer (Noble et al. 2022), sound or the paper's"


def configure(parser) -> None:
    parser.add_argument("--num-clients", type=int, required=True, help="M, the number of clients")
    parser.add_argument("--records-per-client", type=int, required=True, help="R, training records per client")
    parser.add_argument("--client-rate", type=float, required=True, help="l, fraction of clients sampled per round")
    parser.add_argument("--sample-rate", type=float, required=True, help="s, fraction of records per local step")
    parser.add_argument("--local-steps", type=int, required=True, help="K, local steps per round")
    parser.add_argument("--rounds", type=int, required=True, help="T, communication rounds (>= 1)")
    parser.add_argument("--noise-multiplier", type=float, required=True, help="sigma_g, per-step noise multiplier")
    parser.add_argument("--delta", type=float, default=None, help="target delta (default 1/(M R))")
    parser.add_argument("--analysis", choices=("sound", "paper"), default="sound",
                        help="sound (default): client sampling as a participation mixture, other clients' noise "
                             "credited only where it reaches the aggregate intact, modern conversion; paper: the "
                             "paper's App. B accountant, which reproduces its numbers but does not hold for general "
                             "losses")
    parser.add_argument("--accountant", choices=("pld", "rdp"), default=None,
                        help="default: pld for the sound analysis (what a run's ledger reports for the same setting), "
                             "rdp for the paper's (its App. B accountant)")
    parser.add_argument("--algorithm", choices=tuple(ALGORITHMS), default="dp-scaffold",
                        help="which local-step algorithm (matters for the sound analysis: SCAFFOLD's control "
                             "variates carry noise into later rounds, so no other client's noise is credited)")


def execute(args) -> dict:
    return dp_scaffold_epsilon(
        num_clients=args.num_clients,
        records_per_client=args.records_per_client,
        client_rate=args.client_rate,
        sample_rate=args.sample_rate,
        local_steps=args.local_steps,
        rounds=args.rounds,
        noise_multiplier=check_noise_multiplier("noise_multiplier", args.noise_multiplier),
        delta=args.delta,
        analysis=args.analysis,
        algorithm=args.algorithm,
        accountant=args.accountant,
    )
