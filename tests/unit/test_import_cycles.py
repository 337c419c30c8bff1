"""No import cycles among the product's modules, counting every import statement that can run.

import-linter sees only what grimp sees, and an import inside a function hides a cycle from neither
Python nor a reader: the module still needs the other one, just later, and the pair can no longer be
read (or loaded) one before the other. So this walks every import statement of every module with `ast`
(module level, inside functions and methods, under `try` and `if`), builds the module graph and fails
naming each cycle as its chain of modules, with the file and line of each import on it.

What counts as an edge from module A:

- `import a.b.c` and `from a.b import c` where `a.b.c` is a module: an edge to `a.b.c`. `from a.b import
  name` where `name` is not a module: an edge to the package `a.b` (its `__init__`). Relative imports are
  resolved against A's package first.
- Importing a module runs its parent packages' `__init__` first, so the packages above the imported
  module are edges too, except those above A itself: they started before A did.
- Not counted: imports under `if TYPE_CHECKING:` (they never run, and are the usual way to name a type
  without needing its module at run time), imports of anything outside the product, and a module
  importing itself.

So a package whose `__init__` re-exports its submodules is fine as long as none of them imports a name
from the package back: a submodule doing `from pkg import name` (not a submodule) while `pkg/__init__`
imports that submodule, directly or not, is a cycle. It breaks when the submodule is imported first
(the package's `__init__` is only part-way through) and not otherwise, which is why it counts.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Each product package and the folder it sits in.
PACKAGES: Mapping[str, Path] = {
    "specfleet": ROOT / "operator",
    "specfleet_runtime": ROOT / "runtime",
    "specfleet_sandbox": ROOT / "sandbox",
    "specfleet_testbed": ROOT / "testbed",
}
# Cycles tolerated for now, each by the package that holds all of its modules and why. Keep it empty.
ALLOWED: Mapping[str, str] = {}


@dataclass(frozen=True)
class Edge:
    """Module `source` needs module `target`: the import statement at `line` of `source`'s file."""

    source: str
    target: str
    line: int


def find_modules(packages: Mapping[str, Path]) -> dict[str, Path]:
    """Every module of `packages` (a package by its `__init__.py`), by dotted name."""
    modules: dict[str, Path] = {}
    for package, folder in packages.items():
        for path in sorted((folder / package).rglob("*.py")):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            modules[name] = path
    return modules


