"""The README's "Your own data" section runs as written: a CSV with the header it shows (records made up here), its
TOML verbatim as study.toml, and its command through the real entry point (`dpfl.cli.main`)."""

from __future__ import annotations

import json
import math
import re
import shlex
from pathlib import Path

import numpy as np
import torch

from dpfl.cli import main

README = Path(__file__).resolve().parents[2] / "README.md"


def _section_blocks(title: str) -> dict[str, list[str]]:
    """The fenced blocks of the README section ``title``, by language (each a list of block texts)."""
    text = README.read_text()
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    blocks: dict[str, list[str]] = {}
    for lang, body in re.findall(r"```(\w+)\n(.*?)```", text[start:end], flags=re.S):
        blocks.setdefault(lang, []).append(body)
    return blocks


def _write_records(path: Path, header: list[str], n: int = 400) -> None:
    """n records under ``header``: numeric features, 4 clinics, every 5th record 'test', an outcome that follows the
    first feature."""
    rng = np.random.default_rng(0)
    rows = []
    for i in range(n):
        features = rng.standard_normal(3).round(3)
        values = {"clinic": f"clinic_{i % 4}", "split": "test" if i % 5 == 0 else "train",
                  "outcome": str(int(features[0] > 0))}
        numbers = iter(features)
        rows.append(",".join(values.get(column) or str(next(numbers)) for column in header))
    path.write_text(",".join(header) + "\n" + "\n".join(rows) + "\n")


def test_the_readme_runs_a_users_csv_in_three_steps(tmp_path, monkeypatch):
    blocks = _section_blocks("Your own data")
    (header_text,), (toml,), (command,) = blocks["csv"], blocks["toml"], blocks["bash"]
    header = header_text.strip().split(",")
    assert header == ["age", "weight", "dose", "clinic", "split", "outcome"]
    _write_records(tmp_path / "patients.csv", header)
    (tmp_path / "study.toml").write_text(toml)
    argv = shlex.split(command.strip())
    assert argv[0] == "dpfl" and len(command.strip().splitlines()) == 1
    monkeypatch.chdir(tmp_path)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*argv[1:], "--no-progress"]) == 0
    finally:
        torch.set_num_threads(before)
    results = json.loads((tmp_path / "runs" / "study" / "results.json").read_text())
    assert results["data"]["source"]["feature_columns"] == ["age", "weight", "dose"]
    assert results["data"]["partition"]["client_ids"] == [f"clinic_{i}" for i in range(4)]
    assert results["data"]["split"]["test_records"] == 80
    eps = results["final"]["epsilon"]["third_party"]
    assert results["final"]["round"] == 20 and eps is not None and math.isfinite(eps)
