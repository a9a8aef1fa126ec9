"""The divergence check's comparison of replicas (tests/faults/observe.py)."""

from __future__ import annotations

from tests.faults.observe import _differences


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
