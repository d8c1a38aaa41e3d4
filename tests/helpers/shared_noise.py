"""A planted bug for the audit's tests: every client of an audited trial draws the SAME noise."""

import torch

from dpfl.engine import randomness


def share_noise_streams(monkeypatch, clients: int) -> None:
    """Patches ``ClientStreams`` so that the "noise" streams of an audit's trial rows are named without the client:
    audit stream ids are (world * N + trial) * M + client, mapped to the trial's first client's, each row drawing
    from that id's own stream (the trials' batched stream would give rows distinct draws)."""
    original = randomness.ClientStreams.__init__

    def shared(self, seed, round_index, ids, purpose, batched=False):
        ids = torch.as_tensor(ids)
        if purpose == "noise":
            ids, batched = ids - ids % clients, False
        original(self, seed, round_index, ids, purpose, batched)

    monkeypatch.setattr(randomness.ClientStreams, "__init__", shared)
