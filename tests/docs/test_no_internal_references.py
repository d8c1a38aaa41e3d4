"""The user-facing text (README.md, docs/*.md, and the package's docstrings, comments and messages under src/dpfl)
names no internal material a reader cannot follow: no seed-paper numbers ("seed 000"), no notes ("notes/", "notes
003", "anchors.md"), no issue numbers, no "the review", no planning documents ("shared/", "ARCHITECTURE principle");
papers are cited by author and year. The test scans for those patterns and names every file and line that has one."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "src" / "dpfl").rglob("*.py"))]

#: pattern -> what to write instead
PATTERNS = {
    r"\bseeds?[ _-]?0\d\d": "cite the paper by author and year (e.g. Noble et al. 2022), not its seed number",
    r"\bseed papers?\b": "cite the papers by author and year",
    r"\bnotes?/|\bnotes? 0\d\d\b|\bnotes in\b|anchors\.md": "cite the paper or the published source, not notes",
    r"\bshared/": "link a page of docs/ (a reader has no shared/ folder)",
    r"\bissues? #?\d+": "say what the change does, not which issue asked for it",
    r"\bthe review\b|\breview'?s\b": "name the paper or the argument, not a review",
    r"(?-i:\bARCHITECTURE\b)": "link docs/architecture.md or say the principle itself",
    r"\b(first|second|third|this|last) session\b": "describe the code, not the session that wrote it",
}
#: (file name, text) a pattern may match: the benchmark keeps its file name, because `--against REV` imports it by
#: that name from older revisions
ALLOWED = {("README.md", "benchmarks/seed000_throughput.py")}


def _hits(path: Path, text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        scrubbed = line
        for name, allowed in ALLOWED:
            if path.name == name:
                scrubbed = scrubbed.replace(allowed, "")
        for pattern, advice in PATTERNS.items():
            m = re.search(pattern, scrubbed, flags=re.IGNORECASE)
            if m:
                found.append(f"{path.relative_to(ROOT)}:{number}: {m.group(0)!r} ({advice}): {line.strip()}")
    return found


def test_no_internal_references():
    hits = [hit for path in FILES for hit in _hits(path, path.read_text(encoding="utf-8"))]
    assert not hits, "internal references in user-facing text:\n" + "\n".join(hits)


@pytest.mark.parametrize("text", ["as in seed 000's notes", "seeds 000/002", "see notes/anchors.md",
                                  "matching notes 003", "issue 10, open", "The review's instance",
                                  "shared/ARCHITECTURE.md", "(ARCHITECTURE principle 2)", "in the second session"])
def test_the_patterns_catch_internal_references(text):
    assert _hits(ROOT / "docs" / "x.md", text)


@pytest.mark.parametrize("text", ["Noble, Bellet, Dieuleveut 2022, App. B", "run.seed = 0", "--seed 3",
                                  "torch.manual_seed(0)", "notes go to stderr", "a new run"])
def test_the_patterns_spare_ordinary_text(text):
    assert not _hits(ROOT / "docs" / "x.md", text)
