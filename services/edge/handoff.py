"""Work a partition master hands to an edge because it needs the edge's routing
(services/partition/handout.py): a due will to publish like a PUBLISH of its client, and
shared-subscription messages of a member whose connection or session ended, for another member
of their group. The edge answers once every target partition has stored the work; without an
answer the partition hands it out again (at least once).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from hexmq.api.partition.v1 import partition_pb2 as pb
from services.edge.access import AccessControl
from services.edge.dispatch import Dispatcher
from services.edge.router import Router
from services.edge.stats import EdgeStats
from services.edge.tickets import when_all_answered
from services.edge.translate import message_commands

log = logging.getLogger("hexmq.edge")

OK = pb.StatusCode.STATUS_CODE_OK


def when_stored(
    dispatcher: Dispatcher,
    commands: Sequence[tuple[str, pb.EdgeCommand]],
    then: Callable[[], None],
) -> None:
    """Send every publish command; call `then` once all of them are answered OK (never if one
    fails: the partition hands the work out again)."""
    if not commands:
        then()
        return

    def stored(answers: list[pb.Result]) -> None:
        if all(result.status == OK for result in answers):
            then()

    done = when_all_answered(len(commands), stored)
    for _node, cmd in commands:
        dispatcher.publish(cmd, done)


def publish_will(
    router: Router,
    dispatcher: Dispatcher,
    will: pb.PublishWill,
    access: AccessControl | None = None,
    stats: EdgeStats | None = None,
) -> None:
    """Route a due will like a PUBLISH from its client; WillPublished once every target
    partition has it. (With some partition's index unknown it waits for a later hand-out.)
    A will its owner may not publish now (`$SYS/`, or the ACL as it is now, a reload since
    the CONNECT included) is dropped: confirmed, never routed."""
    if router.view is None:
        return
    msg = will.message
    session = router.session_partition(will.client_id)
    confirm = pb.EdgeCommand(
        will_published=pb.WillPublished(client_id=will.client_id, will_id=will.will_id),
    )
    refusal = will_refusal(will, access)
    if refusal is not None:
        if stats is not None:
            stats.limited["will_acl"] += 1
        log.warning("not publishing the will of %s on %r: %s", will.client_id, msg.topic, refusal)
        dispatcher.oneway(session, confirm)
        return
    route = router.route_publish(msg.topic)
    if not route.complete:
        return
    retained = router.retained_route(msg.topic) if msg.retain else None
    commands = message_commands(lambda m: m.CopyFrom(msg), route.targets, retained)
    if retained is not None:
        router.routed_retained(msg)

    def confirmed() -> None:
        dispatcher.oneway(session, confirm)

    when_stored(dispatcher, commands, confirmed)
    log.info("publishing the will of a session of partition %d", session)


def will_refusal(will: pb.PublishWill, access: AccessControl | None) -> str | None:
    """Why a will may not be published now (None: it may). A will from an edge of an earlier
    release names no owner: only the $SYS/ rule applies to it."""
    topic = will.message.topic
    if topic.startswith("$SYS/"):
        return "only the broker publishes under $SYS/"
    if access is None or not will.owner_recorded:
        return None
    username = will.username if will.HasField("username") else None
    return access.may_publish_will(will.client_id, username, topic)


def hand_off_shared(router: Router, dispatcher: Dispatcher, handoff: pb.SharedHandoff) -> None:
    """Give a member's shared-subscription messages to another partition holding members of
    the group (online ones first), as one EnqueueShared naming only the group; then say so
    (moved), or that no other partition holds a member (online, if online_only): not moved."""
    if router.view is None:
        return

    def answer(moved: bool) -> None:
        dispatcher.oneway(
            handoff.from_partition,
            pb.EdgeCommand(
                shared_handoff_done=pb.SharedHandoffDone(
                    client_id=handoff.client_id,
                    handoff_id=handoff.handoff_id,
                    moved=moved,
                    online_only=handoff.online_only,
                ),
            ),
        )

    target = router.shared_candidate(handoff.group, exclude=handoff.from_partition)
    if target is None or (
        handoff.online_only and not (target.online and dispatcher.open(target.partition))
    ):
        if not handoff.online_only and not router.index_complete:
            # A member may be where this edge cannot see yet (its node's index has not come):
            # "nobody else" would drop the messages. Answered on a later hand-out.
            return
        answer(False)  # online_only: with no online member in sight they stay with theirs
        return

    def on_result(result: pb.Result) -> None:
        if result.status == OK:
            answer(True)
        elif result.status == pb.StatusCode.STATUS_CODE_NOT_FOUND and handoff.online_only:
            answer(False)  # its members went offline (or left) meanwhile: stored nowhere

    dispatcher.request(
        target.partition,
        pb.EdgeCommand(
            enqueue_shared=pb.EnqueueShared(
                group=handoff.group,
                messages=handoff.messages,
                online_only=handoff.online_only,
            ),
        ),
        on_result,
    )
    log.info(
        "handing %d messages of shared group %s over from partition %d to partition %d",
        len(handoff.messages),
        handoff.group,
        handoff.from_partition,
        target.partition,
    )
