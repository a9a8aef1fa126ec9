"""Which subscriptions get retained messages, and as what deliveries (pure functions)."""

from __future__ import annotations

from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from services.edge import retained


def spec(f: str, rh: int = 0, sid: int = 0) -> pb.SubscriptionSpec:
    return pb.SubscriptionSpec(filter=f, retain_handling=rh, subscription_id=sid)


def test_retain_handling_and_refusals() -> None:
    specs = [spec("a", 0), spec("b", 1), spec("c", 1), spec("d", 2), spec("e", 0)]
    chosen = retained.wanted(specs, [1, 1, 1, 1, 0x80], [True, True, False, False, False])
    assert [(s.filter, q) for s, q in chosen] == [("a", 1), ("c", 1)]


def test_one_delivery_per_topic_at_the_best_allowed_qos() -> None:
    messages = [
        cpb.Message(topic="x/2", payload=b"2", qos=1),
        cpb.Message(topic="x/1", payload=b"1", qos=1),
        cpb.Message(topic="y", payload=b"y", qos=1),
    ]
    wanted = [(spec("x/+", sid=7), 0), (spec("x/1", sid=9), 1)]
    got = retained.deliveries(messages, wanted)
    assert [(d.message.topic, d.qos, list(d.subscription_ids), d.retain) for d in got] == [
        ("x/1", 1, [7, 9], True),
        ("x/2", 0, [7], True),
    ]
