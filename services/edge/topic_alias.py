"""MQTT 5.0 Topic Aliases (3.3.2.3.4) of one connection, in both directions.

Inbound: the client names topics by the aliases it set (up to the Topic Alias Maximum we sent in
CONNACK); `InboundTopicAliases.resolve` puts the topic back. Outbound: the edge gives the topics of
the deliveries it sends an alias of its own (up to the client's Topic Alias Maximum, capped by
`--max-outbound-topic-aliases`); `OutboundTopicAliases.encode` produces the PUBLISH bytes. The two
maps are independent (3.3.2.3.4) and neither outlives its network connection (MQTT-3.3.2-7).
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable

from hexmq.mqtt import (
    NO_PROPERTIES,
    Packet,
    Properties,
    ProtocolError,
    Publish,
    TopicAliasInvalid,
)


class InboundTopicAliases:
    """The aliases a client has set on this connection: alias -> topic."""

    __slots__ = ("_topics", "maximum")

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self._topics: dict[int, str] = {}

    def resolve(self, packet: Publish) -> Publish:
        """`packet` (which carries a Topic Alias) with its topic filled in and the alias gone,
        after setting the mapping when it names a topic (MQTT-3.3.2-7..12). A bad alias raises
        the codec's error, so the edge ends the connection as for any bad packet."""
        alias = packet.properties.topic_alias
        assert alias is not None
        if not 0 < alias <= self.maximum:
            raise TopicAliasInvalid(f"topic alias {alias} outside 1..{self.maximum}")
        topic = packet.topic
        if topic:
            self._topics[alias] = topic
        else:
            known = self._topics.get(alias)
            if known is None:
                raise ProtocolError(f"topic alias {alias} has no topic yet")
            topic = known
        props = dataclasses.replace(packet.properties, topic_alias=None)
        return dataclasses.replace(packet, topic=topic, properties=props)


# Properties carrying only a Topic Alias, shared by every connection (frozen, so shareable):
# the common delivery has no other property, and then costs no Properties construction.
_ALIAS_ONLY: dict[int, Properties] = {}


def _with_alias(props: Properties, alias: int) -> Properties:
    if props is NO_PROPERTIES:
        only = _ALIAS_ONLY.get(alias)
        if only is None:
            only = _ALIAS_ONLY[alias] = Properties(topic_alias=alias)
        return only
    return dataclasses.replace(props, topic_alias=alias)


class OutboundTopicAliases:
    """The aliases this edge has given topics on one connection, least recently used first.

    Aliases 1..`maximum` are handed out in turn; once all are taken, a new topic takes over the
    least recently used one (sent with its full topic name, which remaps the alias at the
    client). A mapping is recorded only when the PUBLISH that sets it is sent, so a delivery
    discarded for the client's Maximum Packet Size leaves both sides' maps as they were.
    """

    __slots__ = ("_aliases", "maximum")

    def __init__(self, maximum: int) -> None:
        assert maximum > 0
        self.maximum = maximum
        self._aliases: OrderedDict[str, int] = OrderedDict()  # topic -> alias

    def encode(
        self,
        send: Callable[[Packet], bytes],
        topic: str,
        payload: bytes,
        qos: int,
        retain: bool,
        dup: bool,
        packet_id: int | None,
        props: Properties,
        limit: int,
    ) -> bytes:
        """The PUBLISH bytes of a delivery (made by `send`, the connection's codec, so they are
        the next bytes on the connection): an empty topic name and the alias when the client
        knows the topic's alias, else the full name with a new alias. `limit` is the client's
        Maximum Packet Size (0: none): past it the result goes unsent, so the mapping is only
        recorded within it; and if only the alias makes the packet too large, it goes without
        one (the caller discards whatever is still too large)."""
        aliases = self._aliases
        alias = aliases.get(topic)
        if alias is not None:
            # Known at the client: recency is ours alone, so it may change even if unsent.
            aliases.move_to_end(topic)
            data = send(
                Publish("", payload, qos, retain, dup, packet_id, _with_alias(props, alias))
            )
            if limit and len(data) > limit:
                return send(Publish(topic, payload, qos, retain, dup, packet_id, props))
            return data
        full = len(aliases) >= self.maximum
        # All taken: the least recently used alias is remapped (to a topic it has not been
        # used for, as every topic holds one alias).
        alias = next(iter(aliases.values())) if full else len(aliases) + 1
        data = send(Publish(topic, payload, qos, retain, dup, packet_id, _with_alias(props, alias)))
        if limit and len(data) > limit:
            return send(Publish(topic, payload, qos, retain, dup, packet_id, props))
        if full:
            aliases.popitem(last=False)
        aliases[topic] = alias
        return data


def outbound_aliases(client_maximum: int | None, server_cap: int) -> OutboundTopicAliases | None:
    """A connection's outbound aliases: none unless both the client (its CONNECT's Topic Alias
    Maximum) and the edge (`--max-outbound-topic-aliases`) allow some (MQTT-3.1.2-26, -27)."""
    maximum = min(client_maximum or 0, server_cap)
    return OutboundTopicAliases(maximum) if maximum > 0 else None
