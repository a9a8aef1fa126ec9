"""What the cluster does during and after a fault run, observed from outside.

- `EpochWatch`: every few hundred ms, each node's partition service says which partitions it
  masters and at which epoch (PartitionService.Status); two nodes claiming one partition at
  one epoch is a split brain (G7: no partition has two masters accepting writes in one epoch).
- `ViewRecorder`: every view the agreement server holds, as it changes (blocking queries on the
  view key), with what each change did: members lost and added, partitions whose master
  changed and how (failover: the old master left; handover: it stayed). The trace
  cross-check compares it with the Spark job's failover timeline.
- `wait_converged`: after the heal, until the agreed view has every node, every partition its
  RF replicas all in sync, every agent on that view, and every follower keeping up (publishers
  go on publishing meanwhile, so a follower is judged by what it has acknowledged of what its
  master had made durable at the check before, not by the entries in flight at one instant).
- `divergence`: then, per partition of the agreed table, every replica's Redis copy against
  its master's (as tests/integration/test_replication.py's assert_converged does), and copies
  left on nodes that are no replica.
- `handed_over`: how many messages of a shared group went from a member whose connection
  ended to another member (the log lines of the edges, which hand them to other partitions,
  and of the partition services, which give them to a member in the same partition): each
  may reach its new member after that member's own later messages (docs/architecture.md,
  "Shared subscriptions").
"""

from __future__ import annotations

import re
import threading
import time
import urllib.error
import urllib.request
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.partition.v1 import partition_pb2 as ppb
from hexmq_cli import linkstatus
from services.membership.plan import failover_records
from tests.faults.cluster import FaultCluster


class EpochWatch:
    def __init__(self, cluster: FaultCluster, interval: float = 0.3) -> None:
        self.cluster = cluster
        self.interval = interval
        # (partition, epoch) -> nodes seen mastering it; and when first seen per node
        self.claims: dict[tuple[int, int], dict[int, float]] = defaultdict(dict)
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="epoch-watch", daemon=True)
        self._pool = ThreadPoolExecutor(max_workers=len(cluster.nodes) or 1)
        self.t0 = time.monotonic()

    def start(self, t0: float) -> None:
        self.t0 = t0
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _poll(self, node: int) -> None:
        reply = self.cluster.partition_status(node, timeout=0.5)
        if reply is None:
            return
        now = time.monotonic() - self.t0
        for ps in reply.partitions:
            if ps.role == "master":
                self.claims[(ps.partition, ps.epoch)].setdefault(node, now)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            futures = [self._pool.submit(self._poll, n) for n in self.cluster.nodes]
            for f in futures:
                try:
                    f.result(timeout=5)
                except Exception:  # a node that does not answer is simply not seen
                    pass
            self.polls += 1

    def conflicts(self) -> list[dict[str, Any]]:
        return [
            {
                "partition": p,
                "epoch": e,
                "masters": {f"n{n}": round(t, 3) for n, t in nodes.items()},
            }
            for (p, e), nodes in sorted(self.claims.items())
            if len(nodes) > 1
        ]


def view_change(old: mpb.View | None, new: mpb.View) -> dict[str, Any]:
    """What one view change did: members lost and added, and the partitions that changed
    hands (the agents' own records, services/membership/plan.py: failover, handover, offline,
    restored)."""
    before = {m.node_id for m in old.members} if old else set()
    after = {m.node_id for m in new.members}
    records = failover_records(old, new, 0) if old is not None else []
    return {
        "epoch": new.epoch,
        "members": sorted(after),
        "lost": sorted(before - after),
        "added": sorted(after - before) if old else [],
        # Per partition, the master an edge routes it to by this view ("": none, its first
        # replica is no member): what the verdict's reachability of masters starts from.
        "masters": [view_master(pa, after) for pa in new.partitions],
        "moves": [
            {
                "partition": r.partition,
                "from": r.from_node,
                "to": r.to_node,
                "epoch": r.epoch,
                "kind": r.kind,
            }
            for r in records
        ],
    }


