"""One packet at a time: :func:`encode` (``hexmq.mqtt.encoder``) and :func:`decode`
(``hexmq.mqtt.decoder``), for callers that hold whole packets rather than a stream.

Topic *filters* are checked only for UTF-8 and emptiness by the decoder. Their wildcard grammar is
:func:`hexmq.topics.validate_topic_filter`'s, so the edge can refuse one filter with a SUBACK or
UNSUBACK reason code (0x8F, or 0x80 in 3.1.1) rather than lose the whole connection.
"""

from hexmq.mqtt.decoder import decode
from hexmq.mqtt.encoder import encode

__all__ = ["decode", "encode"]
