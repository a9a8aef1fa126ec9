"""The verdict of a fault run: every rule of the issue's bar, each failure named.

Pure over the run's result and its client records, so the rules are unit-tested on made-up
runs (tests/faults/test_verdict.py). A run passes when nothing acknowledged was lost, no QoS 2
message came twice, no order was broken (G1-G3), no epoch had two masters, every replica
converged and the cluster came back to its full shape after the heal, retained messages agree
on every node (G6), no client id had two live connections except across a cut that kept the
server from closing the old one (G5), no subscription granted during a split is missing
(G7), and no client was disconnected except by a kill or a leave of its node, by a takeover
of its own session, or (a 3.1.1 publisher) as the refusal of a publish held past the failover
hold (G7: clients are never disconnected merely because of a split).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hexmq.hashring import partition_of
from tests.faults.nemesis import AGREEMENT, CLIENTS
from tests.support.checker import ConnectionRecord, PublisherRecord, overlaps

# A takeover's close reaches the old client a moment after the new one's CONNACK.
TAKEOVER_TOLERANCE_S = 1.0


def takes_over(o: ConnectionRecord, c: ConnectionRecord, closed: float) -> bool:
    """Whether `o`, a takeover of ours, explains the close of `c` (at `closed`, monotonic): it
    came after `c` opened, and its CONNECT was sent before `c` closed (its CONNACK may come
    later: the server closes the old connection and answers the new one at once, and under
    load either may reach its client first, seen 1.1-1.6 s apart at load 10-21), or, for a
    record without that time, its CONNACK came within TAKEOVER_TOLERANCE_S of the close."""
    if o is c or getattr(o, "purpose", "") != "takeover" or o.started < c.started:
        return False
    requested = getattr(o, "requested", None)
    if requested is not None and requested <= closed:
        return True
    return o.started <= closed + TAKEOVER_TOLERANCE_S


# A partition service whose Redis was killed stops once it notices (on its next write to Redis,
# which may come after the fault healed: seed 4063, 12 s); its restart within this long of the
# heal is the fault's.
REDIS_RESTART_S = 60.0
# Connections of a killed node end when it dies; the client may notice a little later.
KILL_SLACK_S = 5.0
# A disconnect this long after a network fault healed still counts as the fault's.
AFTER_HEAL_S = 10.0
# A network fault lasting this long must see the majority side serve in its last part.
MAJORITY_SERVES_AFTER_S = 8.0
KILL_KINDS = ("kill-master", "kill-follower", "kill-majority")
# A node that leaves sends its clients elsewhere (DISCONNECT 0x9C/0x8B, or a close): G8's
# "no client error beyond the reconnect of a stopped node's own clients".
LEAVE_KINDS = ("leave-rejoin",)
NETWORK_KINDS = (
    "isolate",
    "halves",
    "ring",
    "cut-agreement",
    "one-way",
    "intra-node",
    "plain-cut",
)
# Faults that take a node's processes away (killed, stopped, left, its Redis killed).
DOWN_KINDS = (*KILL_KINDS, *LEAVE_KINDS, "pause", "redis-kill")
# G9: after a heal (a restart, a cut removed) links to the node are back within this long.
LINK_SLACK_S = 10.0
# G9: a subscriber connected through a heal has every message acknowledged before it within
# this long, counting only time in which its session's master was reachable from its node.
SILENT_BOUND_S = 20.0
# G9: after the final heal, every link up again within this long, and no live connection
# waiting for a master within SILENT_BOUND_S.
LINKS_CLEAR_S = 10.0
# G9: a link seen down at more than this many looks (0.5 s apart) after every link was first
# up again after the final heal flaps, or broke again.
DOWN_AGAIN_LOOKS = 6
# G9: a cut link shows in hexmq_links_down within about this long (keepalive 10 s + 5 s, or
# 5 s with data in flight, then the edge's one-second sweep); a warning where it did not.
LINK_SHOWN_S = 16.0
# The edge's --unreachable-disconnect default (3 x --failover-hold, at least 30 s).
UNREACHABLE_S = 30.0
# An unreachable-disconnect is accepted when the model below had the session's master
# unreachable from the node at some moment this close before the client saw the close, and
# for the bound, less this much, before (the edge counts from the sweep that saw the wait).
UNREACHABLE_END_TOLERANCE_S = 3.0
UNREACHABLE_START_TOLERANCE_S = 2.0
# MQTT 5.0 DISCONNECT 0x89 Server busy: the edge's end of a connection whose session's master
# stayed unreachable (services/edge/unreachable.py); its Reason String says which partition.
SERVER_BUSY = 0x89
_UNREACHABLE_REASON = re.compile(r"partition (\d+) of this session had no reachable master")


def node_of(endpoint: str) -> int:
    """'127.0.0.12:21884' -> 2 (node i binds 127.0.0.(10 + i), tests/faults/cluster.py)."""
    host = endpoint.rsplit(":", 1)[0]
    return int(host.rsplit(".", 1)[1]) - 10


def _cut_pairs(fault: dict[str, Any]) -> set[frozenset[int]]:
    t = fault["targets"]
    pairs = {frozenset(p) for p in t.get("one_way", [])}
    groups = t.get("groups", [])
    for i, left in enumerate(groups):
        for right in groups[i + 1 :]:
            pairs |= {frozenset((a, b)) for a in left for b in right}
    return pairs


def _plain_pairs(fault: dict[str, Any]) -> set[tuple[int, int]]:
    return {(a, b) for a, b in fault["targets"].get("plain", [])}


def plain_blocks(pairs: set[tuple[int, int]], src: int, dst: int) -> bool:
    """Whether plain `-s/-d` rules (node numbers, AGREEMENT, CLIENTS) stop a connection node
    `src` opens to a server of `dst` (tests/faults/netns.py, plain_cut_rules): its packets
    carry src's address (the source NAT), its server's replies reach INPUT addressed to
    127.0.0.1."""
    return (src, dst) in pairs or (dst, CLIENTS) in pairs


def _excused_overlap(
    first: int, second: int, at: float, until: float, faults: Sequence[dict[str, Any]]
) -> str:
    """Why two live connections of one client id, on nodes `first` (the older) and `second`,
    from `at` to `until` (seconds from t0), are no G5 failure ("" if they are one). A cut may
    keep a master from the old connection's edge, so that nothing can close it: until the
    heal, and after it until the links are back (G9: LINK_SLACK_S), when the edge re-attaches
    the connection and is told it was taken over; the overlap must have ended by then."""
    for f in faults:
        relinked = f["end"] + (LINK_SLACK_S if f["kind"] in NETWORK_KINDS else 0.0)
        if not f["start"] <= at <= relinked:
            continue
        if at > f["end"]:
            if until > relinked:
                continue
            after = (
                f" (begun {at - f['end']:.1f} s after its heal, ended within {LINK_SLACK_S:g} s)"
            )
        else:
            after = ""
        if f["kind"] in NETWORK_KINDS and frozenset((first, second)) in _cut_pairs(f):
            return f"n{first} and n{second} cut apart by fault {f['index']} ({f['kind']}){after}"
        hit = {first, second} & set(f["targets"]["nodes"])
        if f["kind"] == "plain-cut" and hit:
            return f"n{min(hit)} cut by plain rules, fault {f['index']}{after}"
        if f["kind"] == "intra-node" and hit:
            return f"n{min(hit)} cut from its own services by fault {f['index']}{after}"
        if f["kind"] == "pause" and {first, second} & set(f["targets"]["nodes"]):
            return f"paused by fault {f['index']}"
    return ""


def _refusal(
    conn: ConnectionRecord, publishers: dict[str, PublisherRecord], t0: float, hold: float
) -> bool:
    """A 3.1.1 publisher's connection closed as the refusal of a publish held past the hold."""
    pub = publishers.get(conn.client_id)
    if pub is None or getattr(pub, "version", 5) != 4 or conn.ended is None:
        return False
    where = f"{conn.host}:{conn.port}"
    via: dict[int, str] = getattr(pub, "sent_via", {})
    return any(
        via.get(n) == where
        and conn.started <= pub.sent_at.get(n, -1.0) <= conn.ended
        and conn.ended - pub.sent_at[n] >= hold - 1.0
        for n in pub.unanswered
    )


