"""Where the partition's command core gets new ids: an `IdSource`, random in the service
(services/partition/sources.py RandomIds), counted in tests (tests/support/partition_harness.py),
so that a scenario's effects are the same in every run."""

from __future__ import annotations

from typing import Protocol

# The size of a QoS 2 claim's origin id (pb.Qos2Inbound.origin).
ORIGIN_BYTES = 16


class IdSource(Protocol):
    def origin(self) -> bytes:
        """A new origin id for an inbound QoS 2 claim (ORIGIN_BYTES long), unique cluster-wide:
        its targets use it to store the message once, however often it is routed."""
        ...

    def first_handoff_id(self) -> int:
        """Where this process's shared-subscription handoff ids start: above any a previous run
        of this node may have stored."""
        ...
