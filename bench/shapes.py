"""Who publishes where and who subscribes to what: the client layouts of a run.

A layout places every client on one of the broker's MQTT ports. Against a cluster the ports
are its nodes' and clients go round robin over them, publisher and subscriber on different
nodes where the shape allows it, so a message crosses nodes as it would behind a load balancer.
Against a single broker (mosquitto, one hexmq node) every port is the same one.

- **fan-in**: N publishers on topics ``<prefix>/p<i>``, one subscriber on ``<prefix>/+``. The
  publishers go round robin starting at the second node and the subscriber is on the first,
  so with 3 nodes two thirds of the messages are published on another node.
- **fan-out**: one publisher on ``<prefix>/p0`` (first node), N subscribers on that topic,
  round robin starting at the second node.
- **pairs**: N publishers, each with its own subscriber on its own topic; publisher i on node
  i mod nodes, its subscriber on the next node.
- **split**: pairs as above, but every publisher on the first node and every subscriber on the
  second (the moderate-load suite, bench/moderate.py: each message crosses from one edge to
  another, as the issue's measurements did). With one port, all on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SHAPES = ("fanin", "fanout", "pairs")
# Shapes the moderate-load suite uses (not part of the cluster suite's SHAPES).
EXTRA_SHAPES = ("split",)


@dataclass(frozen=True, slots=True)
class Layout:
    shape: str
    # {"index": i, "port": P, "topic": T}, index from 0 (the payload carries it)
    publishers: list[dict[str, Any]]
    # {"index": j, "port": P, "filter": F, "publishers": [the indexes F matches]}
    subscribers: list[dict[str, Any]]

    @property
    def deliveries_per_publish(self) -> float:
        """How many deliveries one publish makes: a delivered rate over this is a publish rate."""
        matches = sum(len(s["publishers"]) for s in self.subscribers)
        return matches / len(self.publishers)

    def nodes_used(self, ports: list[int]) -> dict[str, list[int]]:
        """Clients per port, for the record."""
        return {
            "publishers": [sum(p["port"] == port for p in self.publishers) for port in ports],
            "subscribers": [sum(s["port"] == port for s in self.subscribers) for port in ports],
        }


def _topic(prefix: str, i: int) -> str:
    return f"{prefix}/p{i}"


def layout(shape: str, clients: int, ports: list[int], prefix: str) -> Layout:
    """`clients` is the fan-in's publishers, the fan-out's subscribers or the number of pairs."""
    if not ports:
        raise ValueError("no ports")
    n = len(ports)

    def node(i: int) -> int:
        return ports[i % n]

    if shape == "fanin":
        pubs = [
            {"index": i, "port": node(i + 1), "topic": _topic(prefix, i)} for i in range(clients)
        ]
        subs = [
            {
                "index": 0,
                "port": node(0),
                "filter": f"{prefix}/+",
                "publishers": list(range(clients)),
            }
        ]
    elif shape == "fanout":
        pubs = [{"index": 0, "port": node(0), "topic": _topic(prefix, 0)}]
        subs = [
            {"index": j, "port": node(j + 1), "filter": _topic(prefix, 0), "publishers": [0]}
            for j in range(clients)
        ]
    elif shape == "pairs":
        pubs = [{"index": i, "port": node(i), "topic": _topic(prefix, i)} for i in range(clients)]
        subs = [
            {"index": i, "port": node(i + 1), "filter": _topic(prefix, i), "publishers": [i]}
            for i in range(clients)
        ]
    elif shape == "split":
        pubs = [{"index": i, "port": node(0), "topic": _topic(prefix, i)} for i in range(clients)]
        subs = [
            {"index": i, "port": node(1), "filter": _topic(prefix, i), "publishers": [i]}
            for i in range(clients)
        ]
    else:
        raise ValueError(f"shape must be one of {SHAPES + EXTRA_SHAPES}, got {shape!r}")
    return Layout(shape, pubs, subs)
