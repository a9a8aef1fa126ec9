"""Membership agents agreeing on the view through an in-memory Consul, on a fake clock.

No asyncio, no sockets, no sleeps: time moves only by `tick` (TICK_MS each). Every node is an
agent plus a model of its partition service, and each tick runs like the real ones would:

1. Consul lapses the sessions not renewed within their TTL (deleting the keys they hold).
2. Every running agent (alive, not paused) renews its session (or opens a new one), writes its
   registration `members/<node>` (addresses and its partition service's incarnation, 0 while
   that is booting) and probes every registered node and view member: a dead or booting node
   answers `refused` (reported after a confirming second probe), a paused or cut one is
   `silent` (reported after `suspect` ms of failed probes); it writes its reports to
   `suspects/<node>`.
3. Every running agent reads the view, the registry and the suspicions (all at once, before any
   of them writes, so their CAS can race), then in turn: its partition service, if the view
   admits it, asks for what a master would (add a follower to in_sync once it has been
   connected for `catchup` ticks, remove one unreachable for `lag` ticks, hand over a tick
   after handover_to names an in-sync node); the agent calls `plan` and proposes the result by
   CAS (a lost CAS re-reads and plans again, a few times at most), then drops the requests
   that are done or moot in the newest view. Each registration's since_ms is counted from the
   agent's last doubt about the node (see `_note_registrations`).

A tick in which nothing can change but time (every node serving, no cut, no doubt, no request,
every agent idle on the current state, every replica in sync) only renews sessions.

`spare` nodes are not started with the others: `restart` starts one, and it joins. `leave`
asks a node's agent to take it out of the cluster (its registration says leaving); once a view
drops it from the members, its processes end (it has left, and `restart` joins it anew).

`pause` stops a node's agent and partition service (SIGSTOP): it renews nothing, plans nothing,
and looks silent to every probe. `cut a b` makes each silent to the other (Consul stays
reachable to both). `kill` ends a node; `restart` starts it with a new incarnation, after
destroying its old session (the agent keeps its session id on disk).

Every agreed view is checked against the one before (a `SimError` otherwise): view epochs go
up by one; partition epochs never decrease and rise, to the view's epoch, exactly when the
master's tenure changes (another master, or an offline partition restored); a new master was
in the previous in-sync set; in_sync holds the master, and an offline partition (master not a
member) has no member in sync; at most one master per (partition, epoch) ever; and a removed
member was lost by a rule of docs/failover.md both in what the planning agent read and in
fact (dead, paused, restarted, booting, or cut from more than half of the members, recently),
or had left: it was leaving and held no replica; and a replica that is dropped while its node
stays a member leaves at least min(RF, members not leaving) replicas in sync.

`Script` runs the scenario language of tests/unit/agreement_scenarios/*.txt on a `Sim`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.hashring import assign
from services.membership.plan import (
    REFUSED,
    SILENT,
    Discovered,
    HandoverRequest,
    InSyncRequest,
    Observed,
    PlanConfig,
    Registration,
    check_view,
    failover_records,
    goal,
    plan,
    request_outcome,
)
from services.membership.probes import SilenceAllowance
from tests.support.memory_consul import Entry, MemoryConsul
from tests.support.scenario_script import ScriptError, ScriptRunner, SimError

TICK_MS = 100
VIEW = "view"
MEMBERS = "members/"
SUSPECTS = "suspects/"
CAS_TRIES = 3

Request = InSyncRequest | HandoverRequest


@dataclass(frozen=True, slots=True)
class Settings:
    nodes: int = 3
    partitions: int = 8
    rf: int = 3
    expect: int = 0  # 0: every node
    settle_ms: int = 1000
    ttl_ms: int = 10_000
    suspect_ms: int = 1000
    catchup: int = 3  # ticks a follower stays connected before its master asks to add it
    # Ticks an in-sync follower is unreachable before its master asks to remove it: longer
    # than suspect_ms, as --replica-lag-timeout (5 s) is longer than --suspect-after (1 s), so
    # that a master cut off from the majority is removed before it shrinks its in-sync sets
    # to itself (agreement_scenarios/isolated_master_shrinks_first.txt shows why).
    lag: int = 20
    boot: int = 2  # ticks a (re)started partition service takes to serve
    spare: int = 0  # nodes after the first `nodes`, not started until `restart`


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What an agent read from Consul at once (at raft index `index`)."""

    index: int
    view: Entry | None
    members: dict[str, Entry]
    suspects: dict[str, Entry]


