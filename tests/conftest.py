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
    OpenMP thread made the suite take over 50 minutes. The default run is spread over one pytest-xdist worker process
    per logical core (pyproject.toml's ``-n logical``); this session fixture runs in each worker, so the workers
    together use one thread per core and do not oversubscribe it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True, scope="session")
def _runs_on_the_cpu_unless_a_test_names_a_gpu():
    """run.device 'auto' builds runs on the CPU in the tests, also on a machine with a GPU: the pinned numbers
    (tests/algorithms/golden*, tests/engine/) are the CPU's, whose random streams differ from a GPU's. A test of the
    GPU names run.device = 'cuda' (tests/engine/test_device.py); one of 'auto' itself calls
    dpfl.engine.device.resolve_device. Nothing is patched on a machine without a GPU."""
    if not torch.cuda.is_available():
        yield
        return
    from dpfl.engine import device
    from dpfl.experiments import assembly

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(assembly, "resolve_device",
                      lambda name: device.resolve_device("cpu" if name == "auto" else name))
        yield
