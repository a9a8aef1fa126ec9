"""Work a partition master hands to an edge because it needs the edge's routing
(services/partition/handout.py): a due will to publish like a PUBLISH of its client. The edge
answers once every target partition has stored the work; without an answer the partition hands
it out again (at least once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.edge.links import PartitionLink
from services.edge.router import Router
from services.edge.translate import message_commands

log = logging.getLogger("hexmq.edge")

OK = pb.StatusCode.STATUS_CODE_OK


def when_stored(
    commands: Sequence[tuple[PartitionLink, pb.EdgeCommand]], then: Callable[[], None]
) -> None:
    """Send every command; call `then` once all of them are answered OK (never if one fails:
    the partition hands the work out again)."""
    if not commands:
        then()
        return
    remaining = len(commands)
    failed = False

    def done(result: pb.Result) -> None:
        nonlocal remaining, failed
        remaining -= 1
        failed = failed or result.status != OK
        if remaining == 0 and not failed:
            then()

    for link, cmd in commands:
        link.request(cmd, done)


def publish_will(router: Router, will: pb.PublishWill) -> None:
    """Route a due will like a PUBLISH from its client; WillPublished once every target
    partition has it."""
    if router.view is None:
        return
    msg = will.message
    route = router.route_publish(msg.topic)
    if not route.complete:
        return
    retained = router.retained_route(msg.topic) if msg.retain else None
    commands = message_commands(lambda m: m.CopyFrom(msg), route.targets, retained)
    session = router.session_route(will.client_id)
    confirm = pb.EdgeCommand(
        partition=session.partition,
        partition_epoch=session.epoch,
        will_published=pb.WillPublished(client_id=will.client_id, will_id=will.will_id),
    )

    def confirmed() -> None:
        session.link.send(confirm)

    when_stored(commands, confirmed)
    log.info("publishing the will of a session of partition %d", session.partition)