@dataclass(slots=True)
class SimNode:
    name: str
    alive: bool = True
    paused: bool = False
    incarnation: int = 0  # of the partition service now running; 0 while it boots
    started: int = 0  # incarnations used so far
    boot_left: int = 0
    spare: bool = False  # never started yet
    leaving: bool = False  # its agent was asked to leave
    left: bool = False  # it left the view by a leave, and ended
    session: str | None = None
    renewed_ms: int = 0
    # The agent: what it first saw when, its failing probes and reports, its pending requests.
    seen: dict[str, tuple[object, int]] = field(default_factory=dict)
    failing: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # kind, since, count
    reports: dict[str, str] = field(default_factory=dict)
    # How long each peer may stay silent before this agent reports it (longer after false
    # alarms), as the real agent's FailureDetector keeps it.
    allowances: dict[str, SilenceAllowance] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    idle_key: object = None  # the inputs of its last plan that changed nothing
    observed_ms: int = -1  # when it last read Consul
    # The partition service: ticks each (partition, epoch, follower) link has been up or down.
    up: dict[tuple[int, int, str], int] = field(default_factory=dict)
    down: dict[tuple[int, int, str], int] = field(default_factory=dict)
    quiesced: dict[tuple[int, int], int] = field(default_factory=dict)

    @property
    def running(self) -> bool:
        return self.alive and not self.paused

    def forget(self) -> None:
        """What a process loses when it ends: all but its session id (kept on disk)."""
        self.seen, self.failing, self.reports, self.requests = {}, {}, {}, []
        self.allowances = {}
        self.idle_key = None
        self.leaving = False
        self.up, self.down, self.quiesced = {}, {}, {}


