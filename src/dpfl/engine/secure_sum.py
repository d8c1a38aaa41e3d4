"""The cohort's sum through real secure aggregation: quantise, mask, sum mod 2^bits, decode.

What ``Boundary.collect`` runs when ``privacy.secure_aggregation = true`` (the simulated sum otherwise):

1. every client's messages are flattened into one vector of d coordinates and clamped to [-B_k, B_k] per message k
   (``bounds``, the algorithm's ``message_bound``: a client-side post-processing that, at the bounds dpfl's
   algorithms give, touches a coordinate only beyond 12 noise standard deviations);
2. scaled by s = (floor((2^(bits-1) - 1) / n) - 1) / max_k B_k and rounded at random without bias (``Discretisation``,
   Agarwal, Kairouz, Liu 2021, Sec. 4), each client from its own stream (purpose "rounding"), so that n clients'
   values can never wrap around (``check_headroom``);
3. summed by the Bonawitz et al. 2017 protocol (``dpfl.protocols.secagg.simulate_round``: every message is bytes,
   keys from the operating system; the server learns only the sum of the clients whose masked input arrived), with
   the protocol's threshold t = ``min_clients`` (None: every invited client must finish); on Flower the parties are
   apart: each node encodes its own messages (``encode``) and the protocol runs across the nodes
   (``dpfl.flower.secure_sum``);
4. decoded to a signed sum and divided by s.

The decoded sum differs from the simulated one by the rounding, below n / s per coordinate (n^2 max B / 2^(bits-1)).
A round with too few clients left, or a malformed, replayed or out-of-round message, raises ``SecAggError`` and the
server's step does not run (no partial update); the ledger charged the round before any noise was drawn.

Integer messages (an algorithm that discretises itself, e.g. dp-fedavg-joint with ``noise = "skellam"``) skip steps 1
and 2: their bounds are in integer units, they are wrapped as they are and the decoded integer sum is exact
(``integer_ring`` refuses a round that could wrap around); the algorithm divides by its own scale.

Privacy of real messages: the ledger charges the continuous Gaussian shares the clients drew
(``dpfl.accounting.observers``). The server sees the sum of each client's randomly rounded update rather than the
rounded sum; the difference (at most n / s per coordinate, ~1e-7 of the clamping bound at 32 bits and 50 clients) is
not in the accounting of this Gaussian path. The Skellam path of dp-fedavg-joint (``dpfl.algorithms.joint_skellam``)
rounds before its noise and has the rounding in its accounting.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from dpfl.engine.randomness import ClientStreams
from dpfl.errors import ConfigError, check_range
from dpfl.protocols.quantize import Discretisation, OverflowRiskError
from dpfl.protocols.secagg import simulate_round


@dataclass(frozen=True)
class SecureAggregation:
    """The protocol's settings (module docstring).

    Attributes:
      bounds: message name -> B, the largest |coordinate| encoded (larger ones are clamped).
      bits: the ring Z_(2^bits).
      min_clients: t, the fewest clients a round may finish with (the protocol's threshold, > half the cohort).
      dropouts: client id -> the protocol stage it leaves at, in every round it is in (to simulate dropouts).
    """

    bounds: Mapping[str, float]
    bits: int = 32
    min_clients: int | None = None
    dropouts: Mapping[int, str] = field(default_factory=dict)

    def __post_init__(self):
        check_range("privacy.secagg_bits", self.bits, 8, 63, integer=True)
        for name, bound in self.bounds.items():
            check_range(f"message_bound[{name!r}]", bound, 0.0, low_open=True)

    def threshold(self, invited: int) -> int:
        """t for a round of ``invited`` clients: min_clients (at most the cohort, more than half of it)."""
        wanted = invited if self.min_clients is None else min(self.min_clients, invited)
        return max(wanted, invited // 2 + 1)

    def sum(self, rows: dict[str, torch.Tensor], clients: torch.Tensor, seed: int, round_index: int,
            stream_ids: torch.Tensor | None = None):
        """(sums, contributors): the decoded sum of each message over the clients whose masked input arrived
        (``stream_ids``: as in ``encode``)."""
        n = int(clients.numel())
        encoded = self.encode(rows, clients, seed, round_index, stream_ids=stream_ids)
        result = simulate_round(encoded, self.threshold(n), self._leaving(clients), self.bits, None, round_index,
                                clients.tolist())
        return self.decode(result.total, rows, n), result.contributors

    def encode(self, rows: dict[str, torch.Tensor], clients: torch.Tensor, seed: int, round_index: int,
               cohort: int | None = None, stream_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Steps 1 and 2 (module docstring) for ``clients``, a part of a cohort of ``cohort`` clients (default: all
        of it): their messages ``rows`` (leading client axis) as [clients, d] integers in [0, 2^bits), each rounded
        from its own stream (so a client encoding its own row alone gets what the whole cohort's encoding gives),
        the one its ``stream_ids`` names (default: its client id; the audit's trials name each row's own)."""
        n = int(clients.numel())
        integer = self._integer(rows)
        flat = torch.cat([rows[k].reshape(n, -1).to(torch.int64 if integer else torch.float64) for k in rows], 1)
        limit = torch.cat([torch.full((rows[k][0].numel(),), float(self.bounds[k]), dtype=torch.float64)
                           for k in self._names(rows)])
        ring = self.ring(rows, n if cohort is None else cohort)
        if integer:
            beyond = flat.abs().to(torch.float64) > limit
            if bool(beyond.any()):
                client = int(clients[int(beyond.any(1).nonzero()[0])])
                raise OverflowRiskError(f"client {client}'s integer message exceeds the bound it declared (up to "
                                        f"{float(limit.max()):.4g} per coordinate): the sum could wrap around mod "
                                        "2^bits")
            return ring.wrap(flat)
        uniform = ClientStreams(seed, round_index, clients if stream_ids is None else stream_ids,
                                "rounding").uniform([(flat.shape[1],)] * n)
        return ring.encode(torch.maximum(torch.minimum(flat, limit), -limit), uniform.to(torch.float64))

    def decode(self, total: torch.Tensor, rows: dict[str, torch.Tensor], cohort: int) -> dict[str, torch.Tensor]:
        """Step 4: the sum mod 2^bits of a cohort's encoded ``rows`` back into each message's shape and dtype (only
        the rows' shapes and dtypes are read: they may be tensors on the "meta" device, which hold no values)."""
        values = self.ring(rows, cohort).decode(total)
        if self._integer(rows):
            values = values.round().to(torch.int64)  # |total| < 2^(bits-1) <= 2^62: exact in float64 below 2^53
        sums, start = {}, 0
        for k in rows:
            width = rows[k][0].numel()
            sums[k] = values[start : start + width].reshape(rows[k].shape[1:]).to(rows[k].dtype)
            start += width
        return sums

    def ring(self, rows: dict[str, torch.Tensor], cohort: int) -> Discretisation:
        """The discretisation of step 2 for the messages ``rows`` of a cohort of ``cohort`` clients: the scale s at
        which ``cohort`` clients' values never wrap around (scale 1 for integer messages, ``integer_ring``)."""
        largest = max(float(self.bounds[k]) for k in self._names(rows))
        if self._integer(rows):
            return self.integer_ring(largest, cohort)
        per_client = (2 ** (self.bits - 1) - 1) // cohort - 1  # ceil(s B) <= per_client + 1: n of them never wrap
        if per_client < 1:
            raise ConfigError("privacy.secagg_bits", self.bits,
                              f"more bits: {cohort} clients do not fit in 2^{self.bits}")
        ring = Discretisation(per_client / largest, self.bits)
        ring.check_headroom(largest, cohort, dimension=sum(rows[k][0].numel() for k in rows))
        return ring

    def integer_ring(self, largest: float, cohort: int) -> Discretisation:
        """The ring for integer messages (already discretised by the algorithm, e.g. Skellam shares): wrapped as they
        are, no clamping (which would break their sum); the bounds are in integer units, and a round is refused
        (``OverflowRiskError``) before anything is sent when ``cohort`` clients' bounds could wrap around."""
        ring = Discretisation(1.0, self.bits)
        if cohort * largest > ring.modulus // 2 - 1:
            raise OverflowRiskError(
                f"{cohort} clients' integer messages of up to {largest:.4g} per coordinate can sum to "
                f"{cohort * largest:.4g}, beyond 2^(bits-1) - 1 = {ring.modulus // 2 - 1} for privacy.secagg_bits = "
                f"{self.bits}: the sum would wrap around. Raise privacy.secagg_bits or lower the algorithm's scale "
                "(algorithm.skellam_scale)")
        return ring

    @staticmethod
    def _integer(rows: dict[str, torch.Tensor]) -> bool:
        """Whether the messages are integers (all of them; ValueError for a mix: one kind is summed)."""
        integer = [k for k in rows if not rows[k].dtype.is_floating_point]
        if integer and len(integer) != len(rows):
            raise ValueError(f"messages {integer} are integers and the others are not: secure aggregation sums one kind")
        return bool(integer)

    def _names(self, rows: dict[str, torch.Tensor]) -> list[str]:
        """The messages' names, each with a bound (ConfigError otherwise)."""
        missing = sorted(set(rows) - set(self.bounds))
        if missing:
            raise ConfigError("privacy.secure_aggregation", True,
                              f"an algorithm that bounds every message it sends (no bound for {missing})")
        return list(rows)

    def _leaving(self, clients: torch.Tensor) -> dict[int, str]:
        present = set(clients.tolist())
        return {c: stage for c, stage in self.dropouts.items() if c in present}


__all__ = ["SecureAggregation"]
