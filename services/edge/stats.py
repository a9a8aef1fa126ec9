"""EdgeStats: the edge's counters, and the $SYS topics that publish them.

Counters are plain integers bumped on the hot path (no locks, no metric objects); the $SYS
publisher and the Prometheus collector read them when they report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from hexmq import __version__

log = logging.getLogger(__name__)

SYS_PREFIX = "$SYS/broker/nodes"


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

    def sys_values(self, connected: int) -> Iterator[tuple[str, str]]:
        """(subtopic, value) pairs, as mosquitto's $SYS/broker tree names them."""
        yield "version", f"hexmq {__version__}"
        yield "uptime", f"{int(time.time() - self.started_at)} seconds"
        yield "clients/connected", str(connected)
        yield "clients/total_connects", str(self.connects)
        yield "messages/received", str(sum(self.messages_in))
        yield "messages/sent", str(sum(self.messages_out))
        for qos in (0, 1, 2):
            yield f"messages/received/qos{qos}", str(self.messages_in[qos])
            yield f"messages/sent/qos{qos}", str(self.messages_out[qos])
        yield "bytes/received", str(self.bytes_in)
        yield "bytes/sent", str(self.bytes_out)
        yield "publish/dropped_qos0", str(self.dropped_qos0)
        yield "publish/dropped_too_large", str(self.dropped_too_large)
        yield "publish/refused", str(self.refused_publishes)
        yield "packets/rejected", str(sum(self.rejected.values()))


Sender = Callable[[str, bytes], None]


async def publish_sys_topics(
    node_id: str,
    stats: EdgeStats,
    connected: Callable[[], int],
    send: Sender,
    interval: float,
) -> None:
    """Every `interval` seconds, publish this node's counters under $SYS/broker/nodes/<node>/
    (QoS 0, like mosquitto's $SYS tree; cluster-wide totals need every node's figures and
    arrive with the conformance work)."""
    prefix = f"{SYS_PREFIX}/{node_id}"
    while True:
        for sub, value in stats.sys_values(connected()):
            send(f"{prefix}/{sub}", value.encode())
        await asyncio.sleep(interval)
