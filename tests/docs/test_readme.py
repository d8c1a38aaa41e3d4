"""Every figure README.md prints is produced by the code, parsed from the page and compared with what the code prints
(a stale page fails with the line to fix). The accounting commands are checked by test_accounting_doc; here:

* fast: the 400-round table's epsilons are `dpfl account dp-scaffold`'s for the page's setting (and the prose's
  "its 12.91"); the torch pin and the test command agree with .ci/run; the speed table is a measurement, labelled so,
  and its benchmark runs and prints those rows (with stubbed timings);
* slow: `dpfl demo`'s table (every column but the wall seconds, and the prose's accuracy gap), and the two 400-round
  runs of examples/dp_scaffold_synthetic.toml (accuracies and epsilons). Runs use one torch thread unless run.threads
  says otherwise (float rounding depends on the count), so the outputs are the same on any machine.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dpfl.cli import main
from dpfl.cli.common import safe_round

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TEXT = README.read_text(encoding="utf-8")
LINES = TEXT.splitlines()
OBSERVERS = {"third party": "third_party", "server": "server", "other silo": "other_silo"}


def _line_of(fragment: str) -> int:
    return next(i for i, line in enumerate(LINES, 1) if fragment in line)


def _search(pattern: str) -> re.Match:
    m = re.search(pattern, TEXT)
    assert m, f"README.md no longer says {pattern!r}: update this test with the page"
    return m


def _headline_table() -> dict[str, list[str]]:
    """observer -> [sound DP-SCAFFOLD-warm, sound DP-FedAvg, paper] cells of the 400-round table."""
    rows = {}
    for line in LINES:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in OBSERVERS:
            rows[OBSERVERS[cells[0]]] = cells[1:]
    assert set(rows) == set(OBSERVERS.values()), "README.md's 400-round table lost a row"
    return rows


def _account_argv() -> list[str]:
    """The README's first `dpfl account dp-scaffold` command (the table's setting), continuation lines joined."""
    start = _line_of("$ dpfl account dp-scaffold --num-clients")
    text = LINES[start - 1]
    k = start
    while text.endswith(" \\"):
        text = text[:-2] + " " + LINES[k].strip()
        k += 1
    return shlex.split(text[2:])[1:]


def _account(argv: list[str], capsys) -> dict:
    capsys.readouterr()
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# -- fast -------------------------------------------------------------------------------------------------------------
def test_headline_table_is_the_accountants(capsys):
    """The table's columns are `dpfl account dp-scaffold` (sound; DP-SCAFFOLD-warm's warm-start rounds are accounted
    as DP-SCAFFOLD's), `--algorithm dp-fedavg` and `--analysis paper`, printed as the CLI rounds them."""
    argv = _account_argv()
    assert "--rounds" in argv and argv[argv.index("--rounds") + 1] == "400"
    columns = [_account(argv, capsys), _account([*argv, "--algorithm", "dp-fedavg"], capsys),
               _account([*argv, "--analysis", "paper"], capsys)]
    table = _headline_table()
    for label, observer in OBSERVERS.items():
        printed = [safe_round(c["epsilon"][observer]) for c in columns]
        assert table[observer] == printed, f"README.md line {_line_of('| ' + label + ' |')}: the code gives {printed}"
    delta = _search(r"at delta = ([0-9.e-]+) and these epsilons").group(1)
    assert float(delta) == columns[0]["delta"]
    paper = _search(r"its (\d+\.\d+) is mostly log\(1/delta\)").group(1)
    assert paper == f"{columns[2]['epsilon']['third_party']:.2f}"


def test_ci_and_readme_agree():
    """The README names the torch pin CI installs, and its test command is the one CI runs."""
    ci = (ROOT / ".ci" / "run").read_text()
    pin = re.search(r'"(torch==[^"]+)"', ci).group(1)
    assert f'"{pin}" --index-url https://download.pytorch.org/whl/cpu' in TEXT
    assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in TEXT
    assert ci.strip().splitlines()[-1].replace("python3", "python") in TEXT


def test_speed_table_is_labelled_a_measurement_and_its_benchmark_prints_it(monkeypatch, capsys):
    path = ROOT / "benchmarks" / "seed000_throughput.py"
    section = TEXT[TEXT.index("## Speed"):]
    assert f"Measured by `python {path.relative_to(ROOT)}`" in section
    spec = importlib.util.spec_from_file_location("throughput", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from dpfl.experiments.config import load_config

    load_config(None, bench.WORKLOAD)  # the workload is a valid config
    timings = {("ghost", False): 0.2, ("vmap", False): 0.5, ("vmap", True): 1.5}
    monkeypatch.setattr(bench, "seconds_per_round", lambda strategy, alone, rounds: timings[strategy, alone])
    monkeypatch.setattr(bench, "peak_memory_mb", lambda: 540.0)
    monkeypatch.setattr(sys, "argv", ["seed000_throughput.py", "--rounds", "1", "--baseline-rounds", "1"])
    bench.main()
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].split() == ["engine", "s/round", "x", "baseline"]
    assert [ln.split() for ln in printed[2:5]] == [["vectorised", "0.2000", "7.5"], ["vmap_cohort", "0.5000", "3.0"],
                                                  ["baseline", "1.5000", "1.0"]]
    rows = [ln for ln in section.splitlines() if re.match(r"\| .* \| \d+\.\d+ \| \d+\.\d+x \|$", ln)]
    assert len(rows) == 3 and rows[-1].startswith("| baseline") and rows[-1].endswith("| 1.0x |")


