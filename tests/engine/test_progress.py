"""Progress: a plain line every few seconds when the output is not a terminal, a bar when it is."""

import io

from dpfl.engine import progress as progress_module
from dpfl.engine.progress import Progress


class Tty(io.StringIO):
    def isatty(self):
        return True


def test_redirected_output_gets_plain_lines_not_frames(monkeypatch):
    clock = iter([0.0, 1.0, 2.0, 6.0, 7.0, 20.0])
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    bar = Progress(6, 0, stream=out)
    for t in range(1, 7):
        bar.update(t, 0.5 + t / 100, {"third_party": 0.1 * t, "server": None})
    bar.close()
    lines = out.getvalue().splitlines()
    # at t = 0 s (round 1), 6 s (round 4; 5 s passed) and the last round; nothing in between, no carriage returns
    assert [line.split(",")[0] for line in lines] == ["round 1/6", "round 4/6", "round 6/6"]
    assert "\r" not in out.getvalue()
    assert lines[-1] == "round 6/6, test accuracy 0.5600, epsilon third_party=0.6, server=inf"


def test_a_terminal_gets_a_live_bar():
    out = Tty()
    bar = Progress(3, 1, stream=out)
    bar.update(2, 0.9, {"third_party": 1.0})
    bar.close()
    assert "\r" in out.getvalue() and "2/3" in out.getvalue()


def test_disabled_prints_nothing():
    out = io.StringIO()
    bar = Progress(3, 0, enabled=False, stream=out)
    bar.update(3, 0.5, {})
    bar.close()
    assert out.getvalue() == ""


def test_heartbeat_is_silent_when_quick_then_one_line_every_few_seconds(monkeypatch):
    from dpfl.engine.progress import Heartbeat

    clock = iter([0.0, 0.5, 1.9, 2.0, 3.0, 4.1, 4.2])  # construction, then one call per value
    monkeypatch.setattr(progress_module.time, "monotonic", lambda: next(clock))
    out = io.StringIO()
    beat = Heartbeat(lambda noise, eps: f"noise {noise} -> epsilon {eps}", after_s=2.0, every_s=2.0, stream=out)
    for k in range(6):
        beat(k, 10 - k)
    assert out.getvalue().splitlines() == ["noise 2 -> epsilon 8", "noise 4 -> epsilon 6"]


def test_an_update_without_epsilon_shows_the_latest_reported_with_its_round(monkeypatch):
    """Off run.epsilon_every's schedule an evaluation reports no epsilon: the line keeps the latest and its round."""
    monkeypatch.setattr(progress_module, "LINE_EVERY_S", 0.0)
    out = io.StringIO()
    bar = Progress(4, 0, stream=out)
    bar.update(1, 0.5, {"third_party": 0.25})
    bar.update(2, 0.5, None)
    bar.update(3, None, None)
    assert out.getvalue().splitlines() == ["round 1/4, test accuracy 0.5000, epsilon third_party=0.25",
                                           "round 2/4, test accuracy 0.5000, epsilon (round 1) third_party=0.25",
                                           "round 3/4, epsilon (round 1) third_party=0.25"]
