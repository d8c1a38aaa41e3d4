"""ledger.json is written from parts encoded once per round (``PrivacyLedger._text``): after every save it holds
exactly ``to_dict``'s content (with or without the summary), one line per journal entry, and it loads back to a
ledger that reports the same epsilon."""

import json

from dp_accounting import dp_event

from dpfl.accounting.events import ParticipationDpEvent
from dpfl.accounting.ledger import PrivacyLedger

OBSERVERS = ("third_party", "server")


def round_events(t: int) -> dict:
    """Rounds 1-3 one event, 4-5 a new one, 6 the first again; the server's event a participation mixture."""
    z = 4.0 if t in (1, 2, 3, 6) else 5.0
    return {"third_party": dp_event.PoissonSampledDpEvent(0.2, dp_event.GaussianDpEvent(z)),
            "server": ParticipationDpEvent(0.5, dp_event.GaussianDpEvent(z / 2))}


def test_every_save_holds_to_dicts_content_and_loads_back(tmp_path):
    path = tmp_path / "ledger.json"
    ledger = PrivacyLedger(OBSERVERS, 1e-6, {"third_party": 50.0}, neighboring="add_remove")
    for t in range(1, 7):
        ledger.record(t, round_events(t), f"fingerprint {t}")
        ledger.save(path, summary=False)
        assert json.loads(path.read_text()) == ledger.to_dict(summary=False)
        assert "epsilon" not in json.loads(path.read_text())
    ledger.record(3, round_events(4), "another fingerprint")  # round 3 re-run with other randomness: charged again
    ledger.save(path)
    saved = json.loads(path.read_text())
    assert saved == json.loads(json.dumps(ledger.to_dict()))
    assert len(saved["events"]) == 4 and [e["round"] for e in saved["journal"]] == [1, 2, 3, 4, 5, 6, 3]
    lines = path.read_text().splitlines()
    assert sum(line.startswith('{"round": ') for line in lines) == 7  # one line per journal entry
    loaded = PrivacyLedger.load(path)
    assert loaded.epsilon() == ledger.epsilon() and loaded.compositions == 7
    assert saved["epsilon"] == ledger.epsilon()
