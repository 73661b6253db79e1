"""The house stays clean: imports inside tspbench form no cycle, and every import points down the layers
(README.md, "Layout"): an edge from a lower layer to a higher one is how cycles start.

The graph is read from the source with `ast` (no import is executed), function-level imports included, so a
lazy import that hides a cycle is caught too. `from A import b` is an edge to module A.b when that file
exists, else to A.
"""

from __future__ import annotations

import ast
from pathlib import Path

import tspbench

PKG = Path(tspbench.__file__).resolve().parent

# Lowest first. A module may import modules of its own layer or of lower ones.
LAYERS: list[tuple[str, ...]] = [
    ("tspbench", "tspbench.paths", "tspbench.config", "tspbench.parallel", "tspbench.spawn"),
    ("tspbench.model", "tspbench.cli"),
    ("tspbench.schemes",),
    ("tspbench.measure",),
    ("tspbench.predict",),
    ("tspbench.record",),
    ("tspbench.run", "tspbench.verify", "tspbench.paper", "tspbench.hf.parallelize", "tspbench.peers"),
    ("tspbench.report",),
    # entry points: the commands (README.md, "Commands") and the Hydra callback that ends a sweep with its report
    (
        "tspbench.__main__",
        "tspbench.run.callbacks",
        "tspbench.estimate",
        "tspbench.gpu_check",
        "tspbench.validate",
        "tspbench.plan",
        "tspbench.headline",
        "tspbench.report.__main__",
        "tspbench.verify.__main__",
    ),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py")}


def resolve(name: str, known: dict[str, Path]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph: dict[str, set[str]] = {m: set() for m in known}
    for mod, path in known.items():
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import
                    anchor = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    anchor = anchor[: len(anchor) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            for t in targets:
                if t.startswith("tspbench"):
                    r = resolve(t, known)
                    if r and r != mod:
                        graph[mod].add(r)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer_of(mod: str) -> int:
    best, depth = None, -1
    for i, prefixes in enumerate(LAYERS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and len(p) > depth:
                best, depth = i, len(p)
    assert best is not None, f"{mod} is in no layer: add it to LAYERS (and to the README's layout)"
    return best


def test_no_import_cycle():
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" ↔ ".join(c) for c in found)


def test_imports_point_down_the_layers():
    graph = import_graph()
    upward = [
        f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
        for a, deps in sorted(graph.items())
        for b in sorted(deps)
        if layer_of(b) > layer_of(a)
    ]
    assert not upward, "\n".join(upward)


def test_the_checks_can_fail():
    """Non-vacuity: a planted cycle and a planted upward edge are found."""
    g = {"tspbench.a": {"tspbench.b"}, "tspbench.b": {"tspbench.a"}, "tspbench.c": set()}
    assert cycles(g) == [["tspbench.a", "tspbench.b"]]
    assert layer_of("tspbench.report.build") > layer_of("tspbench.schemes.tsp")
    graph = import_graph()
    assert "tspbench.schemes.comm" in graph["tspbench.schemes.tsp"]  # the parser sees real edges
    assert "tspbench.verify.serve" in graph["tspbench.verify.runner"]  # including function-level ones
