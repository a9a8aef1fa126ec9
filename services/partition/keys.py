"""The partition's Redis layout: the key of each kind of state (p = partition number,
cid = client id). Pure: names only, no Redis.

    hx:{p}:sessions      hash  cid -> SessionRecord
    hx:{p}:subs:{cid}    hash  topic filter -> SubscriptionSpec
    hx:{p}:q:{cid}       hash  message id (decimal) -> QueuedMessage (a QoS 2 one that the
                               client has PUBREC'd: a released stub, without the message)
    hx:{p}:q2in:{cid}    hash  packet id (decimal) -> Qos2Inbound: the session's inbound QoS 2
                               packet ids, from the first PUBLISH until PUBREL
    hx:{p}:retained      hash  topic -> Message (the topic's retained message; p = partition(topic))
    hx:{p}:q2seen        hash  origin id -> unix ms (decimal): the QoS 2 routings this partition
                               stored as a target, until their claims are routed (qos2_seen.py)
    hx:{p}:handoff       hash  handoff id (decimal) -> SharedHandoff: shared-subscription
                               messages of a member whose session ended, until another member
                               has them (services/partition/redelivery.py)
    hx:{p}:meta          hash  epoch, seq: the replication position this node's copy stands at
Every key of a partition starts with hx:{p}: so a partition can be moved or dropped as a whole.
"""

from __future__ import annotations


def sessions_key(p: int) -> str:
    return f"hx:{p}:sessions"


def subs_key(p: int, cid: str) -> str:
    return f"hx:{p}:subs:{cid}"


def queue_key(p: int, cid: str) -> str:
    return f"hx:{p}:q:{cid}"


def qos2_inbound_key(p: int, cid: str) -> str:
    return f"hx:{p}:q2in:{cid}"


def session_keys(p: int, cid: str) -> tuple[str, str, str]:
    """The keys a session owns besides its record."""
    return subs_key(p, cid), queue_key(p, cid), qos2_inbound_key(p, cid)


def retained_key(p: int) -> str:
    return f"hx:{p}:retained"


def qos2_seen_key(p: int) -> str:
    return f"hx:{p}:q2seen"


def handoff_key(p: int) -> str:
    return f"hx:{p}:handoff"


def meta_key(p: int) -> str:
    return f"hx:{p}:meta"
