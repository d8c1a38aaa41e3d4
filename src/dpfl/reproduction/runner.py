"""Running an item, cached by the sha256 of its settings and of its module's code: ``OUT/<item>/<sha256>/`` holds
results.json (the settings, the rows, everything else the item computed), table.md (the paper's numbers beside
dpfl's) and, for a figure, figure.png. A folder whose results.json exists is reused as it is, so a rerun computes only
the items whose settings changed; results.json is written last (atomically), so an interrupted run leaves nothing to
reuse."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

from dpfl.errors import ConfigError, DpflError
from dpfl.reproduction.item import Item, Row, fmt

#: Bumped when the layout of results.json changes, so older caches are not reused.
FORMAT = 1
RESEARCH_MODE = ("research mode: every training run draws its noise, minibatches and cohorts from run.noise_seed "
                 "(reproducible; its epsilons hold only against observers who do not know the seed)")


def digest(item: Item, settings: dict) -> str:
    """The sha256 of what the item's run depends on: its id, its settings, the results format and the source of the
    module defining its ``compute`` (an edited item is recomputed; a change deeper in dpfl is not noticed: remove the
    folder, or use a new --out, after one)."""
    module = sys.modules.get(item.compute.__module__)
    source = Path(module.__file__).read_bytes() if module is not None and getattr(module, "__file__", None) else b""
    text = json.dumps({"item": item.id, "settings": settings, "format": FORMAT,
                       "code": hashlib.sha256(source).hexdigest()}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def data_folder(item: Item) -> tuple[Path, str | None] | None:
    """Where the item's full run reads its data set, and why it cannot (the loader's message: the files expected,
    the folder and where the data set is published; None when its files are there); None when it reads no public
    data set."""
    if item.data is None:
        return None
    from dpfl.data.library import folder_of
    from dpfl.data.public import CATALOGUE, shape_of

    folder, _ = folder_of(CATALOGUE[item.data][0], None)
    try:
        shape_of(item.data)
    except ConfigError as err:
        return folder, str(err)
    return folder, None


def reproduce(item: Item, quick: bool, out: str | Path) -> dict:
    """The item's results, from the cache when its settings were run before (``"cached": True``), else computed and
    stored. A full run whose data set is absent, or of an item without one (``Item.no_full_run``), is refused,
    naming the loader's folder or the reason, and the quick substitute."""
    if not quick and item.no_full_run:
        raise DpflError(f"{item.id} has no full run: {item.no_full_run}. `dpfl reproduce {item.id} --quick` runs it "
                        f"on {item.substitute or 'data that ships'}")
    if not quick:
        absent = (data_folder(item) or (None, None))[1]
        if absent is not None:
            raise DpflError(f"{item.id}: its full run reads {item.data}, which is not there: {absent}. `dpfl "
                            f"reproduce {item.id} --quick` runs it on {item.substitute or 'data that ships'} instead")
    settings = item.settings(quick)
    key = digest(item, settings)
    folder = Path(out) / item.id / key
    path = folder / "results.json"
    if path.is_file():
        return {**json.loads(path.read_text()), "cached": True, "folder": str(folder)}
    folder.mkdir(parents=True, exist_ok=True)
    computed = dict(item.compute(settings, folder))
    rows = [r.to_dict() if isinstance(r, Row) else r for r in computed.pop("rows")]
    results = {"item": item.id, "paper": item.paper, "what": item.what, "source": item.source,
               "mode": "quick" if quick else "full", "settings": settings, "config_sha256": key,
               "research_mode": RESEARCH_MODE if item.research_mode else None, "rows": rows,
               "figure": "figure.png" if (folder / "figure.png").is_file() else None, "details": computed}
    (folder / "table.md").write_text(table(rows) + "\n")
    partial = folder / "results.json.part"
    partial.write_text(json.dumps(results, indent=1, default=_jsonable))
    os.replace(partial, path)
    return {**results, "cached": False, "folder": str(folder)}


def _jsonable(value):
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, (set, tuple)):
        return list(value)
    return str(value)


HEADER = ("| quantity | paper | dpfl, sound analysis | dpfl, the paper's analysis | match | why they differ |",
          "|---|---|---|---|---|---|")


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table: the paper's value beside dpfl's (sound, and the paper's analysis where it
    differs), match (yes / no / – where there is nothing to match) and the reason for a difference."""
    match = {True: "yes", False: "no", None: "–"}
    lines = list(HEADER)
    for r in rows:
        cells = [r["quantity"], fmt(r["paper"]), fmt(r["sound"]), fmt(r["paper_analysis"]), match[r["match"]],
                 r["note"]]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)
