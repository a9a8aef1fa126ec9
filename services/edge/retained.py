"""Retained messages on SUBSCRIBE: which subscriptions get them, gathering them from every
partition node (a topic's retained message lives in partition(topic)), and turning them into
deliveries for the session."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import SubackReturnCode
from hexmq.topics import SHARED_PREFIX, topic_matches
from services.edge.pending_subscriptions import PendingSubscriptions, RetainedWatch
from services.edge.tickets import when_all_answered

if TYPE_CHECKING:
    from services.edge.links import PartitionLink

log = logging.getLogger(__name__)

OK = pb.StatusCode.STATUS_CODE_OK
# A SUBACK code from this up refused the subscription (5.0 and 3.1.1 alike).
FAILURE = SubackReturnCode.FAILURE


def wanted(
    specs: Sequence[pb.SubscriptionSpec], granted: Sequence[int], existed: Sequence[bool]
) -> list[tuple[pb.SubscriptionSpec, int]]:
    """(subscription, granted QoS) pairs that get retained messages now. Retain Handling: 0
    always, 1 only for a new subscription, 2 never (MQTT-3.3.1-10/11); refused ones never, nor
    shared subscriptions (retained messages go to new Non-shared Subscriptions only: MQTT 5.0
    3.3.1.3, 4.8.2)."""
    return [
        (spec, qos)
        for spec, qos, had in zip(specs, granted, existed, strict=False)
        if qos < SubackReturnCode.FAILURE
        and may_want(spec)
        and (spec.retain_handling == 0 or not had)
    ]


def may_want(spec: pb.SubscriptionSpec) -> bool:
    """Whether a subscription may get retained messages once granted (`wanted` decides)."""
    return spec.retain_handling != 2 and not spec.filter.startswith(SHARED_PREFIX)


def watch(
    pending: PendingSubscriptions, specs: Sequence[pb.SubscriptionSpec]
) -> RetainedWatch | None:
    """A SUBSCRIBE's watch of the retained messages routed before its own are gathered (see
    services/edge/pending_subscriptions.py); None when none of its subscriptions can get any."""
    filters = [spec.filter for spec in specs if may_want(spec)]
    return pending.watch_retained(filters) if filters else None


def gather(
    links: Sequence[PartitionLink],
    filters: Sequence[str],
    done: Callable[[list[cpb.Message]], None],
) -> None:
    """Ask every partition node for the retained messages matching `filters`; `done(found)`
    once all have answered (found may be empty). A node that cannot answer is logged and its
    messages are missed."""
    if not links:
        done([])
        return
    query = pb.RetainedQuery(filters=filters)

    def all_answered(answers: list[pb.Result]) -> None:
        done([m for result in answers if result.status == OK for m in result.retained])

    answered = when_all_answered(len(links), all_answered)

    def on_result(result: pb.Result) -> None:
        if result.status != OK:
            log.warning("retained messages unavailable: %s", result.message)
        answered(result)

    for link in links:
        link.request(pb.EdgeCommand(retained_query=query), on_result)


def deliveries(
    messages: Sequence[cpb.Message], wanted: Sequence[tuple[pb.SubscriptionSpec, int]]
) -> list[pb.QueuedMessage]:
    """One delivery per retained topic (in topic order) at the highest QoS any matching
    subscription allows (never above the message's), with every matching subscription id."""
    out = []
    for m in sorted(messages, key=lambda m: m.topic):
        qos = -1
        ids = []
        for spec, granted in wanted:
            if topic_matches(spec.filter, m.topic):
                qos = max(qos, min(m.qos, granted))
                if spec.subscription_id:
                    ids.append(spec.subscription_id)
        if qos >= 0:
            out.append(pb.QueuedMessage(qos=qos, message=m, subscription_ids=ids, retain=True))
    return out