def _import_statements(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement in `tree` that can run: all of them but those under `if TYPE_CHECKING:`."""
    pending: list[ast.AST] = [tree]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            pending.extend(node.orelse)
        else:
            pending.extend(ast.iter_child_nodes(node))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _parents(name: str) -> list[str]:
    """The packages above module `name`, outermost first."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def module_edges(name: str, modules: Mapping[str, Path]) -> list[Edge]:
    """The edges from module `name` (see the module docstring for what counts)."""
    path = modules[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    above = {*_parents(name), name}
    edges: list[Edge] = []

    def add(target: str, line: int) -> None:
        for module in _parents(target):
            if module in modules and module not in above:
                edges.append(Edge(name, module, line))
        if target in modules and target != name:
            edges.append(Edge(name, target, line))

    for node in _import_statements(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
            continue
        if node.level:
            base_parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*base_parts, node.module] if node.module else base_parts)
        else:
            base = node.module or ""
        for alias in node.names:
            submodule = f"{base}.{alias.name}"
            add(submodule if submodule in modules else base, node.lineno)
    return edges


def import_graph(packages: Mapping[str, Path]) -> dict[str, list[Edge]]:
    """Every module of `packages` and its edges."""
    modules = find_modules(packages)
    return {name: module_edges(name, modules) for name in modules}


def _reachable(graph: Mapping[str, list[Edge]], start: str) -> set[str]:
    seen: set[str] = set()
    pending = [start]
    while pending:
        for edge in graph[pending.pop()]:
            if edge.target not in seen:
                seen.add(edge.target)
                pending.append(edge.target)
    return seen


def find_cycles(graph: Mapping[str, list[Edge]]) -> list[tuple[frozenset[str], list[Edge]]]:
    """Each set of modules that need each other (a strongly connected component of two or more) and
    its shortest cycle through its first module by name, as the edges of that chain."""
    reach = {name: _reachable(graph, name) for name in graph}
    cycles: list[tuple[frozenset[str], list[Edge]]] = []
    done: set[str] = set()
    for name in sorted(graph):
        if name in done or name not in reach[name]:
            continue
        members = frozenset(m for m in reach[name] if name in reach[m])
        done |= members
        cycles.append((members, _shortest_cycle(graph, name, members)))
    return cycles


def _shortest_cycle(graph: Mapping[str, list[Edge]], start: str, members: frozenset[str]) -> list[Edge]:
    """The fewest edges from `start` back to itself, within `members` (breadth first)."""
    came_by: dict[str, Edge] = {}
    pending = deque([start])
    while pending:
        node = pending.popleft()
        for edge in graph[node]:
            if edge.target == start:
                chain = [edge]
                while chain[0].source != start:
                    chain.insert(0, came_by[chain[0].source])
                return chain
            if edge.target in members and edge.target not in came_by:
                came_by[edge.target] = edge
                pending.append(edge.target)
    raise AssertionError(f"{start} is in a cycle but none was found")


def describe(chain: list[Edge], modules: Mapping[str, Path], root: Path = ROOT) -> str:
    """`a -> b -> a`, and under it where each import is."""
    names = " -> ".join([chain[0].source, *(edge.target for edge in chain)])
    where = "".join(
        f"\n    {edge.source} -> {edge.target}: {modules[edge.source].relative_to(root)}:{edge.line}"
        for edge in chain
    )
    return names + where


def _inside(package: str, members: frozenset[str]) -> bool:
    return all(m == package or m.startswith(package + ".") for m in members)


def test_the_product_has_no_import_cycles() -> None:
    modules = find_modules(PACKAGES)
    cycles = find_cycles(import_graph(PACKAGES))
    found = [
        describe(chain, modules)
        for members, chain in cycles
        if not any(_inside(package, members) for package in ALLOWED)
    ]
    assert not found, "import cycles (move what both modules need down a level):\n" + "\n".join(found)
    stale = [package for package in ALLOWED if not any(_inside(package, m) for m, _ in cycles)]
    assert not stale, f"ALLOWED names packages that have no cycle any more: {stale}"


def test_the_walk_finds_the_product_modules() -> None:
    modules = find_modules(PACKAGES)
    assert "specfleet_runtime.router.proxy" in modules
    assert "specfleet.policy" in modules
    edges = import_graph(PACKAGES)["specfleet_runtime.router.app"]
    assert "specfleet_runtime.router.proxy" in {edge.target for edge in edges}


# ---- the walk itself, on small packages ----------------------------------------------------------------


def _package(tmp_path: Path, files: Mapping[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {"pkg": tmp_path}


def _cycles(tmp_path: Path, files: Mapping[str, str]) -> list[list[str]]:
    chains = find_cycles(import_graph(_package(tmp_path, files)))
    return [[chain[0].source, *(edge.target for edge in chain)] for _, chain in chains]


def test_an_import_inside_a_function_closes_a_cycle(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import B\nA = 1\n",
        "pkg/b.py": "B = 2\n\ndef f():\n    from pkg.a import A\n    return A\n",
    }
    assert _cycles(tmp_path, files) == [["pkg.a", "pkg.b", "pkg.a"]]
    packages = _package(tmp_path, files)
    [(_, chain)] = find_cycles(import_graph(packages))
    assert "pkg.b -> pkg.a: pkg/b.py:4" in describe(chain, find_modules(packages), tmp_path)


def test_an_import_only_for_type_checking_does_not_count(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import B\n",
        "pkg/b.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg.a import A\nelse:\n    B = 1\n",
    }
    assert _cycles(tmp_path, files) == []
    files["pkg/b.py"] += "if TYPE_CHECKING:\n    pass\nelse:\n    from pkg import a\n"
    assert _cycles(tmp_path, files) == [["pkg.a", "pkg.b", "pkg.a"]]


@pytest.mark.parametrize(
    "statement",
    [
        "from . import a",
        "from .a import A",
        "import pkg.sub.a",
        "from pkg.sub import a",
        "from ..sub import a",
    ],
)
def test_relative_imports_and_submodules_resolve_to_modules(tmp_path: Path, statement: str) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/sub/__init__.py": "",
        "pkg/sub/a.py": "from pkg.sub.b import B\nA = 1\n",
        "pkg/sub/b.py": f"def f():\n    {statement}\nB = 1\n",
    }
    assert _cycles(tmp_path, files) == [["pkg.sub.a", "pkg.sub.b", "pkg.sub.a"]]


def test_a_package_reexporting_its_submodules_is_no_cycle(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "from pkg.a import A\nfrom pkg.b import B\n",
        "pkg/a.py": "from pkg.b import B\nA = B\n",
        "pkg/b.py": "from . import c\nB = 1\n",
        "pkg/c.py": "",
    }
    assert _cycles(tmp_path, files) == []


def test_a_submodule_importing_a_name_from_its_package_that_imports_it_is_a_cycle(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "from pkg.a import A\n",
        "pkg/a.py": "from pkg.b import B\nA = B\n",
        "pkg/b.py": "from pkg import A\nB = 1\n",
    }
    assert _cycles(tmp_path, files) == [["pkg", "pkg.a", "pkg.b", "pkg"]]


def test_importing_a_module_runs_its_packages_init(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "",
        "pkg/x.py": "from pkg.sub.b import B\n",
        "pkg/sub/__init__.py": "from pkg import x\n",
        "pkg/sub/b.py": "B = 1\n",
    }
    assert _cycles(tmp_path, files) == [["pkg.sub", "pkg.x", "pkg.sub"]]
