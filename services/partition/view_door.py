"""The one door through which an agreed view (membership's `View`) reaches the partition
service: the view watcher hands each view to `ViewDoor.enter`, and nothing else calls the
`apply_view` of the node or of the replication driver.

A view goes to two places, in this order:

1. The partition node (`PartitionNode.apply_view`, sync): the view it fences commands by (who
   masters what at which epoch: WRONG_MASTER, STALE_EPOCH, or held for a partition about to be
   served here), and who held each partition this view gives this node (for its failover
   span).
2. The replication driver (`ReplicationDriver.apply_view`, async: it reads from Redis the
   stored positions of partitions new to this node): the roles. The state machine takes the
   new assignments and, in the same call, the driver hands the node the partitions it now
   masters (`promoted`) and no longer masters (`demoted_all`).

The node first, because what the driver makes happen at once reads the node's view: a
demotion hands the commands that waited for those partitions back to the node, which fences
them by its view; under the old one, which still names this node master, they would wait
again (up to roles.WAIT_S) instead of being answered with the new master at once. And the
node has noted who held each partition this view gives it before the promotion that serves
it begins. Views come one at a time (the watcher awaits each `enter`), so a view is in both
before the next enters either.
"""

from __future__ import annotations

from typing import Protocol

from hexmq.api.membership.v1 import membership_pb2 as mpb


class FencesByView(Protocol):
    """The partition node, as the view reaches it."""

    def apply_view(self, view: mpb.View) -> None: ...


class TakesRoles(Protocol):
    """The replication driver, as the view reaches it."""

    async def apply_view(self, view: mpb.View) -> None: ...
    def admitted(self, view: mpb.View) -> bool: ...


class ViewDoor:
    def __init__(self, node: FencesByView, replication: TakesRoles) -> None:
        self._node = node
        self._replication = replication

    async def enter(self, view: mpb.View) -> bool:
        """Apply `view`: the node's, then replication's (the order above). True if the view
        admits this partition service (else it takes no roles in it)."""
        self._node.apply_view(view)
        await self._replication.apply_view(view)
        return self._replication.admitted(view)