def view_master(pa: mpb.PartitionAssignment, members: set[str]) -> str:
    """The master of a partition by the view, as an edge's route table takes it (its first
    replica, when that is a member; services/edge/route_table.py), else ""."""
    return pa.replicas[0] if pa.replicas and pa.replicas[0] in members else ""


class ViewRecorder:
    """Follows the view key with blocking queries; each new epoch with when it was seen (s
    after t0). Epochs the recorder never saw (two changes between two of its reads, or the
    agreement server down) are listed in `missed`."""

    def __init__(self, cluster: FaultCluster) -> None:
        self.cluster = cluster
        self.changes: list[dict[str, Any]] = []
        self.missed: list[int] = []
        self._last: mpb.View | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="view-recorder", daemon=True)
        self.t0 = time.monotonic()

    def start(self, t0: float) -> None:
        self.t0 = t0
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _run(self) -> None:
        index = 0
        path = f"/v1/kv/hexmq/{self.cluster.cluster_name}/view"
        while not self._stop.is_set():
            request = self.cluster.agreement_request(f"{path}?raw&index={index}&wait=2s")
            try:
                with urllib.request.urlopen(request, timeout=5) as r:
                    index = int(r.headers.get("X-Consul-Index", index))
                    view = mpb.View.FromString(r.read())
            except (urllib.error.URLError, OSError, ValueError):
                index = 0
                self._stop.wait(0.2)
                continue
            self._seen(view)

    def _seen(self, view: mpb.View) -> None:
        last = self._last
        if last is not None and view.epoch <= last.epoch:
            return
        if last is not None and view.epoch > last.epoch + 1:
            self.missed += list(range(last.epoch + 1, view.epoch))
        change = view_change(last, view)
        change["at"] = round(time.monotonic() - self.t0, 3)
        self.changes.append(change)
        self._last = view


# The metrics the link watch reads (hexmq_cli/linkstatus.py parses them).
LINK_METRICS = (
    "hexmq_links_down",
    "hexmq_sessions_waiting_for_master",
    "hexmq_unreachable_disconnects_total",
)


def read_links(host: str, ports: dict[str, int], timeout: float) -> dict[str, Any]:
    """One node's links as its services' metrics show them: `down` ("<service> <link>
    <peer>" per link down), `waiting` (the edge's live connections waiting for a master),
    `ended` (connections its edge ended past --unreachable-disconnect), `unanswered`
    (services whose metrics did not answer). Only the lines of LINK_METRICS are parsed."""
    found: dict[str, Any] = {"down": [], "waiting": 0, "ended": 0, "unanswered": []}
    for service, port in sorted(ports.items()):
        try:
            with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as r:
                text = r.read().decode()
        except (urllib.error.URLError, OSError, ValueError):
            found["unanswered"].append(service)
            continue
        kept = "\n".join(line for line in text.splitlines() if line.startswith(LINK_METRICS))
        links = linkstatus.parse(kept + "\n")
        found["down"] += [f"{service} {d['link']} {d['peer']}" for d in links["down"]]
        if service == "edge":
            found["waiting"] = links.get("sessions_waiting_for_master", 0)
            found["ended"] = links.get("unreachable_disconnects", 0)
    found["down"].sort()
    return found


