"""Values a run accepts but that are most likely mistakes: each warns (``ConfigWarning``), naming the key, the value
and why, once the data is built (what they are measured against, the records and clients, comes from it).

* an explicit ``privacy.delta`` above 1 / N (N training records): the mechanism that publishes one random record in
  full is (0, 1/N)-DP, so such a delta allows leaking whole records; delta is meant to be well below 1 / N (values of
  0.1 and more are refused outright by ``validate``);
* Poisson client sampling whose cohort is empty in at least half the rounds, (1 - l)^M >= 1/2: those rounds train
  no client, yet add noise to the model and spend epsilon;
* partitioned Poisson client sampling (amplified BandMF) whose members take part with q = l b >= 3/4, the default
  b = floor(1 / l) included: its amplification is then small;
* the other-silo observer of a run with a single client: there is no other silo, so its epsilon describes no one;
* a client with far fewer training records than the others whose count changes what every round declares: the ledger
  charges each record the event of the least protected client (e.g. the largest record sampling ratio: a fixed-size
  batch of max(1, floor(s n)) records from n = 1 is no sample at all, Wang, Balle, Kasiviswanathan 2019's
  amplification vanishes), so that one client raises everyone's epsilon (tests/experiments/test_small_client.py:
  3.69 -> 8.75 when the fourth of four clients holds 1 training record instead of 30, the others 40).
"""

from __future__ import annotations

import math
import warnings

import torch

from dpfl.accounting.observers import OTHER_SILO
from dpfl.engine.sampling import PARTITIONED, ClientSampler
from dpfl.engine.simulator import Simulation, declare_round
from dpfl.errors import ConfigWarning

#: q = l b from which partitioned Poisson sampling is warned about (``check_cohort``)
LITTLE_AMPLIFICATION = 0.75
#: The rule of the default delta (``assembly.default_delta``), as the docs and warnings state it.
DELTA_RULE = "the largest power of ten at most 1/(10 N), N the training records"


def warn(message: str) -> None:
    warnings.warn(message, ConfigWarning, stacklevel=2)


def check_delta(delta: float | None, train_records: int, default: float) -> None:
    """An explicit ``privacy.delta`` (None: the default, ``default``) above 1 / ``train_records``."""
    if delta is not None and delta > 1.0 / train_records:
        warn(f"privacy.delta = {delta:g} is above 1 / N = {1.0 / train_records:.3g} (N = {train_records} training "
             "records): a mechanism that publishes one random record in full is (0, 1/N)-DP, so this delta allows "
             "leaking whole records; choose delta well below 1 / N, or leave privacy.delta to its "
             f"default ({default:g}: {DELTA_RULE})")


def check_cohort(clients: ClientSampler) -> None:
    """Poisson client sampling that leaves the cohort empty in at least half the rounds; partitioned Poisson sampling
    whose members take part with q = l b >= ``LITTLE_AMPLIFICATION`` (the default b = floor(1 / l) gives q near 1:
    the observers who do not know the cohort are then charged nearly what those who know it are)."""
    if clients.scheme == PARTITIONED and clients.partition_rate >= LITTLE_AMPLIFICATION:
        fewer = max(1, math.floor(1 / (2 * clients.rate)))
        warn(f"algorithm.bands = {clients.partitions} public partitions at algorithm.client_rate = {clients.rate:g} "
             f"make each member of a round's partition take part with q = l b = {clients.partition_rate:.3g}, so "
             "cohort sampling amplifies little (at q = 1, nothing); fewer bands amplify more at the cost of less "
             f"noise correlation (algorithm.bands = {fewer} gives q = {clients.rate * fewer:.3g}; Choquette-Choo et "
             "al. 2023 choose b by the error at the target epsilon, which dpfl does not optimise)")
        return
    if clients.scheme != "poisson":
        return
    empty = (1.0 - clients.rate) ** clients.num_clients
    if empty >= 0.5:
        warn(f"algorithm.client_rate = {clients.rate:g} samples each of the {clients.num_clients} clients with that "
             f"probability, so {empty:.0%} of the rounds have no client: they train nothing, yet add noise and "
             f"spend epsilon; raise algorithm.client_rate (to 1 / {clients.num_clients} = "
             f"{1 / clients.num_clients:.3g} or more) or sample a fixed cohort (algorithm.client_sampling = 'fixed')")


