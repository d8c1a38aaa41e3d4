"""Epsilon read on the ledger's background thread (``PrivacyLedger.epsilon_through_later``) is the synchronous read's
number exactly: asked before later rounds are recorded (the compositions are taken when it is asked), while a budget
check accounts on the main thread, and through a whole run (results.json's rows, the checkpoint's history)."""

import json
import math
import threading
import time

import pytest
import torch
from dp_accounting import dp_event

import dpfl
from dpfl.accounting import ledger as ledger_module
from dpfl.accounting import pld, pld_power
from dpfl.accounting.ledger import PrivacyLedger

DELTA = 1e-6
OBSERVERS = ("third_party", "server")


def events(q: float) -> dict[str, dp_event.DpEvent]:
    sampled = dp_event.PoissonSampledDpEvent(q, dp_event.GaussianDpEvent(1.0))
    return {"third_party": sampled, "server": dp_event.SelfComposedDpEvent(sampled, 2)}


def fresh_through(played: list[dict], t: int) -> dict[str, float]:
    """``epsilon_through(t)`` of a new ledger that recorded ``played`` with every composition cache emptied."""
    pld._CACHE.clear()
    pld_power._MOMENTS.clear()
    ledger = PrivacyLedger(OBSERVERS, DELTA, neighboring="add_remove")
    for r, round_events in enumerate(played, start=1):
        ledger.record(r, round_events)
    return ledger.epsilon_through(t)


@pytest.mark.parametrize("budget", [None, {"third_party": 50.0}])
def test_a_background_read_is_the_synchronous_read_of_the_rounds_recorded_when_asked(budget):
    """Each round's read is asked right after it is recorded and collected only after every round (two events, so
    the compositions differ from round to round): rounds recorded meanwhile, whose budget checks account on this
    thread while the reads run on the other, change none of them."""
    played = [events(q) for q in (0.2, 0.2, 0.3, 0.2, 0.3, 0.3)]
    ledger = PrivacyLedger(OBSERVERS, DELTA, budget, neighboring="add_remove")
    reads = []
    for t, round_events in enumerate(played, start=1):
        ledger.record(t, round_events)
        reads.append(ledger.epsilon_through_later(t))
    for t, read in enumerate(reads, start=1):
        expected = fresh_through(played, t)
        assert read.result() == expected, t  # the same operations: equal, not merely within 1e-9
        assert 0 < expected["third_party"] < expected["server"] < math.inf
    assert ledger.epsilon_through_later(3).result() == fresh_through(played, 3)  # asked after: the round's own


def test_a_read_already_accounted_is_answered_at_once():
    ledger = PrivacyLedger(OBSERVERS, DELTA, neighboring="add_remove")
    ledger.record(1, events(0.2))
    spent = ledger.epsilon()
    read = ledger.epsilon_through_later(1)
    assert read.done() and read.result() == spent


def test_a_non_private_round_reads_infinity():
    ledger = PrivacyLedger(OBSERVERS, DELTA, neighboring="add_remove")
    ledger.record(1, {"third_party": dp_event.NonPrivateDpEvent(), "server": dp_event.NonPrivateDpEvent()})
    assert ledger.epsilon_through_later(1).result() == {"third_party": math.inf, "server": math.inf}


def test_a_run_reports_every_scheduled_epsilon_in_results_and_checkpoint(tmp_path):
    """A run through ``dpfl.run`` whose reads went to the background: results.json's rows carry epsilon exactly where
    run.epsilon_every schedules it (1, 2, 4, 5: the last round; rows 3 null), each the ledger's synchronous read of
    that round, and the checkpoint's history carries the same rows (every read joined before it is written)."""
    config = {"algorithm": {"name": "dp-fedavg", "rounds": 5}, "data": {"num_clients": 8, "samples_per_client": 20},
              "run": {"noise_seed": 0, "checkpoint_every": 4}}
    dpfl.run(config, out=tmp_path)
    rows = json.loads((tmp_path / "results.json").read_text())["rounds"]
    ledger = PrivacyLedger.load(tmp_path / "ledger.json")
    assert [r["round"] for r in rows if r["epsilon"] is not None] == [1, 2, 4, 5]
    for row in rows:
        if row["epsilon"] is not None:
            expected = ledger.epsilon_through(row["round"])
            assert row["epsilon"] == {o: None if math.isinf(e) else e for o, e in expected.items()}
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=False)  # written after round 5, the last
    assert [m["epsilon"] for m in saved["history"]] == [r["epsilon"] for r in rows]


