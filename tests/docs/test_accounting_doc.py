"""docs/accounting.md promises: "Every number on this page was produced by the command shown beside it." So does the
README's accounting section.

This module re-runs the commands of both pages and checks the outputs they print.

Default run (fast, training-free): every `$ dpfl account ...` / `$ dpfl calibrate ...` line in a fenced block of
docs/accounting.md or README.md (a line ending in ` \\` continues on the next) is run through the real entry point
(`dpfl.cli.main(argv)`, output captured) in a temporary directory that stands for /tmp/acdoc and holds the page's
scaffold.toml (`dpfl calibrate run scaffold.toml`), and every output line the page shows under it
(except `...` placeholders and blank lines) must appear verbatim as a line of the real output (stdout and stderr
together). The `$ command  ->  fragment` form (section 7) requires the fragment verbatim inside the output.

`...` inside a command is expanded only by a rule the page states beside the block:

- "`...` stands for all the arguments of the first command": `...` becomes the arguments of the block's first command
  (everything after `dpfl account <accountant>`); the command must name the same accountant.
- "(`...` = `ARGS`)": `...` becomes ARGS (whitespace normalised).

A command with `...` and no such rule must be listed in SKIP with the reason, or the test fails.

Slow (`pytest -m slow`): the `$ dpfl run scaffold.toml ...` commands (scaffold.toml taken from the page), and the
`$ python NAME.py` scripts reproduced on the page, run in a temporary directory that stands for /tmp/acdoc, in page
order (the resume/refusal examples need run1 from section 1); every printed line shown must appear verbatim. Runs use
one torch thread unless run.threads says otherwise (float rounding depends on the count), so the outputs are the same
on any machine.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "accounting.md"
PAGES = (DOC, ROOT / "README.md")
SCRATCH = "/tmp/acdoc"  # the page's scratch directory; replaced by a temporary one in the slow checks

# Commands (as written on the page, after `$ `) that cannot be expanded unambiguously, with the reason. Every entry
# must still occur on the page (test_skip_table_is_current), so a stale entry is noticed.
SKIP: dict[str, str] = {}

FIRST_COMMAND_RULE = "`...` stands for all the arguments of the first command"
EQUALS_RULE = re.compile(r"\(`\.\.\.` = `([^`]+)`")
FENCE = re.compile(r"^(\s*)```(\w*)\s*$")


@dataclass
class Block:
    page: str  # the page's file name
    lang: str
    start: int  # 1-based line of the opening fence
    lines: list[str]
    before: str  # the page's text between the previous fence and this one
    after: str  # the page's text between this fence and the next one


@dataclass
class Command:
    line: int  # 1-based line on the page
    text: str  # as written, after `$ `
    block: Block
    output: list[str] = field(default_factory=list)  # the lines shown under it
    fragment: str | None = None  # `$ cmd -> fragment` form


def parse_blocks(text: str, page: str = DOC.name) -> list[Block]:
    lines = text.splitlines()
    blocks, i, prose_start = [], 0, 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, lang, start = m.group(1), m.group(2), i
        j = i + 1
        while not (lines[j].strip() == "```"):
            j += 1
        body = [ln[len(indent):] if ln.startswith(indent) else ln.lstrip() for ln in lines[i + 1 : j]]
        blocks.append(Block(page, lang, start + 1, body, "\n".join(lines[prose_start:start]), ""))
        prose_start = i = j + 1
    for block, nxt in zip(blocks, blocks[1:] + [None]):
        end = nxt.start - 1 if nxt else len(lines)
        close = block.start + len(block.lines) + 1  # 1-based line of the closing fence
        block.after = "\n".join(lines[close:end])
    return blocks


def parse_commands(blocks: list[Block]) -> list[Command]:
    commands = []
    for block in blocks:
        current, lines = None, list(enumerate(block.lines))
        while lines:
            k, ln = lines.pop(0)
            if ln.startswith("$ "):
                while ln.endswith(" \\") and lines:  # the command continues on the next line
                    ln = ln[:-2] + " " + lines.pop(0)[1].strip()
                text, fragment = ln[2:].strip(), None
                if " -> " in text:
                    text, fragment = (part.strip() for part in text.split(" -> ", 1))
                current = Command(block.start + 1 + k, text, block, fragment=fragment)
                commands.append(current)
            elif current is not None and ln.strip() and ln.strip() != "...":
                current.output.append(ln.rstrip())
    return commands


def expand(command: Command) -> str | None:
    """The command with `...` expanded by the rule stated beside its block; None when no rule applies."""
    if "..." not in shlex.split(command.text):
        return command.text
    context = command.block.before + "\n" + command.block.after
    if FIRST_COMMAND_RULE in " ".join(context.split()):
        first = parse_commands([command.block])[0].text
        head, args = shlex.split(first)[:3], shlex.split(first)[3:]
        if "..." in args or shlex.split(command.text)[:3] != head:
            return None
        return command.text.replace("...", shlex.join(args), 1)
    m = EQUALS_RULE.search(command.block.after) or EQUALS_RULE.search(command.block.before)
    if m:
        return command.text.replace("...", " ".join(m.group(1).split()), 1)
    return None


BLOCKS_OF = {page.name: parse_blocks(page.read_text(encoding="utf-8"), page.name) for page in PAGES}
BLOCKS = BLOCKS_OF[DOC.name]  # docs/accounting.md's: its runs and scripts
COMMANDS = parse_commands(BLOCKS)
FAST = [c for blocks in BLOCKS_OF.values() for c in parse_commands(blocks)
        if shlex.split(c.text)[:2] in (["dpfl", "account"], ["dpfl", "calibrate"])]


def output_lines(text: str) -> list[str]:
    return [ln.rstrip() for ln in text.splitlines()]


def check_shown(shown: list[str], fragment: str | None, printed: str, where: str) -> None:
    lines = set(output_lines(printed))
    missing = [ln for ln in shown if ln not in lines]
    assert not missing, f"{where}: the page shows lines the command does not print:\n" + "\n".join(
        missing) + "\n--- printed ---\n" + printed
    if fragment is not None:
        assert fragment in printed, f"{where}: {fragment!r} not in the printed output:\n{printed}"


# -- default run: the training-free commands ------------------------------------------------------------------------
@pytest.mark.parametrize("page, least", [(DOC.name, 20), ("README.md", 8)])
def test_page_has_the_commands(page, least):
    """The parser still finds the page's commands (a reformatted page must not pass by checking nothing), and every
    command shows output to check."""
    found = [c for c in FAST if c.block.page == page]
    assert len(found) >= least, [c.text for c in found]
    assert all(c.output or c.fragment for c in found), [c.text for c in found if not (c.output or c.fragment)]
    dollar_lines = [ln for b in BLOCKS_OF[page] for ln in b.lines if re.match(r"\$ dpfl (account|calibrate) ", ln)]
    assert len(dollar_lines) == len(found)


def test_skip_table_is_current():
    texts = {c.text for c in FAST}
    assert set(SKIP) <= texts, f"SKIP lists commands no longer on the page: {set(SKIP) - texts}"
    unexpandable = [c.text for c in FAST if expand(c) is None and c.text not in SKIP]
    assert not unexpandable, f"commands with `...` and no expansion rule on the page (add one, or SKIP): {unexpandable}"


@pytest.mark.parametrize("command", FAST, ids=[f"{c.block.page}-line{c.line}" for c in FAST])
def test_account_and_calibrate_outputs(command, capsys, tmp_path, monkeypatch):
    from dpfl.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "scaffold.toml").write_text(_scaffold_toml())
    if command.text in SKIP:
        pytest.skip(SKIP[command.text])
    expanded = expand(command)
    where = f"{command.block.page} line {command.line}"
    assert expanded is not None, f"{where}: no rule on the page expands `...` in {command.text!r}"
    argv = shlex.split(expanded)[1:]
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    printed = captured.out + captured.err
    error = any(ln.startswith("dpfl ") and ": error: " in ln for ln in command.output)
    assert code == (2 if error else 0), f"{where}: exit status {code}\n{printed}"
    check_shown(command.output, command.fragment, printed, f"{where}: {expanded}")


def test_expansion_rules():
    """The two stated rules expand the page's abbreviated commands to full argument lists."""
    expanded = {c.text: expand(c) for c in FAST if "..." in shlex.split(c.text)}
    assert expanded, "the page has no abbreviated commands any more: drop this test"
    for text, full in expanded.items():
        assert full is not None and "..." not in shlex.split(full), text
        assert "--num-clients 100" in full and "--rounds 400" in full, full


