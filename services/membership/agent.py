"""The membership agent: the I/O around the planner (docs/failover.md).

It holds the node's liveness in Consul (services/membership/session.py), writes the node's
keys (members/<node>, suspects/<node>, acquired with its session), watches the view key and the
members/ and suspects/ prefixes with blocking queries, probes its peers
(services/membership/probes.py), and on every change (and every local request) runs the pure
`plan()`; a proposal is written with ?cas=<the view's ModifyIndex>, and a lost CAS re-reads
and plans again. Agreed views go to the local services through `ViewBoard`
(services/membership/server.py).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from google.protobuf.message import DecodeError

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.membership.view import has_left
from hexmq.node_protocol import THIS_RELEASE, ClusterProtocol, Support
from hexmq.service import cancel_and_wait
from hexmq.telemetry.tracing import Tracing
from hexmq.trust.grpc_tls import ClusterTLS
from services.membership.changes import RebalanceLog, record_view_change
from services.membership.consul_client import NO_CREDENTIALS, ConsulCredentials
from services.membership.discovery.gate import gate_for
from services.membership.discovery.model import Discovery
from services.membership.discovery.options import DiscoverySettings
from services.membership.observed import Registration
from services.membership.plan import (
    Observed,
    PlanConfig,
    failover_records,
    lost_reasons,
    plan,
    refused_joiners,
)
from services.membership.probes import FailureDetector, Prober, ProbeTarget, monotonic_ms
from services.membership.proposals import ProposalBook, Request
from services.membership.records import (
    SERVICE_NAME,
    ClusterKeys,
    MemberRecord,
    RecordError,
    RegistryTracker,
    encode_suspicions,
    parse_member_record,
    parse_suspicions,
)
from services.membership.session import (
    CONSUL_ERRORS,
    MAX_BACKOFF_S,
    Lease,
    LivenessSession,
    Reachability,
)
from services.membership.view_board import ViewBoard

log = logging.getLogger("hexmq.membership")

# Blocking queries wait at most this long (below aiohttp's 300 s default timeout, STACK.md).
BLOCKING_WAIT: Final = "20s"
# A blocking query unanswered this long is given up (Consul answers within wait + wait/16):
# its connection went silent (a cut), and it would otherwise wait for aiohttp's 300 s.
BLOCKING_TIMEOUT_S: Final = 30.0
# How many failover records Status keeps, newest last.
RECENT_FAILOVERS: Final = 50
# A Propose call is answered with the current view epoch after this long at most, even if its
# changes are not agreed yet; the partition service asks again if it still needs them.
PROPOSE_WAIT_S: Final = 5.0
# A loop iteration this late means the agent stalled (see _watch_for_stalls).
STALL_TICK_S: Final = 0.1
STALL_GAP_S: Final = 1.0
# Plans in a row after lost CAS races before waiting for the next change.
MAX_CAS_RETRIES: Final = 5


class NotAcquiredError(Exception):
    """A key this node writes is held by another session (an old one of ours, until Consul
    invalidates it)."""


WRITE_ERRORS: Final[tuple[type[BaseException], ...]] = (*CONSUL_ERRORS, NotAcquiredError)


@dataclass(frozen=True, slots=True)
class AgentConfig:
    node_id: str
    cluster: str
    consul_addr: str
    partition_addr: str
    mqtt_addr: str
    membership_addr: str
    partitions: int
    rf: int
    expect: int | None  # None: every node discovery lists (1 without discovery)
    session_ttl_s: int
    probe_interval_s: float
    probe_timeout_s: float
    suspect_after_s: float
    rejoin_settle_s: float
    # The node's Consul service (what `--discovery consul` lists), and the settings of the
    # discovery backend (None: every registered node is a candidate).
    service_name: str = SERVICE_NAME
    service_tags: tuple[str, ...] = ()
    discovery: DiscoverySettings | None = None
    # The ACL token (asked before each request: a rotated token file is used at once) and
    # TLS files the agent presents to Consul.
    consul_credentials: ConsulCredentials = NO_CREDENTIALS

    def plan_config(self) -> PlanConfig:
        return PlanConfig(
            node_id=self.node_id,
            partitions=self.partitions,
            rf=self.rf,
            expect=self.expect,
            rejoin_settle_ms=int(self.rejoin_settle_s * 1000),
        )


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


# How often a leave that waits looks at whether any other member still stays.
LEAVE_RECHECK_S: Final = 0.5


def nobody_stays(view: pb.View, registrations: Mapping[str, Registration], node_id: str) -> bool:
    """No other member of the view is registered and not leaving: nobody could take node_id's
    partitions, as when every node is stopped at once (`docker compose down` sends SIGTERM to
    every node's services together). Its leave cannot finish then, and waiting for it (up to
    --leave-timeout, 60 s) only delays the stop: each node stops, its partitions still
    assigned to it, as after a plain stop. Until the agent has seen its own registration, it
    knows nothing of the others': somebody may stay."""
    if node_id not in registrations:
        return False
    for member in view.members:
        if member.node_id == node_id:
            continue
        registration = registrations.get(member.node_id)
        if registration is not None and not registration.leaving:
            return False
    return True


