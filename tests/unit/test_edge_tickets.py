"""The edge's fan-in of command answers (services/edge/tickets.py): `when_all_answered` and
`fan_in` built on it."""

from __future__ import annotations

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.edge.tickets import fan_in, when_all_answered

OK = pb.Result(status=pb.StatusCode.STATUS_CODE_OK)


def failed(why: str) -> pb.Result:
    return pb.Result(status=pb.StatusCode.STATUS_CODE_UNAVAILABLE, message=why)


def test_done_once_the_last_answer_comes_with_the_answers_in_order() -> None:
    calls: list[list[pb.Result]] = []
    answered = when_all_answered(3, calls.append)
    answered(OK)
    answered(failed("a"), "a route")  # extra arguments are ignored
    assert calls == []
    answered(failed("b"))
    assert calls == [[OK, failed("a"), failed("b")]]


def test_done_never_again_after_the_count() -> None:
    calls: list[list[pb.Result]] = []
    answered = when_all_answered(1, calls.append)
    answered(OK)
    answered(OK)
    assert len(calls) == 1


def test_fan_in_gives_the_first_failure_or_none() -> None:
    heard: list[pb.Result | None] = []
    answered = fan_in(3, heard.append)
    answered(OK)
    answered(failed("first"))
    answered(failed("second"))
    assert heard == [failed("first")]
    one = fan_in(1, heard.append)
    one(OK, "a route")
    assert heard == [failed("first"), None]
    all_ok = fan_in(2, heard.append)
    all_ok(OK)
    all_ok(OK)
    assert heard == [failed("first"), None, None]