def restarts(
    records: Sequence[dict[str, Any]], faults: Sequence[dict[str, Any]]
) -> tuple[list[str], list[str]]:
    """The run's supervisor's restarts (runner.py, `_supervise`): (explained, unexplained).
    A partition service stops when it loses its Redis, so that it reloads on its restart, and
    may notice that only after a redis-kill of its node has healed: within REDIS_RESTART_S of
    such a fault, a restart is explained. Any other process that exited is a failure (it
    crashed, or stopped by itself, with no fault to explain it)."""
    explained, unexplained = [], []
    for r in records:
        what = f"n{r['node']}: {', '.join(r['exited'])} exited, started again at {r['at']:.1f} s"
        by = [
            f
            for f in faults
            if f["kind"] == "redis-kill"
            and r["node"] in f["targets"]["nodes"]
            and f["start"] <= r["at"] <= f["end"] + REDIS_RESTART_S
        ]
        if by and set(r["exited"]) <= {"partition", "redis"}:
            explained.append(f"{what} (its Redis killed by fault {by[0]['index']})")
        else:
            unexplained.append(f"{what}, no fault explains it")
    return explained, unexplained


def disconnects(
    connections: Sequence[ConnectionRecord],
    faults: Sequence[dict[str, Any]],
    publishers: dict[str, PublisherRecord],
    t0: float,
    hold: float,
    *,
    excused: Callable[[ConnectionRecord], bool] | None = None,
    takeover_attempts: Mapping[str, Sequence[float]] | None = None,
) -> list[dict[str, Any]]:
    """Server-side ends of connections that no kill, takeover or refusal explains (nor
    `excused`: the unreachable-disconnects the verdict accepts). `takeover_attempts`: per
    client id, when (seconds from t0) a takeover's CONNECT went out, accepted or not: the
    master may take the session over, and close the old connection, and the new one still
    fail to reach its client (refused as its edge gave up holding it, or unanswered within
    the client's timeout)."""
    attempts = takeover_attempts or {}
    by_client: dict[str, list[ConnectionRecord]] = {}
    for c in connections:
        by_client.setdefault(c.client_id, []).append(c)
    found = []
    for c in connections:
        if c.ended is None or c.cause not in ("server", "takeover"):
            continue
        if excused is not None and excused(c):
            continue
        ended = c.ended - t0
        node = node_of(f"{c.host}:{c.port}")
        if any(takes_over(o, c, c.ended) for o in by_client[c.client_id]):
            continue
        if any(c.started - t0 <= a <= ended for a in attempts.get(c.client_id, ())):
            continue
        if any(
            f["kind"] in (*KILL_KINDS, *LEAVE_KINDS)
            and node in f["targets"]["nodes"]
            and f["start"] - 0.5 <= ended <= f["end"] + KILL_SLACK_S
            for f in faults
        ):
            continue
        if _refusal(c, publishers, t0, hold):
            continue
        during = [
            f
            for f in faults
            if f["kind"] in NETWORK_KINDS and f["start"] <= ended <= f["end"] + AFTER_HEAL_S
        ]
        found.append(
            {
                "client_id": c.client_id,
                "node": f"n{node}",
                "started": round(c.started - t0, 3),
                "ended": round(ended, 3),
                "cause": c.cause,
                "reason": getattr(c, "reason", ""),
                "during_split": [f["index"] for f in during],
                # DISCONNECT 0x8E with no takeover of ours: another connection of the same
                # client id (an old one) took the session.
                "stale_takeover": c.cause == "takeover",
            }
        )
    return found


