"""--max-connections (served, refused at CONNECT, closed at accept), --max-connection-rate and
the topic limits."""

from __future__ import annotations

import resource

from services.edge.limits import (
    REFUSAL_SLOTS,
    RESERVED_FDS,
    Admission,
    ConnectionLimit,
    ConnectionRate,
    TopicLimits,
    connection_ceiling,
)


def test_admission_by_open_count() -> None:
    limit = ConnectionLimit(2)
    assert [limit.admit() for _ in range(2)] == [Admission.ADMITTED] * 2
    assert limit.admit() is Admission.REFUSE
    verdicts = [limit.admit() for _ in range(REFUSAL_SLOTS)]
    assert verdicts[: REFUSAL_SLOTS - 1] == [Admission.REFUSE] * (REFUSAL_SLOTS - 1)
    assert verdicts[-1] is Admission.DROP
    for _ in range(REFUSAL_SLOTS + 1):
        limit.release()
    assert limit.open == 2
    limit.release()
    assert limit.admit() is Admission.ADMITTED  # a closed connection frees its place


def test_ceiling_leaves_room_below_the_open_file_limit() -> None:
    ceiling = connection_ceiling()
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert ceiling + REFUSAL_SLOTS + RESERVED_FDS <= soft


def test_connection_rate_allows_a_burst_then_the_rate() -> None:
    now = [100.0]
    rate = ConnectionRate(4)
    assert [rate.allow(now[0]) for _ in range(5)] == [True] * 4 + [False]
    now[0] += 0.5  # half a second refills two
    assert [rate.allow(now[0]) for _ in range(3)] == [True, True, False]
    now[0] += 60  # never more than one second's worth
    assert sum(rate.allow(now[0]) for _ in range(10)) == 4


def test_topic_limits_count_utf8_bytes_and_levels() -> None:
    limits = TopicLimits(max_length=8, max_levels=3)
    assert limits.refusal("a/b/c") is None
    assert limits.refusal("12345678") is None
    assert limits.refusal("123456789") == "topic longer than 8 bytes"
    assert limits.refusal("éééé") is None  # 8 bytes
    assert limits.refusal("ééééé") == "topic longer than 8 bytes"  # 10 bytes in 5 characters
    assert limits.refusal("a/b/c/d") == "topic with more than 3 levels"
    # 128 levels by default (issue 25), 0: no limit.
    assert TopicLimits().refusal("a/" * 127 + "b") is None
    assert TopicLimits().refusal("a/" * 128 + "b") == "topic with more than 128 levels"
    assert TopicLimits(max_levels=0).refusal("a/" * 1000 + "b") is None
    assert TopicLimits(max_levels=3).which("a/b/c/d") == (
        "topic_levels",
        "topic with more than 3 levels",
    )
    assert TopicLimits(max_length=8).which("123456789")[0] == "topic_length"
