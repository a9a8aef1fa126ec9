"""EdgeStats: the edge's counters.

Counters are plain integers bumped on the hot path (no locks, no metric objects); the $SYS
publisher (services/edge/systopics.py) and the Prometheus collector read them when they report.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from hexmq.telemetry.metrics import EDGE_LIMITS


@dataclass(slots=True)
class EdgeStats:
    started_at: float = field(default_factory=time.time)
    connects: int = 0
    # Indexed by QoS.
    messages_in: list[int] = field(default_factory=lambda: [0, 0, 0])
    messages_out: list[int] = field(default_factory=lambda: [0, 0, 0])
    bytes_in: int = 0
    bytes_out: int = 0
    # QoS 0 deliveries dropped for subscribers that could not keep up.
    dropped_qos0: int = 0
    # Deliveries larger than the client's Maximum Packet Size, discarded for that client.
    dropped_too_large: int = 0
    # QoS >= 1 publishes refused (not stored, never acknowledged).
    refused_publishes: int = 0
    # Connections ended or refused for bad input or a refusal, by (packet kind, reason code).
    rejected: Counter[tuple[str, int]] = field(default_factory=Counter)
    # What each resource limit turned away or lowered (hexmq.telemetry.metrics.EDGE_LIMITS).
    limited: Counter[str] = field(default_factory=Counter)

    def counters(self, connected: int) -> dict[str, int]:
        """The figures $SYS publishes, by subtopic as mosquitto's $SYS/broker tree names them
        (uptime in seconds)."""
        values = {
            "uptime": int(time.time() - self.started_at),
            "clients/connected": connected,
            "clients/total_connects": self.connects,
            "messages/received": sum(self.messages_in),
            "messages/sent": sum(self.messages_out),
        }
        for qos in (0, 1, 2):
            values[f"messages/received/qos{qos}"] = self.messages_in[qos]
            values[f"messages/sent/qos{qos}"] = self.messages_out[qos]
        values["bytes/received"] = self.bytes_in
        values["bytes/sent"] = self.bytes_out
        values["publish/dropped_qos0"] = self.dropped_qos0
        values["publish/dropped_too_large"] = self.dropped_too_large
        values["publish/refused"] = self.refused_publishes
        values["packets/rejected"] = sum(self.rejected.values())
        for limit in EDGE_LIMITS:
            values[f"limits/{limit}"] = self.limited[limit]
        return values
