"""The edge without processes, at two heights.

The session core alone (services/edge/session/): `SessionEdge` is what a Session reads from its
edge (a real Router with a view and a subscription index, real access control and counters,
partitions open or not by hand), and `Driver` is a client on it: it sends packets, answers the
commands the session sent, ticks its timer, and decodes what it wrote.

    edge = SessionEdge.make(subscriptions={0: ["t/#"]})
    client = Driver(edge)
    actions = client.send(Connect("c1"))   # [PauseReading, Open(open_session), SetTimer]
    actions = client.answer(actions, session_present=False)
    assert client.packets(actions) == [ConnAck(...)]

The whole edge: `make_edge` builds a real Edge whose partition links are real PartitionLinks
that never connect; `up` makes a link ready (its index snapshot), `taken` reads back what it
would send, `ok` feeds it answers, and `Client` is an MQTT client on a fake socket to a real
ClientConnection.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from hexmq import telemetry
from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.hashring import partition_of
from hexmq.mqtt import NEED_DATA, ConnAck, Connect, MQTTConnection, Packet, Role
from hexmq.trust.grpc_tls import ClusterTLS
from services.edge.access import AccessControl
from services.edge.config import EdgeConfig
from services.edge.connection import ClientConnection
from services.edge.limits import Admission, ConnectionLimit, ConnectionRate
from services.edge.links import PartitionLink
from services.edge.router import Router
from services.edge.server import Edge
from services.edge.session import Action, Session
from services.edge.session import actions as act
from services.edge.stats import EdgeStats
from services.edge.tickets import Route
from services.edge.tracing import EdgeTracer

PARTITIONS = 8
NODES = ("n1", "n2")
HOLD = 10.0


def view(epoch: int, moved: Mapping[int, tuple[str, int]] | None = None) -> mpb.View:
    """Every partition on n1 at epoch 1, but those `moved` (partition -> (master, epoch))."""
    moved = moved or {}
    return mpb.View(
        epoch=epoch,
        partition_count=PARTITIONS,
        members=[mpb.Member(node_id=n) for n in NODES],
        partitions=[
            mpb.PartitionAssignment(
                partition=p, epoch=moved.get(p, ("n1", 1))[1], replicas=[moved.get(p, ("n1", 1))[0]]
            )
            for p in range(PARTITIONS)
        ],
    )


def client_id_in(p: int, prefix: str) -> str:
    """A client id whose session lives in partition p."""
    return next(cid for i in range(10_000) if partition_of(cid := f"{prefix}-{i}", PARTITIONS) == p)


def queued(mid: int, qos: int, topic: str = "t/x", payload: bytes = b"") -> pb.QueuedMessage:
    return pb.QueuedMessage(
        message_id=mid, qos=qos, message=cpb.Message(topic=topic, qos=qos, payload=payload)
    )


def config(**overrides: Any) -> EdgeConfig:
    fields: dict[str, Any] = {
        "node_id": "n1",
        "host": "127.0.0.1",
        "port": 0,
        "membership": "127.0.0.1:1",
        "failover_hold": HOLD,
        "sys_interval": 0,
    }
    return EdgeConfig(**(fields | overrides))


# ----- a router alone ---------------------------------------------------------------------------


def alternating_master(p: int) -> str:
    """Partition p's master in `alternating_router`'s view: n1 and n2 in turn."""
    return NODES[p % 2]


def alternating_router(*, up: tuple[str, ...] = NODES) -> Router:
    """A router whose partitions take commands while their master is in `up` (a set the test
    may change: `router.up`)."""
    router = Router()
    router.set_view(
        mpb.View(
            epoch=1,
            partition_count=PARTITIONS,
            partitions=[
                mpb.PartitionAssignment(partition=p, epoch=10 + p, replicas=[alternating_master(p)])
                for p in range(PARTITIONS)
            ],
        )
    )
    live = set(up)
    router.up = live
    router.partition_open = lambda p: alternating_master(p) in live
    for node in NODES:
        router.apply_index_update(node, pb.IndexUpdate(reset=True, snapshot_done=True))
    assert router.index_complete
    return router


def announce(
    router: Router, p: int, filt: str, *, present: bool = True, online: bool = True
) -> None:
    router.apply_index_update(
        alternating_master(p),
        pb.IndexUpdate(
            entries=[pb.IndexEntry(partition=p, filter=filt, present=present, online=online)]
        ),
    )


# ----- the session core -------------------------------------------------------------------------


@dataclass
class SessionEdge:
    """What a Session reads from its edge (services/edge/session/state.py, EdgeServices)."""

    config: EdgeConfig
    router: Router
    stats: EdgeStats = field(default_factory=EdgeStats)
    tracer: EdgeTracer = field(
        default_factory=lambda: EdgeTracer(telemetry.Tracing.disabled(), "n1")
    )
    access: AccessControl = field(default_factory=AccessControl)
    limit: ConnectionLimit = field(default_factory=lambda: ConnectionLimit(100))
    connect_rate: ConnectionRate | None = None
    # Partitions that take no commands now (a CONNECT to one waits at a Gate).
    closed: set[int] = field(default_factory=set)
    # Where each partition's commands go, when not (its master by the view, epoch 1, session 1).
    routes: dict[int, Route] = field(default_factory=dict)
    _ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    @classmethod
    def make(
        cls,
        subscriptions: Mapping[int, Sequence[str]] | None = None,
        moved: Mapping[int, tuple[str, int]] | None = None,
        **overrides: Any,
    ) -> SessionEdge:
        """An edge with the view `view(1, moved)`, its index holding `subscriptions`
        (partition -> filters), and the EdgeConfig `overrides`."""
        router = Router()
        router.set_view(view(1, moved))
        entries = [
            pb.IndexEntry(partition=p, filter=f, present=True)
            for p, filters in (subscriptions or {}).items()
            for f in filters
        ]
        for node in NODES:
            mine = [e for e in entries if router.master(e.partition) == node]
            router.apply_index_update(
                node, pb.IndexUpdate(reset=True, entries=mine, snapshot_done=True)
            )
        return cls(config(**overrides), router)

    def partition_open(self, p: int) -> bool:
        return p not in self.closed

    def partition_route(self, p: int) -> Route | None:
        view = self.router.view
        assert view is not None
        return self.routes.get(p, Route(self.router.master(p), view.partitions[p].epoch, 1))

    def assign_client_id(self) -> str:
        return f"assigned-{next(self._ids)}"


class Driver:
    """An MQTT client driving one Session directly: packets in, actions out, no event loop."""

    def __init__(
        self,
        edge: SessionEdge,
        *,
        now: float = 100.0,
        wall_ms: int = 1_700_000_000_000,
        admission: Admission = Admission.ADMITTED,
    ) -> None:
        self.edge = edge
        self.session = Session(edge, "n1.1.1")
        self.codec = MQTTConnection(Role.CLIENT)
        self.now = now
        self.wall_ms = wall_ms
        self.started = self.session.start("127.0.0.1:40000", admission, now)

    def send(self, *packets: Packet) -> list[Action]:
        data = b"".join(self.codec.send(p) for p in packets)
        return self.session.receive(data, self.now, self.wall_ms)

    def send_bytes(self, data: bytes) -> list[Action]:
        return self.session.receive(data, self.now, self.wall_ms)

    def answer(
        self, sent: act.Action | Sequence[Action], route: Route | None = None, **result: Any
    ) -> list[Action]:
        """Answer one command (or the only command among `sent`) with a Result of `result`'s
        fields (status OK unless given)."""
        if isinstance(sent, Sequence):
            (sent,) = [a for a in sent if token_of(a)]
        token = token_of(sent)
        assert token, f"{sent} wants no answer"
        if route is None and isinstance(sent, act.Request | act.Open | act.Attach):
            route = self.edge.partition_route(sent.partition)
        return self.session.answered(token, pb.Result(**result), route)

    def tick(self, at: float) -> list[Action]:
        self.now = at
        return self.session.tick(at)

    def packets(self, actions: Iterable[Action]) -> list[Packet]:
        """What the session wrote to the client, as the client reads it."""
        for a in actions:
            if isinstance(a, act.Write):
                self.codec.receive_data(a.data)
        out = []
        while (event := self.codec.next_event()) is not NEED_DATA:
            out.append(event)
        return out

    def connect(self, client_id: str = "c1", version: int = 5, **fields: Any) -> ConnAck:
        """CONNECT, its OpenSession answered OK: the CONNACK."""
        sent = self.send(Connect(client_id, protocol_version=version, **fields))
        (connack,) = self.packets(self.answer(sent))
        assert isinstance(connack, ConnAck)
        return connack


def token_of(action: Action) -> int:
    return getattr(action, "token", 0)


def commands(actions: Iterable[Action]) -> list[tuple[str, pb.EdgeCommand]]:
    """The partition commands among `actions`: (what kind, the command)."""
    out = []
    for a in actions:
        command = getattr(a, "command", None)
        if command is not None:
            kind = command.WhichOneof("command")
            assert kind is not None
            out.append((kind, command))
    return out


def of_kind(actions: Iterable[Action], kind: type[act.Action]) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


# ----- the whole edge ---------------------------------------------------------------------------


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def never_dialled() -> grpc.aio.Channel:
    """The dial of a link the harness never starts (its stream is played by hand)."""
    raise AssertionError("a harness link is never dialled")


def make_edge(clock: Clock, first: mpb.View | None = None, **overrides: Any) -> Edge:
    """An Edge with links to n1 and n2 (never connected: see `up`) and the view `first`."""
    edge = Edge(config(**overrides), cluster_tls=ClusterTLS.insecure())
    edge.dispatcher.clock = clock
    hello = pb.Hello(edge_id="n1", edge_incarnation=1)
    for node in NODES:
        edge.router.links[node] = PartitionLink(node, f"{node}:0", hello, edge, never_dialled)
    edge.apply_view(first if first is not None else view(1))
    return edge


def up(link: PartitionLink, subscriptions: Mapping[int, Sequence[str]] | None = None) -> None:
    """As when its stream opens and its index snapshot arrives (an older partition service's
    node-wide reset), announcing `subscriptions` (partition -> filters; default: n1's
    partitions 0 and 3 subscribe to t/#)."""
    link.connected = True
    if subscriptions is None:
        subscriptions = {0: ["t/#"], 3: ["t/#"]} if link.node_id == "n1" else {}
    entries = [
        pb.IndexEntry(partition=p, filter=f, present=True)
        for p, filters in subscriptions.items()
        for f in filters
    ]
    update = pb.IndexUpdate(reset=True, entries=entries, snapshot_done=True)
    link._dispatch(pb.PartitionFrame(events=[pb.PartitionEvent(index_update=update)]))


def taken(link: PartitionLink) -> list[pb.EdgeCommand]:
    """The commands queued on the link (urgent ones first, as in a frame), then cleared."""
    out = link._urgent + link._outgoing
    link._urgent, link._outgoing = [], []
    return out


def ok(link: PartitionLink, *cmds: pb.EdgeCommand, **fields: Any) -> None:
    """Answer `cmds` on `link` with Results of `fields` (OK unless a status is given)."""
    results = [pb.Result(request_id=c.request_id, **fields) for c in cmds]
    link._dispatch(pb.PartitionFrame(events=[pb.PartitionEvent(result=r) for r in results]))


class FakeTransport(asyncio.Transport):
    """A socket that keeps what is written."""

    def __init__(self) -> None:
        super().__init__()
        self.data = bytearray()
        self.writes = 0
        self.closed = False
        self.reading = True

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.data += data
        self.writes += 1

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def get_write_buffer_size(self) -> int:
        return 0


class Client:
    """An MQTT client on a fake socket to a real ClientConnection of `edge`."""

    def __init__(self, edge: Edge, version: int = 5) -> None:
        self.version = version
        self.conn = ClientConnection(edge)
        self.transport = FakeTransport()
        self.conn.connection_made(self.transport)
        self.codec = MQTTConnection(Role.CLIENT)

    def send(self, packet: Packet) -> None:
        self.conn.data_received(self.codec.send(packet))

    async def received(self) -> list[Packet]:
        await asyncio.sleep(0)  # (a write coalesced on the loop would leave now)
        self.codec.receive_data(bytes(self.transport.data))
        self.transport.data.clear()
        out = []
        while (event := self.codec.next_event()) is not NEED_DATA:
            out.append(event)
        return out


async def connected(edge: Edge, client_id: str, version: int = 5) -> Client:
    """A client whose CONNECT its session's master answered OK."""
    client = Client(edge, version)
    client.send(Connect(client_id, protocol_version=version, clean_start=False))
    link = edge.router.links[edge.router.master(edge.router.session_partition(client_id))]
    (open_session,) = taken(link)
    assert open_session.HasField("open_session")
    ok(link, open_session)
    (connack,) = await client.received()
    assert isinstance(connack, ConnAck)
    assert connack.reason_code == 0
    return client