class LinkWatch:
    """G9: a link that is down shows in the metrics within seconds, and every link is up
    again soon after the heal. Every `interval` s each node's services say which of their
    cluster links are down (`hexmq_links_down`) and how many of the edge's connections wait
    for a master; each change per node is recorded (`changes`, s after t0). After the final
    heal (`final_heal`), it polls faster and notes when every node first showed no link down
    (`links_clear_at`) and no connection waiting (`waiting_clear_at`)."""

    def __init__(self, cluster: FaultCluster, interval: float = 1.0) -> None:
        self.cluster = cluster
        self.interval = interval
        self.changes: list[dict[str, Any]] = []
        self.links_clear_at: float | None = None
        self.waiting_clear_at: float | None = None
        # After the links first cleared: per "<node> <service> <link> <peer>", the looks at
        # which it was down again (a link that flaps, or breaks again, after the heal).
        self.down_again: dict[str, int] = {}
        self.healed_at: float | None = None
        self._last: dict[int, tuple[Any, ...]] = {}
        self._latest: dict[int, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="link-watch", daemon=True)
        self._pool = ThreadPoolExecutor(max_workers=max(len(cluster.nodes), 1) + 1)
        self.t0 = time.monotonic()

    def start(self, t0: float) -> None:
        self.t0 = t0
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def final_heal(self, at: float) -> None:
        """Everything was healed at `at` (s after t0): from now on, watch for the clear."""
        self.healed_at = at

    def wait_clear(self, within: float) -> None:
        """Until the links and the waits have both cleared, or `within` s after the final heal:
        a run that ends sooner (its clients drained at once) would judge a wait that had not
        had its time as one that never cleared (seed 4027: a connection waiting for a master
        for the 6 s the run lasted after the heal, judged "never" against a 20 s bound)."""
        assert self.healed_at is not None
        deadline = self.t0 + self.healed_at + within
        while self.links_clear_at is None or self.waiting_clear_at is None:
            left = deadline - time.monotonic()
            if left <= 0 or not self._thread.is_alive():
                return
            self._stop.wait(min(left, 0.25))

    def _poll(self, node: int) -> dict[str, Any] | None:
        info = self.cluster.nodes.get(node)
        if info is None or not info.metrics_ports:
            return None
        return read_links(info.host, info.metrics_ports, timeout=1.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            nodes = list(self.cluster.nodes)
            futures = {n: self._pool.submit(self._poll, n) for n in nodes}
            now = started - self.t0
            seen: dict[int, dict[str, Any]] = {}
            for node, f in futures.items():
                try:
                    links = f.result(timeout=5)
                except Exception:  # a node that does not answer is simply not seen
                    links = None
                if links is not None:
                    seen[node] = links
                    self._record(node, links, now)
            self._latest = seen
            healed = self.healed_at
            if healed is not None and now >= healed:
                self.seen_after_heal(now, len(nodes), seen)
            pause = 0.5 if healed is not None else self.interval
            self._stop.wait(max(0.0, pause - (time.monotonic() - started)))

    def seen_after_heal(self, now: float, nodes: int, seen: dict[int, dict[str, Any]]) -> None:
        """One poll after the final heal: the first at which every node's services all
        answered and showed no link down (no connection waiting) is when the links (the
        waits) cleared."""
        if self.links_clear_at is not None:
            for node, links in seen.items():
                for link in links["down"]:
                    key = f"n{node} {link}"
                    self.down_again[key] = self.down_again.get(key, 0) + 1
        if len(seen) < nodes or any(s["unanswered"] for s in seen.values()):
            return
        if self.links_clear_at is None and not any(s["down"] for s in seen.values()):
            self.links_clear_at = now
        if self.waiting_clear_at is None and not any(s["waiting"] for s in seen.values()):
            self.waiting_clear_at = now

    def _record(self, node: int, links: dict[str, Any], now: float) -> None:
        key = (tuple(links["down"]), links["waiting"], tuple(links["unanswered"]))
        if self._last.get(node) == key:
            return
        self._last[node] = key
        self.changes.append({"at": round(now, 2), "node": f"n{node}", **links})

    def latest(self) -> dict[str, Any]:
        """What each node showed at the last poll."""
        return {f"n{n}": links for n, links in sorted(self._latest.items())}

    def to_json(self) -> dict[str, Any]:
        healed = self.healed_at

        def after(at: float | None) -> float | None:
            return None if at is None or healed is None else round(at - healed, 2)

        return {
            "healed_at": healed,
            "links_clear_s": after(self.links_clear_at),
            "waiting_clear_s": after(self.waiting_clear_at),
            "down_again": dict(sorted(self.down_again.items())),
            "last": self.latest(),
            "changes": self.changes,
        }


@dataclass
class Convergence:
    converged: bool
    seconds: float
    reason: str = ""
    view_epoch: int = 0


def _view_problem(view: mpb.View | None, nodes: int, rf: int) -> str:
    if view is None:
        return "no view (the agreement server does not answer)"
    members = sorted(m.node_id for m in view.members)
    wanted = [f"n{i}" for i in range(1, nodes + 1)]
    if members != wanted:
        return f"view {view.epoch} has members {members}"
    for pa in view.partitions:
        if len(pa.replicas) != rf:
            return f"partition {pa.partition} has replicas {list(pa.replicas)}"
        if sorted(pa.in_sync) != sorted(pa.replicas):
            return f"partition {pa.partition} in sync {list(pa.in_sync)} of {list(pa.replicas)}"
        if pa.handover_to:
            return f"partition {pa.partition} moving to {pa.handover_to}"
    return ""


# What each master had made durable at a check: (partition, epoch, master) -> sequence.
Durable = dict[tuple[int, int, str], int]


def wait_converged(
    cluster: FaultCluster, rf: int, timeout: float, tick: Callable[[], None] | None = None
) -> Convergence:
    """`tick`: called between looks (the run's supervisor)."""
    start = time.monotonic()
    reason = "not checked"
    epoch = 0
    before: Durable = {}
    while time.monotonic() - start < timeout:
        view = cluster.stored_view()
        reason = _view_problem(view, len(cluster.nodes), rf)
        if not reason and view is not None:
            epoch = view.epoch
            reason = _agents_problem(cluster, view)
            if not reason:
                reason, before = _partitions_problem(view, cluster.all_status(), before)
            if not reason:
                return Convergence(True, time.monotonic() - start, "", epoch)
        if tick is not None:
            tick()
        time.sleep(0.5)
    return Convergence(False, time.monotonic() - start, reason, epoch)


def _agents_problem(cluster: FaultCluster, view: mpb.View) -> str:
    for node in cluster.nodes:
        seen = cluster.node_view(node)
        if seen is None or seen.epoch != view.epoch:
            return f"n{node}'s agent is on view {seen.epoch if seen else None}, not {view.epoch}"
    return ""


def _partitions_problem(
    view: mpb.View, replies: dict[int, ppb.StatusReply | None], before: Durable
) -> tuple[str, Durable]:
    """Whether every partition service masters exactly what the view says, and every follower
    is in sync and keeping up; with what each master has made durable now, for the next check.

    Keeping up: no entry in flight (lag 0), or everything its master had made durable at the
    check before acknowledged. Publishers go on publishing while this is checked, so on a
    loaded machine a healthy follower is often an entry or a few short at any one instant, and
    every busy partition at lag 0 at once may never be seen (seed 2001); one that stops
    acknowledging, or falls further behind, still fails.
    """
    masters = {pa.partition: (pa.replicas[0], pa.epoch) for pa in view.partitions}
    now: Durable = {}
    for node, reply in replies.items():
        for ps in reply.partitions if reply is not None else ():
            if ps.role == "master":
                now[(ps.partition, ps.epoch, f"n{node}")] = ps.sequence
    for node, reply in replies.items():
        if reply is None:
            return f"n{node}'s partition service does not answer", now
        for ps in reply.partitions:
            master, epoch = masters[ps.partition]
            if ps.role != "master":
                continue
            if master != f"n{node}" or ps.epoch != epoch:
                return f"n{node} masters p{ps.partition} at {ps.epoch} (view: {master})", now
            earlier = before.get((ps.partition, ps.epoch, master))
            behind = [
                f
                for f in ps.followers
                if not f.in_sync or (f.lag and (earlier is None or f.acknowledged < earlier))
            ]
            if behind:
                how = ", ".join(
                    f"{f.node_id} {'in sync' if f.in_sync else 'not in sync'}, {f.state},"
                    f" acknowledged {f.acknowledged} of {ps.sequence}"
                    for f in behind
                )
                since = f"; {earlier} at the check before" if earlier is not None else ""
                names = [f.node_id for f in behind]
                return f"p{ps.partition}: followers {names} behind n{node} ({how}{since})", now
    return "", now


@dataclass
class Divergence:
    checked: int = 0  # partitions compared
    differing: list[dict[str, Any]] = field(default_factory=list)
    stale_copies: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "partitions_checked": self.checked,
            "differing": self.differing,
            "stale_copies": self.stale_copies,
        }


