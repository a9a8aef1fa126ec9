"""An in-memory cluster around the replication state machine (services/partition/replication.py).

No asyncio, no sleeps, no sockets: every node has a `Replicator`, a store (key -> {field: value}
plus a position per partition, like its Redis) and ordered streams to its peers, and nothing
happens unless a test says so. `Sim` carries `ready()` out the way services/partition/peers.py
does:

- a follower opens one stream per master it follows (`link_open`, hello as the stream's first
  message); the master takes the hello (`feed_open`); a cut or a kill closes both ends
  (`feed_closed`, `link_closed`) and loses what was in flight; streams reopen by themselves
  whenever both nodes are up and the pair is not cut;
- a master write is `propose`, the store write, then `master_durable`;
- a follower's `Persist` is written to its store (clear, ops, positions) and then
  `follower_durable` runs, at once unless the node is held;
- a `SnapshotRead` becomes a reader that walks the master's store in key order, one chunk per
  step (reading current values, like HSCAN), until `snapshot_chunk` returns False or the last
  chunk went out.

Invariants checked as it runs (a `SimError` otherwise): a master releases its tokens in proposal
order; when it releases one, every follower it then counts in sync holds the token's entries in
its store (a follower in sync at the proposal either still is, and so is covered, or has left the
in-sync set, which is how a write commits without a follower that is gone); a follower's stored
position never moves back except when a snapshot clears the partition.

`Script` runs the scenario language of tests/unit/replication_scenarios/*.txt on a `Sim`.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexmq.hashring import assign
from services.partition.replication import (
    DEL,
    HDEL,
    HSET,
    NOWHERE,
    Assignment,
    Op,
    Persist,
    Position,
    ReplicationLimits,
    Replicator,
    SnapshotRead,
)

Token = tuple[str, int, int]  # (master, incarnation, n)
EPOCH = 1
ROUNDS = 100_000


class SimError(AssertionError):
    """The state machine broke an invariant, or a check failed."""


class ScriptError(SimError):
    """A script asked for something impossible (a down node, a message that is not there)."""


@dataclass(slots=True)
class Msg:
    kind: str  # "hello" (follower -> master), "items" (master -> follower), "frame" (acks/needs)
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
    rep: Replicator | None = None
    persists: deque[Persist] = field(default_factory=deque)
    readers: deque[Reader] = field(default_factory=deque)
    # Follower writes wait for `persist`/`release` instead of being made durable at once.
    held: bool = False
    incarnation: int = 0
    proposals: list[Token] = field(default_factory=list)  # this incarnation's, in order
    released: int = 0  # how many of `proposals` were released
    committed: list[Token] = field(default_factory=list)  # every release, all incarnations
    snapshots: int = 0  # snapshot reads asked of this node


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
        self.assignments = {
            p: Assignment(EPOCH, replicas)
            for p, replicas in enumerate(assign(names, partitions, rf))
        }
        self.nodes = {name: SimNode(name) for name in names}
        self.channels: dict[tuple[str, str], deque[Msg]] = {}
        self.streams: dict[tuple[str, str], Stream] = {}
        self.cuts: set[frozenset[str]] = set()
        self.paused: set[tuple[str, str]] = set()
        self.drops: dict[tuple[str, str], int] = {}
        # What each unreleased token wrote: (partition, seq) per entry.
        self._writes: dict[Token, list[tuple[int, int]]] = {}
        for name in names:
            self._start(name)
        self._connect()

    # ----- topology ----------------------------------------------------------------------

    def master_of(self, p: int) -> str:
        return self.assignments[p].replicas[0]

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

    def _start(self, name: str) -> None:
        node = self.nodes[name]
        node.rep = Replicator(name, self.limits)
        node.incarnation += 1
        node.proposals, node.released = [], 0
        node.rep.set_roles(
            self.assignments,
            {
                p: node.positions.get(p, NOWHERE)
                for p, a in self.assignments.items()
                if name in a.replicas
            },
        )
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
                hello = rep.link_open(m)
                self._chan(f, m).append(Msg("hello", hello))
                self._process(f)

    def _break_pair(self, a: str, b: str) -> None:
        for f, m in ((a, b), (b, a)):
            stream = self.streams.pop((f, m), None)
            if stream is None:
                continue
            mrep, frep = self.nodes[m].rep, self.nodes[f].rep
            if stream.master_open and mrep is not None:
                mrep.feed_closed(f)
                self._process(m)
            if frep is not None:
                frep.link_closed(m)
                self._process(f)
        self.channels.pop((a, b), None)
        self.channels.pop((b, a), None)

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
        node.persists.clear()
        node.readers.clear()
        node.held = False
        for token in node.proposals[node.released :]:
            self._writes.pop(token, None)
        for other in sorted(self.nodes):
            if other != name:
                self._break_pair(name, other)

    def restart(self, name: str) -> None:
        if self.alive(name):
            raise ScriptError(f"{name} is up")
        self._start(name)
        self._connect()

    # ----- carrying out ready() ----------------------------------------------------------

    def _process(self, name: str) -> None:
        node = self.nodes[name]
        while node.rep is not None:
            ready = node.rep.ready()
            if not ready:
                return
            for token in ready.committed:
                self._release(node, token)
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
            if not node.held:
                while node.persists:
                    self._persist_one(node)

    def _release(self, node: SimNode, token: object) -> None:
        nxt = node.proposals[node.released] if node.released < len(node.proposals) else None
        if token != nxt:
            raise SimError(f"{node.name} released {token}, but next in proposal order is {nxt}")
        node.released += 1
        node.committed.append(nxt)
        rep = self.rep(node.name)
        for p, seq in self._writes.pop(nxt, []):
            for f, fp in rep.mastered[p].followers.items():
                have = self.nodes[f].positions.get(p, NOWHERE)
                if fp.in_sync and have[1] < seq:
                    raise SimError(
                        f"{node.name} released {nxt} (p{p} seq {seq}) counting {f} in sync, "
                        f"but {f} holds p{p} durably only up to {have}"
                    )

    def _persist_one(self, node: SimNode) -> None:
        persist = node.persists.popleft()
        cleared = set(persist.clear)
        for p in persist.clear:
            for key in [k for k in node.store if k.startswith(prefix(p))]:
                del node.store[key]
            node.positions.pop(p, None)
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
        self.rep(node.name).follower_durable(persist.id)

    # ----- inputs ------------------------------------------------------------------------

    def write(self, name: str, writes: dict[int, list[Op]]) -> Token:
        """One group-commit batch on master `name`: propose, store, master_durable."""
        node = self.nodes[name]
        rep = self.rep(name)
        for p in writes:
            if self.master_of(p) != name:
                raise ScriptError(f"{name} is not the master of p{p} ({self.master_of(p)} is)")
        entries = rep.propose(writes)
        for e in entries:
            for op in e.ops:
                apply_op(node.store, op)
            node.positions[e.partition] = (e.epoch, e.seq)
        token = (name, node.incarnation, len(node.proposals) + 1)
        node.proposals.append(token)
        self._writes[token] = [(e.partition, e.seq) for e in entries]
        rep.master_durable(entries, token)
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
            rep.feed_open(src, {pos.partition: (pos.epoch, pos.seq) for pos in msg.payload})
        elif msg.kind == "items":
            items = list(msg.payload)
            while merge and ch and ch[0].kind == "items" and not self.drops.get((src, dst)):
                items.extend(ch.popleft().payload)
            rep.step_items(src, items)
        else:
            frame = msg.payload
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
        for status in self.rep(master).follower_status(p):
            if status.node_id == f:
                return status
        raise ScriptError(f"{f} is not a follower of p{p} on {master}")


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


class Script:
    """Runs scenario lines against a Sim. Nodes are n1..nN, partitions p0..pP-1; fields are
    written `field=value` (key hx:{p}:data) or `key/field=value` (key hx:{p}:key)."""

    def __init__(self, source: str = "<script>") -> None:
        self.source = source
        self.sim: Sim | None = None
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
            "diverge": self.do_diverge,
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
            "snapshots": self.check_snapshots,
        }

    def run_text(self, text: str) -> None:
        for lineno, raw in enumerate(text.splitlines(), 1):
            self.run_line(raw, lineno)

    def run_file(self, path: Path) -> None:
        self.source = str(path)
        self.run_text(path.read_text())

    def run_line(self, raw: str, lineno: int = 0) -> None:
        words = raw.split("#", 1)[0].split()
        if not words:
            return
        try:
            handler = self.commands.get(words[0])
            if handler is None:
                raise ScriptError(f"unknown command {words[0]!r}")
            if self.sim is None and words[0] != "nodes":
                raise ScriptError("the first command must be `nodes`")
            handler(words[1:])
        except (SimError, ValueError, IndexError, KeyError) as exc:
            where = f"{self.source}:{lineno}" if lineno else self.source
            kind = SimError if type(exc) is SimError else ScriptError
            raise kind(f"{where}: {raw.strip()!r}: {exc}") from exc

    # ----- parsing -----------------------------------------------------------------------

    @property
    def s(self) -> Sim:
        assert self.sim is not None
        return self.sim

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
        """write n1 p0 f=v [key/f=v] [-f] [-key/*] [p1 ...]: one batch on the master; `f=v` is
        an HSET, `-f` an HDEL, `-key/*` a DEL of the whole key."""
        self.s.write(self.node(a[0]), self.ops(a[1:], self.op))

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

    def do_check(self, a: list[str]) -> None:
        check = self.checks.get(a[0])
        if check is None:
            raise ScriptError(f"unknown check {a[0]!r}")
        check(a[1:])

    # ----- checks ------------------------------------------------------------------------

    @staticmethod
    def expect(what: str, have: object, want: object) -> None:
        if have != want:
            raise SimError(f"{what}: expected {want}, got {have}")

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
        statuses = self.s.rep(self.node(a[0])).follower_status(self.part(a[1]))
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
        self.expect("log start", m.log_start, int(a[2]))

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

    def check_snapshots(self, a: list[str]) -> None:
        """check snapshots n1 K: snapshot reads n1 was asked for so far."""
        self.expect("snapshots", self.s.nodes[self.node(a[0])].snapshots, int(a[1]))