def test_a_row_written_before_its_epsilon_was_read_is_written_again_with_it(tmp_path):
    """results.json encodes each row once, except a row written with "epsilon": null that has one since."""
    from dpfl.experiments.results_file import ResultsFile

    results = ResultsFile(tmp_path / "results.json")
    rows = [{"round": 1, "epsilon": {"server": 0.5}}, {"round": 2, "epsilon": None}]
    results.write({"rounds": rows})
    rows[1] = {"round": 2, "epsilon": {"server": 0.7}}
    results.write({"rounds": [*rows, {"round": 3, "epsilon": None}]})
    written = json.loads((tmp_path / "results.json").read_text())["rounds"]
    assert [r["epsilon"] for r in written] == [{"server": 0.5}, {"server": 0.7}, None]


def test_the_reader_thread_leaves_stop_signals_to_the_main_thread():
    """SIGINT and SIGTERM are blocked on the reader thread, so the kernel never hands them to it (there CPython 3.11
    would run the run's stop handler late: ``dpfl.engine.stop_signal``)."""
    import signal

    from dpfl.accounting import ledger

    mask = ledger._READER.submit(signal.pthread_sigmask, signal.SIG_BLOCK, []).result()
    assert {signal.SIGINT, signal.SIGTERM} <= mask
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # this thread's: untouched


def test_the_accountant_named_each_round_is_the_one_that_answers():
    """``accountants()`` bounds "tightest"'s choice by the compositions of the same events decided before (the
    composition doubled, tried first): at every round it names what a fresh "tightest" accountant of the round's
    composition chooses, across the round where the PLD grows beyond pld.MAX_POINTS and RDP takes over."""
    from dpfl.accounting import accountants
    from dpfl.accounting.accountant import NEIGHBORING

    event = dp_event.GaussianDpEvent(0.25)  # mu = 8 a round: the PLD's losses pass 200 (MAX_POINTS) within 20 rounds
    ledger = PrivacyLedger(["server"], DELTA, neighboring="add_remove")
    named = []
    for t in range(1, 21):
        ledger.record(t, {"server": event})
        fresh = accountants.make("tightest", NEIGHBORING["add_remove"]).compose(event, t)
        named.append((ledger.accountants()["server"], accountants.chosen_name(fresh)))
    assert all(ours == theirs for ours, theirs in named), named
    assert named[0][1] == "pld" and named[-1][1] == "rdp"


def test_a_curve_two_threads_ask_for_at_once_is_computed_once(monkeypatch):
    """The RDP curves are looked up one at a time (``rdp._CURVES``): the ledger's reader thread and the round's thread
    asking for the same new curve (seconds for a subsampled Gaussian's fractional orders) compute it once."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    from dpfl.accounting import rdp

    computed, compute = [], rdp._compute_curve

    def slow(event, *args):
        computed.append(repr(event))
        time.sleep(0.2)  # both threads ask while the first computes
        return compute(event, *args)

    monkeypatch.setattr(rdp, "_compute_curve", slow)
    event = dp_event.PoissonSampledDpEvent(0.37, dp_event.GaussianDpEvent(1.3))  # used by no other test
    with ThreadPoolExecutor(2) as pool:
        curves = list(pool.map(lambda _: rdp.rdp_curve(event, [2.0, 4.0]), range(2)))
    assert np.array_equal(curves[0], curves[1]) and computed.count(repr(event)) == 1


def test_an_accounting_a_round_waits_for_goes_before_the_reads_waiting():
    """The accounting lock (``ledger._ACCOUNTING``) is handed to a waiting thread of the round's path (here the main
    thread) before a waiting read (the reader thread), whichever asked first; a read then gets it."""
    order, holding = [], threading.Event()
    ledger_module._ACCOUNTING.__enter__()  # held, as by an accounting in progress
    try:
        read = ledger_module._READER.submit(_take_lock, order, "read")
        _wait_until(lambda: ledger_module._ACCOUNTING._waiting_reads == 1)
        round_path = threading.Thread(target=_take_lock, args=(order, "round", holding))
        round_path.start()
        _wait_until(lambda: ledger_module._ACCOUNTING._urgent == 1)
    finally:
        ledger_module._ACCOUNTING.__exit__(None, None, None)
    round_path.join(10)
    read.result(10)
    assert order == ["round", "read"] and holding.is_set()


def _take_lock(order: list, name: str, done: threading.Event | None = None) -> None:
    with ledger_module._ACCOUNTING:
        order.append(name)
    if done is not None:
        done.set()


def _wait_until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)
