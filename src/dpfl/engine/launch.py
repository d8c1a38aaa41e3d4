"""`dpfl run CONFIG --nproc N`: N local processes, the ranks of one run (``dpfl.engine.ranks``), on gloo over
127.0.0.1 and a free port.

The parent starts the N ranks (`python -m dpfl.cli run ...` with torchrun's variables RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; each in a session of its own, so that a terminal's Ctrl-C reaches them once, through the
parent), forwards SIGINT and SIGTERM to every rank (the ranks agree to stop after the same round:
``Ranks.agreed_signal``; a second signal aborts them at once), and waits. Rank 0's standard output and error are the
run's; the other ranks' standard output is discarded (they print nothing there) and their errors are shown.

Its exit status is the first non-zero one a rank ended with (128 + the signal for a rank a signal ended, as a shell
reports it), else 0; ranks that agree on a stop (a budget, a divergence, an interrupt) all end with its status. A rank
that ends while others run leaves them waiting for it in a collective: they are killed ``GRACE_SECONDS`` after it
(their run directory is crash-safe: ``--resume`` continues it).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import time
from pathlib import Path

#: The variable that tells a rank `dpfl run --nproc N` started it, with N (its resume command says --nproc N)
NPROC = "DPFL_NPROC"
#: How long the other ranks may run on after one ended with a non-zero status before they are killed
GRACE_SECONDS = 5.0
_POLL_SECONDS = 0.05


def launch(command: list[str], nproc: int) -> int:
    """Runs ``command`` (`python -m dpfl.cli run ...` for `dpfl run --nproc`) as ``nproc`` ranks (module
    docstring); their exit status."""
    source = str(Path(__file__).resolve().parents[2])  # the dpfl the parent runs, whatever its sys.path
    environment = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
                   "WORLD_SIZE": str(nproc), NPROC: str(nproc),
                   "PYTHONPATH": os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH")) if p)}
    ranks = [subprocess.Popen(command, start_new_session=True,
                              env={**environment, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                              stdout=None if rank == 0 else subprocess.DEVNULL)
             for rank in range(nproc)]

    def forward(signum, frame) -> None:
        for process in ranks:
            if process.poll() is None:
                process.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _wait(ranks)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for process in ranks:  # the parent itself was stopped (an exception): no rank outlives it
            if process.poll() is None:
                process.kill()
                process.wait()


def _wait(ranks: list[subprocess.Popen]) -> int:
    """Waits for every rank; the first non-zero status (module docstring), killing the ranks left
    ``GRACE_SECONDS`` after it."""
    status, deadline = 0, None
    while any(process.poll() is None for process in ranks):
        for process in ranks:
            code = process.poll()
            if code and not status:
                status, deadline = 128 - code if code < 0 else code, time.monotonic() + GRACE_SECONDS
        if deadline is not None and time.monotonic() > deadline:
            for process in ranks:
                if process.poll() is None:
                    process.kill()
        time.sleep(_POLL_SECONDS)
    for process in ranks:
        if process.returncode and not status:
            status = 128 - process.returncode if process.returncode < 0 else process.returncode
    return status


#: Where ``free_port`` looks first: below the system's ephemeral range (Linux: 32768-60999), from this port up
LOWEST_PORT = 20000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_TRIES = 64


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now, for rank 0's store, which binds it a few seconds later (after torch is
    imported). The system's own choice (bind to port 0) comes from the ephemeral range, from which every outgoing
    connection on the machine also takes its source port (gloo's, another run's), so one of them can take it in
    between; the port is therefore drawn at random below that range, where only explicit binds go, and checked free.
    Where the range is unknown (not Linux) or no port below it is free, the system's choice."""
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = LOWEST_PORT
    for _ in range(_TRIES if low > LOWEST_PORT else 0):
        port = LOWEST_PORT + secrets.randbelow(low - LOWEST_PORT)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


__all__ = ["NPROC", "GRACE_SECONDS", "launch", "free_port"]
