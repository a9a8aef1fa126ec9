"""QoS 2 PUBLISH from a client, up to PUBCOMP (and PUBREL, its second half).

1. Qos2Receive to the session's partition: is this packet id new? (It records a claim.)
2. NEW: route like QoS 1, then Qos2Routed (recorded as received, durably), then PUBREC.
   DUPLICATE: PUBREC at once, nothing routed.
3. PUBREL: Qos2Release (forgotten, durably), then PUBCOMP.
See docs/architecture.md (QoS 2) for why the claim comes before the routing, and
services/edge/qos2_origins.py for the claim's origin id that the routing carries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import PubComp, Publish, PubRec, PubRel
from services.edge.qos2_origins import RoutedOrigin, carry_origin, fault_stall
from services.edge.session.actions import ForgetOrigins, PublishCommand
from services.edge.session.inbound import Qos2Claims, Unrecorded
from services.edge.session.receive_maximum import count_in, uncount_in
from services.edge.session.refusals import refuse_publish, watch_retained
from services.edge.session.state import GONE, OK, RC, UNAVAILABLE, V5, SessionState, State
from services.edge.tickets import fan_in, refused_by_hold
from services.edge.translate import publish_commands

if TYPE_CHECKING:
    from opentelemetry.trace import Span


def claims_of(s: SessionState) -> Qos2Claims:
    claims = s.claims
    if claims is None:
        claims = s.claims = Qos2Claims()
    return claims


def publish_qos2(
    s: SessionState,
    packet: Publish,
    pid: int,
    retained: tuple[str, pb.PartitionTarget] | None,
    span: Span | None,
    wall_ms: int,
) -> None:
    """A QoS 2 PUBLISH the client may send (services/edge/session/handle_publish.py)."""
    claims = claims_of(s)
    tracer = s.edge.tracer
    if pid in claims.received:
        # Answered before on this connection (MQTT-4.3.3-9): PUBREC again, nothing routed.
        s.send(PubRec(pid))
        if span is not None:
            tracer.finish(span)
        return
    if claims.in_progress(pid):
        if span is not None:
            tracer.finish(span, error="duplicate of a publish being stored")
        return  # a resend of the one being stored: its PUBREC follows
    size = len(packet.payload)
    if not count_in(s, size):
        return
    claims.routing[pid] = size

    def on_claim(result: pb.Result) -> None:
        if result.status != OK:
            settled(s, pid)
            if result.status not in GONE and s.state is State.CONNECTED:
                refuse_publish(s, pid, result.message, span, qos=2, quiet=refused_by_hold(result))
            elif span is not None:
                tracer.finish(span, error=result.message)
            return
        if result.qos2_state == pb.QOS2_STATE_NEW:
            route_qos2(s, packet, pid, size, retained, span, result.qos2_origin, wall_ms)
            return
        settled(s, pid)
        if result.qos2_state == pb.QOS2_STATE_DUPLICATE:
            pubrec(s, pid, RC.SUCCESS, span)
        elif span is not None:  # IN_PROGRESS: the PUBREC comes from that attempt
            tracer.finish(span, error="duplicate of a publish being stored")

    s.request(
        pb.EdgeCommand(
            qos2_receive=pb.Qos2Receive(
                client_id=s.client_id, connection_id=s.connection_id, packet_id=pid
            )
        ),
        on_claim,
    )


def route_qos2(
    s: SessionState,
    packet: Publish,
    pid: int,
    size: int,
    retained: tuple[str, pb.PartitionTarget] | None,
    span: Span | None,
    origin: bytes,
    wall_ms: int,
) -> None:
    """The packet id is claimed: store the message at every target, as for QoS 1, with the
    claim's origin id (targets that stored it in an earlier attempt skip it). This goes on
    (and is reported to the session's partition) even if the client leaves."""
    router = s.edge.router
    # Routed now, with shared groups placed by the origin id: a retry of this claim picks
    # the partitions this attempt picks.
    route = router.route_publish(packet.topic, origin)
    if not route.targets and retained is None:
        reason = RC.NO_MATCHING_SUBSCRIBERS if s.version == V5 else RC.SUCCESS
        record_qos2(s, pid, size, None, reason, span)
        return
    commands = publish_commands(s.client_id, packet, route.targets, retained, wall_ms)
    if retained is not None:
        router.routed_retained(commands[0][1].publish.message)
    routed = carry_origin(origin, commands)
    not_retained: list[str] = []

    def stored(failure: pb.Result | None) -> None:
        if failure is not None:
            quiet = refused_by_hold(failure)
            record_qos2(s, pid, size, failure.message, RC.SUCCESS, span, routed, quiet=quiet)
        elif not_retained and s.version == V5:
            # Its subscribers have it, but it was not retained (the cluster's retained cap):
            # PUBREC 0x97, which ends the exchange, so the claim is dropped as for a failure
            # (the packet id is a new message after it, MQTT-4.3.3-9).
            s.edge.stats.rejected["publish", RC.QUOTA_EXCEEDED] += 1
            record_qos2(
                s, pid, size, not_retained[0], RC.SUCCESS, span, routed, code=RC.QUOTA_EXCEEDED
            )
        else:
            record_qos2(s, pid, size, None, RC.SUCCESS, span, routed)

    if span is not None:
        s.edge.tracer.stamp(span, commands)
    answered = watch_retained(fan_in(len(commands), stored), not_retained, retained)
    for node, cmd in fault_stall(s.config.fault_stall_qos2_routing, packet, commands):
        s.emit(PublishCommand(s.ask(answered), node, cmd))


def record_qos2(
    s: SessionState,
    pid: int,
    size: int,
    failure: str | None,
    reason: int,
    span: Span | None,
    routed: RoutedOrigin | None = None,
    *,
    quiet: bool = False,
    code: int = RC.UNSPECIFIED_ERROR,
) -> None:
    """Tell the session's partition how the routing ended; PUBREC once it is recorded.
    Once the claim is settled (routed, or dropped) its targets forget its origin id.
    `quiet`: the failure is a refusal past the failover bound (logged per partition)."""
    # A failed routing drops the claim only when a 5.0 PUBREC 0x80 is about to end the
    # exchange (the id is a new message after it, MQTT-4.3.3-9). Otherwise the client
    # resends this same message (3.1.1 is disconnected; a 5.0 client that left heard
    # nothing), and the resend takes the kept claim over and routes with its origin id,
    # so the targets that stored it do not store it twice.
    keep = failure is not None and not (s.version == V5 and s.state is State.CONNECTED)
    tracer = s.edge.tracer

    def on_result(result: pb.Result) -> None:
        if failure is not None:
            settled(s, pid)
            dropped = result.status == OK and not keep
            if dropped and routed is not None:
                s.emit(ForgetOrigins(routed))
            if s.state is State.CONNECTED:
                # Not stored everywhere: refused. If the drop of the claim was not
                # confirmed, no PUBREC 0x80 (which would free the id while the claim and
                # its origin id may stand): the connection closes and the client resends.
                refuse_publish(
                    s, pid, failure, span, qos=2, close=not dropped, quiet=quiet, code=code
                )
            elif span is not None:
                tracer.finish(span, error=failure)
            return
        if result.status == UNAVAILABLE and s.state is State.CONNECTED:
            # Stored everywhere but not recorded (the session's partition had no master
            # within the failover bound): say it again once the connection is re-attached
            # (services/edge/session/delivery.py), and only then PUBREC.
            claims_of(s).wait_for_record(pid, Unrecorded(size, reason, span, routed))
            return
        settled(s, pid)
        if result.status == OK:
            if routed is not None:
                s.emit(ForgetOrigins(routed))
            pubrec(s, pid, reason, span)
        elif result.status not in GONE and s.state is State.CONNECTED:
            s.close(f"QoS 2 PUBLISH {pid} could not be recorded: {result.message}")
        elif span is not None:
            tracer.finish(span, error=result.message)

    s.request(
        pb.EdgeCommand(
            qos2_routed=pb.Qos2Routed(
                client_id=s.client_id,
                connection_id=s.connection_id,
                packet_id=pid,
                ok=failure is None,
                keep_claim=keep,
            )
        ),
        on_result,
    )


def settled(s: SessionState, pid: int) -> None:
    """The publish is no longer being stored (answered, refused or abandoned)."""
    size = claims_of(s).settled(pid)
    if size is not None:
        uncount_in(s, size)


def pubrec(s: SessionState, pid: int, reason: int, span: Span | None) -> None:
    if s.state is not State.CONNECTED:
        if span is not None:
            s.edge.tracer.finish(span, error="connection closed before PUBREC")
        return
    claims_of(s).received.add(pid)
    s.send(PubRec(pid, reason))
    if span is not None:
        s.edge.tracer.finish(span, reason_code=reason)


def handle_pubrel(s: SessionState, packet: PubRel, now: float, wall_ms: int) -> None:
    pid = packet.packet_id

    def on_result(result: pb.Result) -> None:
        if s.state is not State.CONNECTED:
            return
        if result.status != OK:
            if result.status not in GONE:
                # Unknown whether it was forgotten: no PUBCOMP (the client would reuse the
                # packet id while the partition may still hold it); it sends PUBREL again
                # when it reconnects (MQTT-4.4.0-1).
                s.close(f"PUBREL {pid} could not be recorded: {result.message}")
            return
        claims_of(s).received.discard(pid)
        found = result.qos2_state == pb.QOS2_STATE_RELEASED
        reason = RC.PACKET_IDENTIFIER_NOT_FOUND if s.version == V5 and not found else RC.SUCCESS
        s.send(PubComp(pid, reason))

    s.request(
        pb.EdgeCommand(
            qos2_release=pb.Qos2Release(
                client_id=s.client_id, connection_id=s.connection_id, packet_id=pid
            )
        ),
        on_result,
    )
