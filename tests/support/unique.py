"""Names no other test, worker or run shares: client ids, topics, tags."""

from __future__ import annotations

import uuid


def uid(length: int = 10) -> str:
    """`length` random hex digits."""
    return uuid.uuid4().hex[:length]
