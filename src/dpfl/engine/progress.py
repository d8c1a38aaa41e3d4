"""Progress that fits where it goes: a live bar on a terminal, a plain line every few seconds in a log."""

from __future__ import annotations

import sys
import time

#: Seconds between two plain progress lines when the output is not a terminal.
LINE_EVERY_S = 5.0


class Progress:
    """Reports rounds done, test accuracy and epsilon per observer: the latest epsilon reported, with its round when
    it is not this round's (an evaluation off run.epsilon_every's schedule reports none: ``epsilon_schedule``).

    On a terminal (stderr is a tty) a tqdm bar; otherwise one line per ``LINE_EVERY_S`` seconds, and the round the
    run ended at (its last round, or the round a stop came after: ``close`` prints it if it was not printed), so that
    a redirected run's log holds readable lines, not thousands of carriage-return frames, and ends where the run did.
    """

    def __init__(self, total: int, done: int, enabled: bool = True, stream=None):
        self.total, self.done = total, done
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self._bar = None
        self._last = -float("inf")
        self._unprinted = None  # the arguments of the latest update when its line was not printed
        self._epsilon: tuple[int, dict] | None = None  # (round, epsilon) of the latest update that reported epsilon
        if enabled and getattr(self.stream, "isatty", lambda: False)():
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, initial=done, unit="round", dynamic_ncols=True, file=self.stream)

    def update(self, round_done: int, accuracy: float | None = None, epsilon: dict | None = None,
               epsilon_round: int | None = None) -> None:
        """``epsilon``: as it stood after round ``epsilon_round`` (default ``round_done``; an earlier round's when its
        read finished only now: ``Simulation.settle_epsilon``)."""
        self.done = round_done
        if not self.enabled:
            return
        if epsilon is not None:
            self._epsilon = (round_done if epsilon_round is None else epsilon_round, epsilon)
        reported, shown = self._epsilon or (round_done, {})
        eps = ("" if reported == round_done else f"(round {reported}) ") + \
            ", ".join(f"{o}={_fmt(e)}" for o, e in shown.items()) if shown else ""
        if self._bar is not None:
            self._bar.update(round_done - self._bar.n)
            if accuracy is not None:
                self._bar.set_postfix_str(f"acc={accuracy:.3f} eps {eps}")
            return
        now = time.monotonic()
        if now - self._last >= LINE_EVERY_S or round_done == self.total:
            self._last = now
            self._unprinted = None
            acc = "" if accuracy is None else f", test accuracy {accuracy:.4f}"
            print(f"round {round_done}/{self.total}{acc}{', epsilon ' + eps if eps else ''}", file=self.stream,
                  flush=True)
        else:
            self._unprinted = (round_done, accuracy, epsilon, epsilon_round)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self._unprinted is not None:  # the run stopped early: its log ends with the round it stopped after
            self._last, pending, self._unprinted = -float("inf"), self._unprinted, None
            self.update(*pending)


class Heartbeat:
    """A line on stderr every ``every_s`` seconds once a computation has run ``after_s`` seconds, silent when it is
    quick: call it with the latest step's values, and ``describe`` turns them into the line (a calibration's trials)."""

    def __init__(self, describe, after_s: float = 2.0, every_s: float = 2.0, stream=None):
        self.describe, self.after_s, self.every_s = describe, after_s, every_s
        self.stream = stream
        self._start = time.monotonic()
        self._last = -float("inf")

    def __call__(self, *values) -> None:
        now = time.monotonic()
        if now - self._start >= self.after_s and now - self._last >= self.every_s:
            self._last = now
            print(self.describe(*values), file=self.stream or sys.stderr, flush=True)


def _fmt(eps) -> str:
    return "inf" if eps is None else f"{eps:.3g}"


__all__ = ["Progress", "Heartbeat", "LINE_EVERY_S"]
