"""The import graph of the package and the benchmarks, read from the source with `ast`: no cycles, and the
layers' forbidden arrows.

Every `import` counts wherever it stands (module level, inside a function, under TYPE_CHECKING): an import
moved into a function to dodge a cycle still ties the two modules together, so it is a cycle here too.
`python tests/unit/test_import_graph.py` prints every cycle and forbidden arrow it finds.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("outpost", "benchmarks")

# (from-layer, to-layer): an arrow from a module under the first to one under the second is a layering bug.
FORBIDDEN = [
    ("outpost.engine", "outpost.models"),
    ("outpost.api", "outpost.engine"),
    ("outpost.api", "outpost.serving"),
    ("outpost.api", "outpost.cluster"),
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    """The dotted names an import statement loads: `from a import b` loads module `a.b` if there is one,
    else names an attribute of `a` (and so loads `a`)."""
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
        return
    base = node.module or ""
    if node.level:
        anchor = module.split(".")
        anchor = anchor if is_package else anchor[:-1]
        anchor = anchor[: len(anchor) - (node.level - 1)]
        base = ".".join([*anchor, base] if base else anchor)
    yield from (f"{base}.{alias.name}" for alias in node.names)


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of `name` that is a module of the package (an attribute import names its module).

    Importing `a.b.c` also runs the `a` and `a.b` packages' `__init__`; those implicit arrows are left out
    (every submodule has them), so a package is tied into a cycle only by what it names itself."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def import_graph() -> nx.DiGraph:
    modules = _modules()
    graph: nx.DiGraph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for name in _imported(node, module, is_package):
                target = _resolve(name, modules) if name.startswith(PACKAGES) else None
                # A package's own submodules importing it back is Python's normal package layout only
                # when the package re-exports them; an arrow to oneself is never a cycle worth reporting.
                if target and target != module:
                    graph.add_edge(module, target, line=node.lineno)
    return graph


def cycles(graph: nx.DiGraph) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (enough to name the knot)."""
    found = []
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1:
            found.append(nx.find_cycle(graph.subgraph(component)))
    return [[a for a, _ in cycle] + [cycle[0][0]] for cycle in found]


def _under(module: str, layer: str) -> bool:
    return module == layer or module.startswith(layer + ".")


def forbidden_arrows(graph: nx.DiGraph) -> list[str]:
    return [
        f"{a} -> {b} (line {graph.edges[a, b]['line']})"
        for a, b in graph.edges
        for src, dst in FORBIDDEN
        if _under(a, src) and _under(b, dst)
    ]


def test_the_graph_sees_the_package() -> None:
    graph = import_graph()
    # Sanity: the reader resolves relative, dotted and function-local imports (the checks would pass on an
    # empty graph otherwise).
    assert graph.number_of_nodes() > 100
    assert graph.has_edge("outpost.serving.local_backend", "outpost.engine.codec")  # module level
    assert graph.has_edge("outpost.models.convert.cli_args", "outpost.models.convert")  # in a function
    assert graph.has_edge("benchmarks.serve.main", "benchmarks.serve.plots")  # the benchmarks too


def test_the_package_has_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_no_layer_imports_a_layer_it_must_not() -> None:
    arrows = forbidden_arrows(import_graph())
    assert not arrows, "forbidden imports:\n" + "\n".join(arrows)


def test_the_reader_finds_function_local_and_relative_imports() -> None:
    src = "def f():\n    from .b import thing\n    import outpost.c\n"
    tree = ast.parse(src)
    names = [
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
        for name in _imported(node, "outpost.pkg.a", is_package=False)
    ]
    assert names == ["outpost.pkg.b.thing", "outpost.c"]


if __name__ == "__main__":
    g = import_graph()
    for cycle in cycles(g):
        print("cycle:", " -> ".join(cycle))
    for arrow in forbidden_arrows(g):
        print("forbidden:", arrow)