def majority_served(
    faults: Sequence[dict[str, Any]], publishers: Sequence[PublisherRecord], t0: float
) -> list[str]:
    """Network splits with a majority side that did not acknowledge anything sent through a
    majority node in the split's last part (G7: the majority side fails over and serves).

    Only splits that leave the agreement server with the majority: G7's majority is the side
    that holds the agreement quorum, as a Consul quorum placed with the nodes does. A lone
    agreement server on the minority side (half the `halves` faults) lets only that side
    change the view, and only once the majority's sessions lapse; those splits are judged by
    every other rule (nothing lost, no two masters, nobody disconnected)."""
    problems = []
    for f in faults:
        if f["kind"] not in ("isolate", "halves") or f["end"] - f["start"] < 10.0:
            continue
        minority = set(f["targets"]["minority"])
        if any(AGREEMENT in g and minority & set(g) for g in f["targets"]["groups"]):
            continue
        window = (f["start"] + MAJORITY_SERVES_AFTER_S, f["end"])
        sent = acked = 0
        for p in publishers:
            via: dict[int, str] = getattr(p, "sent_via", {})
            for n, at in p.sent_at.items():
                if n not in via or node_of(via[n]) in minority:
                    continue
                if window[0] <= at - t0 <= window[1]:
                    sent += 1
                    acked += n in p.acked
        if sent and not acked:
            problems.append(
                f"fault {f['index']} ({f['kind']}): nothing sent through the majority side in "
                f"{window[0]:.1f}-{window[1]:.1f} s was acknowledged ({sent} sent)"
            )
    return problems


