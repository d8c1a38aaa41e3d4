"""Record-level privacy of DP-SCAFFOLD, DP-FedAvg and DP-FedSGD towards each observer, without training.

Noble, Bellet, Dieuleveut (AISTATS 2022). Record-level DP, replace-one neighbouring. One local step of a client
releases a Gaussian-noised minibatch gradient on floor(s R) of its R training records drawn without replacement:
``SampledWithoutReplacementDpEvent(R, floor(s R), GaussianDpEvent(sigma_g))``; a round is K such steps by each of the
floor(l M) clients of the cohort. ``dpfl.accounting.observers`` derives each observer's round from that:

* ``analysis="sound"`` (default): client sampling as a participation mixture with probability l, the cohort's noise
  credited only to draws that reach the aggregate additively (none for SCAFFOLD, whose control variates carry the
  noise forward; the last step for FedAvg; every step for FedSGD), Wang et al.'s record-level subsampling bound capped
  by the unsampled curve and by their Gaussian-specific Thm 27; RDP (the events sample without replacement, which
  the PLD accountant does not support) with the modern conversion (Canonne, Kamath, Steinke 2020).
* ``analysis="paper"``: the paper's App. B accountant, which reproduces its numbers (epsilon 13 for M=100, R=4000,
  l=s=0.2, sigma_g=60, K=50, T=400, recomputed 12.91; its Table 1 round counts): Wang et al.'s general bound at both
  sampling levels, sigma_g sqrt(lM) at every step, the classic conversion (Mironov 2017, Prop. 3). Two of its steps do
  not hold for general losses (``observers.PAPER_UNPROVEN``).
"""

from __future__ import annotations

import math

from dp_accounting import dp_event

from dpfl.accounting.accountant import account
from dpfl.accounting.calibrate import max_steps
from dpfl.accounting.observers import (OBSERVERS, PAPER_UNPROVEN, THIRD_PARTY, Cohort, Release,
                                       local_steps_additive, observer_events)
from dpfl.counts import sampled_count
from dpfl.errors import ConfigError, check_range

#: How each analysis accounts: (RDP bound for sampling records without replacement, RDP -> DP conversion).
ANALYSIS_SETTINGS = {"sound": ("tight", "modern"), "paper": ("paper", "classic")}
#: The algorithms of the paper and which of their local steps are additive (``observers.local_steps_additive``).
ALGORITHMS = {"dp-scaffold": dict(moves_locally=True, carries_noise=True),
              "dp-fedavg": dict(moves_locally=True, carries_noise=False),
              "dp-fedsgd": dict(moves_locally=False, carries_noise=False)}


def _at_least_one(field: str, rate: float, population: int) -> int:
    """``sampled_count``, which must be at least 1."""
    count = sampled_count(rate, population)
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
    analysis: str = "sound",
    algorithm: str = "dp-scaffold",
) -> dict[str, dp_event.DpEvent]:
    """One round's event for each observer (``observers.OBSERVERS``), as in the module docstring."""
    num_clients = check_range("num_clients", num_clients, 1, integer=True)
    records_per_client = check_range("records_per_client", records_per_client, 1, integer=True)
    check_range("client_rate", client_rate, 0, 1, low_open=True)
    check_range("sample_rate", sample_rate, 0, 1, low_open=True)
    local_steps = check_range("local_steps", local_steps, 1, integer=True)
    check_range("noise_multiplier", noise_multiplier, 0, math.inf, low_open=True, high_open=True)
    if algorithm not in ALGORITHMS:
        raise ConfigError("algorithm", algorithm, f"one of {list(ALGORITHMS)}")
    if analysis not in ANALYSIS_SETTINGS:
        raise ConfigError("analysis", analysis, f"one of {list(ANALYSIS_SETTINGS)}")
    batch = _at_least_one("sample_rate", sample_rate, records_per_client)
    cohort = _at_least_one("client_rate", client_rate, num_clients)
    step = dp_event.GaussianDpEvent(noise_multiplier)
    if batch < records_per_client:
        step = dp_event.SampledWithoutReplacementDpEvent(records_per_client, batch, step)
    release = Release((step,) * local_steps, local_steps_additive(local_steps, **ALGORITHMS[algorithm]))
    return observer_events(release, Cohort.fixed(num_clients, cohort), analysis=analysis)