class Sim:
    def __init__(self, settings: Settings) -> None:
        if settings.nodes < 1 or settings.spare < 0 or settings.nodes + settings.spare > 9:
            raise ScriptError("nodes must be 1..9, spares included")
        self.cfg = settings
        self.expect = settings.expect or settings.nodes
        # What node discovery lists (the same for every agent); None: no discovery.
        self.listing: frozenset[str] | None = None
        self.consul = MemoryConsul()
        total = settings.nodes + settings.spare
        self.nodes = {f"n{i}": SimNode(f"n{i}") for i in range(1, total + 1)}
        self.tick_no = 0
        self.cuts: dict[frozenset[str], int | None] = {}  # pair -> tick healed (None: still cut)
        self.views: list[pb.View] = []  # every agreed view, in order
        self.records: list[pb.FailoverRecord] = []
        self.masters: dict[tuple[int, int], str] = {}  # (partition, epoch) -> master, ever
        self.faulty_until: dict[str, int] = {}  # node -> last tick it was dead/paused/booting
        self.lost_cas = 0
        self.plans = 0
        self._parsed: dict[int, pb.View] = {}
        self._snapshot: Snapshot | None = None
        self._snapshot_index = -1
        self._known_at: tuple[int, list[str]] = (-1, [])
        self._rest_view = 0  # the view epoch last found with every replica in sync
        self._masters_cache: dict[tuple[int, str], list[pb.PartitionAssignment]] = {}
        self.marked: pb.View | None = None
        for i, node in enumerate(self.nodes.values()):
            if i < settings.nodes:
                self._boot(node)
            else:
                node.alive, node.spare = False, True

    @property
    def now_ms(self) -> int:
        return self.tick_no * TICK_MS

    @property
    def view(self) -> pb.View | None:
        return self.views[-1] if self.views else None

    # ----- faults ------------------------------------------------------------------------

    def node(self, name: str) -> SimNode:
        if name not in self.nodes:
            raise ScriptError(f"no node {name!r}")
        return self.nodes[name]

    def active(self) -> list[SimNode]:
        """The nodes meant to be in the cluster: started once, and not left since."""
        return [n for n in self.nodes.values() if not n.spare and not n.left]

    def _boot(self, node: SimNode) -> None:
        node.alive, node.paused, node.spare, node.left = True, False, False, False
        node.started += 1
        node.incarnation, node.boot_left = 0, self.cfg.boot
        node.forget()
        if node.session is not None:
            self.consul.destroy(node.session)
            node.session = None

    def discover(self, names: list[str]) -> None:
        """Discovery lists these nodes from now on (names of nodes the sim does not run are
        listed nodes that never register)."""
        self.listing = frozenset(names)
        for node in self.nodes.values():
            node.idle_key = None  # what an agent plans on changed

    def kill(self, name: str) -> None:
        node = self.node(name)
        if not node.alive:
            raise ScriptError(f"{name} is already down")
        node.alive, node.paused, node.incarnation = False, False, 0
        node.forget()

    def restart(self, name: str) -> None:
        node = self.node(name)
        if node.alive:
            raise ScriptError(f"{name} is running")
        self._boot(node)

    def leave(self, name: str) -> None:
        node = self.node(name)
        if not node.running or node.leaving:
            raise ScriptError(f"{name} is not running, or already leaving")
        node.leaving = True

    def _end_after_leave(self, node: SimNode, view: pb.View) -> None:
        """A leaving node that the view no longer has, nor holds as a target member or in a
        partition, ends, and its agent ends its session. One removed before its leave was
        agreed, or while it held the last in-sync copy of a partition, stays, to be admitted
        again and finish its leave."""
        held = node.name in view.target_members or any(
            node.name in a.replicas for a in view.partitions
        )
        if node.leaving and not held and node.name not in {m.node_id for m in view.members}:
            node.alive, node.left, node.incarnation = False, True, 0
            node.forget()
            if node.session is not None:
                self.consul.destroy(node.session)
                node.session = None

    def pause(self, name: str) -> None:
        node = self.node(name)
        if not node.running:
            raise ScriptError(f"{name} is not running")
        node.paused = True

    def resume(self, name: str) -> None:
        node = self.node(name)
        if not node.paused:
            raise ScriptError(f"{name} is not paused")
        node.paused = False

    def cut(self, a: str, b: str) -> None:
        if self.node(a) is self.node(b):
            raise ScriptError("a node cannot be cut from itself")
        self.cuts[frozenset((a, b))] = None

    def heal(self, a: str | None = None, b: str | None = None) -> None:
        pairs = [frozenset((a, b))] if a and b else [p for p, t in self.cuts.items() if t is None]
        for pair in pairs:
            if pair in self.cuts:
                self.cuts[pair] = self.tick_no

    def is_cut(self, a: str, b: str) -> bool:
        return self.cuts.get(frozenset((a, b)), 0) is None

    def probe(self, src: str, dst: str) -> str | None:
        """What src's health check of dst's partition service finds: None when it answers."""
        node = self.nodes[dst]
        if node.paused or self.is_cut(src, dst):
            return SILENT
        if not node.alive or node.incarnation == 0:
            return REFUSED  # not running, or not listening yet
        return None

    # ----- time --------------------------------------------------------------------------

    def tick(self, count: int = 1) -> None:
        for _ in range(count):
            self.tick_no += 1
            if self._at_rest():
                # Nothing can change but time: only sessions are renewed (as _publish would).
                for node in self.active():
                    if self.now_ms - node.renewed_ms >= self.cfg.ttl_ms // 3:
                        assert node.session is not None
                        self.consul.renew(node.session, self.now_ms)
                        node.renewed_ms = self.now_ms
                self.consul.expire(self.now_ms)
                continue
            self.consul.expire(self.now_ms)
            for node in self.nodes.values():
                if node.running and node.boot_left:
                    node.boot_left -= 1
                    if not node.boot_left:
                        node.incarnation = node.started
                if not node.running or node.incarnation == 0:
                    self.faulty_until[node.name] = self.tick_no
            running = [self.nodes[n] for n in sorted(self.nodes) if self.nodes[n].running]
            for node in running:
                self._publish(node)
            # Every agent reads before any plans: one snapshot serves them all.
            read = self._read()
            for node in running:
                try:
                    self._agent_step(node, read)
                except SimError:
                    raise
                except Exception as exc:  # the planner failing is a finding, not a script error
                    raise SimError(
                        f"tick {self.tick_no}: {node.name}'s agent: {type(exc).__name__}: {exc}"
                    ) from exc

    def _at_rest(self) -> bool:
        """Whether a tick would change nothing but session expiry times: every node running
        and serving, no cut, no failing probe, no request, every agent idle on the current
        Consul state with every registration settled, every replica in sync, no handover."""
        read = self._read()
        view = self._parse(read.view)
        if view is None or None in self.cuts.values():
            return False
        active = self.active()
        if len(self.consul.sessions) != len(active):
            return False
        for node in active:
            if (
                not node.running
                or node.incarnation == 0
                or node.failing
                or node.reports
                or node.requests
                or node.leaving
                or node.session not in self.consul.sessions
                or not isinstance(node.idle_key, tuple)
                or node.idle_key != (read.index, (), node.idle_key[2])
                or len(node.idle_key[2]) != len(read.members)
            ):
                return False
        if self._rest_view != view.epoch:
            if (
                view.joining
                or view.leaving
                or any(len(a.in_sync) != len(a.replicas) or a.handover_to for a in view.partitions)
            ):
                return False
            self._rest_view = view.epoch
        return True

    def _publish(self, node: SimNode) -> None:
        """Renew or open the session, register, probe and report."""
        if node.session is None or self.now_ms - node.renewed_ms >= self.cfg.ttl_ms // 3:
            if node.session is None or not self.consul.renew(node.session, self.now_ms):
                node.session = self.consul.create_session(node.name, self.cfg.ttl_ms, self.now_ms)
            node.renewed_ms = self.now_ms
        addrs = (f"{node.name}:partition", f"{node.name}:mqtt", f"{node.name}:membership")
        self.consul.put(
            MEMBERS + node.name, (*addrs, node.incarnation, node.leaving), acquire=node.session
        )
        for other in self._known(self._read()):
            if other == node.name:
                continue
            result = self.probe(node.name, other)
            allowance = node.allowances.get(other)
            if allowance is None:
                allowance = node.allowances[other] = SilenceAllowance(self.cfg.suspect_ms)
            if result is None:
                node.failing.pop(other, None)
                node.reports.pop(other, None)
                allowance.answered(self.now_ms)
                continue
            kind, since, count = node.failing.get(other, (result, self.now_ms, 0))
            if kind != result:
                kind, since, count = result, self.now_ms, 0
            node.failing[other] = (kind, since, count + 1)
            if kind == REFUSED and count + 1 >= 2:
                node.reports[other] = kind
                allowance.reported = False  # gone, not stalled
            elif kind == SILENT and self.now_ms - since >= allowance.limit_ms(self.now_ms):
                node.reports[other] = kind
                allowance.report()
        for other in sorted(set(node.reports) - set(self._known(self._read()))):
            node.reports.pop(other)
        self.consul.put(
            SUSPECTS + node.name, tuple(sorted(node.reports.items())), acquire=node.session
        )

    def _read(self) -> Snapshot:
        if self._snapshot is None or self._snapshot_index != self.consul.index:
            self._snapshot_index = self.consul.index
            self._snapshot = Snapshot(
                self.consul.index,
                self.consul.get(VIEW),
                self.consul.under(MEMBERS),
                self.consul.under(SUSPECTS),
            )
        return self._snapshot

    def _known(self, read: Snapshot) -> list[str]:
        """The nodes an agent probes: every registered node and every view member."""
        if self._known_at[0] != read.index:
            known = {k.removeprefix(MEMBERS) for k in read.members}
            view = self._parse(read.view)
            if view is not None:
                known |= {m.node_id for m in view.members}
            self._known_at = (read.index, sorted(known))
        return self._known_at[1]

    def _parse(self, entry: Entry | None) -> pb.View | None:
        if entry is None:
            return None
        view = self._parsed.get(entry.modify_index)
        if view is None:
            view = self._parsed[entry.modify_index] = pb.View.FromString(entry.value)
        return view

    def _agent_step(self, node: SimNode, read: Snapshot) -> None:
        view = self._parse(read.view)
        if view is not None:
            self._partition_service(node, view)
        self._plan(node, read)
        # Requests leave once done or moot in the newest view; until then plan sees them all,
        # moot ones included (the view may have moved on since they were made).
        view = self._parse(self._read().view)
        if view is not None and node.requests:
            node.requests = [r for r in node.requests if request_outcome(r, view) == "pending"]
        if view is not None:
            self._end_after_leave(node, view)

    def _plan(self, node: SimNode, read: Snapshot) -> None:
        """Plan and propose; a lost CAS re-reads and plans again, a few times at most."""
        for _ in range(CAS_TRIES):
            view = self._parse(read.view)
            self._note_registrations(node, read)
            settled = tuple(
                n
                for n, (_, since) in node.seen.items()
                if self.now_ms - since >= self.cfg.settle_ms
            )
            # An agent plans again only when something it plans on changed (time matters only
            # through which registrations have settled).
            key = (read.index, tuple(node.requests), settled)
            if key == node.idle_key:
                return
            # `expect 0` with discovery: every listed node (the agent's default without --expect).
            expect = None if self.cfg.expect == 0 and self.listing is not None else self.expect
            config = PlanConfig(
                node.name, self.cfg.partitions, self.cfg.rf, expect, self.cfg.settle_ms
            )
            self.plans += 1
            new = plan(view, self._observe(node, read), config, self.now_ms)
            if new is None:
                node.idle_key = key
                return
            cas = read.view.modify_index if read.view else 0
            if self.consul.put(VIEW, new.SerializeToString(deterministic=True), cas=cas):
                self._agreed(new, read, node.name)
                return
            self.lost_cas += 1
            read = self._read()

    def _note_registrations(self, node: SimNode, read: Snapshot) -> None:
        """Each registration's since_ms: the start of the stretch in which this agent has
        watched, without a gap, that exact value (a re-created key, with a new CreateIndex,
        counts as new) with no live member reporting the node and its own probes of it
        answered; so --rejoin-settle counts from the last doubt about the node, and an agent
        that was paused vouches for nothing it did not see (docs/failover.md)."""
        if self.now_ms - node.observed_ms > TICK_MS:
            node.seen = {}
        node.observed_ms = self.now_ms
        view = self._parse(read.view)
        live = {m.node_id for m in view.members} if view is not None else set()
        reported = {
            n
            for key, entry in read.suspects.items()
            if key.removeprefix(SUSPECTS) in live
            and MEMBERS + key.removeprefix(SUSPECTS) in read.members
            for n, _ in entry.value
        }
        for key, entry in read.members.items():
            name = key.removeprefix(MEMBERS)
            mark = (entry.value, entry.create_index)
            doubted = name in reported or name in node.failing
            if name not in node.seen or node.seen[name][0] != mark or doubted:
                node.seen[name] = (mark, self.now_ms)
        if len(node.seen) > len(read.members):
            for name in sorted(node.seen):
                if MEMBERS + name not in read.members:
                    del node.seen[name]

    def _observe(self, node: SimNode, read: Snapshot) -> Observed:
        registry = {}
        for key, entry in read.members.items():
            name = key.removeprefix(MEMBERS)
            partition, mqtt, membership, incarnation, leaving = entry.value
            registry[name] = Registration(
                name,
                partition,
                mqtt,
                membership,
                incarnation,
                node.seen[name][1],
                leaving=leaving,
            )
        suspicions = {
            key.removeprefix(SUSPECTS): dict(entry.value) for key, entry in read.suspects.items()
        }
        discovered = None
        if self.listing is not None:
            serving = {n for n, r in registry.items() if r.incarnation > 0}
            discovered = Discovered(
                self.listing & registry.keys(), missing=len(self.listing - serving)
            )
        return Observed(registry, suspicions, tuple(node.requests), discovered)

    def _partition_service(self, node: SimNode, view: pb.View) -> None:
        """What a master's partition service asks its agent for, by the view it holds."""
        admitted = {m.node_id: m.incarnation for m in view.members}
        if node.incarnation == 0 or admitted.get(node.name) != node.incarnation:
            return
        pending = set(node.requests)
        mastered = self._mastered(view, node.name)
        if not mastered:
            return
        linked = {
            name: other.running
            and other.incarnation > 0
            and admitted.get(name) == other.incarnation
            and not self.is_cut(node.name, name)
            for name, other in self.nodes.items()
        }
        for a in mastered:
            p, epoch = a.partition, a.epoch
            add, remove = set(), set()
            for f in a.replicas[1:]:
                link = (p, epoch, f)
                if linked[f]:
                    node.up[link] = node.up.get(link, 0) + 1
                    node.down.pop(link, None)
                else:
                    node.down[link] = node.down.get(link, 0) + 1
                    node.up.pop(link, None)
                if f not in a.in_sync and node.up.get(link, 0) >= self.cfg.catchup:
                    add.add(f)
                elif f in a.in_sync and node.down.get(link, 0) >= self.cfg.lag:
                    remove.add(f)
            if add or remove:
                request = InSyncRequest(p, epoch, frozenset(add), frozenset(remove))
                if request not in pending:
                    node.requests.append(request)
            to = a.handover_to
            if to and to in a.in_sync:
                waited = node.quiesced[(p, epoch)] = node.quiesced.get((p, epoch), 0) + 1
                handover = HandoverRequest(p, epoch, to)
                if waited >= 2 and handover not in pending:  # a tick to quiesce
                    node.requests.append(handover)

    def _mastered(self, view: pb.View, name: str) -> list[pb.PartitionAssignment]:
        key = (view.epoch, name)
        found = self._masters_cache.get(key)
        if found is None:
            found = self._masters_cache[key] = [a for a in view.partitions if a.replicas[0] == name]
        return found

    # ----- invariants --------------------------------------------------------------------

    def _agreed(self, new: pb.View, read: Snapshot, proposer: str) -> None:
        old = self.view
        where = f"view {new.epoch} (proposed by {proposer} at tick {self.tick_no})"
        try:
            check_view(new)
        except ValueError as exc:
            raise SimError(f"{where}: {exc}") from exc
        if new.epoch != (old.epoch + 1 if old else 1):
            raise SimError(f"{where}: follows view {old.epoch if old else None}")
        members = {m.node_id for m in new.members}
        for a in new.partitions:
            p, master = a.partition, a.replicas[0]
            offline = master not in members
            if offline and members & set(a.in_sync):
                raise SimError(f"{where}: p{p} offline with members in sync {list(a.in_sync)}")
            if not offline and not set(a.replicas) <= members:
                raise SimError(f"{where}: p{p} replicas {list(a.replicas)} not all members")
            if self.masters.setdefault((p, a.epoch), master) != master:
                raise SimError(
                    f"{where}: p{p} epoch {a.epoch} mastered by {self.masters[(p, a.epoch)]}"
                    f" and by {master}"
                )
        if old is not None:
            self._check_step(old, new, where)
            self._check_removals(old, new, read, where)
            self.records += failover_records(old, new, self.now_ms)
        self.views.append(new)

    def _check_step(self, old: pb.View, new: pb.View, where: str) -> None:
        was = {m.node_id for m in old.members}
        now = {m.node_id for m in new.members}
        for a, b in zip(old.partitions, new.partitions, strict=True):
            restored = a.replicas[0] not in was and b.replicas[0] in now
            tenure = a.replicas[0] != b.replicas[0] or restored
            if b.epoch < a.epoch:
                raise SimError(f"{where}: p{b.partition} epoch went back {a.epoch} -> {b.epoch}")
            if (b.epoch != a.epoch) != tenure or (tenure and b.epoch != new.epoch):
                raise SimError(
                    f"{where}: p{b.partition} master {a.replicas[0]}@{a.epoch} ->"
                    f" {b.replicas[0]}@{b.epoch}"
                )
            if tenure and b.replicas[0] not in a.in_sync:
                raise SimError(
                    f"{where}: p{b.partition} new master {b.replicas[0]} was not in sync"
                    f" {list(a.in_sync)}"
                )
            dropped = (set(a.replicas) - set(b.replicas)) & now
            floor = min(new.replication_factor, len(now - set(new.leaving)))
            if dropped and len(b.in_sync) < floor:
                raise SimError(
                    f"{where}: p{b.partition} dropped {sorted(dropped)} alive, leaving in sync"
                    f" only {list(b.in_sync)}"
                )

    def _check_removals(self, old: pb.View, new: pb.View, read: Snapshot, where: str) -> None:
        removed = {m.node_id for m in old.members} - {m.node_id for m in new.members}
        members = [m.node_id for m in old.members]
        registry = {k.removeprefix(MEMBERS): e.value[3] for k, e in read.members.items()}
        reports = {k.removeprefix(SUSPECTS): dict(e.value) for k, e in read.suspects.items()}
        live = [r for r in members if r in registry]
        window = self.tick_no - (self.cfg.ttl_ms // TICK_MS + 10)
        held = {r for a in old.partitions for r in a.replicas}
        for m in sorted(removed):
            if m in old.leaving and m not in held and self.nodes[m].leaving:
                continue  # it left: nothing held, nothing to fail over
            incarnation = next(x.incarnation for x in old.members if x.node_id == m)
            kinds = [reports.get(r, {}).get(m) for r in live if r != m]
            by_rule = (
                registry.get(m) != incarnation
                or REFUSED in kinds
                or 2 * sum(k is not None for k in kinds) > len(members)
            )
            cut_from = [
                r
                for r in members
                if (t := self.cuts.get(frozenset((m, r)), -1)) is None or t >= window
            ]
            in_fact = self.faulty_until.get(m, -1) >= window or 2 * len(cut_from) > len(members)
            if not by_rule or not in_fact:
                raise SimError(
                    f"{where}: removed {m} (by the rules: {by_rule}, in fact: {in_fact};"
                    f" reports {kinds}, cut from {cut_from})"
                )

    def at_goal(self, *, everyone: bool = True) -> list[str]:
        """What keeps the view from its goal: every partition's replicas its goal (master
        first), all in sync; and with `everyone`, every node a member and a target and every
        partition placed as assign() over all nodes would."""
        view = self.view
        if view is None:
            return ["no view"]
        problems = []
        names = sorted(n.name for n in self.active())
        if everyone and (
            [m.node_id for m in view.members] != names or list(view.target_members) != names
        ):
            problems.append(f"members {[m.node_id for m in view.members]}")
        table = assign(names, view.partition_count, view.replication_factor)
        for a in view.partitions:
            want = goal(view, a.partition)
            if (
                list(a.replicas[:1]) != want[:1]
                or sorted(a.replicas) != sorted(want)
                or sorted(a.in_sync) != sorted(want)
                or a.handover_to
                or (everyone and want != list(table[a.partition]))
            ):
                problems.append(
                    f"p{a.partition}: replicas {list(a.replicas)} in sync {list(a.in_sync)}"
                    f" handover {a.handover_to or '-'}; goal {want}"
                )
        return problems


PARTITION = re.compile(r"p(\d+)$")


class Script(ScriptRunner["Sim"]):
    """Runs scenario lines against a Sim: `nodes 3 partitions 16 rf 3 [expect E] [settle MS]
    [ttl MS] [suspect MS] [catchup T] [lag T] [boot T] [spare S]`, then `tick N`, `kill n2`,
    `restart n2` (a spare: its first start), `leave n2`, `pause n3`, `resume n3`, `cut n1 n2`,
    `heal [n1 n2]`, `discover [NODE...]` (what node discovery lists from now on; with `expect
    0`, the default, the first view then waits for every listed node), `mark` (remember the
    view) and checks: `check targets n1 n2`, `check joining
    n4`, `check leaving n2`, `check as-marked` (members, targets and table as at `mark`),
    `check members n1 n3`, `check master p3 n1`, `check in-sync p3 n1 n3`, `check replicas p3
    n1 n2 n3` (master first, followers in any order), `check offline p5`, `check epoch p3 4`,
    `check view-epoch 5`, `check record p3 failover n1 n2`, `check goal` (all nodes members,
    every partition placed as assign() would, all in sync), `check settled` (the same for the
    members now)."""

    def __init__(self, source: str = "<script>") -> None:
        super().__init__(source)
        self.commands: dict[str, Callable[[list[str]], None]] = {
            "nodes": self.do_nodes,
            "tick": lambda a: self.s.tick(int(a[0]) if a else 1),
            "kill": lambda a: self.s.kill(a[0]),
            "restart": lambda a: self.s.restart(a[0]),
            "pause": lambda a: self.s.pause(a[0]),
            "resume": lambda a: self.s.resume(a[0]),
            "cut": lambda a: self.s.cut(a[0], a[1]),
            "heal": lambda a: self.s.heal(*a[:2]),
            "discover": lambda a: self.s.discover(a),
            "leave": lambda a: self.s.leave(a[0]),
            "mark": self.do_mark,
            "check": self.do_check,
        }
        self.checks: dict[str, Callable[[list[str]], None]] = {
            "members": self.check_members,
            "master": self.check_master,
            "in-sync": self.check_in_sync,
            "replicas": self.check_replicas,
            "offline": self.check_offline,
            "epoch": self.check_epoch,
            "view-epoch": self.check_view_epoch,
            "record": self.check_record,
            "goal": self.check_goal,
            "settled": self.check_settled,
            "targets": self.check_targets,
            "joining": self.check_joining,
            "leaving": self.check_leaving,
            "as-marked": self.check_as_marked,
        }

    def do_nodes(self, a: list[str]) -> None:
        if self.sim is not None:
            raise ScriptError("`nodes` comes once, first")
        names = {
            "partitions",
            "rf",
            "expect",
            "settle",
            "ttl",
            "suspect",
            "catchup",
            "lag",
            "boot",
            "spare",
        }
        fields = {"settle": "settle_ms", "ttl": "ttl_ms", "suspect": "suspect_ms"}
        options: dict[str, int] = {"nodes": int(a[0])}
        for word, value in zip(a[1::2], a[2::2], strict=True):
            if word not in names:
                raise ScriptError(f"unknown setting {word!r}")
            options[fields.get(word, word)] = int(value)
        self.sim = Sim(Settings(**options))

    def part(self, word: str) -> pb.PartitionAssignment:
        m = PARTITION.match(word)
        view = self.s.view
        if view is None:
            raise SimError("no view agreed yet")
        if m is None or int(m.group(1)) >= view.partition_count:
            raise ScriptError(f"no partition {word!r}")
        return view.partitions[int(m.group(1))]

    def check_members(self, a: list[str]) -> None:
        view = self.s.view
        self.expect("members", [m.node_id for m in view.members] if view else [], sorted(a))

    def check_master(self, a: list[str]) -> None:
        self.expect(f"{a[0]} master", self.part(a[0]).replicas[0], a[1])

    def check_in_sync(self, a: list[str]) -> None:
        self.expect(f"{a[0]} in sync", sorted(self.part(a[0]).in_sync), sorted(a[1:]))

    def check_replicas(self, a: list[str]) -> None:
        replicas = list(self.part(a[0]).replicas)
        have = replicas[:1] + sorted(replicas[1:])
        self.expect(f"{a[0]} replicas", have, a[1:2] + sorted(a[2:]))

    def check_offline(self, a: list[str]) -> None:
        view = self.s.view
        members = {m.node_id for m in view.members} if view else set()
        master = self.part(a[0]).replicas[0]
        self.expect(f"{a[0]} offline (master {master})", master not in members, True)

    def check_epoch(self, a: list[str]) -> None:
        self.expect(f"{a[0]} epoch", self.part(a[0]).epoch, int(a[1]))

    def check_view_epoch(self, a: list[str]) -> None:
        view = self.s.view
        self.expect("view epoch", view.epoch if view else 0, int(a[0]))

    def check_record(self, a: list[str]) -> None:
        p = int(self.part(a[0]).partition)
        want = (p, a[1], a[2], a[3] if len(a) > 3 else "")
        have = [(r.partition, r.kind, r.from_node, r.to_node) for r in self.s.records]
        if want not in have:
            raise SimError(f"no record {want} in {[h for h in have if h[0] == p]}")

    def check_goal(self, a: list[str]) -> None:
        problems = self.s.at_goal()
        if problems:
            raise SimError("not at goal: " + "; ".join(problems))

    def do_mark(self, a: list[str]) -> None:
        if self.s.view is None:
            raise SimError("no view agreed yet")
        self.s.marked = self.s.view

    def _view(self) -> pb.View:
        if self.s.view is None:
            raise SimError("no view agreed yet")
        return self.s.view

    def check_targets(self, a: list[str]) -> None:
        self.expect("target members", list(self._view().target_members), sorted(a))

    def check_joining(self, a: list[str]) -> None:
        self.expect("joining", list(self._view().joining), sorted(a))

    def check_leaving(self, a: list[str]) -> None:
        self.expect("leaving", list(self._view().leaving), sorted(a))

    def check_as_marked(self, a: list[str]) -> None:
        """Members, targets and every partition's master, replicas and in-sync set as at the
        last `mark` (epochs may differ)."""
        was, now = self.s.marked, self._view()
        if was is None:
            raise ScriptError("`check as-marked` needs a `mark` first")

        def table(v: pb.View) -> list[object]:
            rows: list[object] = [[m.node_id for m in v.members], list(v.target_members)]
            rows += [
                (a.replicas[0], sorted(a.replicas), sorted(a.in_sync), a.handover_to)
                for a in v.partitions
            ]
            return rows

        for i, (x, y) in enumerate(zip(table(was), table(now), strict=True)):
            what = ("members", "targets")[i] if i < 2 else f"p{i - 2}"
            self.expect(f"{what} as marked", y, x)

    def check_settled(self, a: list[str]) -> None:
        problems = self.s.at_goal(everyone=False)
        if problems:
            raise SimError("not settled: " + "; ".join(problems))