def _view_blind(fault: dict[str, Any]) -> set[int]:
    """The nodes whose agent a fault cuts from the agreement server (or whose services from
    their agent): they keep the view they had when it started."""
    t, kind = fault["targets"], fault["kind"]
    blind: set[int] = set()
    groups = t.get("groups", [])
    if any(AGREEMENT in g for g in groups):
        blind |= {n for g in groups if AGREEMENT not in g for n in g}
    blind |= {n for pair in t.get("one_way", []) if AGREEMENT in pair for n in pair}
    if kind == "intra-node" and "membership" in t.get("own", []):
        blind |= set(t["nodes"])
    if kind == "plain-cut":
        pairs = _plain_pairs(fault)
        blind |= {n for n in t["nodes"] if plain_blocks(pairs, n, AGREEMENT)}
    return blind - {AGREEMENT}


class Reachability:
    """Whether the master of a partition was reachable from a node's edge at a moment, as far
    as the run's records tell: the master by the agreed views (`views.changes[].masters`, as
    the recorder saw them), and the faults: a master killed, paused, leaving or without its
    Redis; the edge's node paused; a cut between the two nodes (conntrack cuts, plain rules,
    the node's own edge cut from its own partition service); a node cut from the view that
    moved the partition's master; the master without the agreement server (an in-sync change
    waits for it). Each fault counts until LINK_SLACK_S after its heal (G9:
    links are back by then). A model, not the edge's own state: it judges the edge's claims
    (an unreachable-disconnect) and bounds how long a subscriber may wait (G9)."""

    def __init__(self, faults: Sequence[dict[str, Any]], changes: Sequence[dict[str, Any]]):
        self.faults = list(faults)
        known = [c for c in changes if c.get("masters") is not None]
        self._at = [float(c["at"]) for c in known]
        self._masters: list[list[str]] = [c["masters"] for c in known]
        self._blind = {f["index"]: _view_blind(f) for f in self.faults}

    @property
    def known(self) -> bool:
        return bool(self._masters)

    def master(self, partition: int, at: float) -> int | None:
        """The partition's master (node number) by the view in force at `at`; None: none."""
        i = max(bisect.bisect_right(self._at, at) - 1, 0)
        masters = self._masters[i]
        name = masters[partition] if partition < len(masters) else ""
        return int(name.removeprefix("n")) if name else None

    def why_not(self, node: int, partition: int, at: float, slack: float = LINK_SLACK_S) -> str:
        """Why node `node`'s edge could not reach the partition's master at `at` ("": it
        could, or the records cannot tell); a fault counts until `slack` after its heal."""
        if not self.known:
            return ""
        m = self.master(partition, at)
        if m is None:
            return "the view names no master"
        for f in self.faults:
            if not f["start"] <= at < f["end"] + slack:
                continue
            kind, t = f["kind"], f["targets"]
            nodes = set(t.get("nodes", []))
            label = f"fault {f['index']} ({kind})"
            if kind in DOWN_KINDS and m in nodes:
                return f"its master n{m} down: {label}"
            if kind == "pause" and node in nodes:
                return f"n{node} paused: {label}"
            if kind == "agreement-restart" or (kind == "cut-agreement" and m in nodes):
                # A master whose follower lags must take it out of the in-sync set through
                # the agreement store before it may answer writes (G1); until then the
                # partition waits (seed 4051: partition 28 for 35 s of an agreement restart).
                return f"its master n{m} without the agreement server: {label}"
            if kind not in NETWORK_KINDS:
                continue
            if node != m and frozenset((node, m)) in _cut_pairs(f):
                return f"n{node} cut from its master n{m}: {label}"
            if kind == "intra-node" and node == m in nodes and "partition" in t.get("own", []):
                return f"n{node}'s edge cut from its own partition service: {label}"
            if kind == "plain-cut" and plain_blocks(_plain_pairs(f), node, m):
                return f"plain rules between n{node} and its master n{m}: {label}"
            if node in self._blind[f["index"]] and self.master(partition, f["start"]) != m:
                return f"n{node} cut from the view that made n{m} its master: {label}"
        return ""

    def stretch(self, node: int, partition: int, at: float, step: float = 0.25) -> float:
        """How long the master had been unreachable without a break at the latest moment it
        was, within UNREACHABLE_END_TOLERANCE_S before `at`, counted to `at` (0: reachable
        all that while)."""
        t = at
        while t >= at - UNREACHABLE_END_TOLERANCE_S and not self.why_not(node, partition, t):
            t -= step
        if t < at - UNREACHABLE_END_TOLERANCE_S:
            return 0.0
        start = t
        while start - step >= 0 and self.why_not(node, partition, start - step):
            start -= step
        return at - start

    def deadline(
        self, node: int, partition: int, start: float, seconds: float, end: float
    ) -> float:
        """The moment `seconds` of reachable time have passed after `start` (at most `end`),
        each fault counting until its heal only (G9: links are back and the backlog delivered
        within `seconds` of a heal)."""
        t, reachable, step = start, 0.0, 0.25
        while reachable < seconds and t < end:
            if not self.why_not(node, partition, t, slack=0.0):
                reachable += step
            t += step
        return min(t, end)


