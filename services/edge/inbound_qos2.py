"""InboundQos2Handling: QoS 2 PUBLISH from a client, up to PUBCOMP.

1. Qos2Receive to the session's partition: is this packet id new? (It records a claim.)
2. NEW: route like QoS 1, then Qos2Routed (recorded as received, durably), then PUBREC.
   DUPLICATE: PUBREC at once, nothing routed.
3. PUBREL: Qos2Release (forgotten, durably), then PUBCOMP.
See docs/architecture.md (QoS 2) for why the claim comes before the routing, and
services/edge/qos2_origins.py for the claim's origin id that the routing carries.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opentelemetry.trace import Span

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import PubComp, Publish, PubRec, PubRel
from services.edge.connection_base import GONE, OK, RC, UNAVAILABLE, V5, ConnectionBase, State
from services.edge.qos2_origins import RoutedOrigin, carry_origin, fault_stall
from services.edge.tickets import refused_by_hold
from services.edge.translate import publish_commands

if TYPE_CHECKING:
    from services.edge.router import PublishRoute


class InboundQos2Handling(ConnectionBase):
    """The inbound QoS 2 part of ClientConnection (a mixin over ConnectionBase)."""

    def _on_publish_qos2(
        self,
        packet: Publish,
        pid: int,
        route: PublishRoute,
        retained: tuple[str, pb.PartitionTarget] | None,
        span: Span | None,
    ) -> None:
        if pid in self._q2_received:
            # Answered before on this connection (MQTT-4.3.3-9): PUBREC again, nothing routed.
            self._write(self.codec.send(PubRec(pid)))
            if span is not None:
                self.edge.tracer.finish(span)
            return
        if pid in self._q2_routing or pid in self._q2_unrecorded:
            if span is not None:
                self.edge.tracer.finish(span, error="duplicate of a publish being stored")
            return  # a resend of the one being stored: its PUBREC follows
        if not self._count_in():
            return
        self._q2_routing.add(pid)

        def on_claim(result: pb.Result) -> None:
            if result.status != OK:
                self._q2_settled(pid)
                if result.status not in GONE and self.state is State.CONNECTED:
                    self._publish_refused(
                        pid, result.message, span, qos=2, quiet=refused_by_hold(result)
                    )
                elif span is not None:
                    self.edge.tracer.finish(span, error=result.message)
                return
            if result.qos2_state == pb.QOS2_STATE_NEW:
                self._route_qos2(packet, pid, retained, span, result.qos2_origin)
                return
            self._q2_settled(pid)
            if result.qos2_state == pb.QOS2_STATE_DUPLICATE:
                self._q2_pubrec(pid, 0, span)
            elif span is not None:  # IN_PROGRESS: the PUBREC comes from that attempt
                self.edge.tracer.finish(span, error="duplicate of a publish being stored")

        self._session_request(
            pb.EdgeCommand(
                qos2_receive=pb.Qos2Receive(
                    client_id=self.client_id, connection_id=self.connection_id, packet_id=pid
                )
            ),
            on_claim,
        )

    def _route_qos2(
        self,
        packet: Publish,
        pid: int,
        retained: tuple[str, pb.PartitionTarget] | None,
        span: Span | None,
        origin: bytes,
    ) -> None:
        """The packet id is claimed: store the message at every target, as for QoS 1, with the
        claim's origin id (targets that stored it in an earlier attempt skip it). This goes on
        (and is reported to the session's partition) even if the client leaves."""
        # Routed now, with shared groups placed by the origin id: a retry of this claim picks
        # the partitions this attempt picks.
        route = self.edge.router.route_publish(packet.topic, origin)
        if not route.targets and retained is None:
            reason = RC.NO_MATCHING_SUBSCRIBERS if self.version == V5 else 0
            self._record_qos2(pid, None, reason, span)
            return
        commands = publish_commands(self.client_id, packet, route.targets, retained)
        if retained is not None:
            self.edge.router.routed_retained(commands[0][1].publish.message)
        routed = carry_origin(origin, commands)
        failures: list[pb.Result] = []
        remaining = len(commands)

        def done(result: pb.Result) -> None:
            nonlocal remaining
            remaining -= 1
            if result.status != OK:
                failures.append(result)
            if remaining:
                return
            if failures:
                failure = failures[0]
                quiet = refused_by_hold(failure)
                self._record_qos2(pid, failure.message, 0, span, routed, quiet=quiet)
            else:
                self._record_qos2(pid, None, 0, span, routed)

        if span is not None:
            self.edge.tracer.stamp(span, commands)
        dispatcher = self.edge.dispatcher
        for node, cmd in fault_stall(self.config.fault_stall_qos2_routing, packet, commands):
            dispatcher.publish(cmd, done)
            self._throttle(node)

    def _record_qos2(
        self,
        pid: int,
        failure: str | None,
        reason: int,
        span: Span | None,
        routed: RoutedOrigin | None = None,
        *,
        quiet: bool = False,
    ) -> None:
        """Tell the session's partition how the routing ended; PUBREC once it is recorded.
        Once the claim is settled (routed, or dropped) its targets forget its origin id.
        `quiet`: the failure is a refusal past the failover bound (logged per partition)."""
        # A failed routing drops the claim only when a 5.0 PUBREC 0x80 is about to end the
        # exchange (the id is a new message after it, MQTT-4.3.3-9). Otherwise the client
        # resends this same message (3.1.1 is disconnected; a 5.0 client that left heard
        # nothing), and the resend takes the kept claim over and routes with its origin id,
        # so the targets that stored it do not store it twice.
        keep = failure is not None and not (self.version == V5 and self.state is State.CONNECTED)
        forgets = self.edge.qos2_forgets

        def on_result(result: pb.Result) -> None:
            if failure is not None:
                self._q2_settled(pid)
                dropped = result.status == OK and not keep
                if dropped and routed is not None:
                    forgets.forget(routed)
                if self.state is State.CONNECTED:
                    # Not stored everywhere: refused. If the drop of the claim was not
                    # confirmed, no PUBREC 0x80 (which would free the id while the claim and
                    # its origin id may stand): the connection closes and the client resends.
                    self._publish_refused(pid, failure, span, qos=2, close=not dropped, quiet=quiet)
                elif span is not None:
                    self.edge.tracer.finish(span, error=failure)
                return
            if result.status == UNAVAILABLE and self.state is State.CONNECTED:
                # Stored everywhere but not recorded (the session's partition had no master
                # within the failover bound): say it again once the connection is re-attached
                # (services/edge/reattach.py), and only then PUBREC.
                self._q2_routing.discard(pid)
                self._q2_unrecorded[pid] = (reason, span, routed)
                return
            self._q2_settled(pid)
            if result.status == OK:
                if routed is not None:
                    forgets.forget(routed)
                self._q2_pubrec(pid, reason, span)
            elif result.status not in GONE and self.state is State.CONNECTED:
                self._close(f"QoS 2 PUBLISH {pid} could not be recorded: {result.message}")
            elif span is not None:
                self.edge.tracer.finish(span, error=result.message)

        self._session_request(
            pb.EdgeCommand(
                qos2_routed=pb.Qos2Routed(
                    client_id=self.client_id,
                    connection_id=self.connection_id,
                    packet_id=pid,
                    ok=failure is None,
                    keep_claim=keep,
                )
            ),
            on_result,
        )

    def _q2_settled(self, pid: int) -> None:
        """The publish is no longer being stored (answered, refused or abandoned)."""
        self._q2_routing.discard(pid)
        self._q2_unrecorded.pop(pid, None)
        self._uncount_in()

    def _q2_pubrec(self, pid: int, reason: int, span: Span | None) -> None:
        if self.state is not State.CONNECTED:
            if span is not None:
                self.edge.tracer.finish(span, error="connection closed before PUBREC")
            return
        self._q2_received.add(pid)
        self._write(self.codec.send(PubRec(pid, reason)))
        if span is not None:
            self.edge.tracer.finish(span, reason_code=reason)

    def _on_pubrel(self, packet: PubRel) -> None:
        pid = packet.packet_id

        def on_result(result: pb.Result) -> None:
            if self.state is not State.CONNECTED:
                return
            if result.status != OK:
                if result.status not in GONE:
                    # Unknown whether it was forgotten: no PUBCOMP (the client would reuse the
                    # packet id while the partition may still hold it); it sends PUBREL again
                    # when it reconnects (MQTT-4.4.0-1).
                    self._close(f"PUBREL {pid} could not be recorded: {result.message}")
                return
            self._q2_received.discard(pid)
            found = result.qos2_state == pb.QOS2_STATE_RELEASED
            reason = RC.PACKET_IDENTIFIER_NOT_FOUND if self.version == V5 and not found else 0
            self._write(self.codec.send(PubComp(pid, reason)))

        self._session_request(
            pb.EdgeCommand(
                qos2_release=pb.Qos2Release(
                    client_id=self.client_id, connection_id=self.connection_id, packet_id=pid
                )
            ),
            on_result,
        )
