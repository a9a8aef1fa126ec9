"""The protocol check of an inter-node stream's hello (docs/releases.md), shared by the edge
links (server.py) and the replication feeds (peers.py)."""

from __future__ import annotations

import logging

import grpc

from hexmq.api.common.v1 import common_pb2
from hexmq.node_protocol import THIS_RELEASE, ProtocolError, Support, link_refusal


async def refuse_hello(
    context: grpc.aio.ServicerContext,
    peer: str,
    protocol: common_pb2.ProtocolSupport,
    what: str,
    log: logging.Logger,
) -> bool:
    """Abort the stream and return True when `peer`'s hello speaks no protocol version this
    release shares (FAILED_PRECONDITION, logged) or an invalid one (INVALID_ARGUMENT)."""
    try:
        theirs = Support.from_proto(protocol)
    except ProtocolError as exc:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"hello protocol: {exc}")
        return True
    why = link_refusal(peer, theirs, THIS_RELEASE)
    if why is None:
        return False
    log.error("refusing %s: %s", what, why)
    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, why)
    return True
