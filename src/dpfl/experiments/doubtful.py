"""Values a run accepts but that are most likely mistakes: each warns (``ConfigWarning``), naming the key, the value
and why, once the data is built (what they are measured against, the records and clients, comes from it).

* an explicit ``privacy.delta`` above 1 / N (N training records): the mechanism that publishes one random record in
  full is (0, 1/N)-DP, so such a delta allows leaking whole records; delta is meant to be well below 1 / N (values of
  0.1 and more are refused outright by ``validate``);
* Poisson client sampling whose cohort is empty in at least half the rounds, (1 - l)^M >= 1/2: those rounds train
  no client, yet add noise to the model and spend epsilon;
* the other-silo observer of a run with a single client: there is no other silo, so its epsilon describes no one;
* a client with far fewer training records than the others whose count changes what every round declares: the ledger
  charges each record the event of the least protected client (e.g. the largest record sampling ratio: a fixed-size
  batch of max(1, floor(s n)) records from n = 1 is no sample at all, Wang, Balle, Kasiviswanathan 2019's
  amplification vanishes), so that one client raises everyone's epsilon (tests/experiments/test_small_client.py:
  3.69 -> 8.75 when the fourth of four clients holds 1 training record instead of 30, the others 40).
"""

from __future__ import annotations

import warnings

import torch

from dpfl.accounting.observers import OTHER_SILO
from dpfl.engine.sampling import ClientSampler
from dpfl.engine.simulator import Simulation, declare_round
from dpfl.errors import ConfigWarning

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
    """Poisson client sampling that leaves the cohort empty in at least half the rounds."""
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


__all__ = ["check_delta", "check_cohort", "check_observers", "check_smallest_client"]
