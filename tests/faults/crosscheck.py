"""The trace cross-check: the Spark job's audit of a traced fault run against what the
run's clients and view recorder saw. Pure over rows (dicts), so it is unit-tested on
hand-made ones; tests/faults/test_schedules.py feeds it the job's Parquet tables.

Messages are matched without payloads: a publisher sends one message at a time, so its
n-th `mqtt.publish` span (by time, per `hexmq.client_id_hash`) is its message n; subscribers
are matched by the hash of their client id. What must agree:

1. every publish a publisher made has exactly one trace (per publisher: spans == sent);
2. the (message, subscriber) pairs the job audits as delivered are exactly those the
   clients received;
3. nothing acknowledged is lost in the audit, and no QoS 2 delivery is duplicated there;
   every duplicate a client saw is a duplicated delivery in the audit;
4. every `partition.failover` span is a change of master the agreed views made (partition,
   epoch, old and new master), filed under the view epoch that made it; a change without a
   span is one whose new master never served (the partition moved again first);
5. the view changes the job reports as losing a node are those that removed it, and their
   first doubt lies between the start of the fault before them and their agreement.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

Row = Mapping[str, Any]
# A view change's loss detected before its fault began is no doubt of that fault; this much
# clock skew between the run's clock and the spans' is allowed.
SKEW_NS = 200_000_000


def _messages(
    sent: Mapping[str, int], messages: Sequence[Row], hash_of: Callable[[str], str]
) -> tuple[dict[str, tuple[str, int]], list[str]]:
    """trace id -> (publisher, counter), and disagreements of rule 1."""
    publishers = {hash_of(p): p for p in sent}
    counters: dict[str, int] = defaultdict(int)
    traces = {}
    for m in sorted(messages, key=lambda m: m["publish_ns"]):
        who = publishers.get(m["client_id_hash"])
        if who is None:
            continue
        counters[who] += 1
        traces[m["trace_id"]] = (who, counters[who])
    problems = [
        f"{who}: {counters[who]} publish spans for {count} messages sent"
        for who, count in sent.items()
        if counters[who] != count
    ]
    return traces, problems


def deliveries_agree(
    sent: Mapping[str, int],
    acked_counters: Mapping[str, Sequence[int]],
    received: Mapping[str, Sequence[str]],
    messages: Sequence[Row],
    deliveries: Sequence[Row],
    hash_of: Callable[[str], str],
) -> tuple[list[str], dict[str, int]]:
    """Rules 1-3 over what publishers sent and got acknowledged and what each subscriber
    received (payloads in order): (problems, counts)."""
    traces, problems = _messages(sent, messages, hash_of)
    subscribers = {hash_of(s): s for s in received}
    acked = {f"{who}:{n}" for who, ns in acked_counters.items() for n in ns}
    audited: set[tuple[str, str]] = set()
    duplicated: set[tuple[str, str]] = set()
    lost_acked = []
    qos2_duplicates = []
    for d in deliveries:
        if d["trace_id"] not in traces or d["subscriber_hash"] not in subscribers:
            continue
        who, n = traces[d["trace_id"]]
        pair = (subscribers[d["subscriber_hash"]], f"{who}:{n}")
        if d["delivered_ns"] is not None:
            audited.add(pair)
        if d["duplicated"]:
            duplicated.add(pair)
            if d["qos"] == 2:
                qos2_duplicates.append(pair)
        if d["lost"] and pair[1] in acked:
            lost_acked.append(pair)
    seen = {(sub, m) for sub, got in received.items() for m in got}
    seen_twice = {(sub, m) for sub, got in received.items() for m in got if list(got).count(m) > 1}
    missing_spans = sorted(seen - audited)
    not_seen = sorted(audited - seen)
    if missing_spans:
        problems.append(
            f"{len(missing_spans)} deliveries without a deliver span: {missing_spans[:5]}"
        )
    if not_seen:
        problems.append(f"{len(not_seen)} audited deliveries no client got: {not_seen[:5]}")
    if lost_acked:
        problems.append(f"the audit loses {len(lost_acked)} acknowledged: {lost_acked[:5]}")
    if qos2_duplicates:
        problems.append(
            f"the audit duplicates {len(qos2_duplicates)} at QoS 2: {qos2_duplicates[:5]}"
        )
    unaudited_dups = sorted(seen_twice - duplicated)
    if unaudited_dups:
        problems.append(f"duplicates the audit does not show: {unaudited_dups[:5]}")
    counts = {
        "publish_traces": len(traces),
        "delivered_audit": len(audited),
        "delivered_clients": len(seen),
        "duplicated_audit": len(duplicated),
        "duplicated_clients": len(seen_twice),
    }
    return problems, counts


def failovers_agree(
    changes: Sequence[Row], missed: Sequence[int], failovers: Sequence[Row]
) -> tuple[list[str], dict[str, int]]:
    """Rule 4, over the epochs the view recorder saw (the job also sees the final `down`)."""
    last = max((c["epoch"] for c in changes), default=0)
    moves = {
        (m["partition"], m["epoch"], m["from"], m["to"]): c["epoch"]
        for c in changes
        for m in c["moves"]
        if m["kind"] in ("failover", "handover", "restored")
    }
    problems = []
    spans = set()
    for f in failovers:
        if f["new_epoch"] > last:
            continue
        key = (f["partition"], f["new_epoch"], f["old_master"], f["new_master"])
        spans.add(key)
        if f["new_epoch"] in missed:
            # The recorder missed the view that made it (it saw the next one, whose diff
            # carries the change): the span serves that change, but where it is filed and
            # whether a later missed view superseded it cannot be checked.
            continue
        if key not in moves:
            problems.append(f"a failover span no view made: {key}")
        elif f["view_epoch"] != moves[key]:
            problems.append(
                f"failover {key} filed under view {f['view_epoch']}, made by {moves[key]}"
            )
    # Epochs at which each partition's master changed, to tell a superseded change.
    later: dict[int, list[int]] = defaultdict(list)
    for p, epoch, _old, _new in moves:
        later[p].append(epoch)
    unserved = [k for k in moves if k not in spans]
    never_superseded = [k for k in unserved if not any(e > k[1] for e in later[k[0]])]
    if never_superseded:
        problems.append(f"changes of master without a failover span: {never_superseded[:5]}")
    return problems, {
        "view_moves": len(moves),
        "failover_spans": len(spans),
        "moves_superseded_before_serving": len(unserved) - len(never_superseded),
    }


def losses_agree(result: Row, timeline: Sequence[Row]) -> tuple[list[str], dict[str, int]]:
    """Rule 5."""
    changes = result["views"]["changes"]
    last = max((c["epoch"] for c in changes), default=0)
    ours = {c["epoch"]: set(c["lost"]) for c in changes if c["lost"]}
    theirs = {
        t["view_epoch"]: set(t["node_lost"].split(","))
        for t in timeline
        if t["node_lost"] and t["view_epoch"] <= last
    }
    problems = []
    if ours != theirs:
        problems.append(f"nodes lost by view epoch: the views say {ours}, the job says {theirs}")
    t0 = int(result["t0_wall_ns"])
    by_epoch = {t["view_epoch"]: t for t in timeline}
    at = {c["epoch"]: c["at"] for c in changes}
    for epoch in ours:
        row = by_epoch.get(epoch)
        if row is None:
            continue
        seen_at = t0 + int(at[epoch] * 1e9)
        began = [f for f in result["faults"] if f["start"] * 1e9 + t0 - SKEW_NS <= seen_at]
        start = t0 + int(began[-1]["start"] * 1e9) if began else t0
        # The job's installation is the last agent's (one that was cut off installs late):
        # only the first doubt is bounded, by the fault and by the view being agreed.
        if not start - SKEW_NS <= row["detected_ns"] <= min(row["installed_ns"], seen_at + SKEW_NS):
            problems.append(
                f"view {epoch}: first doubt {(row['detected_ns'] - t0) / 1e9:.2f} s does not "
                f"fit the fault ({(start - t0) / 1e9:.2f} s) and the view ({at[epoch]:.2f} s)"
            )
    return problems, {"views_losing_a_node": len(ours)}


def run_crosscheck(run_dir: Path, hexmq: Path) -> dict[str, Any]:
    """Run the Spark job (`hexmq traces analyze`) over a traced run's trace files, read its
    tables and apply every rule; {"problems": [...], "counts": {...}}. Needs pyspark."""
    import json
    import subprocess

    from pyspark.sql import functions as F

    from hexmq.telemetry.names import client_id_hash
    from spark.hexmq_traces.job import build_session

    result = json.loads((run_dir / "result.json").read_text())
    seen = json.loads((run_dir / "deliveries.json").read_text())
    out = run_dir / "analysis"
    job = subprocess.run(
        [str(hexmq), "traces", "analyze", str(run_dir / "traces"), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if job.returncode != 0:
        return {"problems": [f"the Spark job failed: {job.stderr[-2000:]}"], "counts": {}}
    session = build_session(master="local[2]", shuffle_partitions=2)
    session.sparkContext.setLogLevel("ERROR")
    try:
        prefix = f"f/{result['tag']}/"
        messages = [
            r.asDict()
            for r in session.read.parquet(str(out / "messages"))
            .filter(F.col("topic").startswith(prefix))
            .select("trace_id", "client_id_hash", "publish_ns")
            .collect()
        ]
        traces = {m["trace_id"] for m in messages}
        deliveries = [
            r.asDict()
            for r in session.read.parquet(str(out / "deliveries"))
            .select("trace_id", "subscriber_hash", "delivered_ns", "lost", "duplicated", "qos")
            .collect()
            if r["trace_id"] in traces
        ]
        failovers = [
            r.asDict() for r in session.read.parquet(str(out / "partition_failovers")).collect()
        ]
        timeline = [
            r.asDict() for r in session.read.parquet(str(out / "failover_timeline")).collect()
        ]
    finally:
        session.stop()
    problems: list[str] = []
    counts: dict[str, int] = {}
    for found, numbers in (
        deliveries_agree(
            seen["sent"], seen["acked"], seen["received"], messages, deliveries, client_id_hash
        ),
        failovers_agree(result["views"]["changes"], result["views"]["missed"], failovers),
        losses_agree(result, timeline),
    ):
        problems += found
        counts.update(numbers)
    return {"problems": problems, "counts": counts}
