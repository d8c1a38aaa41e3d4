"""dp-fedavg-user's worst-case instance, its claim and its exact privacy, for any population, rate and horizon: shared
by tests/privacy/test_dp_fedavg_user_worst_case.py (which runs the instance through the engine at a small size) and
benchmarks/tightness.py (which tabulates claim / exact at the test's size and at the issue's, M = 1000).

The instance (the test module's docstring derives it): one local step of linear losses, every update clipped to a
fixed vector of norm C, so the owner's presence moves the sum by exactly S (C under zero-out, Poisson cohorts; 2C
under replace-one, fixed-size cohorts) and each observer sees a 1-D Gaussian in units of S:

* server noise: the sum (third party, other silo) at std z, the owner's own unnoised message (a server: infinite);
* noise shares: each client's share std z / sqrt(n) (n the cohort size, its expected size qM for Poisson); the
  sum carries the shares of the clients in it;
* client noise: each message at std z.

``exact_instance`` grants the observer knowledge of who takes part where privacy.cohort says it has it (the other
clients' participation as a label, the owner's as a disjoint "absent" view: ``exact.observer_instance``), which only
raises the exact epsilon; towards an observer of the server's noise that does not know the cohort it is the Gaussian
mixture over the owner's participation. ``secret_cohort_instance`` is that observer under Poisson cohorts: the
Poisson subsampled Gaussian ``exact.poisson_pair(q, z)`` every round.
"""

from __future__ import annotations

import dataclasses
import logging
import math

import exact as ex
from dpfl.accounting.observers import cohort_known_to
from dpfl.algorithms.dp_fedavg_user import NAME, DpFedAvgUserConfig, build
from dpfl.algorithms.registry import Setting
from dpfl.engine.boundary import Boundary
from dpfl.engine.sampling import ClientSampler
from dpfl.experiments.noise_level import declared_epsilon

logging.getLogger("absl").setLevel(logging.ERROR)

PLACEMENTS = ("server", "shares", "client")
SAMPLINGS = ("fixed", "poisson")
#: (boundary, observer) -> the view it sees: the sum, the sum less another silo's own message, the owner's message
SEES = {("plain", "third_party"): "sum", ("plain", "server"): "owner", ("plain", "other_silo"): "sum_minus_other",
        ("secagg", "third_party"): "sum", ("secagg", "server"): "sum", ("secagg", "other_silo"): "sum_minus_other",
        ("trusted", "third_party"): "sum", ("trusted", "other_silo"): "sum_minus_other"}


@dataclasses.dataclass(frozen=True)
class UserLevelCase:
    """M clients of ``records`` records each, a cohort rate q (fixed size: n = qM), z, T rounds, delta."""

    clients: int = 10
    rate: float = 0.4
    noise_multiplier: float = 1.5
    rounds: int = 3
    delta: float = 1e-5
    clip: float = 1.0
    lr: float = 0.5
    records: int = 3

    @property
    def cohort(self) -> int:
        return ClientSampler(self.clients, self.rate, "fixed").cohort_size

    def setting(self, sampling: str, analysis: str = "sound") -> Setting:
        return Setting(client_rate=self.rate, client_sampling=sampling, num_clients=self.clients,
                       train_counts=(self.records,) * self.clients, rounds=self.rounds, delta=self.delta,
                       analysis=analysis)

    def algorithm(self, placement: str, sampling: str, analysis: str = "sound", target_quantile=None,
                  count_noise=None):
        config = DpFedAvgUserConfig(local_steps=1, sample_rate=1.0, lr=self.lr, clip=self.clip,
                                    noise_multiplier=self.noise_multiplier, noise_at=placement,
                                    target_quantile=target_quantile, count_noise=count_noise)
        return build(NAME, config, self.setting(sampling, analysis))

    def claimed(self, alg, boundary: str, sampling: str, analysis: str = "sound",
                cohort: str = "secret") -> dict[str, float]:
        """The run's ledger after T rounds, as the simulator declares and accounts them (``cohort``: privacy.cohort)."""
        return declared_epsilon(alg, self.setting(sampling, analysis), Boundary(boundary, cohort=cohort),
                                ClientSampler(self.clients, self.rate, sampling))

    def exact_instance(self, placement: str, sampling: str, boundary: str, observer: str,
                       cohort: str = "secret") -> ex.Instance | None:
        """The instance towards ``observer`` (None: it sees an unnoised message), which knows the cohort or not as
        privacy.cohort = ``cohort`` says (``observers.cohort_known_to``). Server noise towards an observer that knows
        it: N(1, z^2) against N(0, z^2) in the rounds the owner takes part; towards one that does not: the Gaussian
        mixture over the owner's participation (1 - p) N(0, z^2) + p N(1, z^2) against N(0, z^2) every round (with
        the others' updates equal, a fixed-size cohort's sum is the same pair at p = n / M)."""
        view = SEES[(boundary, observer)]
        m, n, z = self.clients, self.cohort, self.noise_multiplier
        if placement == "server":
            if view == "owner" or observer == "server":
                return None
            knows = observer in cohort_known_to(boundary, cohort)

            def step(p: float) -> tuple:  # (participation, pair)
                return (p, ex.gaussian_pair(z)) if knows else (1.0, ex.poisson_pair(p, z))

            if observer == "other_silo" and sampling == "fixed":  # it knows whether itself is in the cohort
                p = n / m
                return ex.Instance(((1 - p, *step(n / (m - 1))), (p, *step((n - 1) / (m - 1)))))
            return ex.Instance(((1.0, *step(self.rate)),))
        share = ex.gaussian_pair(z / math.sqrt(n) if placement == "shares" else z)
        kind = "secagg" if boundary == "secagg" else "plain"
        return ex.observer_instance(observer, share, m, n, kind, sampling)

    def secret_cohort_instance(self) -> ex.Instance:
        """Server noise, Poisson cohorts, an observer of the models only: (1-q) N(0, z^2) + q N(1, z^2) vs N(0, z^2)."""
        return ex.Instance(((1.0, 1.0, ex.poisson_pair(self.rate, self.noise_multiplier)),))


__all__ = ["PLACEMENTS", "SAMPLINGS", "SEES", "UserLevelCase"]
