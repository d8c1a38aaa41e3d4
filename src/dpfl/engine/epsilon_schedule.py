"""Which evaluated rounds carry epsilon (``run.epsilon_every``): epsilon is computed where it is read.

Every round's privacy is charged to the ledger before the round draws its noise, whatever this schedule says (a budget
is checked there, ``dpfl.accounting.ledger``); what the schedule decides is only which results.json rows, progress lines
and TensorBoard points *report* epsilon. Reporting it costs one accounting per observer (a PLD self-composition by FFT,
or an RDP curve), which on a small model is most of a round (about 15 ms a round at 1000 users, against 9 ms of
training), so a row off the schedule carries ``"epsilon": null`` (the whole dict: distinct from ``{observer: null}``, an
infinite epsilon) and its readers skip it. A scheduled read runs on the ledger's background thread while the next
rounds train (``PrivacyLedger.epsilon_through_later``); ``Simulation.run`` joins it at the latest at the next checkpoint,
the last round or a stop, so a results.json written meanwhile shows that row's epsilon null until a later write.

* ``"auto"`` (the default): rounds 1, 2, 4, 8, ... (powers of two: the curve's shape at a cost of log2 T accountings),
  every checkpoint round (multiples of run.checkpoint_every: the checkpoint's ledger.json computes each observer's
  epsilon anyway, so the row's is free through the ledger's memo) and the run's last round;
* an integer k >= 1: every k-th round and the last (1: every evaluated round).

A row carries epsilon only where it is evaluated too (run.eval_every). The schedule is a function of the round and the
config alone, not of what the ledger happens to have computed (its budget checks, its memo), so a resumed run's rows
are those of an uninterrupted one. The numbers a row carries are exactly a fresh ledger's, and results.json's final
epsilon is always computed (at the end of a run and at any stop); the whole curve, every round, is there on demand
(``dpfl.Results.epsilon_curve``, from the ledger's journal).
"""

from __future__ import annotations

from dpfl.errors import ConfigError

AUTO = "auto"
#: what run.epsilon_every may be
ALLOWED = "'auto' (rounds 1, 2, 4, 8, ..., every checkpoint and the last) or an integer k >= 1 (every k-th round " \
          "and the last)"


def check_epsilon_every(value) -> int | str:
    """``value`` if it is "auto" or an integer >= 1; else ConfigError naming run.epsilon_every."""
    if value == AUTO or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ConfigError("run.epsilon_every", value, ALLOWED)


def epsilon_due(round_done: int, rounds: int, every: int | str, checkpoint_every: int) -> bool:
    """Whether the evaluation after round ``round_done`` (numbered from 1) of a run of ``rounds`` reports epsilon
    (module docstring)."""
    if round_done >= rounds:
        return True
    if every == AUTO:
        return round_done & (round_done - 1) == 0 or round_done % checkpoint_every == 0
    return round_done % every == 0


__all__ = ["AUTO", "ALLOWED", "check_epsilon_every", "epsilon_due"]
