"""Membership: events fold into views, the board serves the newest, bad member files are named."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from services.membership.backend import Joined, Left, StaticMembership, ViewBuilder
from services.membership.server import ViewBoard
from services.membership.view import MemberInfo, MembersFileError, load_members


def member(n: int) -> MemberInfo:
    return MemberInfo(
        f"n{n}", f"127.0.0.1:{7000 + n}", f"127.0.0.1:{1882 + n}", f"127.0.0.1:{8000 + n}"
    )


def test_views_follow_joins_and_leaves() -> None:
    builder = ViewBuilder(partitions=16, rf=2)
    first = builder.apply([Joined(member(3)), Joined(member(1)), Joined(member(2))])
    assert first is not None
    assert first.epoch == 1
    assert [m.node_id for m in first.members] == ["n1", "n2", "n3"]
    assert [a.partition for a in first.partitions] == list(range(16))
    assert all(len(set(a.replicas)) == 2 for a in first.partitions)

    assert builder.apply([Joined(member(2))]) is None  # nothing changed: no new epoch

    second = builder.apply([Left("n2")])
    assert second is not None
    assert second.epoch == 2
    assert all("n2" not in a.replicas for a in second.partitions)
    assert builder.apply([Left("n1"), Left("n3")]) is None  # no member left: no view


async def test_static_membership_reports_every_member_once() -> None:
    batches = [batch async for batch in StaticMembership([member(1), member(2)]).events()]
    assert batches == [[Joined(member(1)), Joined(member(2))]]


async def test_board_wakes_watchers_with_newer_views_only() -> None:
    builder = ViewBuilder(partitions=4, rf=1)
    first = builder.apply([Joined(member(1))])
    second = builder.apply([Joined(member(2))])
    assert first is not None
    assert second is not None
    board = ViewBoard(first)
    waiter = asyncio.create_task(board.newer_than(1))
    await asyncio.sleep(0)
    assert not waiter.done()
    await board.publish(second)
    assert (await asyncio.wait_for(waiter, 1)).epoch == 2
    with pytest.raises(ValueError, match="not newer"):
        await board.publish(first)


def test_members_file_errors_name_the_problem(tmp_path: Path) -> None:
    bad_json = tmp_path / "a.json"
    bad_json.write_text('{"members": [\n  {"node_id": "n1",}\n]}')
    with pytest.raises(MembersFileError, match=r"a\.json:2: not JSON"):
        load_members(bad_json)
    missing = tmp_path / "b.json"
    missing.write_text(json.dumps({"members": [{"node_id": "n1"}]}))
    with pytest.raises(MembersFileError, match=r"members\[0\] needs string fields"):
        load_members(missing)
    dup = tmp_path / "c.json"
    entry = {"node_id": "n1", "partition_addr": "a", "mqtt_addr": "b", "membership_addr": "c"}
    dup.write_text(json.dumps({"members": [entry, entry]}))
    with pytest.raises(MembersFileError, match="duplicate node_id"):
        load_members(dup)
    with pytest.raises(MembersFileError, match="cannot read"):
        load_members(tmp_path / "absent.json")
