"""MQTT 5.0 Topic Aliases (3.3.2.3.4) of one connection.

Inbound: the client names topics by the aliases it set (up to the Topic Alias Maximum we sent in
CONNACK); `InboundTopicAliases.resolve` puts the topic back. The map does not outlive its
network connection (MQTT-3.3.2-7).
"""

from __future__ import annotations

import dataclasses

from hexmq.mqtt import ProtocolError, Publish, TopicAliasInvalid


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
