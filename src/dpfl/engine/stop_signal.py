"""Stopping a run between rounds on a signal: Ctrl-C (SIGINT) and SIGTERM (``kill PID``; what a job scheduler, a
container runtime or systemd sends to stop a process) both let the round in progress finish, so the run checkpoints,
writes results.json with status "stopped" and a reason naming the signal, and can be resumed (``Simulation.run``);
a second one aborts at once (``RunAborted``: the ledger already records the round's charge, so nothing spent is lost).
Before, SIGTERM ended the process where it stood, leaving results.json "running".

The handlers are installed only in the main thread (the only one Python delivers signals to): SIGINT's where SIGINT
is not ignored, SIGTERM's only where SIGTERM has its default action, so a host process that installed its own SIGTERM
handler (Flower's ServerApp process does) or ignores it keeps that behaviour. Each is restored on leaving the run.
"""

from __future__ import annotations

import signal
import sys
import threading

from dpfl.errors import RunAborted

#: The signals that stop a run after its round, and how messages (stopped_reason, the notice on stderr) name them.
STOP_SIGNALS = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class StopOnSignal:
    """Within ``with``: the first SIGINT or SIGTERM only sets ``requested`` to its number (the run finishes its round,
    checkpoints and stops); a second one of either raises ``RunAborted`` at once (module docstring)."""

    def __init__(self):
        self.requested: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "StopOnSignal":
        if threading.current_thread() is threading.main_thread():
            if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
                self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._handle)
            if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
                self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            raise RunAborted(signum)
        self.requested = signum
        name = STOP_SIGNALS[signum]
        print(f"\n{name}: stopping after this round ({name} again aborts now)", file=sys.stderr, flush=True)

    def __exit__(self, *exc_info) -> bool:
        for signum, previous in self._previous.items():  # None: a handler not installed from Python
            signal.signal(signum, signal.default_int_handler if previous is None and signum == signal.SIGINT else
                          signal.SIG_DFL if previous is None else previous)
        return False


__all__ = ["STOP_SIGNALS", "StopOnSignal"]
