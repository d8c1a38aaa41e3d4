"""docs/config.md is the configuration reference generated from the code (``dpfl.experiments.reference``); these
tests fail when the page differs from what the code generates, and check the page against the config loader itself:
every key of every registered algorithm and model is on it, with the default ``config.defaults`` gives it and the
algorithm names that accept it. Also `dpfl config`: the resolved config it prints reads back to the same config."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from dpfl.algorithms import registry
from dpfl.cli import main
from dpfl.errors import ConfigError
from dpfl.experiments.config import MODEL_KEYS, defaults, key_schema, load_config
from dpfl.experiments.reference import REGENERATE, reference, value_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "config.md"
EXAMPLES = sorted((ROOT / "examples").glob("*.toml"))
ROW = re.compile(r"^\| `(\w+)\.(\w+)` \| ([^|]+) \| `([^`]*)` \| (.*)$")


def _rows() -> dict[str, list[tuple[str, list[str]]]]:
    """section.key -> its rows on the page, each (the heading above it, the cells after the key: type, default, the
    rest as one string). A key shared by several algorithm families has one row per family."""
    rows: dict[str, list[tuple[str, list[str]]]] = {}
    heading = ""
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            heading = line
        m = ROW.match(line)
        if m:
            rows.setdefault(f"{m.group(1)}.{m.group(2)}", []).append(
                (heading, [m.group(3).strip(), m.group(4), m.group(5)]))
    return rows


def test_page_is_generated_from_the_code():
    page, generated = PAGE.read_text(encoding="utf-8"), reference()
    if page != generated:
        first = next((i for i, (a, b) in enumerate(zip(page.splitlines(), generated.splitlines())) if a != b),
                     min(len(page.splitlines()), len(generated.splitlines())))
        shown = generated.splitlines()[first] if first < len(generated.splitlines()) else "(end of page)"
        pytest.fail(f"docs/config.md differs from the code's config reference (first at line {first + 1}: the code "
                    f"gives {shown!r}); regenerate it with `{REGENERATE}`")


@pytest.mark.parametrize("name", registry.names())
@pytest.mark.parametrize("model", list(MODEL_KEYS))
def test_every_key_is_on_the_page_with_its_default(name, model):
    """Every key the loader accepts for (name, model) has a row, with the default the loader fills in; an
    [algorithm] key's row names ``name`` (or says it applies to all the family's names)."""
    rows, full = _rows(), defaults(name, model)
    for section, keys in key_schema(name, model).items():
        for key in keys:
            if (section, key) in (("algorithm", "name"), ("model", "name")):
                continue
            where = f"{section}.{key}"
            assert where in rows, f"{where} (accepted for {name}, {model}) has no row on docs/config.md"
            candidates = rows[where]
            if section == "algorithm" and key not in registry.COMMON_KEYS:  # the row of name's family
                candidates = [(h, cells) for h, cells in candidates if f"`{name}`" in h]
                assert len(candidates) == 1, (where, name)
                assert f"`{name}`" in candidates[0][1][2] or "all its names" in candidates[0][1][2], (where, name)
            assert any(cells[1] == value_text(full[section][key]) for _, cells in candidates), \
                (where, candidates, full[section][key])


def test_a_private_only_key_does_not_list_the_non_private_names():
    rows = _rows()
    for spec in registry.specs():
        for name in spec.names:
            for key, f in spec.config.__dataclass_fields__.items():
                if key not in spec.keys(name):
                    assert not any(f"`{name}`" in cells[2] for _, cells in rows[f"algorithm.{key}"]), (name, key)
                    setting = f"algorithm.{key}={value_text(spec.default_of(f))}"
                    with pytest.raises(ConfigError, match=f"algorithm.{key}"):
                        load_config(None, [f"algorithm.name='{name}'", setting])


def test_reference_command_prints_the_page(capsys):
    assert main(["config", "--reference"]) == 0
    assert capsys.readouterr().out == PAGE.read_text(encoding="utf-8")


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_config_command_prints_a_config_that_reads_back_the_same(example, capsys, tmp_path):
    overrides = ["privacy.budget={server = 2.5}", "model.name='mlp'", "model.hidden=[16, 8]"]
    assert main(["config", str(example), *[a for o in overrides for a in ("--set", o)]]) == 0
    printed = capsys.readouterr().out
    resolved = load_config(example, overrides)
    unset = [f"# {key} = none" for values in resolved.values() for key, v in values.items() if v is None]
    commented = [line.split("   (")[0] for line in printed.splitlines() if line.startswith("# ")]
    assert unset and all(line in commented for line in unset)  # TOML cannot write them: comments
    (tmp_path / "resolved.toml").write_text(printed)
    tomllib.loads(printed)
    assert load_config(tmp_path / "resolved.toml") == resolved


def test_config_command_names_a_bad_key(capsys):
    assert main(["config", "--set", "algorithm.no_such_key=1"]) == 2
    assert "algorithm.no_such_key" in capsys.readouterr().err
    assert main(["config", "--reference", "--set", "algorithm.lr=1"]) == 2
