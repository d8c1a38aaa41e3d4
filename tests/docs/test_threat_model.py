"""docs/flower.md's threat-model table, checked against the tests behind it: every cell (adversary, mode) names the
tests that show what the cell says, the table has exactly these rows and columns, and every named test exists in the
suite (a renamed or deleted test, or a row added without one, fails here)."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("plain", "secagg, honest-but-curious", "secagg, active")
METADATA = "flower/test_flower_metadata.py::"
PINNED = "flower/test_flower_pinned_release.py::"
NOISE = "flower/test_flower_secret_noise.py::"
MALICIOUS = "flower/test_flower_malicious_server.py::"
SECAGG = "flower/test_flower_secagg.py::"
ENROLMENT = "flower/test_enrolment.py::"
PROTOCOL = "protocols/test_secagg.py::"
POLICY = "flower/test_secagg_policy.py::"

PLAIN_SERVER = METADATA + "test_the_server_runs_without_the_pooled_data_and_gives_dpfl_runs_ledger_and_model"
JOB = (PINNED + "test_a_doubled_noise_level_is_refused_so_two_replies_cannot_cancel_the_noise",
       PINNED + "test_a_release_config_other_than_the_pinned_one_is_refused_also_under_a_new_run_id",
       PINNED + "test_a_public_noise_seed_is_the_silos_own_choice")
FORGET = (NOISE + "test_a_silo_whose_journal_is_lost_or_rolled_back_refuses_every_round",
          NOISE + "test_a_round_re_sent_with_another_model_is_refused_and_with_the_same_gets_the_same_reply",
          PINNED + "test_noise_is_bound_to_the_input_even_if_the_journal_did_not_refuse")
SECOND_SUM = MALICIOUS + "test_a_second_aggregation_of_a_round_is_refused_even_after_its_train_message_is_re_sent"
SUBSTITUTION = MALICIOUS + "test_key_substitution_reads_an_input_unless_the_silos_sign_their_keys"

#: (adversary as the table's bold words, mode) -> the tests behind the cell.
CELLS = {
    ("honest-but-curious server", "plain"): (PLAIN_SERVER,),
    ("honest-but-curious server", "secagg, honest-but-curious"): (
        SECAGG + "test_the_server_receives_only_masked_vectors_independent_of_the_updates",),
    ("honest-but-curious server", "secagg, active"): (
        ENROLMENT + "test_dpfl_write_silos_gives_every_silo_a_signing_key_and_its_node_config_runs_the_active_"
                    "variant",),
    ("actively malicious server", "plain"): (PLAIN_SERVER,),
    ("actively malicious server", "secagg, honest-but-curious"): (
        SUBSTITUTION, MALICIOUS + "test_a_silo_refuses_a_cohort_of_itself_and_the_honest_round_goes_on"),
    ("actively malicious server", "secagg, active"): (
        SUBSTITUTION, MALICIOUS + "test_a_silo_with_a_signing_key_refuses_a_round_without_signatures",
        PROTOCOL + "test_the_server_cannot_show_clients_different_survivor_sets"),
    **{("server that changes the job", mode): JOB for mode in MODES},
    ("server that changes the job", "secagg, active"): JOB + (
        PINNED + "test_messages_in_the_clear_are_refused_where_the_release_sums_them_securely",),
    ("server that makes a silo forget", "plain"): FORGET,
    ("server that makes a silo forget", "secagg, honest-but-curious"): FORGET + (SECOND_SUM,),
    ("server that makes a silo forget", "secagg, active"): FORGET + (SECOND_SUM,),
    ("malicious silo", "plain"): (PROTOCOL + "test_a_client_cannot_send_in_another_clients_name",),
    ("malicious silo", "secagg, honest-but-curious"): (
        PROTOCOL + "test_a_client_cannot_send_in_another_clients_name",
        PROTOCOL + "test_with_only_t_responders_a_corrupted_share_is_detected_without_a_culprit"),
    ("malicious silo", "secagg, active"): (
        PROTOCOL + "test_a_share_dealt_off_the_polynomial_never_names_the_honest_recipient",
        PROTOCOL + "test_a_recipient_refuses_a_share_without_its_dealers_signature_and_names_the_dealer"),
    ("server colluding with c silos", "plain"): (PLAIN_SERVER,),
    ("server colluding with c silos", "secagg, honest-but-curious"): (SUBSTITUTION,),
    ("server colluding with c silos", "secagg, active"): (
        PROTOCOL + "test_fewer_than_t_consistency_signatures_stop_the_round",
        POLICY + "test_the_node_config_sets_its_own_policy"),
    ("network eavesdropper", "plain"): (PLAIN_SERVER,),
    ("network eavesdropper", "secagg, honest-but-curious"): (
        SECAGG + "test_the_server_receives_only_masked_vectors_independent_of_the_updates",),
    ("network eavesdropper", "secagg, active"): (PROTOCOL + "test_signatures_bind_the_round_setup",),
}


def table() -> tuple[list[str], list[str]]:
    """The threat-model table's columns and its rows' adversaries (the bold words of each row)."""
    text = (ROOT / "docs" / "flower.md").read_text()
    section = text.split("### Threat model: what each mode protects", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    columns = [cell.strip() for cell in lines[0].strip("|").split("|")][1:]
    rows = [re.match(r"\| \*\*(.+?)\*\*", line).group(1) for line in lines[2:]]
    return columns, rows


def test_the_threat_model_table_has_a_test_for_every_cell():
    columns, rows = table()
    assert tuple(columns) == MODES
    assert sorted((row, mode) for row in rows for mode in columns) == sorted(CELLS)


def test_every_test_the_table_names_exists():
    names = {}
    for node in {node for tests in CELLS.values() for node in tests}:
        path, name = node.split("::")
        if path not in names:
            tree = ast.parse((ROOT / "tests" / path).read_text())
            names[path] = {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}
        assert name in names[path], f"{node} is not a test of tests/{path}"
