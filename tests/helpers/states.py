"""Comparing algorithm states in tests: a ``ClientTable`` (sparse per-client rows) compares by its every row."""

import torch

from dpfl.engine.client_table import ClientTable, is_table
from dpfl.engine.protocol import State


def dense(value):
    """A state tensor as it is, or a ``ClientTable``'s [num_clients, *row] rows, also from a checkpoint's entry (its
    ``state_dict``: the clients that hold rows, in the order they first wrote, and their rows; two runs compare by
    every client's row, whatever the order of their storage)."""
    if is_table(value):
        value = ClientTable.from_state_dict(value)
    return value.dense() if isinstance(value, ClientTable) else value


def states_equal(a: State, b: State) -> bool:
    """The same names and bit-equal tensors (every client's row of a table) in both parts."""
    return all(set(getattr(a, part)) == set(getattr(b, part)) and
               all(torch.equal(dense(getattr(a, part)[k]), dense(getattr(b, part)[k])) for k in getattr(a, part))
               for part in ("server", "clients"))
