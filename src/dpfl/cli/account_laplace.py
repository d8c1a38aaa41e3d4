"""`dpfl account laplace`: epsilon of the Laplace mechanism composed over steps.

Without ``--delta`` the answer is pure epsilon-DP by basic composition, steps x sensitivity / scale (Dwork & Roth
2014, Thm 3.16); with ``--delta`` it is (epsilon, delta)-DP by the accountant (PLD by default, RDP where the PLD
would be too large to build in seconds, with a ``note``), which is smaller.
"""

from __future__ import annotations

from dpfl.accounting.accountant import ACCOUNTANTS, account, laplace_event, pure_epsilon
from dpfl.accounting.conversion import CONVERSIONS
from dpfl.cli.common import with_default_accountant
from dpfl.errors import ConfigError, check_noise_multiplier, check_range

NAME = "laplace"
HELP = "epsilon of the Laplace mechanism composed over steps (pure DP without --delta)"


def configure(parser) -> None:
    parser.add_argument("--scale", type=float, required=True, help="Laplace noise scale b")
    parser.add_argument("--sensitivity", type=float, required=True, help="l1 sensitivity of the statistic")
    parser.add_argument("--steps", type=int, required=True, help="number of compositions")
    parser.add_argument("--delta", type=float, help="target delta in (0, 1); omitted: pure DP (delta = 0)")
    parser.add_argument("--accountant", choices=ACCOUNTANTS, help="with --delta; default pld (rdp where pld would take minutes)")
    parser.add_argument("--conversion", choices=CONVERSIONS, default="classic", help="RDP -> DP conversion (rdp)")


def execute(args) -> dict:
    for flag, value in (("scale", args.scale), ("sensitivity", args.sensitivity)):
        check_range(flag, value, 0, float("inf"), low_open=True, high_open=True)
    check_noise_multiplier("scale / sensitivity", args.scale / args.sensitivity)
    event = laplace_event(args.scale, args.sensitivity, args.steps)
    if args.delta is None:
        if args.accountant is not None:
            raise ConfigError("delta", None, f"a number in (0, 1) when --accountant {args.accountant} is given")
        return {
            "epsilon": pure_epsilon(event),
            "delta": 0.0,
            "accountant": "basic_composition",
            "conversion": None,
            "note": "pure epsilon-DP (delta = 0) by basic composition: steps x sensitivity / scale",
        }
    result, note = with_default_accountant(lambda accountant: account(event, args.delta, accountant, args.conversion),
                                           args.accountant)
    return {**result.to_dict(), **({"note": note} if note else {})}
