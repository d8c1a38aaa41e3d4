"""The privacy accountant of the DP-SCAFFOLD paper (Noble, Bellet, Dieuleveut, AISTATS 2022; seed 000, App. B).

Record-level DP, replace-one neighbouring. One local step of a client releases a Gaussian-noised minibatch gradient
on floor(s R) of its R training records drawn without replacement:
``SampledWithoutReplacementDpEvent(R, floor(s R), GaussianDpEvent(sigma_g))``. A round (``observers.round_events``)
is, for

* the third party: the cohort of floor(l M) of the M users, drawn without replacement, around the K-fold local steps
  whose noise multiplier is sigma_g sqrt(lM) (the cohort's noise averages);
* the honest-but-curious server: the K-fold local steps with sigma_g (no user-sampling amplification, no averaging).

Both sampling levels use the general subsampling bound of Wang, Balle, Kasiviswanathan 2019 (Thm 9), see
``dpfl.accounting.rdp``; T rounds compose linearly and the curve is turned into (epsilon, delta) with the CLASSIC
conversion (Mironov 2017, Prop. 3), delta = 1/(M R) by default. This reproduces the paper's numbers (e.g. epsilon 13
for M=100, R=4000, l=s=0.2, sigma_g=60, K=50, T=400, recomputed 12.91; its Table 1 round counts).
"""

from __future__ import annotations

import math

import numpy as np
from dp_accounting import dp_event

from dpfl.accounting.conversion import rdp_to_epsilon
from dpfl.accounting.observers import SERVER, THIRD_PARTY, round_events
from dpfl.accounting.rdp import DEFAULT_ORDERS, rdp_curve
from dpfl.errors import ConfigError, check_range

ACCOUNTANT = "rdp"
CONVERSION = "classic"
DP_SCAFFOLD_OBSERVERS = (THIRD_PARTY, SERVER)


def _sampled_count(field: str, rate: float, population: int) -> int:
    """floor(rate * population), tolerant of float rounding (0.29 * 100 is 28.999...); at least 1."""
    count = math.floor(rate * population + 1e-9)
    if count < 1:
        raise ConfigError(field, rate, f"a rate with floor(rate * {population}) >= 1, i.e. >= {1 / population:.6g}")
    return count


def dp_scaffold_round_events(
    num_clients: int,
    records_per_client: int,
    client_rate: float,
    sample_rate: float,
    local_steps: int,
    noise_multiplier: float,
) -> dict[str, dp_event.DpEvent]:
    """One round's event for each observer (``DP_SCAFFOLD_OBSERVERS``), as in the module docstring."""
    num_clients = check_range("num_clients", num_clients, 1, integer=True)
    records_per_client = check_range("records_per_client", records_per_client, 1, integer=True)
    check_range("client_rate", client_rate, 0, 1, low_open=True)
    check_range("sample_rate", sample_rate, 0, 1, low_open=True)
    local_steps = check_range("local_steps", local_steps, 1, integer=True)
    check_range("noise_multiplier", noise_multiplier, 0, math.inf, low_open=True, high_open=True)
    batch = _sampled_count("sample_rate", sample_rate, records_per_client)
    cohort = _sampled_count("client_rate", client_rate, num_clients)
    step = dp_event.SampledWithoutReplacementDpEvent(records_per_client, batch, dp_event.GaussianDpEvent(noise_multiplier))
    events = round_events(step, local_steps, num_clients, cohort)
    return {observer: events[observer] for observer in DP_SCAFFOLD_OBSERVERS}


def _delta(delta, num_clients: int, records_per_client: int) -> float:
    if delta is None:
        return 1 / (num_clients * records_per_client)
    return check_range("delta", delta, 0, 1, low_open=True, high_open=True)


def dp_scaffold_epsilon(
    num_clients: int,
    records_per_client: int,
    client_rate: float,
    sample_rate: float,
    local_steps: int,
    rounds: int,
    noise_multiplier: float,
    delta: float | None = None,
    subsampling_bound: str = "paper",
) -> dict:
    """Epsilon of T = ``rounds`` rounds of DP-SCAFFOLD (or DP-FedAvg, Claim 4.1) towards each observer.

    ``subsampling_bound="paper"`` (default) is the paper's accountant and reproduces its numbers; "tight" is the same
    analysis with each subsampling bound capped by its inner mechanism's curve (valid: subsampling never hurts), which
    shows how loose the published epsilons are (12.91 -> 2.82 for the synthetic setting).

    Args:
      num_clients: M. records_per_client: R, TRAINING records per client. client_rate: l. sample_rate: s.
      local_steps: K. rounds: T. noise_multiplier: sigma_g. delta: default 1/(M R).

    Returns:
      {"epsilon": {"third_party": .., "server": ..}, "delta": .., "accountant": "rdp", "conversion": "classic",
       "subsampling_bound": ..}
    """
    events = dp_scaffold_round_events(
        num_clients, records_per_client, client_rate, sample_rate, local_steps, noise_multiplier
    )
    rounds = check_range("rounds", rounds, 0, integer=True)
    delta = _delta(delta, num_clients, records_per_client)
    epsilon = {
        observer: rdp_to_epsilon(
            DEFAULT_ORDERS, rdp_curve(dp_event.SelfComposedDpEvent(event, rounds), subsampling_bound=subsampling_bound),
            delta, CONVERSION,
        )[0]
        for observer, event in events.items()
    }
    return {"epsilon": epsilon, "delta": delta, "accountant": ACCOUNTANT, "conversion": CONVERSION,
            "subsampling_bound": subsampling_bound}


def max_rounds(
    num_clients: int,
    records_per_client: int,
    client_rate: float,
    sample_rate: float,
    local_steps: int,
    noise_multiplier: float,
    target_epsilon: float,
    delta: float | None = None,
    observer: str = THIRD_PARTY,
    subsampling_bound: str = "paper",
) -> int:
    """The largest T with epsilon(T) <= ``target_epsilon`` towards ``observer`` (0 if even one round exceeds it).

    RDP is linear in T, so with the classic conversion epsilon(T) <= target iff some order a has
    T rdp_round(a) + log(1/delta)/(a-1) <= target: T = max_a floor((target - log(1/delta)/(a-1)) / rdp_round(a)).
    """
    if observer not in DP_SCAFFOLD_OBSERVERS:
        raise ConfigError("observer", observer, f"one of {DP_SCAFFOLD_OBSERVERS}")
    check_range("target_epsilon", target_epsilon, 0, low_open=True)
    events = dp_scaffold_round_events(
        num_clients, records_per_client, client_rate, sample_rate, local_steps, noise_multiplier
    )
    delta = _delta(delta, num_clients, records_per_client)
    per_round = rdp_curve(events[observer], subsampling_bound=subsampling_bound)
    slack = target_epsilon - math.log(1 / delta) / (DEFAULT_ORDERS - 1)
    rounds = np.floor(slack / per_round)
    return max(0, int(rounds.max()))


__all__ = ["DP_SCAFFOLD_OBSERVERS", "dp_scaffold_round_events", "dp_scaffold_epsilon", "max_rounds"]
