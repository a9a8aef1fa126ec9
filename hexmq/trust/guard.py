"""What a server asks of its callers: each RPC names the roles it admits, and whether the
caller must be this node (or an operator), or be the node its request claims to be.

    guard = Guard(tls, "partition")
    caller = await guard.admit(context, "Link", roles={EDGE}, claimed=hello.edge_id)

A caller that does not qualify gets PERMISSION_DENIED, and the refusal is logged once per
identity and RPC (a peer retrying every 50 ms does not flood the log), with the identity its
certificate presented and its address. Over plain text (`--insecure-cluster`) there are no
identities and nothing is checked: that is what the option's start-up warning says.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import grpc

from hexmq.trust.grpc_tls import ClusterTLS
from hexmq.trust.identity import OPERATOR, Identity

log = logging.getLogger(__name__)

# Refusals remembered for the once-per-peer log (a bound, so a scan cannot grow it forever).
_LOGGED_MAX = 4096


def refusal(
    caller: Identity | None,
    *,
    roles: Collection[str],
    node: str | None = None,
    claimed: str | None = None,
    members: Collection[str] | None = None,
) -> str | None:
    """Why `caller` may not make the call (None: it may). Pure.

    `roles`: the roles admitted. `node`: the caller must belong to this node (the server's
    own), unless it is an operator (when admitted). `claimed`: the node id the request speaks
    for must be the caller's own. `members`: the caller's node must be one of these (the
    view's members)."""
    if caller is None:
        return "its certificate names no identity of this cluster"
    if caller.role not in roles:
        return f"a {caller.role} may not make this call (only {', '.join(sorted(roles))})"
    if caller.role == OPERATOR:
        return None
    if node is not None and caller.node != node:
        return f"only node {node} itself or an operator may make this call"
    if claimed is not None and claimed != caller.node:
        return f"it claims to be {claimed!r} but its certificate names {caller.node}"
    if members is not None and caller.node not in members:
        return f"node {caller.node} is not a member of the view"
    return None


class Guard:
    """One server's checks of its callers."""

    def __init__(self, tls: ClusterTLS, server: str) -> None:
        self._tls = tls
        self._server = server
        self._logged: set[tuple[str, str, str]] = set()
        self.refused = 0

    @property
    def checking(self) -> bool:
        """Whether callers have identities to check (this server serves TLS)."""
        return self._tls.serve_tls

    async def admit(
        self,
        context: grpc.aio.ServicerContext,
        rpc: str,
        *,
        roles: Collection[str],
        node: str | None = None,
        claimed: str | None = None,
        members: Collection[str] | None = None,
    ) -> Identity | None:
        """The caller's identity if it may make this call (None over plain text); otherwise
        the call ends with PERMISSION_DENIED (context.abort raises)."""
        if not self._tls.serve_tls:
            return None
        caller = self._tls.caller(context)
        why = refusal(caller, roles=roles, node=node, claimed=claimed, members=members)
        if why is None:
            return caller
        self.refused += 1
        self._log_once(caller, rpc, context.peer(), why)
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{rpc} refused: {why}")
        raise AssertionError("context.abort returned")  # pragma: no cover

    def _log_once(self, caller: Identity | None, rpc: str, peer: str, why: str) -> None:
        who = str(caller) if caller is not None else f"an unnamed certificate at {peer}"
        key = (who, rpc, why)
        if key in self._logged:
            return
        if len(self._logged) >= _LOGGED_MAX:
            self._logged.clear()
        self._logged.add(key)
        log.warning(
            "%s refused %s from %s (%s): %s; further refusals of it are not logged",
            self._server,
            rpc,
            who,
            peer,
            why,
        )
