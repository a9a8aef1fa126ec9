"""The divergence check's comparison of replicas and the convergence check's judgement of
followers (tests/faults/observe.py)."""

from __future__ import annotations

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as ppb
from tests.faults.observe import _differences, _partitions_problem


def meta(epoch: int, seq: int, history: bytes) -> dict[bytes, bytes]:
    return {b"epoch": str(epoch).encode(), b"seq": str(seq).encode(), b"history": history}


def test_an_epoch_without_entries_in_one_replicas_history_is_no_divergence() -> None:
    # Seed 2000: the master took a snapshot during epoch 37, in which nothing was written.
    master = {"hx:19:meta": meta(46, 11, b"1:1,32:3,37:6,46:6"), "hx:19:sessions": {b"s": b"x"}}
    follower = {"hx:19:meta": meta(46, 11, b"1:1,32:3,46:6"), "hx:19:sessions": {b"s": b"x"}}
    assert _differences(master, follower) == []
    # An epoch past the last entry is empty too.
    assert (
        _differences(
            {"hx:1:meta": meta(3, 5, b"1:1,3:4,5:6")}, {"hx:1:meta": meta(3, 5, b"1:1,3:4")}
        )
        == []
    )


def test_histories_that_place_entries_in_other_epochs_differ() -> None:
    a = {"hx:19:meta": meta(46, 11, b"1:1,32:3,46:6")}
    b = {"hx:19:meta": meta(46, 11, b"1:1,32:4,46:6")}
    assert _differences(a, b) == ["hx:19:meta"]
    assert _differences(a, {"hx:19:meta": meta(46, 12, b"1:1,32:3,46:6")}) == ["hx:19:meta"]
    assert _differences({"hx:1:q:c": {b"1": b"m"}}, {"hx:1:q:c": {b"1": b"n"}}) == ["hx:1:q:c"]


# ----- convergence: every follower in sync and keeping up ------------------------------------


def view_of(*parts: tuple[int, int, list[str]]) -> mpb.View:
    return mpb.View(
        epoch=120,
        partitions=[
            mpb.PartitionAssignment(partition=p, epoch=e, replicas=r, in_sync=r)
            for p, e, r in parts
        ],
    )


def mastering(
    p: int, epoch: int, sequence: int, *followers: tuple[str, int, bool]
) -> ppb.PartitionStatus:
    return ppb.PartitionStatus(
        partition=p,
        epoch=epoch,
        role="master",
        sequence=sequence,
        followers=[
            ppb.FollowerStatus(
                node_id=node,
                acknowledged=acked,
                lag=sequence - acked,
                in_sync=in_sync,
                state="live",
            )
            for node, acked, in_sync in followers
        ],
    )


def status(node: int, *partitions: ppb.PartitionStatus) -> ppb.StatusReply:
    return ppb.StatusReply(node_id=f"n{node}", partitions=partitions)


def test_followers_an_entry_or_few_short_keep_up_if_they_passed_the_check_before() -> None:
    # Seed 2001 (replayed): under continuous publishing on a loaded machine, in-sync live
    # followers are a few entries short at every check; the instant view of lag never converged.
    view = view_of((17, 77, ["n2", "n3", "n5"]))
    first = {2: status(2, mastering(17, 77, 1889, ("n3", 1886, True), ("n5", 1889, True)))}
    reason, before = _partitions_problem(view, first, {})
    assert reason.startswith("p17: followers ['n3'] behind n2 (n3 in sync, live, acknowledged")
    assert before == {(17, 77, "n2"): 1889}
    # Later: n3 has everything n2 had at the check before, and is again a few entries short.
    second = {2: status(2, mastering(17, 77, 1923, ("n3", 1920, True), ("n5", 1922, True)))}
    reason, before = _partitions_problem(view, second, before)
    assert reason == ""
    assert before == {(17, 77, "n2"): 1923}


def test_a_follower_that_does_not_reach_what_its_master_had_before_is_behind() -> None:
    view = view_of((17, 77, ["n2", "n3", "n5"]))
    before = {(17, 77, "n2"): 1923}
    # The master wrote nothing more and n3 is still short: stuck.
    stuck = {2: status(2, mastering(17, 77, 1923, ("n3", 1920, True), ("n5", 1923, True)))}
    reason, _ = _partitions_problem(view, stuck, before)
    assert reason == (
        "p17: followers ['n3'] behind n2"
        " (n3 in sync, live, acknowledged 1920 of 1923; 1923 at the check before)"
    )
    # The master wrote on and n3 falls further behind.
    falling = {2: status(2, mastering(17, 77, 2400, ("n3", 1900, True), ("n5", 2400, True)))}
    assert _partitions_problem(view, falling, before)[0].startswith("p17: followers ['n3']")


def test_a_follower_out_of_the_in_sync_set_is_behind_even_with_nothing_in_flight() -> None:
    view = view_of((17, 77, ["n2", "n3", "n5"]))
    replies = {2: status(2, mastering(17, 77, 50, ("n3", 50, False), ("n5", 50, True)))}
    reason, _ = _partitions_problem(view, replies, {(17, 77, "n2"): 50})
    assert reason.startswith("p17: followers ['n3'] behind n2 (n3 not in sync")


def test_what_a_master_had_at_another_epoch_or_on_another_node_does_not_count() -> None:
    view = view_of((17, 78, ["n2", "n3", "n5"]))
    replies = {2: status(2, mastering(17, 78, 1923, ("n3", 1920, True), ("n5", 1923, True)))}
    # Earlier sequences of epoch 77, or of another master, are no baseline for epoch 78.
    for before in ({(17, 77, "n2"): 1900}, {(17, 78, "n3"): 1900}):
        assert _partitions_problem(view, replies, before)[0].startswith("p17: followers ['n3']")
    assert _partitions_problem(view, replies, {(17, 78, "n2"): 1900})[0] == ""


def test_mastering_what_the_view_does_not_say_or_not_answering_is_no_convergence() -> None:
    view = view_of((3, 5, ["n1", "n2", "n3"]), (4, 9, ["n2", "n1", "n3"]))
    calm = mastering(3, 5, 10, ("n2", 10, True), ("n3", 10, True))
    assert _partitions_problem(view, {1: status(1, calm), 2: None}, {})[0] == (
        "n2's partition service does not answer"
    )
    stale = mastering(4, 8, 7, ("n1", 7, True), ("n3", 7, True))
    assert _partitions_problem(view, {1: status(1, calm), 3: status(3, stale)}, {})[0] == (
        "n3 masters p4 at 8 (view: n2)"
    )
    assert _partitions_problem(view, {1: status(1, calm)}, {}) == ("", {(3, 5, "n1"): 10})
