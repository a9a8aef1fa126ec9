"""What the partition's command handling takes from outside itself: the time and new ids.

Handlers read no clock: the adapter (services/partition/server.py for edge commands, the
loop of services/partition/housekeeping.py for sweeps) gives each the time as `now`, unix
milliseconds. What runs after a batch is durable reads the node's `clock`. Ids come from an
`IdSource` (services/partition/id_source.py): random in a service (here), counted in tests.
"""

from __future__ import annotations

import os
import time

from services.partition.id_source import ORIGIN_BYTES, IdSource

__all__ = ["ORIGIN_BYTES", "IdSource", "RandomIds", "wall_ms"]


def wall_ms() -> int:
    """The adapter's clock: the wall clock, unix ms."""
    return int(time.time() * 1000)


class RandomIds:
    """The service's ids: origin ids drawn at random, handoff ids from the start time in ns."""

    def origin(self) -> bytes:
        return os.urandom(ORIGIN_BYTES)

    def first_handoff_id(self) -> int:
        return time.time_ns()