# -- slow: training runs and the page's scripts ---------------------------------------------------------------------
def _script_of(name: str, block: Block) -> str:
    """The ```python block right before the block that runs `python name`, introduced by `name` in the page's text."""
    index = BLOCKS.index(block)
    previous = BLOCKS[index - 1]
    assert previous.lang == "python", f"no python block right before the block running {name}"
    assert f"`{name}`" in previous.before, f"the python block before `python {name}` is not introduced as `{name}`"
    return "\n".join(previous.lines) + "\n"


def _scaffold_toml() -> str:
    for block in BLOCKS:
        if block.lang == "toml" and f"`{SCRATCH}/scaffold.toml`" in block.before:
            return "\n".join(block.lines) + "\n"
    raise AssertionError("the page no longer shows scaffold.toml")


RUNS = [c for c in COMMANDS if shlex.split(c.text)[:3] == ["dpfl", "run", "scaffold.toml"]]
SCRIPTS = [c for c in COMMANDS if re.fullmatch(r"python \w+\.py", c.text)]


def _run_in_scratch(commands: list[Command], tmp_path: Path) -> None:
    """Runs ``commands`` in page order in ``tmp_path``, which stands for /tmp/acdoc (scaffold.toml written there):
    every line the page shows under each must be printed verbatim (paths under /tmp/acdoc mapped to tmp_path)."""
    scratch = str(tmp_path)
    (tmp_path / "scaffold.toml").write_text(_scaffold_toml())
    env = {**os.environ, "PYTHONUNBUFFERED": "1",  # this checkout's package, not whichever one is installed
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    for command in commands:
        argv = shlex.split(command.text.replace(SCRATCH, scratch))
        if argv[0] == "python":
            (tmp_path / argv[1]).write_text(_script_of(argv[1], command.block))
            argv = [sys.executable, *argv[1:]]
        else:
            argv = [sys.executable, "-m", "dpfl.cli", *argv[1:]]
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        shown = [ln.replace(SCRATCH, scratch) for ln in command.output]
        error = any(": error: " in ln for ln in shown)
        budget = any(ln.startswith("stopped by the privacy budget after round ") for ln in shown)
        expected = 2 if error else 3 if budget else 0  # dpfl run's exit statuses (cli/run.py)
        where = f"line {command.line}: {command.text}"
        assert done.returncode == expected, f"{where}: exit status {done.returncode}\n{done.stdout}{done.stderr}"
        check_shown(shown, None, done.stdout + done.stderr, where)


@pytest.mark.slow
def test_run_commands(tmp_path):
    """The page's `dpfl run scaffold.toml ...` commands, in page order (sections 1 and 6: three 30-round runs, two
    budget stops, then the refused resume and the refused new run into run1): their `round N: ...`, `stopped
    by the privacy budget: ...`, `results: ...` and error lines."""
    assert len(RUNS) >= 7 and sum(ln.startswith("round 30: ") for c in RUNS for ln in c.output) >= 3
    _run_in_scratch(RUNS, tmp_path)


@pytest.mark.slow
def test_scripts(tmp_path):
    """The page's `python NAME.py` scripts (replace_one, skellam, theory, crash), each the ```python block right
    before its output; crash.py trains 30 + 30 + 10 + 5 rounds."""
    assert {c.text for c in SCRIPTS} >= {"python replace_one.py", "python skellam.py", "python theory.py",
                                         "python crash.py"}
    _run_in_scratch(SCRIPTS, tmp_path)
