"""The package's import graph, read from the source (imports inside functions included): no module imports one that
imports it back, however far round, and each layer imports only the layers below it (docs/architecture.md, "Layers").

A function-level import does not make a circle go away, it only hides it from the interpreter: a reader following
the code still walks in a circle, and the two modules cannot be understood apart. Imports under ``if
TYPE_CHECKING:`` are left out: they name a type in an annotation and run nothing.
"""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src"

#: Each part of dpfl and the layer it sits in: a part imports only parts of lower layers (and itself).
LAYERS = {
    "dpfl.errors": 0, "dpfl.counts": 0,
    "dpfl.durable": 1, "dpfl.data": 1, "dpfl.models": 1,
    "dpfl.accounting": 2, "dpfl.exact_noise": 2,
    "dpfl.noise": 3, "dpfl.results": 3,  # Results reads a run's ledger (epsilon_curve)
    "dpfl.protocols": 4,
    "dpfl.engine": 5,
    "dpfl.algorithms": 6, "dpfl.audit": 6, "dpfl.planning": 6,
    "dpfl.experiments": 7, "dpfl.reproduction": 7,
    "dpfl.flower": 8, "dpfl.api": 8,
    "dpfl": 9, "dpfl.papers": 9,  # the papers' reproductions: imported by nothing but `dpfl reproduce`
    "dpfl.cli": 10,
}

def import_graph() -> dict[str, set[str]]:
    """{module: the dpfl modules it imports}, lazy imports included."""
    modules = {}
    for path in (SOURCE / "dpfl").rglob("*.py"):
        name = ".".join(path.relative_to(SOURCE).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in modules.items():
        imported = set()
        tree = ast.parse(path.read_text())
        typing_only = {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and _is_type_checking(block.test)
                       for statement in block.body for n in ast.walk(statement)}
        for node in (n for n in ast.walk(tree) if id(n) not in typing_only):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("dpfl"):
                imported |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                             for a in node.names}
            elif isinstance(node, ast.Import):
                imported |= {a.name for a in node.names if a.name.startswith("dpfl")}
        graph[name] = {m for m in imported if m in modules and m != name}
    return graph


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def part(module: str) -> str:
    """The part of dpfl a module belongs to: its subpackage or top-level module (``dpfl`` for the package root)."""
    return ".".join(module.split(".")[:2])


def test_no_module_imports_one_that_imports_it_back():
    assert circles(import_graph()) == []


def test_each_layer_imports_only_the_layers_below_it():
    graph = import_graph()
    unplaced = sorted({part(m) for m in graph} - set(LAYERS))
    assert unplaced == [], f"place these parts of dpfl in LAYERS: {unplaced}"
    upward = sorted((m, d) for m, ds in graph.items() for d in ds
                    if part(m) != part(d) and LAYERS[part(d)] >= LAYERS[part(m)])
    assert upward == []


def test_the_checks_see_a_circle_and_an_upward_import():
    """The two checks above on a made-up graph: a circle hidden behind a third module, and protocols -> engine."""
    graph = {"dpfl.a.x": {"dpfl.a.y"}, "dpfl.a.y": {"dpfl.a.z"}, "dpfl.a.z": {"dpfl.a.x"}, "dpfl.a.w": {"dpfl.a.x"}}
    assert circles(graph) == [{"dpfl.a.x", "dpfl.a.y", "dpfl.a.z"}]
    assert LAYERS[part("dpfl.engine.noise")] >= LAYERS[part("dpfl.protocols.shuffler")]
