"""An in-memory cluster around the replication state machine (services/partition/replication.py).

No asyncio, no sleeps, no sockets: every node has a `Replicator`, a store (key -> {field: value}
plus a position and epoch history per partition, like its Redis) and ordered streams to its
peers, and nothing happens unless a test says so. `Sim` carries `ready()` out the way
services/partition/peers.py does, and plays the agreement the way the membership agents do
(docs/failover.md), with one agreed view for everyone:

- a follower opens one stream per master it follows (`link_open`, its joins in the hello as the
  stream's first message); the master takes the hello (`feed_open`); a cut or a kill closes both
  ends (`feed_closed`, `link_closed`) and loses what was in flight; streams reopen by themselves
  whenever both nodes are up and the pair is not cut;
- a master write is `propose`, the store write, then `master_durable`;
- a follower's `Persist` is written to its store (clear, ops, positions, histories) and then
  `follower_durable` runs, at once unless the node is held;
- a `SnapshotRead` becomes a reader that walks the master's store in key order, one chunk per
  step (reading current values, like HSCAN), until `snapshot_chunk` returns False or the last
  chunk went out;
- a master's in-sync changes and handovers are agreed at once (or, after `manual-agree`, when
  the script says `agree`): the view changes, every live node takes it (`set_view`), and the
  asking master hears the outcome (`in_sync_settled`, `handover_settled`);
- a node made `late` takes views only when the script says `catch-up` (its partition service
  busy, e.g. loading partitions), while its agent answers its requests from the agreed view at
  once: an answer can come before the views that led to it;
- `kill` ends a process without the view noticing; `fail` is the agreement removing a node (a
  master's partitions go to the first in-sync replica, at a new epoch); `restart` starts a
  process with a new incarnation, which the view treats as its old one leaving and the node
  joining again as a follower of what it held (`readmit`);
- every node runs a release (`version`, from its next start): this one, or the previous one
  (v0.2.0: protocol version 1 only), whose follower does not know SnapshotChunk.packed_ops and
  so takes only `ops` from a chunk. Every view tells every node what the members speak
  together (`set_protocol`, as the planner's view does: hexmq/node_protocol.py).

Invariants checked as it runs (a `SimError` otherwise): a master releases its tokens in
proposal order; when it releases one, every replica in the view's in-sync set of each partition
the token wrote holds that entry durably; a promoted master holds every write acknowledged so
far; no two nodes master a partition in one epoch; a follower's stored position never moves
back except when a snapshot clears the partition.

`Script` runs the scenario language of tests/unit/replication_scenarios/*.txt on a `Sim`.
"""

from __future__ import annotations

import dataclasses
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.hashring import assign
from hexmq.node_protocol import (
    LEGACY,
    THIS_RELEASE,
    ZLIB_SNAPSHOTS,
    ClusterProtocol,
    Support,
    cluster_protocol,
)
from services.partition.replication import (
    DEL,
    HDEL,
    HSET,
    NOWHERE,
    Assignment,
    HandoverReady,
    History,
    InSyncChange,
    Op,
    Persist,
    Position,
    ReplicationLimits,
    Replicator,
    SnapshotRead,
    Stored,
    on_history,
)
from services.partition.replication_status import follower_status
from tests.support.scenario_script import ScriptError, ScriptRunner, SimError

Token = tuple[str, int, int]  # (master, incarnation, n)
EPOCH = 1
# An assignment given to _publish with this epoch gets the new view's epoch (its master changed).
NEW_EPOCH = -1
ROUNDS = 100_000


@dataclass(slots=True)
class Msg:
    # "hello" (follower -> master), "items" (master -> follower), "frame" (acks/needs/joins)
    kind: str
    payload: Any


@dataclass(slots=True)
class Stream:
    follower: str
    master: str
    # The master took the hello (feed_open) and has not seen the stream close since.
    master_open: bool = False


@dataclass(slots=True)
class Reader:
    read: SnapshotRead
    # The last (key, field) handed out: the next chunk starts after it.
    cursor: tuple[str, bytes] | None = None


@dataclass(slots=True)
class SimNode:
    name: str
    store: dict[str, dict[bytes, bytes]] = field(default_factory=dict)
    positions: dict[int, Position] = field(default_factory=dict)
    histories: dict[int, History] = field(default_factory=dict)
    rep: Replicator | None = None
    persists: deque[Persist] = field(default_factory=deque)
    readers: deque[Reader] = field(default_factory=deque)
    # Follower writes wait for `persist`/`release` instead of being made durable at once.
    held: bool = False
    incarnation: int = 0
    proposals: list[Token] = field(default_factory=list)  # this incarnation's, in order
    released: int = 0  # how many of `proposals` were released
    committed: list[Token] = field(default_factory=list)  # every release, all incarnations
    aborted: int = 0  # released tokens with an aborted part
    snapshots: int = 0  # snapshot reads asked of this node
    promotions: int = 0
    # The release its process runs (what it speaks); `release` from its next start.
    support: Support = THIS_RELEASE
    release: Support = THIS_RELEASE
    packed_chunks: int = 0  # snapshot chunks this node sent with packed writes


def apply_op(store: dict[str, dict[bytes, bytes]], op: Op) -> None:
    kind, key, fld, value = op
    if kind == HSET:
        store.setdefault(key, {})[fld] = value
    elif kind == HDEL:
        h = store.get(key)
        if h is not None:
            h.pop(fld, None)
            if not h:
                del store[key]
    elif kind == DEL:
        store.pop(key, None)
    else:
        raise ScriptError(f"unknown op kind {kind}")


def prefix(p: int) -> str:
    return f"hx:{p}:"


