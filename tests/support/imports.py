"""The import graph of our packages, read from the source (no module is imported): for the
import-rule tests (tests/unit/test_edge_imports.py, tests/unit/test_service_imports.py).

Every import counts, wherever it stands: at the top, inside a function, under TYPE_CHECKING (a
circle of type-only imports is still a design that cannot be read in one direction). An
import names the module and, for `from m import x`, also `m.x` (which is a module when x is
one).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATED = ("hexmq", "api")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, root: Path = ROOT) -> set[str]:
    """Every name `path` imports (relative imports made absolute)."""
    here = module_name(path, root).split(".")
    package = here if path.name == "__init__.py" else here[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package[: len(package) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def modules(package: str, root: Path = ROOT) -> dict[str, Path]:
    """The modules of a package ("services.edge", "hexmq"), generated code left out."""
    found = {}
    for path in (root / Path(*package.split("."))).rglob("*.py"):
        if path.relative_to(root).parts[: len(GENERATED)] == GENERATED:
            continue
        found[module_name(path, root)] = path
    return found


def graph(package: str, root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of `package` -> every name it imports."""
    return {name: imported_names(path, root) for name, path in modules(package, root).items()}


def within(edges: dict[str, set[str]]) -> dict[str, set[str]]:
    """The graph's arrows between its own modules only."""
    return {name: names & edges.keys() - {name} for name, names in edges.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def reaching(edges: dict[str, set[str]], *prefixes: str) -> dict[str, set[str]]:
    """Each module that imports a name under one of `prefixes` (the name itself or below it)
    -> those names."""
    found = {}
    for name, names in edges.items():
        hits = {n for n in names if any(n == p or n.startswith(p + ".") for p in prefixes)}
        if hits:
            found[name] = hits
    return found


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """A small source tree under `root` (path -> text), for a rule's test on a violating import."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root