def _differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    keys = sorted(set(a) | set(b))
    return [k for k in keys if _comparable(k, a.get(k)) != _comparable(k, b.get(k))]


def _comparable(key: str, value: Any) -> Any:
    """A key's contents as replicas must agree on them. The replication position (hx:P:meta)
    carries the epoch history, in which an epoch whose master wrote nothing may appear on
    one replica and not on another (a follower that took a snapshot during that epoch stores
    the master's history with it); such an empty epoch holds no entry, so it is left out."""
    if not key.endswith(":meta") or not isinstance(value, dict):
        return value
    history = value.get(b"history")
    if history is None:
        return value
    seq = int(value.get(b"seq", 0))
    pairs = [tuple(int(x) for x in item.split(b":")) for item in history.split(b",") if item]
    kept = [
        (epoch, start)
        for i, (epoch, start) in enumerate(pairs)
        if start <= (pairs[i + 1][1] - 1 if i + 1 < len(pairs) else seq)
    ]
    return {**value, b"history": kept}


def divergence(cluster: FaultCluster, attempts: int = 3, pause: float = 1.0) -> Divergence | None:
    """Compare every replica's copy of every partition with its master's, at the view the
    agreement server holds (None: it does not answer). A difference must persist over
    `attempts` looks `pause` seconds apart (writes of the drain may still be on their way to a
    follower), and each look reads the view again: a view that changed meanwhile moved
    replicas, and a copy compared at the view before would be a node's stale copy counted
    as a diverged replica (seed 4098: a node reported silent after convergence, then its
    rejoin's rebalance handed partitions over while they were compared)."""
    result = None
    for attempt in range(attempts):
        view = cluster.stored_view()
        if view is None:
            return result
        result = _compare(cluster, view)
        if not result.differing:
            return result
        if attempt < attempts - 1:
            time.sleep(pause)
    return result


