"""SessionAttachment: a live connection's session re-attached at its partition's master, and the
delivery acknowledgements the connection sends, tracked until the partition confirms them.

When the view moves a connection's session partition to another master (or another epoch), or
the link to its master comes back (the partition service may have restarted), the connection
stays open and sends AttachSession to the master of its partition now (docs/failover.md,
"Re-attach"). It carries what only the edge knows of the connection's deliveries: the message
ids sent and not acknowledged (QoS 1 PUBLISH, QoS 2 PUBLISH awaiting PUBREC), those whose
PUBREL awaits PUBCOMP, and the acknowledgements and PUBRECs sent in DeliveryAcks whose results
have not come back. The new master applies the acknowledgements, counts the rest as in flight
and sends only what the client has not seen (MQTT-4.4.0-1). The connection keeps its in-flight
maps (packet id -> message id), so a PUBACK arriving afterwards still maps to its message.

The partition's other commands wait behind the re-attach (services/edge/hold.py), and the
connection's acknowledgements wait in the connection until it is answered (they would
otherwise reach the master before it knows the connection). TAKEN_OVER or NOT_FOUND closes the
connection (the session went elsewhere or ended); MOVED and UNAVAILABLE are held and sent again
by the dispatcher; no master within the failover bound leaves the connection open and the
re-attach waiting again (a client is not disconnected because its session has no master:
DESIGN G7).
"""

from __future__ import annotations

from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.mqtt import Disconnect
from services.edge.connection_base import OK, RC, V5, ConnectionBase, State, log
from services.edge.tickets import refused_by_hold

# DeliveryAck batches a connection keeps until their results confirm them; past this the
# oldest are taken as confirmed (a partition service of an older version never answers them).
MAX_UNCONFIRMED_ACKS = 256


class SessionAttachment(ConnectionBase):
    """The re-attach part of ClientConnection (a mixin over ConnectionBase)."""

    def reattach(self) -> bool:
        """Make this connection its session's live one at the partition's master now. False
        when it is not connected, already attached there, or a re-attach is on its way (then
        another follows it if still needed)."""
        route = self.route
        if self.state is not State.CONNECTED or route is None:
            return False
        if self._attach is not None:
            self._attach_again = True
            return False
        dispatcher = self.edge.dispatcher
        current = dispatcher.route(route.partition)
        if current is not None and current == self.attached:
            return False
        if self._acks or self._recs:
            self._remember_acks(self._acks, self._recs)
            self._acks, self._recs = [], []
        carried = list(self._unconfirmed)
        unconfirmed = self._unconfirmed
        attach = pb.AttachSession(
            client_id=self.client_id,
            connection_id=self.connection_id,
            receive_maximum=self.receive_maximum,
            maximum_packet_size=self.client_max_packet,
            inflight_ids=[*self._inflight_out.values(), *self._q2_out.values()],
            released_ids=list(self._rel_out.values()),
            acked_ids=[mid for token in carried for mid in unconfirmed[token][0]],
            received_ids=[mid for token in carried for mid in unconfirmed[token][1]],
        )
        self._attach = dispatcher.attach(
            route.partition,
            pb.EdgeCommand(attach_session=attach),
            lambda result: self._on_attached(carried, result),
        )
        return True

    def _on_attached(self, carried: list[int], result: pb.Result) -> None:
        ticket, self._attach = self._attach, None
        again, self._attach_again = self._attach_again, False
        if self.state is not State.CONNECTED:
            return
        if result.status == OK:
            assert ticket is not None
            self.attached = ticket.sent_to
            for token in carried:
                self._unconfirmed.pop(token, None)
            self._flush_acks()
            # QoS 2 publishes stored everywhere whose routing could not be recorded: now it
            # can be.
            unrecorded, self._q2_unrecorded = self._q2_unrecorded, {}
            for pid, (reason, span, routed) in unrecorded.items():
                self._q2_routing.add(pid)
                self._record_qos2(pid, None, reason, span, routed)
            route = self.route
            assert route is not None
            if again or self.edge.dispatcher.route(route.partition) != self.attached:
                self.reattach()
            return
        if refused_by_hold(result):
            # No master within the bound: the connection stays, the re-attach waits again.
            self.reattach()
            return
        log.warning(
            "%s: session could not be re-attached (%s): %s",
            self.client_id,
            pb.StatusCode.Name(result.status),
            result.message,
        )
        self.state = State.CLOSED
        if self.version == V5:
            reason = (
                RC.SESSION_TAKEN_OVER
                if result.status == pb.StatusCode.STATUS_CODE_TAKEN_OVER
                else RC.UNSPECIFIED_ERROR
            )
            self._write(self.codec.send(Disconnect(reason)))
        self._close(None)

    # ----- delivery acknowledgements ------------------------------------------------------

    def _flush_acks(self) -> None:
        if not (self._acks or self._recs) or self.route is None or self._attach is not None:
            return  # (while a re-attach is on its way they wait: it must come first)
        acks, self._acks = self._acks, []
        recs, self._recs = self._recs, []
        token = self._remember_acks(acks, recs)
        self.edge.dispatcher.acknowledge(
            self.route.partition,
            pb.EdgeCommand(
                delivery_ack=pb.DeliveryAck(
                    client_id=self.client_id,
                    connection_id=self.connection_id,
                    message_ids=acks,
                    received_ids=recs,
                ),
            ),
            lambda result: self._ack_answered(token, result),
        )

    def _remember_acks(self, acks: list[int], recs: list[int]) -> int:
        token = next(self._ack_tokens)
        unconfirmed = self._unconfirmed
        unconfirmed[token] = (acks, recs)
        if len(unconfirmed) > MAX_UNCONFIRMED_ACKS:
            unconfirmed.popitem(last=False)
        return token

    def _ack_answered(self, token: int, result: pb.Result) -> None:
        if result.status == OK:
            self._unconfirmed.pop(token, None)
