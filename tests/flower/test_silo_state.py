"""A silo's own state (``dpfl.flower.silo_state``): its secret key, created on its first round and never derivable
from what the server holds; its data fingerprint; its journal of rounds, which refuses to replay noise onto another
computation. These need no flwr."""

import hashlib
import json

import pytest
import torch

from dpfl.engine.keys import KEY_FILE, load_key
from dpfl.flower.silo_journal import HEAD_FILE, JOURNAL_FILE, JournalError
from dpfl.flower.silo_state import SiloState, SiloStateError, bound_key, data_fingerprint, input_digest

RELEASE, RUN = "ab" * 32, "run-1"


def test_a_silo_creates_its_own_key_on_its_first_round_owner_only_and_derives_one_per_run(tmp_path):
    state = SiloState.beside(tmp_path / "silo.npz")
    assert state.directory == tmp_path / "silo.npz.dpfl-state"
    key = state.run_key(RELEASE, RUN)
    secret = load_key(state.directory / KEY_FILE)
    assert (state.directory / KEY_FILE).stat().st_mode & 0o077 == 0
    assert key == state.run_key(RELEASE, RUN) != secret  # stable, and not the secret itself
    assert state.run_key(RELEASE, "run-2") != key and state.run_key("cd" * 32, RUN) != key
    other = SiloState.beside(tmp_path / "other.npz")
    assert other.run_key(RELEASE, RUN) != key  # every silo has its own


def test_a_round_is_answered_again_only_on_the_same_input(tmp_path):
    state = SiloState(tmp_path / "state")
    x = {"x": torch.arange(4.0)}
    state.admit(RELEASE, RUN, 0, input_digest(0, x, {}))
    state.admit(RELEASE, RUN, 0, input_digest(0, x, {}))  # a resumed round: the same computation, the same noise
    with pytest.raises(SiloStateError, match="round 1 of this run was already answered on another input"):
        state.admit(RELEASE, RUN, 0, input_digest(0, {"x": torch.arange(4.0) + 1}, {}))
    with pytest.raises(SiloStateError, match="another input"):  # the journal is on disk: a new process refuses too
        SiloState(tmp_path / "state").admit(RELEASE, RUN, 0, input_digest(0, x, {"c": torch.ones(2)}))
    state.admit(RELEASE, "run-2", 0, input_digest(0, {"x": torch.arange(4.0) + 1}, {}))  # another run: its own key


def test_a_silo_whose_data_changed_or_whose_key_is_lost_refuses_and_says_why(tmp_path):
    state = SiloState(tmp_path / "state")
    x, y = torch.ones(3, 2), torch.tensor([0, 1, 0])
    state.check_data(data_fingerprint(x, y))
    state.check_data(data_fingerprint(x.clone(), y.clone()))
    with pytest.raises(SiloStateError, match="data changed since its first round"):
        state.check_data(data_fingerprint(x, torch.tensor([0, 1, 1])))
    state.run_key(RELEASE, RUN)
    state.admit(RELEASE, RUN, 0, "digest")
    (state.directory / KEY_FILE).unlink()
    with pytest.raises(SiloStateError, match="answered rounds but its noise key .* is gone"):
        state.run_key(RELEASE, RUN)


def test_the_journal_is_a_hash_chain_whose_head_sits_beside_the_key(tmp_path):
    """The key is created after the journal's head; every answer is one fsynced line; the head names the last."""
    state = SiloState(tmp_path / "state")
    state.run_key(RELEASE, RUN)
    state.admit(RELEASE, RUN, 0, "digest", {"server": 1.5})
    state.admit(RELEASE, RUN, 1, "digest-2", {"server": 2.5})
    lines = (state.directory / JOURNAL_FILE).read_bytes().splitlines()
    assert [json.loads(line)["kind"] for line in lines] == ["genesis", "round", "round"]
    assert all(json.loads(b)["prev"] == hashlib.sha256(a).hexdigest() for a, b in zip(lines, lines[1:]))
    assert (state.directory / HEAD_FILE).read_text() == f"2 {hashlib.sha256(lines[-1]).hexdigest()}\n"
    assert [r["epsilon"] for r in state.rounds()] == [{"server": 1.5}, {"server": 2.5}]
    assert (state.directory / JOURNAL_FILE).stat().st_mode & 0o077 == 0


@pytest.mark.parametrize("damage", ["edited", "reordered", "truncated", "journal gone", "head gone", "both gone",
                                    "head damaged", "swapped"])
def test_a_journal_that_lost_or_changed_an_entry_is_refused(tmp_path, damage):
    state = SiloState(tmp_path / "state")
    state.run_key(RELEASE, RUN)
    state.admit(RELEASE, RUN, 0, "digest")
    state.admit(RELEASE, RUN, 1, "digest-2")
    journal, head = state.directory / JOURNAL_FILE, state.directory / HEAD_FILE
    lines = journal.read_bytes().splitlines(keepends=True)
    if damage == "edited":
        journal.write_bytes(b"".join(lines[:1] + [lines[1].replace(b"digest", b"forged")] + lines[2:]))
    elif damage == "reordered":
        journal.write_bytes(b"".join([lines[0], lines[2], lines[1]]))
    elif damage == "truncated":
        journal.write_bytes(b"".join(lines[:2]))
    elif damage == "head damaged":
        head.write_text("two words\n")
    elif damage == "swapped":  # another silo's (or study's) journal of the same length
        other = SiloState(tmp_path / "other")
        other.admit(RELEASE, RUN, 0, "x")
        other.admit(RELEASE, RUN, 1, "y")
        journal.write_bytes((other.directory / JOURNAL_FILE).read_bytes())
    for gone, path in (("journal", journal), ("head", head)):
        if damage in (f"{gone} gone", "both gone"):
            path.unlink()
    with pytest.raises(JournalError, match="journal cannot be trusted"):
        SiloState(tmp_path / "state").admit(RELEASE, RUN, 0, "digest")  # even the same input: nothing is answered