def unreachable_ends(
    connections: Sequence[ConnectionRecord],
    reach: Reachability,
    t0: float,
    *,
    versions: Mapping[str, int],
    partition_of: Callable[[str], int],
    bound: float = UNREACHABLE_S,
) -> list[tuple[ConnectionRecord, dict[str, Any]]]:
    """Connections the edge ended because their session's master stayed unreachable past
    `--unreachable-disconnect` (5.0: DISCONNECT 0x89 with its Reason String; 3.1.1: a close,
    which says nothing, so every server close of a 3.1.1 client is a candidate), each judged:
    accepted when (and only when) the model had the session's partition without a master
    reachable from the connection's node for the bound before the close. A 3.1.1 close the
    model does not explain is left to the other rules (a kill, a refusal) and not listed."""
    found = []
    for c in connections:
        if c.ended is None or c.cause != "server":
            continue
        reason, code = getattr(c, "reason", ""), getattr(c, "code", 0)
        named = _UNREACHABLE_REASON.search(reason)
        if code == SERVER_BUSY and named:
            partition, how = int(named.group(1)), "DISCONNECT 0x89"
        elif versions.get(c.client_id) == 4 and not code:
            partition, how = partition_of(c.client_id), "closed (3.1.1)"
        else:
            continue
        node = node_of(f"{c.host}:{c.port}")
        ended = c.ended - t0
        unreachable = reach.stretch(node, partition, ended)
        accepted = unreachable >= bound - UNREACHABLE_START_TOLERANCE_S
        if not accepted and how != "DISCONNECT 0x89":
            continue
        found.append(
            (
                c,
                {
                    "client_id": c.client_id,
                    "node": f"n{node}",
                    "partition": partition,
                    "ended": round(ended, 3),
                    "how": how,
                    "reason": reason,
                    "unreachable_s": round(unreachable, 2),
                    "why": reach.why_not(node, partition, ended - UNREACHABLE_END_TOLERANCE_S)
                    or reach.why_not(node, partition, ended),
                    "accepted": accepted,
                },
            )
        )
    return found


@dataclass
class Arrivals:
    """What one subscriber received on the workload's topics: when each message first came,
    and every arrival's time (s after t0, sorted)."""

    client_id: str
    first: dict[str, float]
    times: list[float] = field(default_factory=list)


