"""--max-connections: served, refused at CONNECT, closed at accept."""

from __future__ import annotations

import resource

from services.edge.limits import (
    REFUSAL_SLOTS,
    RESERVED_FDS,
    Admission,
    ConnectionLimit,
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
