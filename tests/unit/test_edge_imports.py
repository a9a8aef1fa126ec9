"""The edge's import graph: no circle among its modules (type-only imports count too: a circle
of them is a design that cannot be read in one direction), and a session core that imports
neither asyncio nor gRPC, not even through what it imports."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EDGE = ROOT / "services" / "edge"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def edge_imports(path: Path) -> set[str]:
    """The services.edge modules `path` imports, anywhere in it (TYPE_CHECKING blocks too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found.update(n for n in names if n.startswith("services.edge"))
    return found


def graph() -> dict[str, set[str]]:
    modules = {module_name(p): p for p in EDGE.rglob("*.py")}
    return {name: edge_imports(path) & modules.keys() - {name} for name, path in modules.items()}


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


def test_the_edge_has_no_import_circle() -> None:
    edges = graph()
    assert "services.edge.session.core" in edges
    assert circles(edges) == []


def test_the_circle_finder_finds_circles() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_the_session_core_imports_neither_asyncio_nor_grpc() -> None:
    probe = (
        "import sys; import services.edge.session; "
        "print(sorted(m for m in ('asyncio', 'grpc') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
