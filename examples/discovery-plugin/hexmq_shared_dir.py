"""A hexmq discovery plugin: the nodes are the files of a directory that every node shares
(an NFS or SMB mount, a volume), as HiveMQ's shared-file and S3 discovery work.

Each node's membership agent writes `DIR/<node id>` holding its partition service's address
when discovery starts, removes it when the agent stops, and lists every node that has a file
there, reading the directory again every `interval` seconds:

    hexmq membership ... --discovery shared-dir \\
        --discovery-option dir=/mnt/hexmq-nodes --discovery-option interval=5

A node joins the cluster by starting (its file appears), and stays out while its file is
missing. Files whose name is not a node id, or that do not hold HOST:PORT (one being
written), are skipped until they do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from services.membership.discovery import DiscoveryContext, DiscoveryError, ListedNode, Listing

OPTIONS = {"dir", "interval"}


class SharedDirDiscovery:
    name = "shared-dir"

    def __init__(self, directory: Path, node_id: str, partition_addr: str, interval_s: float):
        self.directory = directory
        self.node_id = node_id
        self.partition_addr = partition_addr
        self.interval_s = interval_s

    def read(self) -> Listing:
        nodes = []
        for path in sorted(self.directory.iterdir()):
            try:
                host, _, port = path.read_text().strip().rpartition(":")
                nodes.append(ListedNode(node_id=path.name, host=host, port=int(port)))
            except (OSError, ValueError):  # not ours, or half-written: skipped for now
                continue
        return Listing.of(nodes)

    async def listings(self) -> AsyncIterator[Listing]:
        own = self.directory / self.node_id
        self.directory.mkdir(parents=True, exist_ok=True)
        # Written whole, then renamed: a reader never sees half an address.
        partial = self.directory / f".{self.node_id}.tmp"
        partial.write_text(self.partition_addr + "\n")
        partial.replace(own)
        last = None
        try:
            while True:
                listing = self.read()
                if listing != last:
                    last = listing
                    yield listing
                await asyncio.sleep(self.interval_s)
        finally:
            own.unlink(missing_ok=True)


def make(context: DiscoveryContext) -> SharedDirDiscovery:
    """Called once when the agent starts; a ValueError stops it with exit code 2."""
    unknown = sorted(set(context.options) - OPTIONS)
    if unknown:
        raise DiscoveryError(f"unknown option(s) {', '.join(unknown)}; it takes dir, interval")
    if not context.options.get("dir"):
        raise DiscoveryError("needs --discovery-option dir=PATH (the directory nodes share)")
    try:
        interval = float(context.options.get("interval", "5"))
    except ValueError:
        raise DiscoveryError("interval must be seconds, e.g. interval=5") from None
    if not interval > 0:
        raise DiscoveryError(f"interval must be more than 0 seconds, got {interval}")
    return SharedDirDiscovery(
        Path(context.options["dir"]), context.node_id, context.partition_addr, interval
    )
