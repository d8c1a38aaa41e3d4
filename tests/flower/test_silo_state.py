"""A silo's own state (``dpfl.flower.silo_state``): its secret key, created on its first round and never derivable
from what the server holds; its data fingerprint; its journal of rounds, which refuses to replay noise onto another
computation. These need no flwr."""

import pytest
import torch

from dpfl.engine.keys import KEY_FILE, load_key
from dpfl.flower.silo_state import SiloState, SiloStateError, data_fingerprint, input_digest

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


def test_a_damaged_journal_is_refused(tmp_path):
    state = SiloState(tmp_path / "state")
    state.admit(RELEASE, RUN, 0, "digest")
    (state.directory / "rounds.json").write_text("{not json")
    with pytest.raises(SiloStateError, match="rounds.json is damaged"):
        state.admit(RELEASE, RUN, 1, "other")


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