def nothing_silent(
    heals: Sequence[tuple[str, float]],
    subscribers: Sequence[Arrivals],
    connections: Sequence[ConnectionRecord],
    acked: Sequence[tuple[float, str]],
    reach: Reachability,
    *,
    partition_of: Callable[[str], int],
    t0: float,
    end: float,
    bound: float = SILENT_BOUND_S,
) -> dict[str, Any]:
    """G9 "nothing silent". After each heal (`heals`: label, s after t0), each subscriber
    connected then (a connection open at the heal) must have every message acknowledged
    before the heal (`acked`: ack time, payload) by its deadline: `bound` s after the heal,
    counting only time in which its session's master was reachable from its node
    (Reachability: a later fault that cuts its path again stops the clock). Or the server
    ended that connection before the deadline (a disconnect with a reason: it reconnects and
    the final check wants the messages then). A connection the run itself ended first (a move,
    a takeover) is not judged for that heal. One open at its deadline and still missing
    messages is silent. `end`: when the records stop (s after t0); a connection that had every
    message it was owed by then caught up, one that had not and whose deadline the end cut
    short is not judged."""
    acked = sorted(acked)
    ack_times = [a for a, _ in acked]
    by_client: dict[str, list[ConnectionRecord]] = {}
    for c in connections:
        by_client.setdefault(c.client_id, []).append(c)
    tally = {"judged": 0, "caught_up": 0, "owed_nothing": 0, "disconnected": 0, "moved": 0}
    silent: list[dict[str, Any]] = []
    longest: dict[str, Any] = {"seconds": 0.0}
    # Per heal: how many messages had been acknowledged, and what each subscriber connected
    # then was owed (acknowledged, not yet received) and by which node.
    per_heal: list[dict[str, Any]] = []
    for label, healed in heals:
        wanted = [m for _, m in acked[: bisect.bisect_right(ack_times, healed)]]
        owed_at: dict[str, str] = {}
        per_heal.append(
            {"heal": label, "at": round(healed, 2), "acknowledged": len(wanted), "owed": owed_at}
        )
        for sub in subscribers:
            live = [
                c
                for c in by_client.get(sub.client_id, [])
                if c.started - t0 <= healed and (c.ended is None or c.ended - t0 > healed)
            ]
            if not live:
                continue
            conn = max(live, key=lambda c: c.started)
            never = float("inf")
            owed = [m for m in wanted if sub.first.get(m, never) > healed]
            owed_at[sub.client_id] = f"{len(owed)} on n{node_of(f'{conn.host}:{conn.port}')}"
            if not owed:
                tally["owed_nothing"] += 1
                continue
            node = node_of(f"{conn.host}:{conn.port}")
            partition = partition_of(sub.client_id)
            deadline = reach.deadline(node, partition, healed, bound, end)
            closed = never if conn.ended is None else conn.ended - t0
            missing = [m for m in owed if sub.first.get(m, never) > min(deadline, closed)]
            if not missing:
                tally["judged"] += 1
                tally["caught_up"] += 1
                took = max(sub.first[m] for m in owed) - healed
                if took > longest["seconds"]:
                    longest = {"seconds": round(took, 2), "client_id": sub.client_id, "heal": label}
                continue
            if closed < deadline:
                ours = conn.cause in ("client", "takeover") or any(
                    takes_over(o, conn, closed + t0) for o in by_client[sub.client_id]
                )
                tally["moved" if ours else "disconnected"] += 1
                continue
            if deadline - healed < bound:
                continue  # the run ended first
            tally["judged"] += 1
            later = [sub.first[m] for m in missing if m in sub.first]
            received = bisect.bisect_right(sub.times, deadline) - bisect.bisect_right(
                sub.times, healed
            )
            silent.append(
                {
                    "client_id": sub.client_id,
                    "node": f"n{node}",
                    "partition": partition,
                    "heal": label,
                    "healed_at": round(healed, 2),
                    "deadline": round(deadline, 2),
                    "owed": len(owed),
                    "missing": len(missing),
                    "examples": missing[:5],
                    "received_in_between": received,
                    "arrived_later": len(later),
                    "last_arrived_at": round(max(later), 2) if later else None,
                    "connection": {
                        "started": round(conn.started - t0, 2),
                        "ended": None if conn.ended is None else round(closed, 2),
                    },
                }
            )
    return {
        "bound_s": bound,
        "heals": per_heal,
        **tally,
        "longest_catch_up": longest,
        "silent": silent,
    }


