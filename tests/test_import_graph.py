"""The shape of the code (docs/architecture.md, "Layers"): every ``import`` of a stepkit module inside
``stepkit/`` (at module level or inside a function: a late import is still a dependency) goes to a module of
the same layer or one below, and the modules' import graph has no circle (imports under ``if TYPE_CHECKING:``
are annotations, not dependencies). No file is longer than 600 lines."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT

PACKAGE = ROOT / "stepkit"
MAX_LINES = 600

# lowest first; a module's layer is that of the longest prefix listed
LAYERS = [
    ("stepkit", "stepkit.aio", "stepkit.errors", "stepkit.options", "stepkit.console", "stepkit.matching", "stepkit.metrics",
     "stepkit.conversations", "stepkit.columns", "stepkit.columns_legacy", "stepkit.schema", "stepkit.shards",
     "stepkit.models", "stepkit.prompts", "stepkit.grading"),
    ("stepkit.engines", "stepkit.stage", "stepkit.per_row"),
    ("stepkit.runner",),
    ("stepkit.stages", "stepkit.views"),
    ("stepkit.cli",),
]
LAYER_NAMES = ["grading/schema/shards (base)", "engines and the stage contract", "runner", "stages and views", "cli"]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(name: str) -> int:
    best, layer = -1, None
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (name == p or name.startswith(p + ".")) and len(p) > best:
                best, layer = len(p), i
    assert layer is not None, f"{name} is in no layer: add it to LAYERS"
    return layer


def _runtime_nodes(tree: ast.AST):
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:`` (annotations only, never imported)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def import_graph() -> dict[str, set[str]]:
    """Module -> the stepkit modules it imports (``from a.b import c`` counts as ``a.b.c`` when that is a
    module, else ``a.b``)."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}

    def resolve(target: str) -> str | None:
        while target and target not in modules:
            target = target.rpartition(".")[0]
        return target or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in _runtime_nodes(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            for t in targets:
                if t.startswith("stepkit"):
                    r = resolve(t)
                    if r and r != name and not name.startswith(r + "."):  # a package's own __init__ is no edge
                        deps.add(r)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on, stack, found, counter = {}, {}, set(), [], [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_no_import_climbs_a_layer():
    graph = import_graph()
    climbing = [f"{m} ({LAYER_NAMES[layer_of(m)]}) imports {d} ({LAYER_NAMES[layer_of(d)]})"
                for m, deps in sorted(graph.items()) for d in sorted(deps) if layer_of(d) > layer_of(m)]
    assert climbing == []


def test_no_import_circle():
    assert cycles(import_graph()) == []


def test_the_checks_see_a_circle_and_a_climb():
    """The two checks above can fail: a made-up graph with a circle and an upward import."""
    graph = {"stepkit.shards": {"stepkit.runner.plan"}, "stepkit.runner.plan": {"stepkit.shards"}}
    assert cycles(graph) == [["stepkit.runner.plan", "stepkit.shards"]]
    assert layer_of("stepkit.runner.plan") > layer_of("stepkit.shards")


def test_no_file_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}, "cut these by job (docs/architecture.md)"
