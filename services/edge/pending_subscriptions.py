"""PendingSubscriptions: the SUBSCRIBEs and UNSUBSCRIBEs this edge has sent to their sessions'
partitions and not yet seen answered, as the edge's routing must know them.

One logical broker in time too: a PUBLISH that this edge receives after a SUBSCRIBE (from any
client on it) reaches that subscription if it matches, as on a single broker, even before the
session's partition has announced the filter to the edges' subscription index
(services/edge/subscription_index.py). The SUBSCRIBE went to the session's partition ahead of
the PUBLISH (services/edge/hold.py keeps each partition's commands in order, held or not), so it
is enough to route the PUBLISH to that partition too: its master applies the subscription
first, then matches the message against it, and answers the publisher only once both are
durable. When the partition answers the SUBSCRIBE, the index update it sent ahead of the answer
on the same link has been applied, and the pending entry goes. Across nodes nothing changes: a
subscription counts cluster-wide from its SUBACK (the partition's IndexBarrier).

An UNSUBSCRIBE needs nothing for ordinary filters: its partition applies it before any PUBLISH
routed there after it. A shared group is different: the publishing edge places each message at
one partition holding members, and a partition whose member is unsubscribing here may have
just lost its last one, so a message placed there would reach nobody. While such an
UNSUBSCRIBE is unanswered the partition is the group's last choice (services/edge/router.py).

Retained messages: a SUBSCRIBE's retained messages are gathered after its SUBACK
(services/edge/subscriptions.py), and a retained PUBLISH this edge routed after the SUBSCRIBE has
already reached the new subscription live. A RetainedWatch, kept from the SUBSCRIBE until the
gathered messages are queued, records every retained message this edge routes that matches the
subscription, so that the gathered copy of it is not sent a second time.

Pure: no asyncio, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from hexmq.api.common.v1 import common_pb2 as cpb
from hexmq.topics import SHARED_PREFIX, TopicTrie, topic_matches

# What tells one routed message from another: topic, publisher, when the edge took it, payload.
MessageKey = tuple[str, str, int, bytes]


def message_key(message: cpb.Message) -> MessageKey:
    return (message.topic, message.publisher_id, message.published_at_ms, message.payload)


@dataclass(eq=False, slots=True)
class RetainedWatch:
    """One SUBSCRIBE's filters that may get retained messages, and the retained messages this
    edge routed (so, to that subscription, live) since it arrived."""

    filters: tuple[str, ...]
    routed_live: set[MessageKey] = field(default_factory=set)

    def saw(self, message: cpb.Message) -> None:
        topic = message.topic
        if any(topic_matches(f, topic) for f in self.filters):
            self.routed_live.add(message_key(message))

    def not_sent_live(self, messages: Iterable[cpb.Message]) -> list[cpb.Message]:
        """The gathered retained messages that did not already reach the subscription live."""
        routed = self.routed_live
        if not routed:
            return list(messages)
        return [m for m in messages if message_key(m) not in routed]


class PendingSubscriptions:
    def __init__(self) -> None:
        # Filters being subscribed -> the partitions of the sessions subscribing (the trie's
        # value is unused), and how many unanswered SUBSCRIBEs put each pair there.
        self._subscribing: TopicTrie[int, None] = TopicTrie()
        self._subscribe_counts: dict[tuple[str, int], int] = {}
        # (shared filter, partition) of unanswered UNSUBSCRIBEs, counted.
        self._leaving: dict[tuple[str, int], int] = {}
        self._watches: list[RetainedWatch] = []

    def __bool__(self) -> bool:
        """Something is pending that routing must consider."""
        return bool(self._subscribe_counts or self._leaving)

    # ----- SUBSCRIBE ----------------------------------------------------------------------

    def subscribing(self, partition: int, filters: Iterable[str]) -> None:
        """A SUBSCRIBE of a session of `partition` for these (valid) filters was sent."""
        counts = self._subscribe_counts
        for filt in filters:
            key = (filt, partition)
            count = counts.get(key, 0)
            if not count:
                self._subscribing.add(filt, partition, None)
            counts[key] = count + 1

    def subscribed(self, partition: int, filters: Iterable[str]) -> None:
        """That SUBSCRIBE was answered (however: granted, refused, or never to be sent)."""
        counts = self._subscribe_counts
        for filt in filters:
            key = (filt, partition)
            count = counts.get(key, 0)
            if count > 1:
                counts[key] = count - 1
            elif count == 1:
                del counts[key]
                self._subscribing.remove(filt, partition)

    def matching(self, topic: str) -> Iterator[tuple[str, int]]:
        """(filter, partition) of every pending subscription matching `topic`."""
        if not self._subscribe_counts:
            return iter(())
        return ((filt, p) for filt, p, _ in self._subscribing.match(topic))

    # ----- UNSUBSCRIBE ----------------------------------------------------------------------

    def unsubscribing(self, partition: int, filters: Iterable[str]) -> list[str]:
        """An UNSUBSCRIBE of a session of `partition` was sent; returns the filters recorded
        (the shared ones: see the module docstring), for `unsubscribed`."""
        recorded = [f for f in filters if f.startswith(SHARED_PREFIX)]
        leaving = self._leaving
        for filt in recorded:
            key = (filt, partition)
            leaving[key] = leaving.get(key, 0) + 1
        return recorded

    def unsubscribed(self, partition: int, filters: Iterable[str]) -> None:
        leaving = self._leaving
        for filt in filters:
            key = (filt, partition)
            count = leaving.get(key, 0)
            if count > 1:
                leaving[key] = count - 1
            elif count == 1:
                del leaving[key]

    def leaving(self, group: str, partition: int) -> bool:
        """A member of the shared group in `partition` is unsubscribing through this edge."""
        return (group, partition) in self._leaving

    # ----- retained messages ---------------------------------------------------------------

    def watch_retained(self, filters: Iterable[str]) -> RetainedWatch:
        watch = RetainedWatch(tuple(filters))
        self._watches.append(watch)
        return watch

    def end_watch(self, watch: RetainedWatch) -> None:
        try:
            self._watches.remove(watch)
        except ValueError:
            pass  # ended already

    def routed_retained(self, message: cpb.Message) -> None:
        """This edge routed a retained message (RETAIN set): every watch it matches records it."""
        for watch in self._watches:
            watch.saw(message)

    @property
    def watches(self) -> int:
        return len(self._watches)
