"""The partition master's command core does no I/O and reads no clock: its modules (the state,
the command table and the commands, services/partition/state.py and what it names) import no
module of the event loop, Redis, gRPC, sockets, threads or the clock, and none of the
partition service's adapters, not even through the service's other modules. The adapters
(node.py, promotion.py, the group commit, the store, the servicer) carry its effects out.

Read from the source, as tests/unit/test_service_imports.py reads it (tests/support/imports.py:
every import counts, type-only and function-level ones too). Each rule is also run on a small
tree with one violating import, so that a rule that could never fail would show.
"""

from __future__ import annotations

from pathlib import Path

from tests.support.imports import graph, reaching, within, write_tree

PACKAGE = "services.partition"
CORE = {
    f"{PACKAGE}.{name}"
    for name in (
        "state",
        "commands",
        "fencing",
        "roles",
        "session_commands",
        "subscriptions",
        "delivery",
        "qos2_inbound",
        "wills",
        "will_board",
        "effects",
        "stored",
        "limits",
        "id_source",
    )
}
IO = ("asyncio", "redis", "grpc", "socket", "selectors", "threading", "time", "subprocess")
ADAPTERS = tuple(
    f"{PACKAGE}.{name}"
    for name in (
        "node",
        "promotion",
        "store",
        "group_commit",
        "redis_tx",
        "redis_access",
        "peers",
        "agreement",
        "server",
        "main",
    )
)
# Modules the core reaches that import asyncio for their own adapter half, which the core
# never calls: an EdgeLink's frames (the servicer drains them), the index barrier's timeout.
KNOWN = {f"{PACKAGE}.links": {"asyncio"}, f"{PACKAGE}.index_barrier": {"asyncio"}}


def reached(edges: dict[str, set[str]], start: set[str]) -> set[str]:
    """The modules of the package that `start` imports, directly or through others."""
    inner = within(edges)
    seen: set[str] = set()
    todo = [name for name in start if name in inner]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(inner[name])
    return seen


def core_io(root: Path | None = None, core: set[str] = CORE) -> dict[str, set[str]]:
    """Each module the core reaches that imports an I/O module (but for KNOWN), and which."""
    edges = graph(PACKAGE) if root is None else graph(PACKAGE, root)
    found = reaching({name: edges[name] for name in reached(edges, core)}, *IO, *ADAPTERS)
    return {
        name: extra for name, names in found.items() if (extra := names - KNOWN.get(name, set()))
    }


def test_the_core_modules_are_there() -> None:
    assert graph(PACKAGE).keys() >= CORE


def test_the_command_core_imports_no_io_module_nor_an_adapter() -> None:
    assert core_io() == {}


def test_the_known_exceptions_are_still_there() -> None:
    edges = graph(PACKAGE)
    found = reaching({name: edges[name] for name in reached(edges, CORE)}, *IO)
    assert {name: found.get(name, set()) & known for name, known in KNOWN.items()} == KNOWN


def test_a_clock_read_in_the_core_is_found(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "services/__init__.py": "",
            "services/partition/__init__.py": "",
            "services/partition/roles.py": "import time\n",
        },
    )
    assert core_io(root) == {f"{PACKAGE}.roles": {"time"}}


def test_an_adapter_reached_through_another_module_is_found(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "services/__init__.py": "",
            "services/partition/__init__.py": "",
            "services/partition/delivery.py": "from services.partition import retained\n",
            "services/partition/retained.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from services.partition.store import RedisStore\n"
            ),
        },
    )
    assert core_io(root) == {
        f"{PACKAGE}.retained": {f"{PACKAGE}.store", f"{PACKAGE}.store.RedisStore"}
    }
