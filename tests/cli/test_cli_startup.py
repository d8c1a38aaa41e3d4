"""What a `dpfl` process imports: `--version` and `--help` nothing heavy, `account gaussian` no torch (each command's
parser is filled in only when chosen, ``dpfl.cli.LazySubParsers``); and the help of a lazily filled command is whole.
Each command runs in a fresh interpreter, as the installed script does; benchmarks/cli_startup.py times them."""

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "dp_accounting", "scipy", "numpy")
GAUSSIAN = ["account", "gaussian", "--noise-multiplier", "1.1", "--sampling-rate", str(256 / 60000), "--steps",
            "14063", "--delta", "1e-5", "--json"]


def dpfl_process(argv: list[str]) -> tuple[int, str, list[str]]:
    """(exit status, stdout, the heavy modules imported) of `dpfl ARGV` in a fresh interpreter."""
    probe = ("import sys\nfrom dpfl.cli import main\ncode = main(sys.argv[1:])\n"
             f"print([m for m in {HEAVY!r} if m in sys.modules], file=sys.stderr)\nsys.exit(code)")
    done = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True,
                          env={"PYTHONPATH": ":".join(sys.path)})
    return done.returncode, done.stdout, json.loads(done.stderr.strip().splitlines()[-1].replace("'", '"'))


@pytest.mark.parametrize("argv", [["--version"], ["--help"]])
def test_version_and_help_import_nothing_heavy(argv):
    code, out, imported = dpfl_process(argv)
    assert code == 0 and out.startswith(("dpfl 0.", "usage: dpfl")), out
    assert imported == []


def test_account_gaussian_does_not_import_torch():
    code, out, imported = dpfl_process(GAUSSIAN)
    assert code == 0
    assert json.loads(out)["epsilon"] == pytest.approx(2.382, rel=1e-3)  # as tests/cli/test_cli_account.py
    assert "torch" not in imported and "dp_accounting" in imported


def test_top_level_help_lists_every_command():
    code, out, _ = dpfl_process(["--help"])
    assert code == 0
    listed = [line.split()[0] for line in out.splitlines() if line.startswith("    ") and not line.startswith("     ")]
    assert listed == ["run", "demo", "sweep", "config", "plot", "audit", "flower-app", "write-silos", "silo",
                      "reproduce", "account", "calibrate", "plan"]


def test_a_lazily_filled_command_prints_its_whole_help(capsys):
    from dpfl.cli import main

    assert main(["run", "--help"]) == 0
    run_help = capsys.readouterr().out
    assert "exit status:" in run_help and "dp-scaffold" in run_help and "--resume" in run_help  # the epilog's registry
    assert main(["account", "--help"]) == 0
    assert "dp-fedavg-user" in capsys.readouterr().out
    assert main(["account", "dp-fedavg-user", "--help"]) == 0
    assert "--noise-at {server,shares,client}" in capsys.readouterr().out
    assert main(["audit", "--help"]) == 0
    assert "--canary {dirac," in capsys.readouterr().out