def judge(
    result: dict[str, Any],
    connections: Sequence[ConnectionRecord],
    publishers: Sequence[PublisherRecord],
    t0: float,
    hold: float,
    *,
    versions: Mapping[str, int] | None = None,
    unreachable_s: float = UNREACHABLE_S,
) -> dict[str, Any]:
    """`versions`: each client id's MQTT version (4: 3.1.1), for the 3.1.1 closes that may be
    unreachable-disconnects; `unreachable_s`: the edges' --unreachable-disconnect."""
    failures: list[str] = []
    warnings: list[str] = []
    counts = result["counts"]
    for key, what in (
        ("lost", "acknowledged message(s) lost"),
        ("unexpected", "message(s) nobody published"),
        ("duplicated_qos2", "QoS 2 duplicate(s)"),
        ("order_violations", "order violation(s)"),
    ):
        if counts[key]:
            failures.append(f"{counts[key]} {what}")
    group = result["shared_group"]
    failures += [
        f"shared group: {len(group[key])} {key.replace('_', ' ')}"
        for key in ("lost", "duplicates_qos2", "unexpected")
        if group[key]
    ]
    # A member's messages handed to another member when its connection ended arrive there
    # after that member's own later ones (MQTT 5.0 4.8.2 promises no order across members;
    # docs/architecture.md): as many late ones as were handed over are allowed, no more.
    late, handed = len(group["order_violations"]), group.get("handed_over", 0)
    if late > handed:
        failures.append(
            f"shared group: {late} order violations ({handed} messages handed between members)"
        )
    elif late:
        warnings.append(
            f"shared group: {late} message(s) out of order at a member, of {handed} handed "
            "over from a member whose connection ended"
        )
    if result["epoch_conflicts"]:
        failures.append(f"{len(result['epoch_conflicts'])} partition epoch(s) with two masters")
    if not result["convergence"]["converged"]:
        failures.append(f"not converged after the heal: {result['convergence']['reason']}")
    settled = result.get("settled")  # (results of runs before it have none)
    if settled is not None and not settled["converged"]:
        failures.append(
            f"not converged again before the replicas were compared: {settled['reason']}"
        )
    elif settled is not None and settled["view_epoch"] != result["convergence"]["view_epoch"]:
        warnings.append(
            f"the view moved on after convergence (view {result['convergence']['view_epoch']},"
            f" then {settled['view_epoch']} when the replicas were compared)"
        )
    diverged = result["divergence"]
    if diverged is None:
        failures.append("divergence not checked (no view)")
    elif diverged["differing"]:
        failures.append(f"{len(diverged['differing'])} replica(s) differ from their master")
    elif diverged["stale_copies"]:
        warnings.append(f"{len(diverged['stale_copies'])} copies left on non-replicas")
    if not result["retained"]["converged"]:
        failures.append("retained messages differ between nodes or are older than acknowledged")
    explained, unexplained = restarts(result.get("restarts", []), result["faults"])
    warnings += explained
    failures += unexplained
    if result["unreconnected"]:
        failures.append(f"subscribers that could not reconnect: {result['unreconnected']}")
    missing = [s for s in result["split_subscriptions"] if s["granted"] and not s["delivered"]]
    if missing:
        failures.append(f"{len(missing)} subscription(s) granted during a split are missing")
    faults = result["faults"]
    end = result["timing"]["end"] + t0
    g5 = []
    for o in overlaps(connections, end=end, tolerance=TAKEOVER_TOLERANCE_S):
        at = o.start - t0
        excuse = _excused_overlap(node_of(o.first), node_of(o.second), at, at + o.seconds, faults)
        g5.append(
            {
                "client_id": o.client_id,
                "first": o.first,
                "second": o.second,
                "at": round(at, 3),
                "seconds": round(o.seconds, 3),
                "excused": excuse,
            }
        )
    violations = [o for o in g5 if not o["excused"]]
    if violations:
        failures.append(f"{len(violations)} client id(s) with two live connections (G5)")
    by_id = {p.client_id: p for p in publishers}
    reach = Reachability(faults, result.get("views", {}).get("changes", []))
    partitions = int(result.get("config", {}).get("partitions", 32))
    ends = unreachable_ends(
        connections,
        reach,
        t0,
        versions=versions or {},
        partition_of=lambda cid: partition_of(cid, partitions),
        bound=unreachable_s,
    )
    accepted = {id(c) for c, e in ends if e["accepted"]}
    attempts: dict[str, list[float]] = {}
    for move in result.get("moves", []):
        if move["how"] == "takeover":
            attempts.setdefault(move["client_id"], []).append(move["at"])
    dropped = disconnects(
        connections,
        faults,
        by_id,
        t0,
        hold,
        excused=lambda c: id(c) in accepted,
        takeover_attempts=attempts,
    )
    rejected = {(e["client_id"], e["ended"]): e for _c, e in ends if not e["accepted"]}
    for d in dropped:
        if (d["client_id"], d["ended"]) in rejected:
            d["unreachable_s"] = rejected[(d["client_id"], d["ended"])]["unreachable_s"]
    g7 = [d for d in dropped if d["during_split"]]
    if g7:
        failures.append(f"{len(g7)} client(s) disconnected during a network split (G7)")
    if len(dropped) > len(g7):
        failures.append(f"{len(dropped) - len(g7)} client(s) disconnected unexpectedly")
    if rejected:
        failures.append(
            f"{len(rejected)} connection(s) ended as if their master were unreachable for "
            f"{unreachable_s:g} s, though it was reachable from their node for part of that "
            "time (G9)"
        )
    if accepted:
        warnings.append(
            f"{len(accepted)} connection(s) ended past --unreachable-disconnect "
            f"({unreachable_s:g} s): accepted, their session's partition had no master "
            "reachable from their node for that long (G9)"
        )
    failures += majority_served(faults, publishers, t0)
    silence = result.get("silence")
    if silence is not None and silence["silent"]:
        who = sorted({s["client_id"] for s in silence["silent"]})
        failures.append(
            f"{len(silence['silent'])} time(s) a subscriber stayed connected through a heal "
            f"and was still missing messages acknowledged before it {silence['bound_s']:g} s "
            f"later (G9: nothing silent): {', '.join(who)}"
        )
    failures += links_problems(result.get("links"))
    warnings += links_unshown(faults, result.get("links"))
    return {
        "ok": not failures,
        "failures": failures,
        "warnings": warnings,
        "g5_overlaps": g5,
        "unexpected_disconnects": dropped,
        "unreachable_disconnects": [e for _c, e in ends],
    }


