"""What a master tells of a follower's progress in bytes (FollowerStatus.bytes_left, for
`hexmq cluster status`): the log entries it lacks, or while it needs or takes a snapshot, the
partition's state not sent yet plus the log after the snapshot's position."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from hexmq.api.common.v1.common_pb2 import Message
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.replication import op_size
from services.partition.replication_status import (
    follower_status,
    in_sync_followers,
    lag,
    lag_by_follower,
)
from services.partition.server import state_bytes
from services.partition.sessions import Session
from services.partition.write_batch import WriteBatch
from tests.support.replication_sim import Script


def run(text: str) -> Script:
    script = Script()
    script.run_text(text)
    return script


def status(script: Script, master: str, follower: str, state: int = 0) -> tuple[str, int]:
    for st in follower_status(script.s.rep(master), 0, lambda: state):
        if st.node_id == follower:
            return st.state, st.bytes_left
    raise AssertionError(f"{follower} does not follow p0 on {master}")


def test_a_follower_catching_up_by_log_lacks_the_bytes_of_its_missing_entries() -> None:
    s = run(
        """nodes 2 partitions 1 rf 2
        deliver
        write n1 p0 a=1
        deliver
        pause n1 n2
        write n1 p0 bb=22
        write n1 p0 ccc=333 d=4
        """
    )
    op = len("hx:0:data") + 8  # key and overhead of each write (replication.op_size)
    missing = (op + len("bb22")) + (op + len("ccc333")) + (op + len("d4"))
    assert status(s, "n1", "n2") == ("live", missing)
    s.run_line("resume n1 n2")
    s.run_line("deliver")
    assert status(s, "n1", "n2") == ("live", 0)


def test_a_snapshot_lacks_the_state_not_sent_yet_and_the_log_after_it() -> None:
    s = run(
        """nodes 2 partitions 1 rf 2 log 1 chunk 1
        deliver
        write n1 p0 a=1
        deliver
        kill n2
        tick 2
        write n1 p0 b=2
        write n1 p0 c=3
        restart n2
        deliver n2 n1 1
        """
    )
    assert status(s, "n1", "n2", state=1000) == ("snapshot", 1000)  # nothing sent yet
    s.run_line("read n1")  # the first chunk: hx:0:data a=1
    sent = len("hx:0:data") + len("a1") + 8
    assert status(s, "n1", "n2", state=1000) == ("snapshot", 1000 - sent)
    s.run_line("write n1 p0 dd=44")  # after the snapshot's position: sent after its last chunk
    after = len("hx:0:data") + len("dd44") + 8
    assert status(s, "n1", "n2", state=1000) == ("snapshot", 1000 - sent + after)
    s.run_line("deliver")
    assert status(s, "n1", "n2", state=1000) == ("live", 0)


def test_the_followers_a_write_waits_for_and_their_lag() -> None:
    """replication_status's other readings (the append spans', the gauges'): the followers a
    write waits for, their lag in the partition, and per follower node."""
    s = run(
        """nodes 3 partitions 1 rf 3
        deliver
        write n1 p0 a=1
        deliver
        pause n1 n2
        write n1 p0 b=2
        write n1 p0 c=3
        deliver
        """
    )
    rep = s.s.rep("n1")
    waited_for = in_sync_followers(rep, 0)
    assert sorted(fp.node for fp in waited_for) == ["n2", "n3"]
    assert {fp.node: lag(rep, 0, fp) for fp in waited_for} == {"n2": 2, "n3": 0}
    assert lag_by_follower(rep) == {"n2": 2, "n3": 0}
    assert {st.node_id: st.lag for st in follower_status(rep, 0)} == {"n2": 2, "n3": 0}
    # A node that masters nothing waits for nobody.
    assert in_sync_followers(s.s.rep("n2"), 0) == []
    assert lag_by_follower(s.s.rep("n2")) == {}


def test_a_partitions_state_is_estimated_as_its_snapshot_would_measure_it() -> None:
    """server.state_bytes, from the master's memory, against the ops a snapshot of the same
    state carries (each op as the snapshot's reader makes it: an HSET per stored field)."""
    p = 3
    node = SimpleNamespace(retained={"r/1": (p, Message(topic="r/1", payload=b"x" * 40))})
    sessions = []
    batch = WriteBatch()
    for i in range(3):
        record = pb.SessionRecord(client_id=f"client-{i}", session_expiry_s=600)
        session = Session(p, record)
        spec = pb.SubscriptionSpec(filter=f"t/{i}/#", qos=1)
        session.subscriptions[spec.filter] = spec
        for mid in range(1, 5 + i):
            qm = pb.QueuedMessage(message_id=mid * 1000, qos=1)
            qm.message.topic = f"t/{i}/x"
            qm.message.payload = b"p" * 64
            session.queue[qm.message_id] = qm
            batch.put_message(p, record.client_id, qm)
        sessions.append(session)
        batch.put_session(p, record)
        batch.put_subscription(p, record.client_id, spec)
    batch.put_retained(p, node.retained["r/1"][1])
    snapshot = sum(op_size(op) for op in batch.ops[p])
    estimate = state_bytes(cast(Any, node), p, sessions)
    assert abs(estimate - snapshot) <= snapshot // 20, (estimate, snapshot)
