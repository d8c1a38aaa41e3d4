"""Shared fixtures."""

import pytest
import torch


@pytest.fixture
def one_torch_thread():
    """Runs a test with one torch thread (restored after): these tests run small tensors, where a second OpenMP thread
    only waits for the first's time slices (10-30x slower on a 2-core machine shared with other work)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread_everywhere():
    """The whole default run uses one torch thread (as runs do, run.threads unset): on a busy 2-core machine a second
    OpenMP thread made the suite take over 50 minutes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