def test_gpu_table_is_labelled_with_its_benchmark_and_has_the_rows_it_prints(monkeypatch, capsys):
    """The GPU section's table is benchmarks/gpu_throughput.py's output on the GPU it names: the benchmark (timings
    stubbed, the device a stand-in GPU) prints the same header and, per row, the same workload, implementation and
    device, and the section names the GPU and the command."""
    from types import SimpleNamespace

    path = ROOT / "benchmarks" / "gpu_throughput.py"
    section = TEXT[TEXT.index("## GPU\n"):TEXT.index("## Speed\n")]
    assert f"`python {path.relative_to(ROOT)}" in section and "--quick" in section and "NVIDIA H200" in section
    spec = importlib.util.spec_from_file_location("gpu_throughput", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setattr(bench, "resolve_device", lambda name: torch.device("cuda"))
    monkeypatch.setattr(bench, "device_name", lambda device: "a stand-in GPU")
    monkeypatch.setattr(torch, "set_num_threads", lambda threads: None)  # this process's threads are the tests'
    monkeypatch.setattr(bench, "simulation", lambda workload, device, threads, quick: SimpleNamespace(
        grads=SimpleNamespace(strategy="ghost")))
    monkeypatch.setattr(bench, "dpfl_seconds", lambda sim, rounds: 0.5)
    monkeypatch.setattr(bench, "baseline_seconds", lambda sim, rounds: 2.0)
    bench.main(["--device", "cuda", "--threads", "16"])
    printed = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("|")]
    table = [ln for ln in section.splitlines() if ln.startswith("|")]
    assert printed[:2] == table[:2]
    cells = [[c.strip() for c in ln.split("|")[1:4]] for ln in printed[2:]]
    assert cells == [[c.strip() for c in ln.split("|")[1:4]] for ln in table[2:]]
    assert [ln.split("|")[5].strip() for ln in printed[2:]] == ["4x", "1x", "4x", "4x", "1x"]


def _python_blocks(section: str) -> list[str]:
    """The ```python blocks of a README section, in order."""
    return re.findall(r"```python\n(.*?)```", section[:section.index("\n## ", 1)], flags=re.DOTALL)


def test_python_api_section_runs(tmp_path, monkeypatch, capsys):
    """The README's Python API blocks run as shown (from the repository's root: the example path is relative): the
    first writes its run directory and prints what it says it prints; the second (a user's module on the user's
    arrays) prints a test accuracy and a finite epsilon (its noise comes from a fresh secret key: the accuracy
    varies)."""
    blocks = _python_blocks(TEXT[TEXT.index("## Python API"):])
    assert len(blocks) == 2 and all("import dpfl\n" in code for code in blocks)
    monkeypatch.chdir(tmp_path)
    exec(compile(blocks[0].replace('"examples/', f'"{ROOT}/examples/'), "README.md (Python API)", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    results = json.loads((tmp_path / "runs" / "api" / "results.json").read_text())
    assert printed[0] == f"{results['final']['test_accuracy']} {results['final']['epsilon']} 1e-05"
    assert printed[1].startswith("1 ") and len(printed) == 3 and 0 < float(printed[2]) < 10
    exec(compile(blocks[1], "README.md (Python API, your own module)", "exec"), {})
    accuracy, epsilon = map(float, capsys.readouterr().out.split())
    assert 0 <= accuracy <= 1 and 0 < epsilon < 100


# -- slow: training ---------------------------------------------------------------------------------------------------
def _dpfl(*argv: str, cwd: Path) -> str:
    """`dpfl ARGV` in a fresh interpreter, running this checkout's package (not whichever one is installed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "dpfl.cli", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=3600)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.slow
def test_demo_table(tmp_path):
    """`dpfl demo` prints the README's table: every column but the wall seconds, the delta line, and the gap the
    prose states (in points of accuracy)."""
    start = _line_of("algorithm          test acc")
    shown = LINES[start - 1:start + 3]
    printed = _dpfl("demo", "--out", str(tmp_path / "demo"), "--no-progress", cwd=tmp_path).splitlines()
    assert printed[0] == shown[0]
    for page, real in zip(shown[1:3], printed[1:3]):
        assert page.split()[:-1] == real.split()[:-1], f"README.md line {start + shown.index(page)}: {real}"
    assert printed[3] == shown[3]
    gap = int(_search(r"drift\s+correction is worth (\d+) points").group(1))
    accuracies = [float(line.split()[1]) for line in printed[1:3]]
    assert gap == round(100 * (accuracies[0] - accuracies[1]))


@pytest.mark.slow
def test_headline_runs(tmp_path):
    """The 400-round runs of examples/dp_scaffold_synthetic.toml reach the accuracies the README states, with the
    epsilons of its table (DP-SCAFFOLD-warm and DP-FedAvg, sound analysis)."""
    m = _search(r"DP-SCAFFOLD-warm reaches (\d\.\d+)\s+test accuracy, DP-FedAvg (\d\.\d+), at delta = ([0-9.e-]+)")
    assert "`--set run.noise_seed=0`, the research mode" in TEXT
    table = _headline_table()
    config = str(ROOT / "examples" / "dp_scaffold_synthetic.toml")
    for column, (name, accuracy) in enumerate((("dp-scaffold-warm", m.group(1)), ("dp-fedavg", m.group(2)))):
        summary = json.loads(_dpfl("run", config, "--set", f"algorithm.name='{name}'", "--set", "run.noise_seed=0",
                                   "--out", str(tmp_path / name),
                                   "--no-progress", "--json", cwd=tmp_path))
        assert f"{summary['test_accuracy']:.3f}" == accuracy, (name, summary)
        assert summary["delta"] == float(m.group(3))
        assert {o: safe_round(e) for o, e in summary["epsilon"].items()} == {o: c[column] for o, c in table.items()}