def links_unshown(faults: Sequence[dict[str, Any]], links: dict[str, Any] | None) -> list[str]:
    """G9: network faults that lasted LINK_SHOWN_S or more (and cut a node's links, not just
    its agent's to the agreement server) during whose first LINK_SHOWN_S no service showed a
    link down to or at a node the fault targets."""
    if links is None:
        return []
    unshown = []
    for f in faults:
        if f["kind"] not in NETWORK_KINDS or f["kind"] == "cut-agreement":
            continue
        if f["end"] - f["start"] < LINK_SHOWN_S:
            continue
        hit = {f"n{n}" for n in f["targets"]["nodes"]}
        shown = any(
            f["start"] <= c["at"] <= f["start"] + LINK_SHOWN_S
            and (
                (c["node"] in hit and c["down"])
                or any(d.rsplit(" ", 1)[-1] in hit for d in c["down"])
            )
            for c in links.get("changes", [])
        )
        if not shown:
            unshown.append(
                f"fault {f['index']} ({f['kind']}): no link shown down within "
                f"{LINK_SHOWN_S:g} s (G9)"
            )
    return unshown


def links_problems(links: dict[str, Any] | None) -> list[str]:
    """G9 after the final heal: every link up again within LINKS_CLEAR_S (hexmq_links_down 0
    on every service of every node), no live connection waiting for a master within
    SILENT_BOUND_S (hexmq_sessions_waiting_for_master 0). None: not watched."""
    if links is None:
        return []
    problems = []
    clear = links.get("links_clear_s")
    if clear is None or clear > LINKS_CLEAR_S:
        last = {n: s.get("down") or s.get("unanswered") for n, s in links["last"].items()}
        shown = {n: d for n, d in last.items() if d}
        when = "never" if clear is None else f"only {clear:g} s"
        problems.append(
            f"links not all up {LINKS_CLEAR_S:g} s after the final heal ({when}; at the "
            f"last look: {shown or 'all up'}) (G9)"
        )
    again = {k: n for k, n in links.get("down_again", {}).items() if n > DOWN_AGAIN_LOOKS}
    if again:
        shown = ", ".join(f"{k} ({n} looks)" for k, n in sorted(again.items())[:5])
        problems.append(
            f"links down again after they were all up after the final heal: {shown} (G9)"
        )
    waiting = links.get("waiting_clear_s")
    if waiting is None or waiting > SILENT_BOUND_S:
        when = "never" if waiting is None else f"only {waiting:g} s"
        problems.append(
            f"connections still waiting for a master {SILENT_BOUND_S:g} s after the final heal "
            f"({when}) (G9)"
        )
    return problems