class Sim:
    def __init__(
        self,
        nodes: int,
        partitions: int,
        rf: int,
        limits: ReplicationLimits | None = None,
        chunk: int = 2,
    ) -> None:
        names = [f"n{i}" for i in range(1, nodes + 1)]
        self.limits = limits or ReplicationLimits()
        self.chunk = chunk
        self.goal = dict(enumerate(assign(names, partitions, rf)))
        self.view_epoch = EPOCH
        self.assignments = {
            p: Assignment(EPOCH, replicas, frozenset(replicas)) for p, replicas in self.goal.items()
        }
        self.members = set(names)
        # Nodes cut off from the agreement: they keep the last view they took.
        self.blind: set[str] = set()
        # Nodes whose partition service takes views late: the views (roles, protocol) each has
        # yet to take, oldest first.
        self.late: dict[str, deque[tuple[dict[int, Assignment], ClusterProtocol]]] = {}
        self.nodes = {name: SimNode(name) for name in names}
        self.channels: dict[tuple[str, str], deque[Msg]] = {}
        self.streams: dict[tuple[str, str], Stream] = {}
        self.cuts: set[frozenset[str]] = set()
        self.paused: set[tuple[str, str]] = set()
        self.drops: dict[tuple[str, str], int] = {}
        # What each unreleased token wrote: (partition, epoch, seq) per entry.
        self._writes: dict[Token, list[tuple[int, int, int]]] = {}
        # Every acknowledged write: partition -> [(epoch, seq)].
        self.acknowledged: dict[int, list[tuple[int, int]]] = {}
        # Who mastered each (partition, epoch).
        self.tenures: dict[tuple[int, int], str] = {}
        # Agreement: requests waiting (manual mode), and whether they wait at all.
        self.auto_agree = True
        # (asker, its incarnation, request): an agent takes requests of its node's current
        # incarnation only.
        self.requests: deque[tuple[str, int, InSyncChange | HandoverReady]] = deque()
        for p, a in self.assignments.items():
            self.tenures[(p, a.epoch)] = a.master
        for name in names:
            self._start(name)
        self._connect()

    # ----- topology ----------------------------------------------------------------------

    def master_of(self, p: int) -> str:
        return self.assignments[p].master

    def alive(self, name: str) -> bool:
        return self.nodes[name].rep is not None

    def rep(self, name: str) -> Replicator:
        rep = self.nodes[name].rep
        if rep is None:
            raise ScriptError(f"{name} is down")
        return rep

    def _chan(self, src: str, dst: str) -> deque[Msg]:
        ch = self.channels.get((src, dst))
        if ch is None:
            ch = self.channels[(src, dst)] = deque()
        return ch

    def _stored(self, name: str) -> dict[int, Stored]:
        node = self.nodes[name]
        return {
            p: Stored(node.positions.get(p, NOWHERE), node.histories.get(p, ()))
            for p in self.assignments
        }

    def _roles(self, name: str) -> dict[int, Assignment]:
        """The view as the node takes it: none at all while it is not a member."""
        return dict(self.assignments) if name in self.members else {}

    def protocol(self) -> ClusterProtocol:
        """What the members speak together (the planner writes it into every view)."""
        return cluster_protocol(self.nodes[n].support for n in sorted(self.members))

    def _take_view(
        self, name: str, view: tuple[dict[int, Assignment], ClusterProtocol] | None = None
    ) -> None:
        """The current view, or `view` (one a late node missed)."""
        roles, protocol = view if view is not None else (self._roles(name), self.protocol())
        rep = self.rep(name)
        rep.set_protocol(protocol)
        rep.set_view(roles, self._stored(name))

    def _start(self, name: str) -> None:
        node = self.nodes[name]
        node.rep = Replicator(name, self.limits)
        node.support = node.release
        node.incarnation += 1
        node.proposals, node.released = [], 0
        self._take_view(name)
        self._process(name)

    def _connect(self) -> None:
        """Open every stream that can be open (followers reconnect as soon as they can)."""
        for f in sorted(self.nodes):
            rep = self.nodes[f].rep
            if rep is None:
                continue
            for m in sorted(rep.masters_followed()):
                if (f, m) in self.streams or not self.alive(m) or frozenset((f, m)) in self.cuts:
                    continue
                self.streams[(f, m)] = Stream(f, m)
                hello = (rep.link_open(m), self.nodes[f].incarnation)
                self._chan(f, m).append(Msg("hello", hello))
                self._process(f)

    def _break_pair(self, a: str, b: str) -> None:
        # Both streams and what was in flight go first: telling the nodes may reopen streams
        # (a relink), which must not lose their fresh hellos.
        broken = [(f, m, self.streams.pop((f, m), None)) for f, m in ((a, b), (b, a))]
        self.channels.pop((a, b), None)
        self.channels.pop((b, a), None)
        touched = []
        for f, m, stream in broken:
            if stream is None:
                continue
            mrep, frep = self.nodes[m].rep, self.nodes[f].rep
            if stream.master_open and mrep is not None:
                mrep.feed_closed(f)
                touched.append(m)
            if frep is not None:
                frep.link_closed(m)
                touched.append(f)
        for name in touched:
            self._process(name)

    def _close_unwanted(self) -> None:
        """Streams a follower no longer needs (its view changed) are closed, as peers.py does."""
        for f, m in sorted(self.streams):
            rep = self.nodes[f].rep
            if rep is not None and m not in rep.masters_followed():
                self._break_pair(f, m)

    def cut(self, a: str, b: str) -> None:
        self.cuts.add(frozenset((a, b)))
        self._break_pair(a, b)

    def heal(self, a: str, b: str) -> None:
        self.cuts.discard(frozenset((a, b)))
        self.drops.pop((a, b), None)
        self.drops.pop((b, a), None)
        self._connect()

    def heal_all(self) -> None:
        self.cuts.clear()
        self.drops.clear()
        self._connect()

    def kill(self, name: str) -> None:
        node = self.nodes[name]
        if node.rep is None:
            raise ScriptError(f"{name} is already down")
        node.rep = None
        self.late.pop(name, None)  # its next process takes the current view
        node.persists.clear()
        node.readers.clear()
        node.held = False
        for token in node.proposals[node.released :]:
            self._writes.pop(token, None)
        for other in sorted(self.nodes):
            if other != name:
                self._break_pair(name, other)

    def restart(self, name: str) -> None:
        """A new incarnation: the view lets the old one go (if it had not yet), the process
        starts with what its store holds, and the node is admitted again as a follower."""
        if self.alive(name):
            raise ScriptError(f"{name} is up")
        if name in self.members:
            self.fail(name)
        self._start(name)
        self.readmit(name)
        self._connect()

    # ----- the agreement -----------------------------------------------------------------

    def _publish(self, changes: dict[int, Assignment]) -> None:
        """A new view with these partitions changed, taken by every live node."""
        self.view_epoch += 1
        for p, a in changes.items():
            old = self.assignments[p]
            if a.epoch == NEW_EPOCH or a.master != old.master:
                a = dataclasses.replace(a, epoch=self.view_epoch)
                holder = self.tenures.setdefault((p, a.epoch), a.master)
                if holder != a.master:
                    raise SimError(f"p{p} epoch {a.epoch} has two masters: {holder}, {a.master}")
            self.assignments[p] = a
        for name in sorted(self.nodes):
            rep = self.nodes[name].rep
            if rep is None or name in self.blind:
                continue
            missed = self.late.get(name)
            if missed is not None:
                missed.append((self._roles(name), self.protocol()))
            else:
                self._take_view(name)
        for name in sorted(self.nodes):
            self._process(name)
        self._close_unwanted()
        self._connect()

    def fall_behind(self, name: str) -> None:
        """`name` takes the views published from now on only when told (`catch_up`)."""
        self.rep(name)
        self.late.setdefault(name, deque())

    def catch_up(self, name: str, count: int | None = None) -> None:
        """`name` takes the next `count` views it missed, in order (all of them, and every
        later view as it comes, when count is None)."""
        self.rep(name)
        missed = self.late.get(name)
        if missed is None:
            raise ScriptError(f"{name} is not late")
        if count is not None and count > len(missed):
            raise ScriptError(f"{name} missed {len(missed)} views, not {count}")
        for _ in range(len(missed) if count is None else count):
            self._take_view(name, missed.popleft())
            self._process(name)
        if count is None:
            del self.late[name]
        self._close_unwanted()
        self._connect()

    def blind_node(self, name: str) -> None:
        """`name` no longer hears the agreement (its view stays as it is)."""
        self.blind.add(name)

    def see(self, name: str) -> None:
        """`name` hears the agreement again and takes the current view."""
        self.blind.discard(name)
        rep = self.nodes[name].rep
        if rep is not None:
            self._take_view(name)
            self._process(name)
            if self.auto_agree:
                self.agree()
            self._close_unwanted()
            self._connect()

    def fail(self, name: str) -> None:
        """The agreement removes `name` (dead, or wrongly thought so): a partition it mastered
        gets its first in-sync replica (in goal order) that is a member, at a new epoch (none:
        offline, kept as it is); it leaves every replica list and in-sync set (never emptying
        one)."""
        if name not in self.members:
            raise ScriptError(f"{name} is not in the view")
        self.members.discard(name)
        changes = {}
        for p, a in self.assignments.items():
            if name not in a.replicas:
                continue
            in_sync = a.in_sync - {name}
            if a.master == name:
                order = [*self.goal[p], *a.replicas]  # the ring's order first, as the planner
                master = next((n for n in order if n in in_sync and n in self.members), None)
                if master is None:
                    continue  # offline until an in-sync replica is back
                replicas = (master, *(n for n in a.replicas if n not in (master, name)))
                changes[p] = Assignment(NEW_EPOCH, replicas, in_sync, "")
            else:
                replicas = tuple(n for n in a.replicas if n != name)
                handover_to = "" if a.handover_to == name else a.handover_to
                changes[p] = Assignment(a.epoch, replicas, in_sync or a.in_sync, handover_to)
        self._publish(changes)

    def readmit(self, name: str) -> None:
        """`name` joins again: a follower (not in sync) of the partitions its goal gives it;
        partitions left offline with it as their last in-sync replica get it back as master."""
        if name in self.members:
            raise ScriptError(f"{name} is in the view")
        changes = {}
        for p, a in self.assignments.items():
            if a.master not in self.members and name in a.in_sync:
                replicas = (name, *(n for n in a.replicas if n != name))
                changes[p] = Assignment(NEW_EPOCH, replicas, a.in_sync, "")
            elif name in self.goal[p] and name not in a.replicas:
                changes[p] = Assignment(a.epoch, (*a.replicas, name), a.in_sync, "")
        self.members.add(name)
        self._publish(changes)

    def hand_over(self, p: int, to: str) -> None:
        """The placement asks p's master to hand the partition over to `to`."""
        a = self.assignments[p]
        self._publish({p: dataclasses.replace(a, handover_to=to)})

    def agree(self, count: int | None = None) -> int:
        """Carry out waiting requests (all, or `count`); returns how many."""
        done = 0
        waiting: deque[tuple[str, int, InSyncChange | HandoverReady]] = deque()
        while self.requests and (count is None or done < count):
            asker, incarnation, request = self.requests.popleft()
            if asker in self.blind:
                # Its agent cannot reach the agreement: the request waits (it is asked again).
                waiting.append((asker, incarnation, request))
                continue
            if incarnation == self.nodes[asker].incarnation and self.alive(asker):
                self._agree_one(asker, request)
            done += 1
        self.requests.extendleft(reversed(waiting))
        return done

    def _agree_one(self, asker: str, request: InSyncChange | HandoverReady) -> None:
        a = self.assignments[request.partition]
        current = a.epoch == request.epoch and a.master == asker and asker in self.members
        if isinstance(request, HandoverReady):
            if current and request.to in a.in_sync and request.to in self.members:
                replicas = (request.to, *(n for n in a.replicas if n != request.to))
                self._publish({request.partition: Assignment(NEW_EPOCH, replicas, a.in_sync, "")})
            else:
                self.rep(asker).handover_settled(request)
                self._process(asker)
            return
        made = True
        if current:
            f = request.follower
            same = request.incarnation == self.nodes[f].incarnation
            if (
                request.add
                and same
                and f in a.replicas
                and f in self.members
                and f not in a.in_sync
            ):
                self._publish({request.partition: dataclasses.replace(a, in_sync=a.in_sync | {f})})
            elif request.add:
                made = same and f in a.in_sync
            elif f in a.in_sync and len(a.in_sync) > 1:
                self._publish({request.partition: dataclasses.replace(a, in_sync=a.in_sync - {f})})
        else:
            # Moot (the partition moved on): refused, a removal too, as the membership agent
            # does (services/membership/proposals.py, ProposalBook.settle; seed 4086).
            made = False
        self.rep(asker).in_sync_settled(request, made=made)
        self._process(asker)

    # ----- carrying out ready() ----------------------------------------------------------

    def _process(self, name: str) -> None:
        node = self.nodes[name]
        relink = False
        while node.rep is not None:
            ready = node.rep.ready()
            if not ready:
                break
            relink = relink or ready.relink
            for token, aborted in ready.committed:
                self._release(node, token, aborted)
            for f, items in ready.to_followers.items():
                stream = self.streams.get((f, name))
                if stream is not None and stream.master_open:
                    self._chan(name, f).append(Msg("items", items))
            for m, frame in ready.to_masters.items():
                if (name, m) in self.streams:
                    self._chan(name, m).append(Msg("frame", frame))
            node.persists.extend(ready.persist)
            for read in ready.snapshot_reads:
                node.readers.append(Reader(read))
                node.snapshots += 1
            for p in ready.promoted:
                node.promotions += 1
                self._check_promotion(node, p)
            for request in [*ready.in_sync_changes, *ready.handovers]:
                self.requests.append((name, node.incarnation, request))
            if not node.held:
                while node.persists:
                    self._persist_one(node)
            if self.auto_agree and self.requests:
                self.agree()
                self._connect()
        if relink:
            self._close_unwanted()
            self._connect()
        self._check_logs(node)

    def _check_logs(self, node: SimNode) -> None:
        """Every recent log the node keeps holds consecutive entries from its start (a master
        serves followers by indexing it: entries[seq - start])."""
        rep = node.rep
        if rep is None:
            return
        logs = [(f"master of p{p}", m.log) for p, m in rep.mastered.items()]
        logs += [(f"follower of p{p}", fd.log) for p, fd in rep.followed.items()]
        for what, log in logs:
            seqs = [e.seq for e in log.entries]
            if seqs and (seqs[0] != log.start or seqs != list(range(seqs[0], seqs[-1] + 1))):
                raise SimError(f"{node.name}'s log as {what} is not consecutive: {seqs[:8]}...")

    def _holds(self, node: SimNode, p: int, epoch: int, seq: int) -> bool:
        pos = node.positions.get(p, NOWHERE)
        return on_history(node.histories.get(p, ()), pos[1], (epoch, seq))

    def _check_promotion(self, node: SimNode, p: int) -> None:
        m = self.rep(node.name).mastered[p]
        holder = self.tenures.setdefault((p, m.epoch), node.name)
        if holder != node.name:
            raise SimError(f"p{p} epoch {m.epoch}: {node.name} masters it, but so did {holder}")
        missing = [w for w in self.acknowledged.get(p, []) if not self._holds(node, p, *w)]
        if missing:
            raise SimError(
                f"{node.name} became master of p{p} at epoch {m.epoch} without acknowledged "
                f"writes {missing[:3]} (it stands at {node.positions.get(p, NOWHERE)})"
            )

    def _release(self, node: SimNode, token: object, aborted: frozenset[int]) -> None:
        nxt = node.proposals[node.released] if node.released < len(node.proposals) else None
        if token != nxt:
            raise SimError(f"{node.name} released {token}, but next in proposal order is {nxt}")
        node.released += 1
        node.committed.append(nxt)
        if aborted:
            node.aborted += 1
        for p, epoch, seq in self._writes.pop(nxt, []):
            if p in aborted:
                continue
            a = self.assignments[p]
            for f in sorted(a.in_sync):
                if not self._holds(self.nodes[f], p, epoch, seq):
                    have = self.nodes[f].positions.get(p, NOWHERE)
                    raise SimError(
                        f"{node.name} released {nxt} (p{p} {epoch}:{seq}) while {f} is in the "
                        f"view's in-sync set, but {f} holds p{p} durably only up to {have}"
                    )
            self.acknowledged.setdefault(p, []).append((epoch, seq))

    def _persist_one(self, node: SimNode) -> None:
        persist = node.persists.popleft()
        cleared = set(persist.clear)
        for p in persist.clear:
            for key in [k for k in node.store if k.startswith(prefix(p))]:
                del node.store[key]
            node.positions.pop(p, None)
            node.histories.pop(p, None)
        for op in persist.ops:
            apply_op(node.store, op)
        for p, pos in persist.positions.items():
            old = node.positions.get(p, NOWHERE)
            if p not in cleared and pos[1] < old[1]:
                raise SimError(f"{node.name}: a persist moved p{p} back from {old} to {pos}")
            if pos == NOWHERE:
                node.positions.pop(p, None)
            else:
                node.positions[p] = pos
        for p, history in persist.histories.items():
            node.histories[p] = history
        self.rep(node.name).follower_durable(persist.id)

    # ----- inputs ------------------------------------------------------------------------

    def write(
        self,
        name: str,
        writes: dict[int, list[Op]],
        origins: dict[int, list[bytes]] | None = None,
    ) -> Token:
        """One group-commit batch on master `name`: propose, store, master_durable."""
        node = self.nodes[name]
        rep = self.rep(name)
        for p in writes:
            if p not in rep.mastered:
                raise ScriptError(
                    f"{name} does not master p{p} (by the view, {self.master_of(p)} does)"
                )
        entries, aborted = rep.propose(writes, origins)
        for e in entries:
            for op in e.ops:
                apply_op(node.store, op)
            node.positions[e.partition] = (e.epoch, e.seq)
            if e.history is not None:
                node.histories[e.partition] = e.history
        token = (name, node.incarnation, len(node.proposals) + 1)
        node.proposals.append(token)
        self._writes[token] = [(e.partition, e.epoch, e.seq) for e in entries]
        rep.master_durable(entries, token, aborted)
        self._process(name)
        return token

    def deliver_one(self, src: str, dst: str, *, merge: bool = False) -> bool:
        """Deliver (or drop) the next message from src to dst; False if there is none."""
        ch = self.channels.get((src, dst))
        if not ch:
            return False
        msg = ch.popleft()
        if msg.kind != "hello" and self.drops.get((src, dst), 0) > 0:
            self.drops[(src, dst)] -= 1
            return True
        rep = self.rep(dst)
        if msg.kind == "hello":
            self.streams[(src, dst)].master_open = True
            joins, incarnation = msg.payload
            rep.feed_open(src, joins, incarnation)
        elif msg.kind == "items":
            items = list(msg.payload)
            while merge and ch and ch[0].kind == "items" and not self.drops.get((src, dst)):
                items.extend(ch.popleft().payload)
            if ZLIB_SNAPSHOTS not in self.nodes[dst].support.features:
                items = [_as_previous_release_reads(item) for item in items]
            rep.step_items(src, items)
        else:
            frame = msg.payload
            if frame.joins:
                rep.step_joins(src, frame.joins)
            if frame.acks:
                rep.step_acks(src, frame.acks)
            if frame.needs:
                rep.step_needs(src, frame.needs)
        self._process(dst)
        return True

    def read_chunk(self, name: str, index: int = 0) -> bool:
        """One step of one of `name`'s snapshot readers (the oldest by default)."""
        node = self.nodes[name]
        if node.rep is None or len(node.readers) <= index:
            return False
        reader = node.readers[index]
        read = reader.read
        stream = self.streams.get((read.follower, name))
        if stream is None or not stream.master_open:
            del node.readers[index]  # no stream to send it down: the reader gives up
            return True
        pairs = sorted(
            (key, fld)
            for key, h in node.store.items()
            if key.startswith(prefix(read.partition))
            for fld in h
        )
        if reader.cursor is not None:
            pairs = [kf for kf in pairs if kf > reader.cursor]
        chunk, last = pairs[: self.chunk], len(pairs) <= self.chunk
        ops: list[Op] = [(HSET, key, fld, node.store[key][fld]) for key, fld in chunk]
        ok = node.rep.snapshot_chunk(read, ops, last)
        if ok is not None and ok.packed:
            node.packed_chunks += 1
        if not ok or last:
            del node.readers[index]
        else:
            reader.cursor = chunk[-1]
        self._process(name)
        return True

    def persist(self, name: str, count: int) -> None:
        node = self.nodes[name]
        self.rep(name)
        for _ in range(count):
            if not node.persists:
                raise ScriptError(f"{name} has no queued writes left")
            self._persist_one(node)
        self._process(name)

    def hold(self, name: str) -> None:
        self.rep(name)
        self.nodes[name].held = True

    def release(self, name: str) -> None:
        self.rep(name)
        self.nodes[name].held = False
        self._process(name)
        while self.nodes[name].persists:
            self.persist(name, 1)

    def tick(self, count: int) -> None:
        for _ in range(count):
            for name in sorted(self.nodes):
                rep = self.nodes[name].rep
                if rep is not None:
                    rep.tick()
                    self._process(name)

    def deliver_all(self) -> None:
        """Deliver every message and step every snapshot reader, round robin, until quiet
        (paused directions and held writes stay where they are)."""
        for _ in range(ROUNDS):
            progressed = False
            for src, dst in sorted(self.channels):
                if (src, dst) not in self.paused and self.deliver_one(src, dst):
                    progressed = True
            for name in sorted(self.nodes):
                if self.read_chunk(name):
                    progressed = True
            if not progressed:
                return
        raise SimError(f"not quiet after {ROUNDS} rounds")

    # ----- views -------------------------------------------------------------------------

    def partition_state(self, name: str, p: int) -> tuple[dict[str, dict[bytes, bytes]], Position]:
        node = self.nodes[name]
        data = {k: dict(h) for k, h in node.store.items() if k.startswith(prefix(p))}
        return data, node.positions.get(p, NOWHERE)

    def divergence(self, p: int) -> list[str]:
        """How each replica of p differs from its master (empty: converged)."""
        master = self.master_of(p)
        want = self.partition_state(master, p)
        out = []
        for f in self.assignments[p].replicas[1:]:
            have = self.partition_state(f, p)
            if have != want:
                out.append(f"{f} has {_show(have)}, master {master} has {_show(want)}")
        return out

    def follower(self, master: str, p: int, f: str) -> Any:
        for status in follower_status(self.rep(master), p):
            if status.node_id == f:
                return status
        raise ScriptError(f"{f} is not a follower of p{p} on {master}")


