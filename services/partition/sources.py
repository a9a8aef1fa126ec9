"""What the partition's command handling takes from outside itself: the time and new ids.

Handlers read no clock: the adapter (services/partition/server.py for edge commands, the
loop of services/partition/housekeeping.py for sweeps) gives each the time as `now`, unix
milliseconds. What runs after a batch is durable reads the node's `clock`. Ids come from an
`IdSource`: random in a service, counted in tests (tests/support/partition_harness.py), so that
a scenario's effects are the same in every run.
"""

from __future__ import annotations

import os
import time
from typing import Protocol

# The size of a QoS 2 claim's origin id (pb.Qos2Inbound.origin).
ORIGIN_BYTES = 16


def wall_ms() -> int:
    """The adapter's clock: the wall clock, unix ms."""
    return int(time.time() * 1000)


class IdSource(Protocol):
    def origin(self) -> bytes:
        """A new origin id for an inbound QoS 2 claim (ORIGIN_BYTES long), unique cluster-wide:
        its targets use it to store the message once, however often it is routed."""
        ...

    def first_handoff_id(self) -> int:
        """Where this process's shared-subscription handoff ids start: above any a previous run
        of this node may have stored."""
        ...


class RandomIds:
    """The service's ids: origin ids drawn at random, handoff ids from the start time in ns."""

    def origin(self) -> bytes:
        return os.urandom(ORIGIN_BYTES)

    def first_handoff_id(self) -> int:
        return time.time_ns()
