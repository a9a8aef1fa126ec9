"""The partition's writes as storage ops, and how a batch of them becomes Redis commands.
Pure: ops are data (services/partition/replication.py: HSET/HDEL/DEL on one of the keys of
keys.py), and the commands go onto whatever takes them (a transaction, or a recording in tests).

A handler records its writes on the WriteBatch being gathered (`put_session`, `put_message`,
...); the group commit sequences each partition's ops of a batch as one log entry and has them
written with `apply_ops` and the partition's new position with `put_position` in one MULTI/EXEC;
followers apply the same ops to their own Redis the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from hexmq.api.common.v1 import common_pb2 as common_pb
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.partition.keys import (
    handoff_key,
    meta_key,
    qos2_inbound_key,
    qos2_seen_key,
    queue_key,
    retained_key,
    session_keys,
    sessions_key,
    subs_key,
)
from services.partition.replication import DEL, HDEL, HSET, History, Op, Position


class CommandSink(Protocol):
    """The three commands storage ops become: a transaction's (redis-py's Pipeline,
    services/partition/redis_tx.Transaction) or a test's recording."""

    def hset(self, name: str, *, mapping: dict[Any, Any]) -> object: ...

    def hdel(self, name: str, *keys: str | bytes) -> object: ...

    def delete(self, *names: str) -> object: ...


class WriteBatch:
    """The storage ops of the batch being gathered, per partition, in order."""

    __slots__ = ("ops", "origins", "size")

    def __init__(self) -> None:
        self.ops: dict[int, list[Op]] = {}
        # The origins of the QoS 1 publishes written, per partition (LogEntry.origins).
        self.origins: dict[int, list[bytes]] = {}
        self.size = 0

    def add_origin(self, p: int, origin: bytes) -> None:
        origins = self.origins.get(p)
        if origins is None:
            origins = self.origins[p] = []
        origins.append(origin)

    def add(self, p: int, op: Op) -> None:
        ops = self.ops.get(p)
        if ops is None:
            ops = self.ops[p] = []
        ops.append(op)
        self.size += 1

    # ----- the partition's state, as ops on its keys ---------------------------------------

    def put_session(self, p: int, record: pb.SessionRecord) -> None:
        self.add(p, (HSET, sessions_key(p), record.client_id.encode(), record.SerializeToString()))

    def delete_session(self, p: int, cid: str) -> None:
        self.add(p, (HDEL, sessions_key(p), cid.encode(), b""))
        for key in session_keys(p, cid):
            self.add(p, (DEL, key, b"", b""))

    def put_subscription(self, p: int, cid: str, spec: pb.SubscriptionSpec) -> None:
        self.add(p, (HSET, subs_key(p, cid), spec.filter.encode(), spec.SerializeToString()))

    def delete_subscriptions(self, p: int, cid: str, filters: Iterable[str]) -> None:
        key = subs_key(p, cid)
        for name in filters:
            self.add(p, (HDEL, key, name.encode(), b""))

    def put_message(self, p: int, cid: str, qm: pb.QueuedMessage) -> None:
        self.add(p, (HSET, queue_key(p, cid), b"%d" % qm.message_id, qm.SerializeToString()))

    def delete_messages(self, p: int, cid: str, message_ids: Iterable[int]) -> None:
        key = queue_key(p, cid)
        for mid in message_ids:
            self.add(p, (HDEL, key, b"%d" % mid, b""))

    def put_qos2_inbound(self, p: int, cid: str, packet_id: int, state: pb.Qos2Inbound) -> None:
        self.add(p, (HSET, qos2_inbound_key(p, cid), b"%d" % packet_id, state.SerializeToString()))

    def delete_qos2_inbound(self, p: int, cid: str, packet_id: int) -> None:
        self.add(p, (HDEL, qos2_inbound_key(p, cid), b"%d" % packet_id, b""))

    def put_qos2_seen(self, p: int, origin: bytes, stamp_ms: int) -> None:
        self.add(p, (HSET, qos2_seen_key(p), origin, b"%d" % stamp_ms))

    def delete_qos2_seen(self, p: int, origin: bytes) -> None:
        self.add(p, (HDEL, qos2_seen_key(p), origin, b""))

    def put_retained(self, p: int, msg: common_pb.Message) -> None:
        self.add(p, (HSET, retained_key(p), msg.topic.encode(), msg.SerializeToString()))

    def delete_retained(self, p: int, topic: str) -> None:
        self.add(p, (HDEL, retained_key(p), topic.encode(), b""))

    def put_handoff(self, p: int, handoff: pb.SharedHandoff) -> None:
        value = handoff.SerializeToString()
        self.add(p, (HSET, handoff_key(p), b"%d" % handoff.handoff_id, value))

    def delete_handoff(self, p: int, handoff_id: int) -> None:
        self.add(p, (HDEL, handoff_key(p), b"%d" % handoff_id, b""))


def apply_ops(pipe: CommandSink, ops: Sequence[Op]) -> None:
    """Queue storage ops on a Redis pipeline (the master's and the followers' one way), one
    command per key and run of one kind: the ops are taken key by key (in the order each key
    first appears, each key's own ops in their order: ops on different keys commute), and a
    run of HSETs or HDELs on one key becomes one command (a subscriber's queued messages in a
    batch, its acknowledgements, interleaved with other subscribers' in the batch). Fewer
    commands to encode and replies to read, same result."""
    by_key: dict[str, list[Op]] = {}
    for op in ops:
        same = by_key.get(op[1])
        if same is None:
            by_key[op[1]] = [op]
        else:
            same.append(op)
    for key, key_ops in by_key.items():
        i, n = 0, len(key_ops)
        while i < n:
            kind, _key, fld, value = key_ops[i]
            j = i + 1
            if kind == HSET:
                mapping = {fld: value}
                while j < n and key_ops[j][0] == HSET:
                    mapping[key_ops[j][2]] = key_ops[j][3]
                    j += 1
                pipe.hset(key, mapping=mapping)
            elif kind == HDEL:
                fields = [fld]
                while j < n and key_ops[j][0] == HDEL:
                    fields.append(key_ops[j][2])
                    j += 1
                pipe.hdel(key, *fields)
            elif kind == DEL:
                pipe.delete(key)
            else:
                raise ValueError(f"unknown storage op kind {kind}")
            i = j


def put_position(pipe: CommandSink, p: int, pos: Position, history: History | None = None) -> None:
    """The partition's replication position (and its epoch history, when it changed)."""
    fields: dict[str, object] = {"epoch": pos[0], "seq": pos[1]}
    if history is not None:
        fields["history"] = format_history(history)
    pipe.hset(meta_key(p), mapping=fields)


def format_history(history: History) -> str:
    """ "epoch:first_seq,..." oldest first, as hx:{p}:meta's history field holds it."""
    return ",".join(f"{epoch}:{seq}" for epoch, seq in history)


def parse_history(raw: bytes | str | None) -> History:
    if not raw:
        return ()
    text = raw.decode() if isinstance(raw, bytes) else raw
    pairs = []
    for item in text.split(","):
        epoch, _, seq = item.partition(":")
        pairs.append((int(epoch), int(seq)))
    return tuple(pairs)
