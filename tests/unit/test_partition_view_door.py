"""One door for the view (services/partition/view_door.py): each agreed view reaches the
partition node and then the replication driver, both, in that order, one view after another;
and no other code of the partition service hands a view to either."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

from hexmq.api.membership.v1 import membership_pb2 as mpb
from services.partition.view_door import ViewDoor

ROOT = Path(__file__).resolve().parents[2]


class Node:
    def __init__(self, heard: list[tuple[str, int]]) -> None:
        self.heard = heard
        self.view: mpb.View | None = None

    def apply_view(self, view: mpb.View) -> None:
        self.heard.append(("node", view.epoch))
        self.view = view


class Replication:
    """Takes a view as the driver does: awaiting (its read of stored positions) before the
    roles, which act on the node at once."""

    def __init__(self, heard: list[tuple[str, int]], node: Node, admits: bool = True) -> None:
        self.heard = heard
        self.node = node
        self.admits = admits
        # The node's view epoch when this driver took each view's roles.
        self.node_saw: list[int | None] = []

    async def apply_view(self, view: mpb.View) -> None:
        await asyncio.sleep(0)
        self.heard.append(("replication", view.epoch))
        self.node_saw.append(self.node.view.epoch if self.node.view is not None else None)

    def admitted(self, view: mpb.View) -> bool:
        return self.admits


async def test_each_view_reaches_the_node_then_the_replication_driver() -> None:
    heard: list[tuple[str, int]] = []
    node = Node(heard)
    replication = Replication(heard, node)
    door = ViewDoor(node, replication)
    for epoch in (1, 2, 3):
        await door.enter(mpb.View(epoch=epoch))
    assert heard == [
        ("node", 1),
        ("replication", 1),
        ("node", 2),
        ("replication", 2),
        ("node", 3),
        ("replication", 3),
    ]
    # The roles of each view were taken while the node already fenced by that view.
    assert replication.node_saw == [1, 2, 3]


async def test_enter_says_whether_the_view_admits_this_service() -> None:
    heard: list[tuple[str, int]] = []
    node = Node(heard)
    assert await ViewDoor(node, Replication(heard, node, admits=True)).enter(mpb.View(epoch=1))
    assert not await ViewDoor(node, Replication(heard, node, admits=False)).enter(mpb.View(epoch=2))
    # Not admitted: both have the view all the same (the driver then takes no roles in it).
    assert heard[-2:] == [("node", 2), ("replication", 2)]


def test_no_other_code_of_the_partition_service_applies_a_view() -> None:
    """`apply_view` is called only by the door: a second way in could give the two halves
    different views, or the right views in the wrong order. (The node's own `apply_view`
    carries the view into its command core, `roles.apply_view(state, view, now)`: that is the
    node's half of the door, not another way in.)"""
    callers = [
        f"{path.name}:{call.lineno}"
        for path in sorted((ROOT / "services" / "partition").glob("*.py"))
        for call in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "apply_view"
        and not (isinstance(call.func.value, ast.Name) and call.func.value.id == "roles")
    ]
    assert [c.split(":")[0] for c in callers] == ["view_door.py", "view_door.py"], callers
