"""`--discovery static`: the nodes listed in a members file, re-read when it changes.

    # hexmq members: NODE_ID HOST:PORT (the node's partition service, its --partition-addr)
    n1 10.0.0.1:2885
    n2 10.0.0.2:2885      # comments and blank lines are fine

A line that is not that (or repeats a node id or an address) is an error naming the file and
the line: at startup the agent refuses to start; later, the file is kept as it last parsed
(an editor half-way through a save must not change who may join) and the error is logged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

from hexmq.netaddr import parse_hostport
from services.membership.discovery.model import DiscoveryError, ListedNode, Listing, normal_host
from services.membership.discovery.polling import poll_listings

NAME: Final = "static"
READ_ERRORS: Final = (OSError, UnicodeDecodeError, DiscoveryError)


def parse_members(text: str, source: str) -> Listing:
    """The members file's listing; DiscoveryError names `source` and the line."""
    nodes: list[ListedNode] = []
    ids: dict[str, int] = {}
    addrs: dict[tuple[str, int], int] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        where = f"{source}:{lineno}"
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if len(words) != 2:
            raise DiscoveryError(
                f"{where}: expected NODE_ID HOST:PORT (two fields), got {raw.strip()!r}"
            )
        node_id, addr = words
        try:
            host, port = parse_hostport(addr, what="the address")
            node = ListedNode(node_id=node_id, host=host, port=port)
        except ValueError as exc:
            raise DiscoveryError(f"{where}: {exc}") from None
        if node_id in ids:
            raise DiscoveryError(f"{where}: node {node_id} is listed on line {ids[node_id]} too")
        key = (normal_host(host), port)
        if key in addrs:
            raise DiscoveryError(f"{where}: address {addr} is listed on line {addrs[key]} too")
        ids[node_id], addrs[key] = lineno, lineno
        nodes.append(node)
    return Listing.of(nodes)


def read_members(path: Path) -> Listing:
    try:
        text = path.read_text()
    except OSError as exc:
        raise DiscoveryError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise DiscoveryError(f"{path}: not UTF-8 text ({exc.reason})") from None
    return parse_members(text, str(path))


class StaticDiscovery:
    """The members file, read at start and again every `interval_s` seconds."""

    name = NAME

    def __init__(self, path: Path, interval_s: float) -> None:
        self.path = path
        self.interval_s = interval_s

    async def _read(self) -> Listing:
        # A members file is a few lines: reading it on the loop costs less than a thread.
        return read_members(self.path)

    def listings(self) -> AsyncIterator[Listing]:
        return poll_listings(
            f"{NAME} ({self.path})", self._read, self.interval_s, (DiscoveryError,)
        )
