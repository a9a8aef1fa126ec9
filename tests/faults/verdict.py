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

from collections.abc import Sequence
from typing import Any

from tests.faults.nemesis import AGREEMENT
from tests.support.checker import ConnectionRecord, PublisherRecord, overlaps

# A takeover's close reaches the old client a moment after the new one's CONNACK.
TAKEOVER_TOLERANCE_S = 1.0
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
NETWORK_KINDS = ("isolate", "halves", "ring", "cut-agreement", "one-way")


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


def _excused_overlap(first: int, second: int, at: float, faults: Sequence[dict[str, Any]]) -> str:
    for f in faults:
        if not f["start"] <= at <= f["end"]:
            continue
        if f["kind"] in NETWORK_KINDS and frozenset((first, second)) in _cut_pairs(f):
            return f"n{first} and n{second} cut apart by fault {f['index']} ({f['kind']})"
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


def disconnects(
    connections: Sequence[ConnectionRecord],
    faults: Sequence[dict[str, Any]],
    publishers: dict[str, PublisherRecord],
    t0: float,
    hold: float,
) -> list[dict[str, Any]]:
    """Server-side ends of connections that no kill, takeover or refusal explains."""
    by_client: dict[str, list[ConnectionRecord]] = {}
    for c in connections:
        by_client.setdefault(c.client_id, []).append(c)
    found = []
    for c in connections:
        if c.ended is None or c.cause not in ("server", "takeover"):
            continue
        ended = c.ended - t0
        node = node_of(f"{c.host}:{c.port}")
        taken_over = [
            o
            for o in by_client[c.client_id]
            if o is not c
            and getattr(o, "purpose", "") == "takeover"
            and c.started <= o.started <= c.ended + TAKEOVER_TOLERANCE_S
        ]
        if taken_over:
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


def judge(
    result: dict[str, Any],
    connections: Sequence[ConnectionRecord],
    publishers: Sequence[PublisherRecord],
    t0: float,
    hold: float,
) -> dict[str, Any]:
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
    diverged = result["divergence"]
    if diverged is None:
        failures.append("divergence not checked (no view)")
    elif diverged["differing"]:
        failures.append(f"{len(diverged['differing'])} replica(s) differ from their master")
    elif diverged["stale_copies"]:
        warnings.append(f"{len(diverged['stale_copies'])} copies left on non-replicas")
    if not result["retained"]["converged"]:
        failures.append("retained messages differ between nodes or are older than acknowledged")
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
        excuse = _excused_overlap(node_of(o.first), node_of(o.second), at, faults)
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
    dropped = disconnects(connections, faults, by_id, t0, hold)
    g7 = [d for d in dropped if d["during_split"]]
    if g7:
        failures.append(f"{len(g7)} client(s) disconnected during a network split (G7)")
    if len(dropped) > len(g7):
        failures.append(f"{len(dropped) - len(g7)} client(s) disconnected unexpectedly")
    failures += majority_served(faults, publishers, t0)
    return {
        "ok": not failures,
        "failures": failures,
        "warnings": warnings,
        "g5_overlaps": g5,
        "unexpected_disconnects": dropped,
    }
