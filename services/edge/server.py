"""Edge: the MQTT listener, its live connections, and the links to every partition node."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import ssl
import time
import uuid
from collections.abc import Callable

import grpc

from hexmq import telemetry
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.grpc_options import CLUSTER_CHANNEL_OPTIONS
from hexmq.hashring import partition_of
from hexmq.inproc import NodeServers
from hexmq.membership.client import ViewWatcher
from hexmq.membership.view import has_left
from hexmq.node_protocol import THIS_RELEASE
from hexmq.streams import Dial
from hexmq.trust.grpc_tls import ClusterTLS
from hexmq.trust.identity import EDGE, MEMBERSHIP, PARTITION, Identity
from services.edge.access import AccessControl
from services.edge.config import EdgeConfig
from services.edge.connection import ClientConnection, State
from services.edge.deadlines import LoopDeadlines
from services.edge.dispatch import Dispatcher
from services.edge.handoff import hand_off_shared, publish_will
from services.edge.limits import ConnectionLimit, ConnectionRate, connection_ceiling
from services.edge.links import GRPC_OPTIONS, PartitionLink
from services.edge.listeners import start_listeners
from services.edge.outcomes import kick_code
from services.edge.qos2_origins import OriginForgets
from services.edge.router import Router
from services.edge.stats import EdgeStats
from services.edge.systopics import SysTopics
from services.edge.tickets import Route
from services.edge.tracing import EdgeTracer
from services.edge.unreachable import SWEEP_S, UnreachableMasters

log = logging.getLogger("hexmq.edge")


# How long an edge told to stop (SIGTERM) waits for the view to say its node is leaving before
# it stops plainly (its agent got the same signal and needs a view change to say so).
LEAVE_NOTICE_S = 5.0


class Edge:
    def __init__(
        self,
        config: EdgeConfig,
        tracing: telemetry.Tracing | None = None,
        *,
        access: AccessControl | None = None,
        tls: ssl.SSLContext | None = None,
        cluster_tls: ClusterTLS,
        colocated: NodeServers | None = None,
    ) -> None:
        if (config.tls_listen or config.wss_listen) and tls is None:
            raise ValueError("--tls-listen and --wss-listen need --tls-cert and --tls-key")
        self.config = config
        self.access = access or AccessControl()
        self.limit = ConnectionLimit(config.max_connections or connection_ceiling())
        self.connect_rate = (
            ConnectionRate(config.max_connection_rate) if config.max_connection_rate else None
        )
        self._tls = tls
        # The cluster's links (to partition services and the node's agent), not MQTT's TLS.
        self._cluster_tls = cluster_tls
        # A co-located node (`hexmq node`): its own agent and partition service in process.
        self._colocated = colocated
        self.tracer = EdgeTracer(tracing or telemetry.Tracing.disabled(), config.node_id)
        self.router = Router()
        self.dispatcher = Dispatcher(self.router.links, config.failover_hold)
        self.router.partition_open = self.dispatcher.open
        # Live connections waiting for their session's master, ended past the bound.
        self.unreachable: UnreachableMasters[str] = UnreachableMasters(
            config.unreachable_disconnect
        )
        self._sweeper: asyncio.TimerHandle | None = None
        self.connections: dict[str, ClientConnection] = {}
        # Every connection's timer (CONNECT timeout, keepalive), on one loop timer.
        self.deadlines: LoopDeadlines[ClientConnection] = LoopDeadlines(ClientConnection._tick)
        self.stats = EdgeStats()
        self._sys_task: asyncio.Task[None] | None = None
        self.incarnation = time.time_ns()
        self._counter = itertools.count(1)
        dial_agent: Dial = functools.partial(
            cluster_tls.channel,
            config.membership,
            # Any node's membership agent (an edge may be deployed on its own and pointed at
            # another node's): its role, not its node, is what must match.
            peer=MEMBERSHIP,
            # Pings: a watch only receives, and would not notice a dead connection.
            options=CLUSTER_CHANNEL_OPTIONS,
        )
        if colocated is not None:
            dial_agent = functools.partial(colocated.to_membership, EDGE, cluster_tls.trust_domain)
        self._watcher = ViewWatcher(
            config.membership, self._on_view, dial=dial_agent, node_id=config.node_id
        )
        self._servers: list[asyncio.Server] = []
        # Inbound QoS 2: origin ids whose claims are settled, for their targets to forget.
        self.qos2_forgets = OriginForgets(self.dispatcher, _call_soon)
        # Messages of deliveries from a master the connection's session had left (dropped).
        self.stale_deliveries = 0
        # Commands the connections sent whose answers have not come (a stop waits for them).
        self.answers_due = 0
        # While a partition link's frame is handled (`batched`), connections gather their
        # writes here and write once at its end.
        self.corked = False
        self.to_flush: list[ClientConnection] = []
        # Set by `stop` once its clients have gone and their answers have come.
        self._settled: asyncio.Event | None = None
        self.stopping = False

    # ----- what connections tell it (services/edge/connection.py, ConnectionHost) -----------

    def connection_opened(self, conn: ClientConnection) -> None:
        self.connections[conn.connection_id] = conn

    def flush_later(self, conn: ClientConnection) -> None:
        self.to_flush.append(conn)

    def answers_settled(self) -> None:
        """Every command the connections sent has its answer (for now)."""
        if self._settled is not None:
            self._settle_check()

    def connection_gone(self, conn: ClientConnection) -> None:
        self.connections.pop(conn.connection_id, None)
        self.limit.release()
        self._settle_check()

    def _settle_check(self) -> None:
        """While stopping: set `_settled` once no socket is open and no answer is due."""
        if self._settled is not None and not self.connections and not self.answers_due:
            self._settled.set()

    def new_connection_id(self) -> str:
        return f"{self.config.edge_id}.{self.incarnation:x}.{next(self._counter)}"

    # ----- what sessions read (services/edge/session/state.py, EdgeServices) ---------------

    def partition_open(self, p: int) -> bool:
        return self.dispatcher.open(p)

    def partition_route(self, p: int) -> Route | None:
        return self.dispatcher.route(p)

    def assign_client_id(self) -> str:
        return f"hexmq-{uuid.uuid4().hex[:20]}"

    async def start(self, startup_timeout: float) -> None:
        self._watcher.start()
        async with asyncio.timeout(startup_timeout):
            await self._watcher.wait_ready()
        self._servers = await start_listeners(self, self._tls)
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_S, self.sweep)
        if self.config.sys_interval > 0:
            self._sys_task = asyncio.create_task(
                SysTopics(self, self.config.sys_interval).run(), name="sys-topics"
            )

    async def stop(self, *, leaving: bool = False) -> None:
        """Stop in stages: stop accepting; tell clients (5.0: DISCONNECT 0x8B) and close their
        sockets once their writes are out; wait, within --shutdown-grace, until every socket
        has closed and every command the connections sent has its answer (their sessions'
        closes, QoS 2 routings still to be reported); then abort what is left and stop the
        links. `leaving`: the node left the cluster; 5.0 clients of the plain MQTT listener
        get another node's address as the Server Reference (docs/operations.md, "Leaving")."""
        for server in self._servers:
            server.close()
        if self._sys_task is not None:
            self._sys_task.cancel()
        for conn in list(self.connections.values()):
            conn.shutdown(self.leave_reference(conn) if leaving else self.config.server_reference)
        grace = self.config.shutdown_grace
        self.stopping = True
        self._settled = asyncio.Event()
        self._settle_check()
        try:
            await asyncio.wait_for(self._settled.wait(), grace)
        except TimeoutError:
            log.warning(
                "stopping with %d client sockets open and %d answers due after the %gs grace",
                len(self.connections),
                self.answers_due,
                grace,
            )
        for conn in list(self.connections.values()):
            conn.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        self.deadlines.close()
        self.dispatcher.stop()
        for link in self.router.links.values():
            await link.stop()
        await self._watcher.stop()

    async def follow_leave(
        self, timeout_s: float, cut_short: asyncio.Event, notice_s: float = LEAVE_NOTICE_S
    ) -> bool | None:
        """On SIGTERM: if the node is leaving (its agent was asked, by `hexmq cluster leave` or
        by its own SIGTERM; the view says so within `notice_s`), keep serving until the view
        has let the node go, `timeout_s` has passed or `cut_short` is set. The edge never asks
        for a leave itself, so an edge restarted alone does not take its node out. True: the
        node left; False: it did not within `timeout_s`; None: it is not leaving."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        node = self.config.node_id
        noticed = False
        while not cut_short.is_set():
            view = self.router.view
            if view is not None and has_left(view, node):
                return True
            noticed = noticed or (view is not None and node in view.leaving)
            waited = loop.time() - start
            if (not noticed and waited >= notice_s) or waited >= timeout_s:
                return False if noticed else None
            await asyncio.sleep(0.1)
        return False if noticed else None

    def leave_reference(self, conn: ClientConnection) -> str | None:
        """Where a client of this leaving node should go: --server-reference if set, else, for
        the plain MQTT listener (another node's mqtt_addr is that kind of address), a member
        that is not leaving, spread over them by client id."""
        if self.config.server_reference:
            return self.config.server_reference
        transport = conn.transport
        local = transport.get_extra_info("sockname") if transport is not None else None
        view = self.router.view
        if view is None or not isinstance(local, tuple) or local[1] != self.config.port:
            return None
        others = sorted(
            m.mqtt_addr
            for m in view.members
            if m.node_id != self.config.node_id and m.node_id not in view.leaving and m.mqtt_addr
        )
        if not others:
            return None
        session = conn.session
        return others[partition_of(session.client_id or session.peer, len(others))]

    def connected_clients(self) -> int:
        return sum(1 for c in self.connections.values() if c.session.state is State.CONNECTED)

    def on_publish_will(self, will: pb.PublishWill) -> None:
        publish_will(self.router, self.dispatcher, will, self.access, self.stats)

    def on_shared_handoff(self, handoff: pb.SharedHandoff) -> None:
        hand_off_shared(self.router, self.dispatcher, handoff)

    def link_backlog(self) -> int:
        return sum(link.backlog for link in self.router.links.values())

    async def _on_view(self, view: mpb.View) -> None:
        self.apply_view(view)

    def apply_view(self, view: mpb.View) -> None:
        """A newer view: route by it, link to new members, re-attach the live connections whose
        session partition moved, then send what the partitions that opened hold."""
        self.router.set_view(view)
        hello = pb.Hello(
            # The partition services keep one link per edge id: each edge of a node has its own.
            edge_id=self.config.edge_id,
            edge_incarnation=self.incarnation,
            protocol=THIS_RELEASE.to_proto(),
        )
        for member in view.members:
            if member.node_id not in self.router.links:
                link = PartitionLink(
                    member.node_id,
                    member.partition_addr,
                    hello,
                    self,
                    functools.partial(self._dial_partition, member.node_id, member.partition_addr),
                )
                self.router.links[member.node_id] = link
                link.start()
        moved = self.dispatcher.set_view(view)
        reattached = self._reattach(moved)
        self.dispatcher.pump()
        if self.router.index_complete:
            self.dispatcher.index_completed()
        log.info(
            "view %d: %d partition nodes; %d partitions moved, %d sessions re-attached",
            view.epoch,
            len(view.members),
            len(moved),
            reattached,
        )

    def _dial_partition(self, node: str, target: str) -> grpc.aio.Channel:
        """A channel to node `node`'s partition service, with TLS as the current view says it
        serves (PeerRefused when this edge may not dial it)."""
        colocated = self._colocated
        if colocated is not None and node == colocated.node_id:
            return colocated.to_partition(EDGE, self._cluster_tls.trust_domain)
        view = self.router.view
        member = next((m for m in view.members if m.node_id == node), None) if view else None
        return self._cluster_tls.channel(
            target,
            peer=Identity(PARTITION, node),
            peer_tls=member.tls if member is not None else None,
            options=GRPC_OPTIONS,
        )

    def sweep(self) -> None:
        """Every SWEEP_S: end the live connections whose session waited past
        --unreachable-disconnect for its master (services/edge/unreachable.py decides), and
        show the waits and the links in the metrics."""
        if self._sweeper is not None:
            self._sweeper = asyncio.get_running_loop().call_later(SWEEP_S, self.sweep)
        dispatcher = self.dispatcher
        unsettled = dispatcher.core.unsettled()
        waiting: dict[str, int] = {}
        if unsettled:
            for connection_id, conn in self.connections.items():
                session = conn.session
                if session.partition in unsettled and session.waits_for_master():
                    waiting[connection_id] = session.partition
        ended = self.unreachable.sweep(dispatcher.clock(), waiting)
        metrics = telemetry.METRICS
        metrics.sessions_waiting_for_master.set(len(waiting) - len(ended))
        self._show_links(metrics)
        if not ended:
            return
        partitions = sorted({p for _, p, _ in ended})
        why = {p: dispatcher.why(p) for p in partitions}
        log.warning(
            "ending %d connections whose session's master stayed unreachable past %g s "
            "(--unreachable-disconnect), so that they reconnect: partitions %s (%s)",
            len(ended),
            self.unreachable.bound,
            ", ".join(map(str, partitions[:10])) + (", ..." if len(partitions) > 10 else ""),
            why[partitions[0]],
        )
        metrics.unreachable_disconnects.inc(len(ended))
        for connection_id, p, waited in ended:
            gone = self.connections.get(connection_id)
            if gone is not None:
                gone.master_unreachable(
                    f"partition {p} of this session had no reachable master for {waited:.0f} s: "
                    f"{why[p]}; connect again"
                )

    def _show_links(self, metrics: telemetry.Metrics) -> None:
        """hexmq_links_down{link="edge"}: 1 per link not ready to a node the cluster counts
        on (a member, or a target member: one cut off or down is expected back); a node that
        left for good has no series."""
        view = self.router.view
        expected = (
            {m.node_id for m in view.members} | set(view.target_members)
            if view is not None
            else set()
        )
        for node, link in self.router.links.items():
            if node in expected:
                metrics.links_down.labels("edge", node).set(0 if link.ready else 1)
            else:
                with contextlib.suppress(KeyError):  # (a node that left: no series)
                    metrics.links_down.remove("edge", node)

    def _reattach(self, moved: set[int]) -> int:
        """Re-attach the live connections whose session partition is among `moved` (another
        master, epoch or link session than the one they are attached through)."""
        if not moved:
            return 0
        reattached = 0
        for conn in list(self.connections.values()):
            session = conn.session
            if session.state is State.CONNECTED and session.partition in moved and conn.reattach():
                reattached += 1
        return reattached

    # ----- LinkListener -----------------------------------------------------------------

    def batched(
        self, handle: Callable[[pb.PartitionFrame], None], frame: pb.PartitionFrame
    ) -> None:
        """Handle a frame from a partition link with the connections' writes corked: each
        connection writes once, at the end, what the frame's results and deliveries made."""
        self.corked = True
        try:
            handle(frame)
        finally:
            self.corked = False
            waiting, self.to_flush = self.to_flush, []
            for conn in waiting:
                conn.flush()

    def on_link_up(self, link: PartitionLink) -> None:
        reattached = self._reattach(self.dispatcher.link_up(link))
        self.dispatcher.pump()
        log.info("partition node %s ready; re-attached %d sessions", link.node_id, reattached)

    def on_link_down(self, link: PartitionLink) -> None:
        self.dispatcher.link_down(link)

    def on_delivery(self, link: PartitionLink, delivery: pb.Delivery) -> None:
        conn = self.connections.get(delivery.connection_id)
        if conn is None:
            return
        source = conn.delivery_source()
        if source is not None and link.node_id != source:
            # From a master the session has left (or is leaving: its re-attach elsewhere is on
            # its way). Taking it would put a message in flight that the new master does not
            # know is, and it would send it again: a duplicate. The new master sends whatever
            # the re-attach did not name as in flight, so nothing is lost.
            self.stale_deliveries += len(delivery.messages)
            return
        conn.deliver(delivery)

    def on_kick(self, link: PartitionLink, kick: pb.Kick) -> None:
        conn = self.connections.get(kick.connection_id)
        # A master that waits for the close asks for its confirmation (a master of an earlier
        # release does not, and would not know the command).
        confirm_to = link.node_id if kick.confirm else ""
        if conn is not None:
            # Closes it, then confirms the close to the kicking master (act.ConfirmKick).
            conn.kick(kick_code(kick.reason), confirm_to)
        elif confirm_to:
            # Gone already: not live here, which is what the master waits to hear.
            kicked = pb.Kicked(client_id=kick.client_id, connection_id=kick.connection_id)
            link.send(pb.EdgeCommand(kicked=kicked))

    def on_index_update(self, link: PartitionLink, update: pb.IndexUpdate) -> None:
        for p, epoch in self.router.apply_index_update(link.node_id, update):
            self.dispatcher.saw_epoch(p, epoch)
        if update.snapshot_done and self.router.index_complete:
            self.dispatcher.index_completed()
        if update.seq:
            # Applied: the partition may now answer the SUBSCRIBE that caused it.
            link.send(pb.EdgeCommand(index_ack=pb.IndexAck(seq=update.seq)), urgent=True)


def _call_soon(callback: Callable[[], None]) -> None:
    asyncio.get_running_loop().call_soon(callback)