def check_observers(observers, num_clients: int) -> None:
    """An other-silo observer in a run with a single client."""
    if num_clients == 1 and OTHER_SILO in observers:
        warn(f"data.num_clients = 1: there is no other silo, so the {OTHER_SILO} epsilon the run reports describes "
             "no one (it is the epsilon another silo would have, if there were one)")


def check_noise_to_signal(sim: Simulation, calibrated: bool) -> None:
    """A noisy-mean step whose noise outweighs the largest update the cohort can send (``Algorithm.noise_to_signal``
    above 1): the run will move the model mostly by noise (user-level DP on a small cohort: dp-fedavg-user on digits'
    100 clients, cohorts of 20, z = 1 and logistic regression's 650 parameters give 2.55, and its train loss wanders
    above the untrained model's). Names the client rate that brings the ratio to 1, or, where no cohort of the
    federation does, the noise multiplier that does at the cohort given (``calibrated``: through privacy.epsilon)."""
    measured = sim.algorithm.noise_to_signal(int(sim.model.numel()))
    if measured is None or measured[0] <= 1.0:
        return
    ratio, cohort = measured
    clients = sim.clients
    z = sim.algorithm.noise_multipliers or {}
    noise = "a larger privacy.epsilon" if calibrated else "a smaller algorithm.noise_multiplier"
    fixes = [f"{noise} (the ratio is proportional to the noise multiplier)", "a smaller model"]
    if math.ceil(cohort) <= clients.num_clients:
        rate = math.ceil(cohort) / clients.num_clients
        fixes.insert(0, f"algorithm.client_rate = {rate:.3g} or more (an expected cohort of {math.ceil(cohort)})")
    else:
        fixes.append(f"more clients (a cohort of {math.ceil(cohort)} is needed, the federation has "
                     f"{clients.num_clients})")
    multipliers = "".join(f"; {name} = {value:.3g}" for name, value in z.items())
    warn(f"the noise of each round's step has about {ratio:.3g}x the norm of the largest update the cohort can send "
         f"(algorithm.client_rate = {clients.rate:g}: a cohort of {clients.cohort_size} clients; "
         f"{int(sim.model.numel())} model parameters{multipliers}), so the model will move mostly by noise; for a "
         "ratio of 1 use " + ", or ".join(fixes))


#: A client with fewer training records than this fraction of the median client's is named when its count changes
#: the rounds' declared release (``check_smallest_client``).
SMALL_CLIENT = 0.25


def check_smallest_client(sim: Simulation, client_ids: list | None = None) -> None:
    """The client with the fewest training records, when it holds under ``SMALL_CLIENT`` of the median client's and
    raising its count to the median changes some observer's event of the next round (``declare_round``: the
    algorithm's release through the boundary and the client sampler): its count then sets the event every record is
    charged, so it drives everyone's epsilon. ``client_ids``: the data's own client ids (a natural partition), to name
    it by."""
    counts = sim.train.counts
    smallest = int(torch.argmin(counts))
    records, median = int(counts[smallest]), int(counts.median())
    if records >= SMALL_CLIENT * median:
        return
    lifted = counts.clone()
    lifted[smallest] = median

    def events(train_counts: torch.Tensor) -> dict:
        return declare_round(sim.algorithm, sim.boundary, sim.clients, sim.ledger.analysis, sim.next_round, sim.state,
                             train_counts)[1]

    if events(counts) == events(lifted):
        return
    name = f"client {smallest}" + (f" (id {client_ids[smallest]})" if client_ids else "")
    warn(f"{name} holds {records} training record(s), the median client {median}: every record's privacy is "
         "accounted as that of this client's records, the least protected (e.g. its batches sample the largest share "
         "of its records), so this one client raises every observer's epsilon; merge it into another client, drop "
         "it, or give it more records")


__all__ = ["check_delta", "check_cohort", "check_observers", "check_noise_to_signal", "check_smallest_client"]