def test_a_crash_between_an_append_and_the_heads_rewrite_keeps_the_entry(tmp_path):
    """One entry past the head is real (its answer may have left): kept, and the head advanced. A torn last line
    (its fsync never returned, so no answer left) is dropped."""
    state = SiloState(tmp_path / "state")
    state.admit(RELEASE, RUN, 0, "digest")
    head = (state.directory / HEAD_FILE).read_text()
    state.admit(RELEASE, RUN, 1, "digest-2")
    (state.directory / HEAD_FILE).write_text(head)  # the crash: the line is on disk, the head is not
    with pytest.raises(SiloStateError, match="round 2 of this run was already answered on another input"):
        SiloState(tmp_path / "state").admit(RELEASE, RUN, 1, "other")
    with open(state.directory / JOURNAL_FILE, "ab") as file:
        file.write(b'{"kind": "round", "inp')  # a torn append
    state.admit(RELEASE, RUN, 2, "digest-3")
    assert [r["round"] for r in state.rounds()] == [0, 1, 2]


def test_state_from_before_the_journal_is_refused(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "rounds.json").write_text("{}")
    with pytest.raises(SiloStateError, match="holds the state of an earlier dpfl \\(rounds.json\\) without a journal"):
        SiloState(tmp_path / "state").admit(RELEASE, RUN, 0, "digest")


def test_the_noise_key_of_a_round_is_bound_to_its_data_and_input(tmp_path):
    key = SiloState(tmp_path / "state").run_key(RELEASE, RUN)
    assert bound_key(key, "data", "input") == bound_key(key, "data", "input")
    assert len({bound_key(key, "data", "input"), bound_key(key, "other data", "input"),
                bound_key(key, "data", "other input"), bound_key(key + 1, "data", "input"), key}) == 5


def test_a_silo_answers_each_stage_of_a_rounds_secure_aggregation_once_and_in_order(tmp_path):
    """The journal of secure aggregations (on disk: a new process, i.e. a re-sent message or a restarted node, reads
    the same): stages 0, 1, 2 (the masked input) in order; no repeat; no other setup mid-way; and once the masked
    input is out, no new aggregation of the round; before, a new one may start (a resumed round)."""
    state = SiloState(tmp_path / "state")
    assert state.secagg_defaults(RUN, RELEASE, {"min_cohort": 3, "min_threshold": 2}) == {"min_cohort": 3,
                                                                                          "min_threshold": 2}
    state.secagg_stage(RUN, 0, "setup", 0, committed=2)
    state.secagg_stage(RUN, 0, "setup", 1, committed=2)
    with pytest.raises(SiloStateError, match="stage 1 of round 1's secure aggregation out of order: this silo's last "
                                             "answer in that round was stage 1"):
        SiloState(tmp_path / "state").secagg_stage(RUN, 0, "setup", 1, committed=2)
    with pytest.raises(SiloStateError, match="was stage 1 of an aggregation set up differently"):
        state.secagg_stage(RUN, 0, "other setup", 2, committed=2)
    with pytest.raises(SiloStateError, match="out of order: this silo's last answer in that round was none"):
        state.secagg_stage(RUN, 1, "setup", 1, committed=2)
    state.secagg_stage(RUN, 0, "other setup", 0, committed=2)  # nothing of the input left yet: may start again
    state.secagg_stage(RUN, 0, "other setup", 1, committed=2)
    state.secagg_stage(RUN, 0, "other setup", 2, committed=2)
    for setup in ("other setup", "setup"):
        with pytest.raises(SiloStateError, match="already sent its masked input in round 1 of this run: it takes part "
                                                 "in no other secure aggregation of that round"):
            SiloState(tmp_path / "state").secagg_stage(RUN, 0, setup, 0, committed=2)
    state.secagg_stage(RUN, 0, "other setup", 3, committed=2)
    state.secagg_defaults("run-2", RELEASE, {"min_cohort": 5, "min_threshold": 3})
    state.secagg_stage("run-2", 0, "setup", 0, committed=2)  # another run: its own rounds


def test_a_runs_secure_aggregation_policy_is_the_one_of_its_first_round(tmp_path):
    state = SiloState(tmp_path / "state")
    state.secagg_defaults(RUN, RELEASE, {"min_cohort": 3, "min_threshold": 2})
    assert state.secagg_defaults(RUN, RELEASE, {"min_cohort": 1, "min_threshold": 1}) == {"min_cohort": 3,
                                                                                          "min_threshold": 2}
    with pytest.raises(SiloStateError, match="run run-1 came with the release config abababababab... to this silo's "
                                             "first secure aggregation of it, and now comes with cdcdcdcdcdcd"):
        state.secagg_defaults(RUN, "cd" * 32, {"min_cohort": 1, "min_threshold": 1})
    with pytest.raises(SiloStateError, match="no secure aggregation policy recorded"):
        state.secagg_stage("run-9", 0, "setup", 0, committed=2)