class MembershipAgent:
    def __init__(
        self,
        config: AgentConfig,
        tracing: Tracing,
        on_fatal: Callable[[], None] = lambda: None,
        discovery: Discovery | None = None,
        *,
        tls: ClusterTLS,
    ) -> None:
        self.config = config
        self.tls = tls
        self._on_fatal = on_fatal
        self.failed = False
        self.keys = ClusterKeys(config.cluster)
        self._tracing = tracing
        self.board = ViewBoard()
        self.view_index = 0  # the view key's ModifyIndex (0: no view key)
        self.registry = RegistryTracker()
        self.suspicions: dict[str, dict[str, str]] = {}
        self.proposals = ProposalBook()
        self.recent: collections.deque[pb.FailoverRecord] = collections.deque(
            maxlen=RECENT_FAILOVERS
        )
        self.reachability = Reachability(on_restored=self._read_afresh)
        # Set (and replaced) to abandon the blocking queries in flight (_read_afresh).
        self._afresh = asyncio.Event()
        self._attached: collections.Counter[int] = collections.Counter()
        self._incarnation = 0
        # What each attached partition service incarnation speaks (from its Watch).
        self._supports: dict[int, Support] = {}
        # Registered, serving nodes the view does not admit for their protocol: node -> why.
        self.refused: dict[str, str] = {}
        self._leaving = False
        self._left_logged = False
        self._rebalance = RebalanceLog()
        self._detector = FailureDetector(int(config.suspect_after_s * 1000))
        self._prober = Prober(
            self._detector,
            interval_s=config.probe_interval_s,
            timeout_s=config.probe_timeout_s,
            on_change=self._reports_changed,
            tls=tls,
        )
        self._consul: Any = None
        self._session: LivenessSession | None = None
        self._replan = asyncio.Event()
        self._rewrite = asyncio.Event()
        self._lease_event = asyncio.Event()
        self._lease_version = 0
        self._written: dict[str, tuple[str, bytes]] = {}  # key -> (session, value) written
        self._mismatch_logged = False
        self._plan_error: tuple[int | None, str] | None = None
        self._watch_failures: collections.Counter[str] = collections.Counter()
        self._members_failures_seen = 0
        self._tasks: list[asyncio.Task[None]] = []
        self.gate = (
            None
            if discovery is None
            else gate_for(discovery, config.discovery, config.node_id, self._replan.set)
        )

    # --- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        self._unread = {"view", "members", "suspects"}
        self._all_read = asyncio.Event()
        self._consul = self.config.consul_credentials.connect(self.config.consul_addr)
        self._session = LivenessSession(
            self._consul,
            name=f"hexmq/{self.config.cluster}/{self.config.node_id}",
            ttl_s=self.config.session_ttl_s,
            on_new_session=lambda _sid: self._rewrite.set(),
            on_lease_change=self._notify_lease,
            reachability=self.reachability,
            service_name=self.config.service_name,
            service_tags=self.config.service_tags,
        )
        self._session.set_record(self.record())
        runs: Mapping[str, Callable[[], Any]] = {
            "session": self._session.run,
            "view-watch": self._watch_view,
            "members-watch": lambda: self._watch_prefix(self.keys.members, self._on_members),
            "suspects-watch": lambda: self._watch_prefix(self.keys.suspects, self._on_suspects),
            "key-writer": self._write_keys,
            "planner": self._planner,
            "stall-watch": self._watch_for_stalls,
        }
        if self.gate is not None:
            runs = {**runs, "discovery": self.gate.run}
        self._tasks = [asyncio.create_task(run(), name=name) for name, run in runs.items()]
        for task in self._tasks:
            task.add_done_callback(self._task_ended)

    async def stop(self) -> None:
        for task in self._tasks:
            task.remove_done_callback(self._task_ended)
            await cancel_and_wait(task)
        await self._prober.stop()
        if self.gate is not None:
            await self.gate.stop()
        if self._session is not None:
            await self._session.close()
        if self._consul is not None:
            await self._consul.close()

    def _task_ended(self, task: asyncio.Task[None]) -> None:
        # Every loop handles its own errors; one that ends is a bug, and the agent would go
        # on serving a view it no longer follows: stop, so that a supervisor restarts it.
        if not task.cancelled():
            log.critical("agent task %s ended (%r); stopping", task.get_name(), task.exception())
            self.failed = True
            self._on_fatal()

    # --- the node's own state ----------------------------------------------------------------

    def record(self) -> MemberRecord:
        c = self.config
        return MemberRecord(
            node_id=c.node_id,
            partition_addr=c.partition_addr,
            mqtt_addr=c.mqtt_addr,
            membership_addr=c.membership_addr,
            # A node that has left serves the cluster nothing any more: its registration says
            # so while its services stop, or an agent of a release without leave (v0.2.0, which
            # reads no `leaving`) admits it again as a joining node (seen in a mixed cluster).
            incarnation=0 if self._left() else self._incarnation,
            protocol=self.protocol,
            leaving=self._leaving,
            tls=self.tls.serve_tls,
        )

    def _left(self) -> bool:
        return self._leaving and self.has_left(self.board.view)

    @property
    def protocol(self) -> Support:
        """What the node speaks: what both this agent and its partition service speak (the
        agent's own while none is attached). The Watch refuses a partition service that
        shares no version with the agent, so there is always something in common."""
        attached = self._supports.get(self._incarnation)
        if attached is None:
            return THIS_RELEASE
        return THIS_RELEASE.meet(attached) or THIS_RELEASE

    @property
    def incarnation(self) -> int:
        """The incarnation of the local partition service with an open Watch (0: none)."""
        return self._incarnation

    def partition_attached(self, incarnation: int, protocol: Support = THIS_RELEASE) -> None:
        self._attached[incarnation] += 1
        self._supports[incarnation] = protocol
        self._set_incarnation(incarnation)

    def partition_detached(self, incarnation: int) -> None:
        self._attached[incarnation] -= 1
        if self._attached[incarnation] <= 0:
            del self._attached[incarnation]
            self._supports.pop(incarnation, None)
        if incarnation == self._incarnation and incarnation not in self._attached:
            # Another open watch (an older process still shutting down) does not count: the
            # node serves only with the newest one.
            self._set_incarnation(0)

    def _set_incarnation(self, incarnation: int) -> None:
        if incarnation == self._incarnation:
            return
        previous = self._incarnation
        log.info(
            "partition service incarnation %d -> %d; the node speaks protocol %s",
            previous,
            incarnation,
            self.protocol.describe(),
        )
        if self._leaving and incarnation != 0 and self.has_left(self.board.view):
            # A partition service started after the node left (it alone was restarted): a
            # new start, so the node joins again rather than stay out for good.
            log.info("a new partition service after the leave: %s joins again", self.config.node_id)
            self._leaving = False
            self._left_logged = False
        self._incarnation = incarnation
        if self._session is not None:
            self._session.set_record(self.record())
        self._rewrite.set()

    def lease(self) -> Lease:
        if self._session is None:
            return Lease(False, 0)
        return self._session.lease()

    def _notify_lease(self) -> None:
        self._lease_version += 1
        event, self._lease_event = self._lease_event, asyncio.Event()
        event.set()

    @property
    def lease_version(self) -> int:
        return self._lease_version

    async def lease_changes(self, seen: int) -> int:
        """Wait until the lease was renewed or changed after version `seen`; the new version."""
        while self._lease_version <= seen:
            await self._lease_event.wait()
        return self._lease_version

    # --- leaving (docs/failover.md, "Leave") ---------------------------------------------------

    @property
    def leaving(self) -> bool:
        return self._leaving

    def has_left(self, view: pb.View | None) -> bool:
        """The view no longer has this node as a member, a target member or a replica."""
        return view is not None and has_left(view, self.config.node_id)

    async def leave(self, wait_s: float) -> pb.LeaveReply:
        """Mark the node leaving (its registration says so, and the planner takes it out of the
        targets), then wait up to `wait_s` until the view has let it go. Before any view
        there is nothing to hand over: the node has left at once."""
        if self.board.view is None:
            log.info("leaving: no cluster view yet, so %s holds nothing", self.config.node_id)
            return pb.LeaveReply(left=True)
        if not self._leaving:
            self._leaving = True
            log.info(
                "leaving the cluster: %s hands over its master roles and waits for RF to be "
                "restored without it",
                self.config.node_id,
            )
            if self._session is not None:
                self._session.set_record(self.record())
            self._rewrite.set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        view = self.board.view
        while not self.has_left(view) and (wait := deadline - loop.time()) > 0:
            if view is not None and nobody_stays(
                view, self.registry.registrations(), self.config.node_id
            ):
                log.warning(
                    "leaving: every other member of view %d is leaving or gone (the whole "
                    "cluster stops): nobody can take %s's partitions, so it stops without "
                    "waiting for the leave; they stay assigned here",
                    view.epoch,
                    self.config.node_id,
                )
                reply = self.leave_state()
                reply.nobody_stays = True
                return reply
            try:
                # Woken by a new view, or after LEAVE_RECHECK_S to look at the registrations
                # again (they change without a new view).
                async with asyncio.timeout(min(wait, LEAVE_RECHECK_S)):
                    view = await self.board.newer_than(view.epoch if view is not None else 0)
            except TimeoutError:
                view = self.board.view
        return self.leave_state()

    def leave_state(self) -> pb.LeaveReply:
        view = self.board.view
        if view is None:
            return pb.LeaveReply()
        node = self.config.node_id
        return pb.LeaveReply(
            left=self.has_left(view),
            view_epoch=view.epoch,
            partitions_held=sum(1 for a in view.partitions if node in a.replicas),
        )

    # --- local requests ------------------------------------------------------------------------

    async def propose(self, requests: list[Request]) -> pb.ProposeReply:
        view = self.board.view
        assert view is not None, "the servicer refuses proposals before the first view"
        ticket = self.proposals.add(requests, view)
        self._replan.set()
        try:
            async with asyncio.timeout(PROPOSE_WAIT_S):
                return await asyncio.shield(ticket.reply)
        finally:
            # Answered, or not within PROPOSE_WAIT_S: the caller hears TimeoutError (and asks
            # again); an answer that does not say the change holds would let a master stop
            # counting a follower the view still has in sync.
            self.proposals.drop(ticket)

    # --- status --------------------------------------------------------------------------------

    def status(self) -> pb.MembershipStatus:
        view = self.board.view
        in_view = {m.node_id: m for m in view.members} if view is not None else {}
        registrations = self.registry.registrations()
        probes = self._detector.probe_states(monotonic_ms())
        suspected_by: dict[str, list[str]] = {}
        for reporter, reports in sorted(self.suspicions.items()):
            for node in reports:
                suspected_by.setdefault(node, []).append(reporter)
        members = []
        for node in sorted(in_view.keys() | registrations.keys()):
            reg = registrations.get(node)
            members.append(
                pb.MemberHealth(
                    node_id=node,
                    in_view=node in in_view,
                    registered=reg is not None,
                    incarnation=reg.incarnation if reg else in_view[node].incarnation,
                    probe="" if node == self.config.node_id else probes.get(node, ""),
                    suspected_by=suspected_by.get(node, []),
                    protocol=reg.protocol.to_proto() if reg else None,
                    not_admitted=self.refused.get(node, ""),
                )
            )
        return pb.MembershipStatus(
            node_id=self.config.node_id,
            view=view,
            members=members,
            recent=list(self.recent),
            consul_reachable=self._session is not None and self._session.holds_session,
            lease_valid=self.lease().valid,
        )

    # --- watching Consul -----------------------------------------------------------------------

    def _read_afresh(self) -> None:
        """Consul answers again after a stretch in which it did not: the blocking queries sent
        before may sit on connections whose packets a cut dropped, their answers held back by
        TCP's retransmission backoff for many seconds after the cut heals (the fault suite
        saw an agent miss 14 views for 13 s that way, and its node the partitions those views
        gave it). Abandon them: every watch reads afresh at once."""
        abandon, self._afresh = self._afresh, asyncio.Event()
        abandon.set()

    async def _query(self, key: str, index: int, *, recurse: bool) -> tuple[Any, Any] | None:
        """One blocking KV read, or None if abandoned by _read_afresh first."""
        afresh = asyncio.ensure_future(self._afresh.wait())
        query = asyncio.ensure_future(
            self._consul.kv.get(key, index=index or None, wait=BLOCKING_WAIT, recurse=recurse)
        )
        try:
            async with asyncio.timeout(BLOCKING_TIMEOUT_S):
                await asyncio.wait({afresh, query}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            afresh.cancel()
            if not query.done():
                query.cancel()
                await asyncio.wait({query})
        if query.cancelled():
            return None
        result: tuple[Any, Any] = query.result()
        return result

    async def _blocking_get(
        self, part: str, key: str, index: int, *, recurse: bool
    ) -> tuple[int, Any]:
        """One blocking KV read; retries with backoff while Consul is away."""
        backoff = 0.1
        while True:
            started = time.monotonic()
            try:
                answer = await self._query(key, index, recurse=recurse)
                if answer is None:
                    index = 0  # abandoned: read afresh
                    continue
                new_index, data = answer
            except CONSUL_ERRORS as exc:
                self.reachability.report(part, exc)
                self._watch_failures[part] += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                # Read afresh (no blocking) after an error: whatever changed meanwhile, and a
                # restored server's lower index, show at once.
                index = 0
                continue
            self.reachability.report(part, None)
            new_index = int(new_index)
            if index and new_index == index and time.monotonic() - started < 0.01:
                await asyncio.sleep(0.05)  # a server that does not block: never spin
            # An index that goes backwards (a restored server) resets the watch.
            return (new_index if new_index >= index else 0), data

    async def _watch_view(self) -> None:
        index = 0
        while True:
            index, entry = await self._blocking_get("view", self.keys.view, index, recurse=False)
            self._on_view_entry(entry)
            self._watched("view")

    async def _watch_prefix(self, prefix: str, handle: Callable[[list[Any]], None]) -> None:
        index = 0
        part = prefix.rstrip("/").rsplit("/", 1)[-1]
        while True:
            index, entries = await self._blocking_get(part, prefix, index, recurse=True)
            handle(entries or [])
            self._watched(part)

    def _watched(self, part: str) -> None:
        """A watch has read its keys at least once: the planner plans only on a whole picture
        (an agent that planned before reading the members/ keys once took every member for
        unregistered, and removed them all)."""
        if part not in self._unread:
            return
        self._unread.discard(part)
        if not self._unread:
            self._all_read.set()

    def _on_view_entry(self, entry: Mapping[str, Any] | None) -> None:
        if entry is None:
            if self.view_index:
                log.warning(
                    "the view key %s is gone; keeping view epoch %s",
                    self.keys.view,
                    self.board.view.epoch if self.board.view else None,
                )
            self.view_index = 0
            self._replan.set()
            return
        try:
            view = pb.View.FromString(entry.get("Value") or b"")
        except DecodeError as exc:
            log.error("the view key %s does not hold a View (%s); ignored", self.keys.view, exc)
            return
        current = self.board.view
        if current is not None and view.epoch < current.epoch:
            log.error(
                "the view key %s went back from epoch %d to %d; ignored",
                self.keys.view,
                current.epoch,
                view.epoch,
            )
            return
        self.view_index = int(entry["ModifyIndex"])
        if current is None or view.epoch > current.epoch:
            self._adopt(current, view)
        self._replan.set()

    def _doubt_began(self, old: pb.View | None, view: pb.View) -> int:
        """When this agent first doubted a node `view` removes (unix ns; 0: unknown)."""
        if old is None:
            return 0
        lost = {m.node_id for m in old.members} - {m.node_id for m in view.members}
        now = monotonic_ms()
        starts = [
            since for node in lost if (since := self._detector.doubted_since(node)) is not None
        ]
        return (time.time_ns() - (now - min(starts)) * 1_000_000) if starts else 0

    def _adopt(self, old: pb.View | None, view: pb.View) -> None:
        records = failover_records(old, view, wall_ms()) if old is not None else []
        self.recent.extend(records)
        record_view_change(
            self._tracing, self.config.node_id, old, view, records, self._doubt_began(old, view)
        )
        if not self._mismatch_logged and (
            view.partition_count != self.config.partitions
            or view.replication_factor != self.config.rf
        ):
            self._mismatch_logged = True
            log.error(
                "the agreed view has %d partitions and rf %d, this agent was started with "
                "--partitions %d --rf %d: the view's values win",
                view.partition_count,
                view.replication_factor,
                self.config.partitions,
                self.config.rf,
            )
        if old is not None:
            now = monotonic_ms()
            for node in {m.node_id for m in old.members} - {m.node_id for m in view.members}:
                self.registry.unsettle(node, now)
        before = ClusterProtocol.of_view(old) if old is not None else None
        after = ClusterProtocol.of_view(view)
        if after != before:
            log.info(
                "view %d: the cluster speaks protocol %s%s",
                view.epoch,
                after.describe(),
                f" (was {before.describe()})" if before is not None else "",
            )
        self.board.publish(view)
        self.proposals.settle(view)
        self._update_peers()
        line = self._rebalance.observe(view, wall_ms())
        if line:
            log.info("%s", line)
        if self._leaving and not self._left_logged and self.has_left(view):
            self._left_logged = True
            log.info(
                "left the cluster in view %d: %s holds no partition; its services may stop",
                view.epoch,
                self.config.node_id,
            )
            if self._session is not None:
                self._session.set_record(self.record())  # incarnation 0: not serving
            self._rewrite.set()

    def _update_peers(self) -> None:
        """Probe every other member, and every registered node waiting to join: a node is
        admitted only while nobody finds it unreachable, which only a probe can tell."""
        view = self.board.view
        if view is None:
            return  # nobody to probe before the first view: its members start serving with it
        peers = {
            node: ProbeTarget(reg.partition_addr, reg.tls)
            for node, reg in self.registry.registrations().items()
            if reg.incarnation > 0
        }
        peers.update({m.node_id: ProbeTarget(m.partition_addr, m.tls) for m in view.members})
        peers.pop(self.config.node_id, None)
        self._prober.set_peers(peers)

    def _on_members(self, entries: list[Any]) -> None:
        records = {}
        for entry in entries:
            key = entry["Key"]
            node = self.keys.node_of(key, self.keys.members)
            if node is None:
                continue
            try:
                record = parse_member_record(key, node, entry.get("Value"))
            except RecordError as exc:
                log.warning("%s; that node counts as unregistered", exc)
                continue
            records[node] = (record, int(entry.get("CreateIndex") or 0))
        now = monotonic_ms()
        self.registry.update(records, now)
        if self._watch_failures["members"] != self._members_failures_seen:
            # A gap in the watch: what happened meanwhile is unknown.
            self._members_failures_seen = self._watch_failures["members"]
            self.registry.unsettle_all(now)
        self._update_peers()
        self._replan.set()

    def _on_suspects(self, entries: list[Any]) -> None:
        suspicions = {}
        for entry in entries:
            key = entry["Key"]
            node = self.keys.node_of(key, self.keys.suspects)
            if node is None:
                continue
            try:
                suspicions[node] = parse_suspicions(key, entry.get("Value"))
            except RecordError as exc:
                log.warning("%s; ignored", exc)
        self.suspicions = suspicions
        self._unsettle_suspected()
        self._replan.set()

    def _unsettle_suspected(self) -> None:
        """Doubts of the moment: a report by anyone, or this agent's own probe not answering
        (docs/failover.md: the settle counts from the last doubt)."""
        now = monotonic_ms()
        for reports in self.suspicions.values():
            for node in reports:
                self.registry.unsettle(node, now)
        for node, probe in self._detector.probe_states(now).items():
            if probe != "ok":
                self.registry.unsettle(node, now)

    async def _watch_for_stalls(self) -> None:
        """An agent that was paused (SIGSTOP, a VM freeze, a long GC) did not watch meanwhile:
        after a stall it vouches for no registration it saw before."""
        last = time.monotonic()
        while True:
            await asyncio.sleep(STALL_TICK_S)
            now = time.monotonic()
            if now - last > STALL_GAP_S:
                log.warning(
                    "this agent stalled for %.1f s: every registration counts as new", now - last
                )
                self.registry.unsettle_all(monotonic_ms())
            last = now

    # --- writing this node's keys --------------------------------------------------------------

    def _reports_changed(self) -> None:
        self._rewrite.set()

    async def _write_keys(self) -> None:
        """Keep members/<node> and suspects/<node> as this node's state says, acquired with its
        session; each written only when its value (or the session) changed."""
        backoff = 0.1
        while True:
            await self._rewrite.wait()
            self._rewrite.clear()
            session = self._session.session_id if self._session else None
            if session is None:
                continue  # written as soon as a session exists (on_new_session)
            wanted = {
                self.keys.member(self.config.node_id): self.record().to_json(),
                self.keys.suspicions_of(self.config.node_id): encode_suspicions(
                    self._prober.reports
                ),
            }
            try:
                for key, value in wanted.items():
                    if self._written.get(key) == (session, value):
                        continue
                    if not await self._consul.kv.put(key, value, acquire=session):
                        raise NotAcquiredError(f"{key} not acquired with session {session}")
                    self._written[key] = (session, value)
                self.reachability.report("keys", None)
                backoff = 0.1
            except WRITE_ERRORS as exc:
                self.reachability.report("keys", exc)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)
                self._rewrite.set()

    # --- planning ------------------------------------------------------------------------------

    async def _planner(self) -> None:
        """Plan on every change; while a registration waits to settle (a join) or a request is
        pending, also plan on a clock tick, since time alone can make a plan differ. Nothing
        before every watch has read its keys once."""
        config = self.config.plan_config()
        tick = max(self.config.probe_interval_s, 0.1)
        await self._all_read.wait()
        while True:
            try:
                async with asyncio.timeout(tick if self._waiting_on_time() else None):
                    await self._replan.wait()
            except TimeoutError:
                pass
            self._replan.clear()
            self._prober.refresh()
            for _ in range(MAX_CAS_RETRIES):
                if not await self._plan_once(config):
                    break

    def _waiting_on_time(self) -> bool:
        view = self.board.view
        members = {m.node_id for m in view.members} if view is not None else set()
        return len(self.proposals) > 0 or any(
            node not in members for node in self.registry.registrations()
        )

    def _note_refusals(self, refused: dict[str, str]) -> None:
        """Say once why each node is kept out for its protocol versions (and when that ends)."""
        me = self.config.node_id
        for node, why in sorted(refused.items()):
            if self.refused.get(node) != why:
                who = "this node" if node == me else node
                log.error("not admitting %s to the cluster: %s", who, why)
        for node in sorted(self.refused.keys() - refused.keys()):
            log.info("%s is no longer refused for its protocol versions", node)
        self.refused = refused

    async def _plan_once(self, config: PlanConfig) -> bool:
        """Plan and propose once; True when a CAS was lost (plan again on the re-read view)."""
        view = self.board.view
        self._unsettle_suspected()
        registry = self.registry.registrations()
        observed = Observed(
            registry=registry,
            suspicions=self.suspicions,
            requests=self.proposals.pending(),
            discovered=None
            if self.gate is None
            else self.gate.discovered(registry, {m.node_id for m in view.members} if view else ()),
        )
        self._note_refusals(refused_joiners(view, observed))
        try:
            proposal = plan(view, observed, config, monotonic_ms())
        except ValueError as exc:  # ViewError: a view in Consul that breaks the invariants
            epoch = view.epoch if view is not None else None
            if self._plan_error != (epoch, str(exc)):
                self._plan_error = (epoch, str(exc))
                log.error("cannot plan on view %s: %s; waiting for another view", epoch, exc)
            return False
        if proposal is None:
            return False
        # A failure here is not reported to `reachability`: the watches and the session,
        # which retry until they succeed, say when Consul is away and when it is back; the
        # proposal is made again on the next change they see.
        try:
            won = await self._consul.kv.put(
                self.keys.view, proposal.SerializeToString(), cas=self.view_index
            )
        except CONSUL_ERRORS as exc:
            log.debug("proposing view %d failed: %s", proposal.epoch, exc)
            await asyncio.sleep(0.2)
            return False
        if won:
            log.debug("proposed view %d", proposal.epoch)
            if view is not None:
                _log_removals(view, proposal, observed)
        try:
            _, entry = await self._consul.kv.get(self.keys.view)
        except CONSUL_ERRORS as exc:
            log.debug("reading the view after a proposal failed: %s", exc)
            return False
        self._on_view_entry(entry)
        return not won


def _log_removals(view: pb.View, proposal: pb.View, observed: Observed) -> None:
    """Why the view this agent just wrote removes members (each agent logs the view change;
    only the proposer knows what it saw)."""
    removed = {m.node_id for m in view.members} - {m.node_id for m in proposal.members}
    reasons = lost_reasons(view, observed)
    for node in sorted(removed):
        log.info(
            "proposed view %d without %s: %s",
            proposal.epoch,
            node,
            reasons.get(node, "its leave is done"),
        )