def _delta(delta, num_clients: int, records_per_client: int) -> float:
    if delta is None:
        return 1 / (num_clients * records_per_client)
    return check_range("delta", delta, 0, 1, low_open=True, high_open=True)


#: The accountants each analysis takes, its default first: the sound analysis is accounted as a run's ledger accounts it
#: (PLD; RDP on request); the paper's App. B accountant is an RDP bound.
ACCOUNTANTS = {"sound": ("pld", "rdp"), "paper": ("rdp",)}


def dp_scaffold_epsilon(
    num_clients: int,
    records_per_client: int,
    client_rate: float,
    sample_rate: float,
    local_steps: int,
    rounds: int,
    noise_multiplier: float,
    delta: float | None = None,
    analysis: str = "sound",
    algorithm: str = "dp-scaffold",
    accountant: str | None = None,
) -> dict:
    """Epsilon of T = ``rounds`` rounds towards each observer.

    Args:
      num_clients: M. records_per_client: R, TRAINING records per client. client_rate: l. sample_rate: s.
      local_steps: K. rounds: T (>= 1). noise_multiplier: sigma_g. delta: default 1/(M R).
      analysis: "sound" or "paper" (module docstring). algorithm: a key of ``ALGORITHMS`` (matters for "sound").
      accountant: "pld" or "rdp"; default the analysis's: "pld" for "sound", the accountant a run's ledger uses
        (the fixed-size batches through their dominating Poisson pair, ``dpfl.accounting.pld``), so this is the
        epsilon the same run reports; "rdp" for "paper", whose App. B accountant is an RDP bound (the only one).

    Returns:
      {"epsilon": {"third_party", "server", "other_silo"}, "delta", "analysis", "accountant", "conversion",
       "subsampling_bound", "algorithm"} and, for "paper", "unproven": the steps that do not hold in general.
    """
    events = dp_scaffold_round_events(num_clients, records_per_client, client_rate, sample_rate, local_steps,
                                      noise_multiplier, analysis, algorithm)
    rounds = check_range("rounds", rounds, 1, integer=True)
    delta = _delta(delta, num_clients, records_per_client)
    allowed = ACCOUNTANTS[analysis]
    accountant = allowed[0] if accountant is None else accountant
    if accountant not in allowed:
        raise ConfigError("accountant", accountant, f"one of {list(allowed)} with the {analysis} analysis")
    bound, conversion = ANALYSIS_SETTINGS[analysis]
    epsilon = {
        observer: account(dp_event.SelfComposedDpEvent(event, rounds), delta, accountant, conversion, "replace_one",
                          subsampling_bound=bound).epsilon
        for observer, event in events.items()
    }
    result = {"epsilon": epsilon, "delta": delta, "analysis": analysis, "algorithm": algorithm, "accountant": accountant,
              "conversion": conversion, "subsampling_bound": bound}
    if analysis == "paper":
        result["unproven"] = list(PAPER_UNPROVEN)
    return result


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
    analysis: str = "sound",
    algorithm: str = "dp-scaffold",
) -> int:
    """The largest T with epsilon(T) <= ``target_epsilon`` towards ``observer`` (0 if even one round exceeds it),
    under ``dp_scaffold_epsilon``'s RDP accounting (RDP is linear in T: each trial rescales one cached curve; the
    sound analysis's default PLD allows at least as many rounds, so this count is safe for it too)."""
    if observer not in OBSERVERS:
        raise ConfigError("observer", observer, f"one of {list(OBSERVERS)}")
    check_range("target_epsilon", target_epsilon, 0, low_open=True)
    event = dp_scaffold_round_events(num_clients, records_per_client, client_rate, sample_rate, local_steps,
                                     noise_multiplier, analysis, algorithm)[observer]
    delta = _delta(delta, num_clients, records_per_client)
    bound, conversion = ANALYSIS_SETTINGS[analysis]
    return max_steps(lambda t: dp_event.SelfComposedDpEvent(event, t), target_epsilon, delta, "rdp", conversion,
                     "replace_one", subsampling_bound=bound)


__all__ = ["ALGORITHMS", "ANALYSIS_SETTINGS", "dp_scaffold_round_events", "dp_scaffold_epsilon", "max_rounds"]