def _as_previous_release_reads(item: pb.ReplicationItem) -> pb.ReplicationItem:
    """An item as a follower of v0.2.0 parses it: SnapshotChunk.packed_ops is a field it does
    not know, so it never sees those writes."""
    if item.WhichOneof("item") != "snapshot" or not item.snapshot.packed_ops:
        return item
    seen = pb.ReplicationItem()
    seen.CopyFrom(item)
    seen.snapshot.ClearField("packed_ops")
    return seen


def _show(state: tuple[dict[str, dict[bytes, bytes]], Position]) -> str:
    data, pos = state
    flat = {
        f"{k.split(':', 2)[2]}/{f.decode()}": v.decode()
        for k, h in data.items()
        for f, v in h.items()
    }
    return f"{dict(sorted(flat.items()))} at {pos}"


# ----- the scenario language ---------------------------------------------------------------

PARTITION = re.compile(r"p(\d+)$")


class Script(ScriptRunner["Sim"]):
    """Runs scenario lines against a Sim. Nodes are n1..nN, partitions p0..pP-1; fields are
    written `field=value` (key hx:{p}:data) or `key/field=value` (key hx:{p}:key)."""

    def __init__(self, source: str = "<script>") -> None:
        super().__init__(source)
        self.commands: dict[str, Callable[[list[str]], None]] = {
            "nodes": self.do_nodes,
            "write": self.do_write,
            "delete": self.do_delete,
            "deliver": self.do_deliver,
            "read": self.do_read,
            "persist": self.do_persist,
            "hold": self.do_hold,
            "release": self.do_release,
            "tick": self.do_tick,
            "cut": self.do_cut,
            "heal": self.do_heal,
            "drop": self.do_drop,
            "pause": self.do_pause,
            "resume": self.do_resume,
            "kill": self.do_kill,
            "restart": self.do_restart,
            "fail": self.do_fail,
            "readmit": self.do_readmit,
            "handover": self.do_handover,
            "agree": self.do_agree,
            "manual-agree": self.do_manual_agree,
            "blind": self.do_blind,
            "see": self.do_see,
            "late": self.do_late,
            "catch-up": self.do_catch_up,
            "diverge": self.do_diverge,
            "version": self.do_version,
            "check": self.do_check,
        }
        self.checks: dict[str, Callable[[list[str]], None]] = {
            "replicas": self.check_replicas,
            "committed": self.check_committed,
            "pending": self.check_pending,
            "in-sync": self.check_in_sync,
            "converged": self.check_converged,
            "state": self.check_state,
            "lag": self.check_lag,
            "log-start": self.check_log_start,
            "position": self.check_position,
            "value": self.check_value,
            "wrote": self.check_wrote,
            "snapshots": self.check_snapshots,
            "packed": self.check_packed,
            "protocol": self.check_protocol,
            "master": self.check_master,
            "view-in-sync": self.check_view_in_sync,
            "aborted": self.check_aborted,
            "requests": self.check_requests,
        }

    # ----- parsing -----------------------------------------------------------------------

    def node(self, word: str) -> str:
        if word not in self.s.nodes:
            raise ScriptError(f"no node {word!r}")
        return word

    def part(self, word: str) -> int:
        m = PARTITION.match(word)
        if m is None or int(m.group(1)) not in self.s.assignments:
            raise ScriptError(f"no partition {word!r}")
        return int(m.group(1))

    @staticmethod
    def key_field(p: int, word: str) -> tuple[str, bytes]:
        key, _, fld = word.rpartition("/")
        return f"hx:{p}:{key or 'data'}", fld.encode()

    def ops(self, words: list[str], make: Callable[[int, str], Op]) -> dict[int, list[Op]]:
        writes: dict[int, list[Op]] = {}
        p: int | None = None
        for word in words:
            if PARTITION.match(word):
                p = self.part(word)
                writes.setdefault(p, [])
            elif p is None:
                raise ScriptError("name a partition (p0, p1, ...) before the fields")
            else:
                writes[p].append(make(p, word))
        if not writes:
            raise ScriptError("nothing to write")
        return writes

    # ----- commands ----------------------------------------------------------------------

    def do_nodes(self, a: list[str]) -> None:
        """nodes N partitions P rf R [log E] [log-bytes B] [window W] [lag T] [retry T]
        [chunk C]"""
        if self.sim is not None:
            raise ScriptError("`nodes` comes once, first")
        opts = dict(zip(a[1::2], (int(v) for v in a[2::2]), strict=True))
        unknown = set(opts) - {
            "partitions",
            "rf",
            "log",
            "log-bytes",
            "window",
            "lag",
            "retry",
            "chunk",
        }
        if unknown:
            raise ScriptError(f"unknown options {sorted(unknown)}")
        d = ReplicationLimits()
        limits = ReplicationLimits(
            log_entries=opts.get("log", d.log_entries),
            log_bytes=opts.get("log-bytes", d.log_bytes),
            window=opts.get("window", d.window),
            lag_ticks=opts.get("lag", d.lag_ticks),
            need_retry_ticks=opts.get("retry", d.need_retry_ticks),
        )
        self.sim = Sim(
            int(a[0]), opts.get("partitions", 1), opts.get("rf", 2), limits, opts.get("chunk", 2)
        )

    def do_write(self, a: list[str]) -> None:
        """write n1 p0 f=v [key/f=v] [-f] [-key/*] [@origin] [p1 ...]: one batch on the master;
        `f=v` is an HSET, `-f` an HDEL, `-key/*` a DEL of the whole key, `@origin` the origin
        of a QoS 1 publish the partition's entry holds (alone: an entry with no writes)."""
        origins: dict[int, list[bytes]] = {}
        words: list[str] = []
        p: int | None = None
        for word in a[1:]:
            if PARTITION.match(word):
                p = self.part(word)
            if word.startswith("@"):
                if p is None:
                    raise ScriptError("name a partition (p0, p1, ...) before its origins")
                origins.setdefault(p, []).append(word[1:].encode())
            else:
                words.append(word)
        self.s.write(self.node(a[0]), self.ops(words, self.op), origins)

    def do_delete(self, a: list[str]) -> None:
        """delete n1 p0 f [key/*]: the same as `write n1 p0 -f -key/*`."""
        self.s.write(self.node(a[0]), self.ops(a[1:], lambda p, w: self.op(p, "-" + w)))

    def op(self, p: int, word: str) -> Op:
        if word.startswith("-"):
            key, fld = self.key_field(p, word[1:])
            return (DEL, key, b"", b"") if fld == b"*" else (HDEL, key, fld, b"")
        name, sep, value = word.partition("=")
        if not sep:
            raise ScriptError(f"{word!r}: write field=value, -field or -key/*")
        key, fld = self.key_field(p, name)
        return (HSET, key, fld, value.encode())

    def do_deliver(self, a: list[str]) -> None:
        """deliver: everything until quiet; deliver n1 n2 [k]: the next k messages n1 -> n2;
        deliver n1 n2 all: all of them as one frame (as peers.py batches a backlog)."""
        if not a:
            self.s.deliver_all()
            return
        src, dst = self.node(a[0]), self.node(a[1])
        if a[2:] == ["all"]:
            if not self.s.deliver_one(src, dst, merge=True):
                raise ScriptError(f"nothing was waiting from {src} to {dst}")
            return
        for i in range(int(a[2]) if len(a) > 2 else 1):
            if not self.s.deliver_one(src, dst):
                raise ScriptError(f"only {i} messages were waiting from {src} to {dst}")

    def do_read(self, a: list[str]) -> None:
        """read n1 [k]: k steps of n1's oldest snapshot reader (one chunk each)."""
        for i in range(int(a[1]) if len(a) > 1 else 1):
            if not self.s.read_chunk(self.node(a[0])):
                raise ScriptError(f"{a[0]} had only {i} snapshot chunks to read")

    def do_persist(self, a: list[str]) -> None:
        """persist n2 [k]: make k of n2's held writes durable."""
        self.s.persist(self.node(a[0]), int(a[1]) if len(a) > 1 else 1)

    def do_hold(self, a: list[str]) -> None:
        """hold n2: n2's follower writes wait (not durable, not acknowledged)."""
        self.s.hold(self.node(a[0]))

    def do_release(self, a: list[str]) -> None:
        """release [n2]: write what is held and stop holding (every live node without n2)."""
        for name in [self.node(a[0])] if a else [n for n in self.s.nodes if self.s.alive(n)]:
            self.s.release(name)

    def do_tick(self, a: list[str]) -> None:
        self.s.tick(int(a[0]) if a else 1)

    def do_cut(self, a: list[str]) -> None:
        self.s.cut(self.node(a[0]), self.node(a[1]))

    def do_heal(self, a: list[str]) -> None:
        """heal n1 n2 | heal: reconnect one pair, or every pair (and forget pending drops)."""
        if a:
            self.s.heal(self.node(a[0]), self.node(a[1]))
        else:
            self.s.heal_all()

    def do_drop(self, a: list[str]) -> None:
        """drop n1 n2 k: the next k messages from n1 to n2 (never a hello) are lost."""
        key = (self.node(a[0]), self.node(a[1]))
        self.s.drops[key] = self.s.drops.get(key, 0) + int(a[2])

    def do_pause(self, a: list[str]) -> None:
        """pause n2 n1: `deliver` leaves messages from n2 to n1 waiting."""
        self.s.paused.add((self.node(a[0]), self.node(a[1])))

    def do_resume(self, a: list[str]) -> None:
        if a:
            self.s.paused.discard((self.node(a[0]), self.node(a[1])))
        else:
            self.s.paused.clear()

    def do_kill(self, a: list[str]) -> None:
        self.s.kill(self.node(a[0]))

    def do_restart(self, a: list[str]) -> None:
        self.s.restart(self.node(a[0]))

    def do_version(self, a: list[str]) -> None:
        """version n2 previous|current: the release n2 runs from its next start (previous:
        v0.2.0, protocol version 1, blind to packed snapshot writes)."""
        releases = {"previous": LEGACY, "current": THIS_RELEASE}
        if a[1] not in releases:
            raise ScriptError(f"version {a[1]!r}: previous or current")
        self.s.nodes[self.node(a[0])].release = releases[a[1]]

    def do_fail(self, a: list[str]) -> None:
        """fail n1: the agreement removes n1 from the view (whether or not it is alive)."""
        self.s.fail(self.node(a[0]))

    def do_readmit(self, a: list[str]) -> None:
        """readmit n1: n1 (removed, alive) joins the view again as a follower."""
        self.s.readmit(self.node(a[0]))

    def do_handover(self, a: list[str]) -> None:
        """handover p0 n2: the view asks p0's master to hand it over to n2."""
        self.s.hand_over(self.part(a[0]), self.node(a[1]))

    def do_agree(self, a: list[str]) -> None:
        """agree [k]: carry out waiting in-sync changes and handovers (all, or k)."""
        self.s.agree(int(a[0]) if a else None)

    def do_manual_agree(self, a: list[str]) -> None:
        """manual-agree: requests wait for `agree` from now on (they are agreed at once by
        default)."""
        self.s.auto_agree = False

    def do_blind(self, a: list[str]) -> None:
        """blind n1: n1 stops hearing the agreement: it keeps its last view, its requests are
        never answered (a node cut off from Consul)."""
        self.s.blind_node(self.node(a[0]))

    def do_see(self, a: list[str]) -> None:
        """see n1: n1 hears the agreement again and takes the current view."""
        self.s.see(self.node(a[0]))

    def do_late(self, a: list[str]) -> None:
        """late n1: n1 takes views only at `catch-up` from now on, while its agent answers
        its requests from the agreed view at once (a partition service busy loading)."""
        self.s.fall_behind(self.node(a[0]))

    def do_catch_up(self, a: list[str]) -> None:
        """catch-up n1 [k]: n1 takes the next k views it missed, in order (without k: all of
        them, and it keeps up from then on)."""
        self.s.catch_up(self.node(a[0]), int(a[1]) if len(a) > 1 else None)

    def do_diverge(self, a: list[str]) -> None:
        """diverge n2 p0 E:S [f=v ...]: write straight into n2's store, bypassing replication,
        and set its stored position of p0 (use while n2 is down)."""
        name, p = self.node(a[0]), self.part(a[1])
        node = self.s.nodes[name]
        epoch, seq = (int(x) for x in a[2].split(":"))
        node.positions[p] = (epoch, seq)
        for word in a[3:]:
            fname, _, value = word.partition("=")
            key, fld = self.key_field(p, fname)
            apply_op(node.store, (HSET, key, fld, value.encode()))

    # ----- checks ------------------------------------------------------------------------

    def check_replicas(self, a: list[str]) -> None:
        """check replicas p0 n1 n3 n2: the assignment (master first)."""
        self.expect("replicas", list(self.s.assignments[self.part(a[0])].replicas), a[1:])

    def check_committed(self, a: list[str]) -> None:
        """check committed n1 K: tokens n1 released so far (all its runs)."""
        self.expect("released", len(self.s.nodes[self.node(a[0])].committed), int(a[1]))

    def check_pending(self, a: list[str]) -> None:
        """check pending n1 K: tokens of n1's current run not released yet."""
        node = self.s.nodes[self.node(a[0])]
        self.expect("pending", len(node.proposals) - node.released, int(a[1]))

    def check_in_sync(self, a: list[str]) -> None:
        """check in-sync n1 p0 [n2 ...]: exactly these followers are in sync."""
        statuses = follower_status(self.s.rep(self.node(a[0])), self.part(a[1]))
        have = sorted(st.node_id for st in statuses if st.in_sync)
        self.expect("in sync", have, sorted(self.node(n) for n in a[2:]))

    def check_converged(self, a: list[str]) -> None:
        """check converged [p0]: every replica's store of the partition (all partitions without
        one) equals its master's, position included."""
        parts = [self.part(a[0])] if a else sorted(self.s.assignments)
        problems = [f"p{p}: {d}" for p in parts for d in self.s.divergence(p)]
        if problems:
            raise SimError("not converged: " + "; ".join(problems))

    def check_state(self, a: list[str]) -> None:
        """check state n1 p0 n2 down|snapshot|log|live"""
        st = self.s.follower(self.node(a[0]), self.part(a[1]), self.node(a[2]))
        self.expect(f"state of {a[2]}", st.state, a[3])

    def check_lag(self, a: list[str]) -> None:
        st = self.s.follower(self.node(a[0]), self.part(a[1]), self.node(a[2]))
        self.expect(f"lag of {a[2]}", st.lag, int(a[3]))

    def check_log_start(self, a: list[str]) -> None:
        m = self.s.rep(self.node(a[0])).mastered[self.part(a[1])]
        self.expect("log start", m.log.start, int(a[2]))

    def check_position(self, a: list[str]) -> None:
        """check position n2 p0 E:S: the position in n2's store."""
        node = self.s.nodes[self.node(a[0])]
        have = node.positions.get(self.part(a[1]), NOWHERE)
        self.expect("stored position", f"{have[0]}:{have[1]}", a[2])

    def check_value(self, a: list[str]) -> None:
        """check value n2 p0 [key/]field value|-: a stored value (`-`: absent)."""
        p = self.part(a[1])
        key, fld = self.key_field(p, a[2])
        value = self.s.nodes[self.node(a[0])].store.get(key, {}).get(fld)
        self.expect(f"{a[2]}", "-" if value is None else value.decode(), a[3])

    def check_wrote(self, a: list[str]) -> None:
        """check wrote n2 p0 origin yes|no: whether n2, as master of p0, finds a publish of that
        origin in its recent log (a resent publish it must not write again)."""
        wrote = self.s.rep(self.node(a[0])).wrote(self.part(a[1]), a[2].encode())
        self.expect(f"wrote {a[2]}", "yes" if wrote else "no", a[3])

    def check_master(self, a: list[str]) -> None:
        """check master p0 n2 [E]: the view's master of p0 (and its epoch)."""
        assignment = self.s.assignments[self.part(a[0])]
        self.expect("master", assignment.master, self.node(a[1]))
        if len(a) > 2:
            self.expect("epoch", assignment.epoch, int(a[2]))

    def check_view_in_sync(self, a: list[str]) -> None:
        """check view-in-sync p0 n1 n2: the view's in-sync set of p0."""
        have = sorted(self.s.assignments[self.part(a[0])].in_sync)
        self.expect("view in sync", have, sorted(self.node(n) for n in a[1:]))

    def check_aborted(self, a: list[str]) -> None:
        """check aborted n1 K: released tokens of n1 that had an aborted part."""
        self.expect("aborted", self.s.nodes[self.node(a[0])].aborted, int(a[1]))

    def check_requests(self, a: list[str]) -> None:
        """check requests K: agreement requests waiting (manual-agree)."""
        self.expect("requests", len(self.s.requests), int(a[0]))

    def check_packed(self, a: list[str]) -> None:
        """check packed n1 K: snapshot chunks n1 sent with packed (zlib) writes so far."""
        self.expect("packed chunks", self.s.nodes[self.node(a[0])].packed_chunks, int(a[1]))

    def check_protocol(self, a: list[str]) -> None:
        """check protocol n1 V F1,F2|-: the protocol version and features n1 acts on."""
        protocol = self.s.rep(self.node(a[0])).protocol
        self.expect("protocol version", protocol.version, int(a[1]))
        self.expect("features", ",".join(sorted(protocol.features)) or "-", a[2])

    def check_snapshots(self, a: list[str]) -> None:
        """check snapshots n1 K: snapshot reads n1 was asked for so far."""
        self.expect("snapshots", self.s.nodes[self.node(a[0])].snapshots, int(a[1]))
