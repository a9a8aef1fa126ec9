"""What a node's services say of their cluster links (issue 30, DESIGN.md G9: a link that is
down shows in the metrics and `hexmq cluster status` within seconds), read from the Prometheus
metrics each serves over HTTP (`--metrics-listen`): `hexmq_links_down` of the edge (its links
to the partition services, its view watch) and of the partition service (its replication
streams from masters, its view watch), and the edge's sessions waiting for an unreachable
master and connections ended for it.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Mapping
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

# What each service's `hexmq_links_down{link}` is a link to, in words.
LINK_WORDS = {
    "edge": "edge -> partition service of",
    "replication": "replication stream from master",
    "membership": "view watch -> agent of",
}


def parse(text: str) -> dict[str, Any]:
    """The links down and the edge's waits in one service's metrics text."""
    down: list[dict[str, str]] = []
    found: dict[str, Any] = {"down": down}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "hexmq_links_down" and sample.value >= 1:
                down.append({"link": sample.labels["link"], "peer": sample.labels["peer"]})
            elif sample.name == "hexmq_sessions_waiting_for_master":
                found["sessions_waiting_for_master"] = int(sample.value)
            elif sample.name == "hexmq_unreachable_disconnects_total":
                found["unreachable_disconnects"] = int(sample.value)
            elif sample.name == "hexmq_connections":
                found["connections"] = int(sample.value)
    down.sort(key=lambda d: (d["link"], d["peer"]))
    return found


def read(host: str, ports: Mapping[str, int], timeout: float = 2.0) -> dict[str, Any]:
    """Ask each service (name -> metrics port on `host`; edge, edge2 ...: a node's edges).
    `down` lists every link down with the service that has it; `errors` the services that
    did not answer; the edges' waits are added up over them, and `connections` holds each
    edge's open client connections."""
    status: dict[str, Any] = {"down": [], "errors": {}}
    for service, port in ports.items():
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as r:
                text = r.read().decode()
        except (urllib.error.URLError, OSError, ValueError) as exc:
            status["errors"][service] = str(getattr(exc, "reason", exc))
            continue
        found = parse(text)
        status["down"] += [{"service": service, **d} for d in found.pop("down")]
        # (every service has the gauges; only an edge sets them: edge, edge2 ..., or the
        # co-located node's process, whose one registry every port shows)
        if service.startswith("edge") or service == "node":
            status.setdefault("connections", {})[service] = found.pop("connections", 0)
            for key, value in found.items():
                status[key] = status.get(key, 0) + value
    return status


def describe(node_id: str, links: Mapping[str, Any]) -> list[str]:
    """`hexmq cluster status`'s lines for a node whose links are not all up (none if they are)."""
    lines = [
        f"{node_id}: {d['service']}'s {LINK_WORDS.get(d['link'], d['link'])} {d['peer']} DOWN"
        for d in links.get("down", [])
    ]
    waiting = links.get("sessions_waiting_for_master") or 0
    if waiting:
        ended = links.get("unreachable_disconnects") or 0
        lines.append(
            f"{node_id}: {waiting} live connection(s) waiting for a master the edge cannot "
            f"reach ({ended} ended so far past --unreachable-disconnect)"
        )
    return lines