def _compare(cluster: FaultCluster, view: mpb.View) -> Divergence:
    result = Divergence()
    for pa in view.partitions:
        replicas = [cluster.node_number(r) for r in pa.replicas]
        others = [n for n in cluster.nodes if n not in replicas]
        result.checked += 1
        master = cluster.redis_dump(replicas[0], pa.partition)
        for follower in replicas[1:]:
            keys = _differences(master, cluster.redis_dump(follower, pa.partition))
            if keys:
                result.differing.append(
                    {"partition": pa.partition, "node": f"n{follower}", "keys": keys[:8]}
                )
        for node in others:
            left = cluster.redis_dump(node, pa.partition)
            if left:
                result.stale_copies.append(
                    {"partition": pa.partition, "node": f"n{node}", "keys": sorted(left)[:8]}
                )
    return result


_HANDOFF = re.compile(r"handing (\d+) messages of shared group (\S+) over from ")


def handed_over(cluster_dir: Path, share: str) -> int:
    """Messages of `share` (e.g. $share/g/f/<tag>/#) handed over between members, from every
    node's edge and partition logs (services/edge/handoff.py, services/partition/redelivery.py)."""
    total = 0
    logs = [*cluster_dir.glob("node*/edge.log"), *cluster_dir.glob("node*/partition.log")]
    for log in sorted(logs):
        for line in log.read_text(errors="replace").splitlines():
            m = _HANDOFF.search(line)
            if m and m.group(2) == share:
                total += int(m.group(1))
    return total
