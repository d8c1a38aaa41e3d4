"""run.device: where a run's tensors live, and how much memory one chunk of the cohort's work may take there.

A run's data, model parameters, client state, per-example gradients, noise and evaluation are on one torch device;
its ledger, accounting, results and checkpoints are device-independent (a checkpoint holds CPU tensors and is loaded
onto the resuming run's device: ``dpfl.engine.checkpoint``).

``resolve_device`` reads the config value: "auto" (CUDA when torch sees a GPU, else the CPU), "cpu", "cuda" (the
current GPU) or "cuda:N". Asking for a GPU torch cannot use is a ConfigError naming run.device, before any data is
built.

On the CPU the cohort is chunked to run.memory_mb; on a GPU to a share of the memory free on it when the run is built
(``chunk_budget_bytes``: ``torch.cuda.mem_get_info``), which is what bounds the work there, not the host's RAM.
"""

from __future__ import annotations

import contextlib
import re

import torch

from dpfl.errors import ConfigError

DEVICES = ("auto", "cpu", "cuda", "cuda:N")
#: The share of a GPU's free memory one chunk of the cohort's work may take: the rest is left for the allocator's
#: fragmentation, the evaluation's batches and the model's state (torch's caching allocator keeps freed blocks).
GPU_MEMORY_SHARE = 0.5
_CUDA = re.compile(r"cuda(?::(\d+))?")


def resolve_device(name: str) -> torch.device:
    """The torch device of a run.device value (``DEVICES``); a ConfigError naming run.device for any other value, and
    for a GPU torch cannot use here (no CUDA build, no GPU, or no GPU of that index)."""
    if not isinstance(name, str):
        raise ConfigError("run.device", name, f"one of {list(DEVICES)}")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    match = _CUDA.fullmatch(name)
    if match is None:
        raise ConfigError("run.device", name, f"one of {list(DEVICES)} (N: a GPU's index, from 0)")
    if not torch.cuda.is_available():
        built = "torch's CUDA build" if torch.version.cuda is None else "a GPU torch can use"
        raise ConfigError("run.device", name, f"'cpu' or 'auto' on this machine: torch sees no GPU (install {built}; "
                                              "see the README's GPU section)")
    index = int(match.group(1) or 0)
    count = torch.cuda.device_count()
    if index >= count:
        raise ConfigError("run.device", name, f"'cuda' or 'cuda:N' with N below {count}: torch sees {count} GPU(s)")
    return torch.device(name)


def chunk_budget_bytes(device: torch.device, memory_budget_bytes: int) -> int:
    """Bytes one chunk of the cohort's client work may take on ``device``: run.memory_mb's ``memory_budget_bytes``
    on the CPU; on a GPU ``GPU_MEMORY_SHARE`` of the memory free on it now (``torch.cuda.mem_get_info``)."""
    if device.type != "cuda":
        return memory_budget_bytes
    free, _total = torch.cuda.mem_get_info(device)
    return int(free * GPU_MEMORY_SHARE)


def stream_identity(device: torch.device) -> str:
    """What a round's draws depend on besides the noise key: "" on the CPU (torch's CPU generator, the same on every
    machine); on a GPU its kind (CUDA's Philox generator, and that GPU's float rounding), so that a round replayed on
    another kind of device, which draws other noise onto the same state, is a new release
    (``dpfl.engine.simulator.Simulation._fingerprint``)."""
    if device.type == "cpu":
        return ""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return f"{device.type} {name}".strip()


@contextlib.contextmanager
def full_float32_matmuls():
    """float32 matrix products at full float32 precision inside (torch's "highest"; the user's setting is restored
    after). A mechanism whose clipped sum is computed apart from its norms (the ghost strategy: norms from activation
    and output-gradient norms, the sum from a product of them) holds its sensitivity C only to the products' rounding:
    float32's 2^-24, not the 2^-11 of TF32 (CUDA's "high") or bfloat16 (a CPU's "medium")."""
    precision = torch.get_float32_matmul_precision()
    if precision == "highest":
        yield
        return
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(precision)


def on_device(device: torch.device):
    """A context in which tensors are created on ``device`` by default (the algorithms' own ``torch.zeros``, the
    random streams' generators: ``dpfl.engine.randomness``); on the CPU no context at all, so that the CPU path pays
    no per-operation dispatch for it."""
    return contextlib.nullcontext() if device.type == "cpu" else torch.device(device)


__all__ = ["DEVICES", "GPU_MEMORY_SHARE", "resolve_device", "chunk_budget_bytes", "stream_identity",
           "full_float32_matmuls", "on_device"]
