"""One tensor of per-client state (SCAFFOLD's control variates c_i, ...) stored only for the clients that have written
a row: every other client reads the initial row. A population of 10^5 clients of which a round's cohort of 10^3
writes holds cohort x rounds rows, not 10^5 (an MLP of 10^4 parameters: 40 MB a round's cohort, 4 GB dense).

Reads and writes are by client id, as on a dense [M, ...] tensor (``table[ids]``, ``table[ids] = rows``: ids unique
within a write, as a round's cohort is). Row 0 of the storage is the initial row and ``slot[i]`` is client i's row
(0 until it writes), so a read is one gather. ``state_dict`` lists the clients that hold a row, in the order they
first wrote, with their rows (what a checkpoint stores; ``from_state_dict`` restores the same table).
"""

from __future__ import annotations

import torch


class ClientTable:
    """[num_clients, *row_shape] per-client state, stored sparsely (module docstring)."""

    def __init__(self, num_clients: int, initial: torch.Tensor):
        """``initial``: the row every client starts from."""
        self.num_clients = num_clients
        self._rows = initial.detach().clone().unsqueeze(0)  # [capacity, *row]; row 0 the initial row
        self._held = 1  # rows in use, the initial row included
        self._slot = torch.zeros(num_clients, dtype=torch.long, device=initial.device)

    @classmethod
    def zeros(cls, num_clients: int, *row_shape: int, dtype: torch.dtype = torch.float32) -> "ClientTable":
        return cls(num_clients, torch.zeros(row_shape, dtype=dtype))

    # -- a tensor's reading ---------------------------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.num_clients, *self._rows.shape[1:]))

    @property
    def dtype(self) -> torch.dtype:
        return self._rows.dtype

    @property
    def device(self) -> torch.device:
        return self._rows.device

    @property
    def held(self) -> int:
        """The clients that hold a row of their own."""
        return self._held - 1

    @property
    def nbytes(self) -> int:
        """The bytes held: the rows in use (capacity not yet used aside) and the slot of every client."""
        return self._held * self._rows[0].nbytes + self._slot.nbytes

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        """[len(ids), *row] the rows of the clients ``ids`` (a copy)."""
        return self._rows[self._slot[ids]]

    def dense(self) -> torch.Tensor:
        """[num_clients, *row] every client's row (the initial row where it has none)."""
        return self._rows[self._slot]

    def __setitem__(self, ids: torch.Tensor, rows: torch.Tensor) -> None:
        """Writes ``rows`` [len(ids), *row] as the rows of the clients ``ids`` (unique)."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=self._slot.device).reshape(-1)
        fresh = ids[self._slot[ids] == 0]
        if fresh.numel():
            self._reserve(self._held + fresh.numel())
            self._slot[fresh] = torch.arange(self._held, self._held + fresh.numel(), device=self._slot.device)
            self._held += fresh.numel()
        self._rows[self._slot[ids]] = rows.to(self._rows.dtype)

    def _reserve(self, needed: int) -> None:
        """Room for ``needed`` rows: the capacity at least doubles, up to one row a client."""
        if needed <= self._rows.shape[0]:
            return
        capacity = min(max(needed, 2 * self._rows.shape[0]), self.num_clients + 1)
        grown = self._rows.new_empty((capacity, *self._rows.shape[1:]))
        grown[: self._held] = self._rows[: self._held]
        self._rows = grown

    def to(self, device: torch.device | str) -> "ClientTable":
        """This table on ``device`` (itself when it is there)."""
        if self.device == torch.device(device):
            return self
        moved = ClientTable.__new__(ClientTable)
        moved.num_clients, moved._held = self.num_clients, self._held
        moved._rows, moved._slot = self._rows[: self._held].to(device), self._slot.to(device)
        return moved

    # -- what a checkpoint stores ---------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """{"num_clients", "initial": the initial row, "clients": [held] in the order they first wrote, "rows":
        [held, *row] theirs}, on the CPU."""
        order = torch.argsort(self._slot)[self.num_clients - self.held:]  # slots 1..held-1, in slot order
        return {"num_clients": self.num_clients, "initial": self._rows[0].cpu(), "clients": order.cpu(),
                "rows": self._rows[1 : self._held].cpu()}

    @classmethod
    def from_state_dict(cls, data: dict) -> "ClientTable":
        """The table ``state_dict`` describes (``ValueError`` when its parts disagree)."""
        num_clients, initial, clients, rows = data["num_clients"], data["initial"], data["clients"], data["rows"]
        if not isinstance(num_clients, int) or not all(isinstance(t, torch.Tensor) for t in (initial, clients, rows)):
            raise ValueError("a client table needs num_clients (an int) and initial, clients, rows (tensors)")
        if (clients.dim() != 1 or rows.shape != (clients.numel(), *initial.shape)
                or (clients.numel() and not 0 <= int(clients.min()) <= int(clients.max()) < num_clients)
                or clients.unique().numel() != clients.numel()):
            raise ValueError(f"a client table's clients {tuple(clients.shape)} and rows {tuple(rows.shape)} disagree "
                             f"with its {num_clients} clients and initial row {tuple(initial.shape)}")
        table = cls(num_clients, initial)
        table[clients.long()] = rows
        return table


def is_table(value) -> bool:
    """Whether a state_dict entry describes a ``ClientTable``."""
    return isinstance(value, dict) and {"num_clients", "initial", "clients", "rows"} <= set(value)


__all__ = ["ClientTable", "is_table"]
