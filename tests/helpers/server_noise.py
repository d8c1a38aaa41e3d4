"""A test-only family whose server adds the noise (central DP), for the tests of the server's side of the contract
(``dpfl.engine.protocol.ServerContext``, ``Release.server_events``): no dpfl family draws on the server.

``central-gaussian``: one FedSGD step per round. Each client of the cohort sends the mean of its clipped gradients
over a fixed-size minibatch of floor(s n_i) of its records, WITHOUT noise (declared as non-private: the server sees
it); the server adds N(0, (z Delta)^2 I) to the cohort's sum, Delta = max_i 2C / floor(s n_i) (replace-one: one record
swapped moves its client's mean by at most 2C / floor(s n_i), and no other client's), and steps
x <- x - lr (sum + noise) / count. Its server keeps only x, computed from the noisy sum: what the observers of the
model are charged for (``dpfl.accounting.observers``, "The server's own noise").

``register_central_gaussian(monkeypatch)`` registers it for one test (pytest's ``monkeypatch`` removes it after).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from dp_accounting import dp_event

from dpfl.accounting.observers import Release
from dpfl.algorithms import registry
from dpfl.algorithms.registry import AlgorithmSpec, Setting
from dpfl.engine.boundary import Delivery
from dpfl.engine.protocol import Algorithm, ClientContext, ClientData, ClientOutput, ServerContext, State
from dpfl.engine.sampling import RecordSampler
from dpfl.noise import GaussianMechanism

NAME = "central-gaussian"


@dataclass(frozen=True)
class CentralGaussian(Algorithm):
    """See the module docstring."""

    lr: float
    clip: float
    sampler: RecordSampler
    mechanism: GaussianMechanism
    #: Delta, the largest client's l2 sensitivity of its mean (the sum's, for the worst record owner)
    sensitivity: float

    neighboring = "replace_one"

    def init_state(self, x0: torch.Tensor, num_clients: int) -> State:
        return State({"x": x0.clone()})

    def release(self, round_index: int, state: State, counts: torch.Tensor) -> Release:
        """The clients' means unnoised (the server sees them), the server's one Gaussian draw around record
        sampling at the largest sampling ratio."""
        return Release((dp_event.NonPrivateDpEvent(),), (True,),
                       server_events=(self.sampler.event(self.mechanism.event, counts),))

    def examples_per_client(self, counts: torch.Tensor) -> int:
        return int(self.sampler.batch_sizes(counts).max())

    def client_round(self, round_index: int, server: dict, clients: dict, data: ClientData,
                     ctx: ClientContext) -> ClientOutput:
        x = server["x"]
        keys = ctx.streams("records").uniform([(int(c),) for c in data.counts])
        indices, mask = self.sampler.sample(data.counts, keys)
        xb, yb = data.batch(indices)
        point = x.expand(data.counts.shape[0], x.shape[-1])
        divisor = self.sampler.divisor(data.counts).to(x.dtype).unsqueeze(1)
        mean = ctx.grads.clipped_sum(point, xb, yb, mask, self.clip) / divisor
        return ClientOutput({"g": mean}, {}, [dp_event.NonPrivateDpEvent()])

    def server_update(self, round_index: int, server: dict, delivered: Delivery, ctx: ServerContext) -> dict:
        """x - lr (sum + N(0, (z Delta)^2 I)) / count, row-wise where the state carries a leading row axis."""
        if delivered.count == 0:
            return server
        total = delivered.sum("g")
        rows = total.reshape(-1, total.shape[-1])
        noise = ctx.streams("server_noise").normal(tuple(total.shape[-1:])).reshape(rows.shape)
        noisy, event = self.mechanism(rows, torch.full((rows.shape[0],), self.sensitivity), noise)
        ctx.drew(event)
        return {"x": server["x"] - self.lr * noisy.reshape(total.shape) / delivered.count}


@dataclass(frozen=True)
class CentralGaussianConfig:
    sample_rate: float = field(default=0.5, metadata={"help": "s, each minibatch is floor(s n_i) records"})
    lr: float = field(default=0.5, metadata={"help": "the server's step"})
    clip: float = field(default=1.0, metadata={"help": "C, the per-example l2 clip norm"})
    noise_multiplier: float = field(default=1.0, metadata={"help": "z, the server's noise multiplier"})


def build(name: str, config: CentralGaussianConfig, setting: Setting) -> CentralGaussian:
    sampler = RecordSampler(config.sample_rate, "fixed")
    counts = torch.tensor(setting.train_counts or (1,))  # no counts (validation without data): one record each
    return CentralGaussian(config.lr, config.clip, sampler, GaussianMechanism(config.noise_multiplier),
                           float(sampler.mean_sensitivity(config.clip, counts).max()))


SPEC = AlgorithmSpec(names=(NAME,), config=CentralGaussianConfig, build=build, private=lambda name: True,
                     help="test only: FedSGD whose server adds the Gaussian noise (central DP)")


def register_central_gaussian(monkeypatch) -> None:
    """Registers ``central-gaussian`` until the calling test ends."""
    registry.specs()  # dpfl's own families first, as in every run
    monkeypatch.setitem(registry._REGISTRY, NAME, SPEC)
