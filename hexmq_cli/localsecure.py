"""`hexmq cluster secure`: switch a running local cluster from plain text to what `up` makes
now (docs/security.md, "From plain text to TLS"), node by node, under traffic, losing nothing.

A cluster of a release before TLS, once every node runs this release (a rolling upgrade, in
plain text: `hexmq cluster start N --python ...`), still serves plain text and has no
certificates, no Redis passwords and an agreement server without ACLs. A node serving TLS can
only be reached by peers that have a certificate and dial it with TLS, so the switch takes
three rolls of the nodes (each node stopped and started again, the next one only once every
partition is back in sync, as in an upgrade):

1. every node keeps serving plain text but gets its certificates, and dials with TLS the
   peers that serve it (none yet); its agent presents the agreement server's new token;
   then the agreement server restarts with ACLs on (the agents already present the token);
2. every node serves mutual TLS, still dialling the nodes not switched yet in plain text;
   its Redis restarts with the node's password and the hexmq ACL user;
3. every node dials TLS only (nobody serves plain text any more).

The same steps, by hand, switch any deployment (docs/security.md).
"""

from __future__ import annotations

import logging
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from hexmq_cli import localcluster, localsecurity
from hexmq_cli.clusterstate import (
    ClusterError,
    ClusterState,
    NodeState,
    cluster_lock,
    interpreter_of,
    require_state,
    save_state,
    write_config,
)

log = logging.getLogger("hexmq.cluster")

# How long one node may take to be back and the cluster whole again after its restart.
DEFAULT_STEP_TIMEOUT = 180.0


def _knows_tls(python: str) -> bool:
    probe = subprocess.run(
        [python, "-P", "-c", "import hexmq.trust.grpc_tls"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    return probe.returncode == 0


def _check_ready(state: ClusterState) -> None:
    stopped = [
        f"node {n.node} {s}" for n in state.nodes for s, r in n.processes.items() if not r.running()
    ]
    if stopped:
        raise ClusterError(
            f"every node must run before the switch ({', '.join(stopped)} does not): start "
            "them first"
        )
    for python in sorted({interpreter_of(n) for n in state.nodes}):
        if not _knows_tls(python):
            nodes = [str(n.node) for n in state.nodes if interpreter_of(n) == python]
            raise ClusterError(
                f"node(s) {', '.join(nodes)} run a release without cluster TLS ({python}): "
                "upgrade every node first (`hexmq cluster stop N`, then `hexmq cluster start N "
                "--python` this release's Python; docs/operations.md)"
            )


def wait_whole(state: ClusterState, timeout: float) -> None:
    """Until the agreed view has every node as a member and every partition all its replicas
    in sync: the point at which the next node of a rolling restart may stop."""
    wanted = {n.node_id for n in state.nodes}
    deadline = time.monotonic() + timeout
    seen = "no view"
    while time.monotonic() < deadline:
        view = localcluster.agreed_view(state, state.nodes)
        if view is not None:
            members = {m.node_id for m in view.members}
            lagging = sum(1 for pa in view.partitions if set(pa.in_sync) != set(pa.replicas))
            if members == wanted and not lagging:
                return
            seen = f"view {view.epoch}: members {sorted(members)}, {lagging} partitions catching up"
        time.sleep(0.5)
    raise ClusterError(f"the cluster is not whole again within {timeout:g} s ({seen})")


def _restart(
    cluster_dir: Path,
    node: NodeState,
    change: Callable[[ClusterState, NodeState], None],
    timeout: float,
    grace: float,
) -> None:
    """Stop node `node`, change how it runs, start it, and wait until the cluster is whole."""
    localcluster.stop_nodes(cluster_dir, [node.node], grace=grace)
    with cluster_lock(cluster_dir):
        state = require_state(cluster_dir)
        change(state, state.node(node.node))
        write_config(state)
        save_state(state)
    localcluster.start_node(cluster_dir, node.node, timeout=timeout)
    wait_whole(require_state(cluster_dir), timeout)


def _serve_plain_dial_tls(state: ClusterState, node: NodeState) -> None:
    node.security = localsecurity.PLAIN_DIALS_TLS


def _serve_tls_lock_redis(state: ClusterState, node: NodeState) -> None:
    node.security = localsecurity.TLS_DIALS_PLAIN
    localsecurity.ensure_redis_password(node)
    node.redis_auth = True


def _tls_only(state: ClusterState, node: NodeState) -> None:
    node.security = localsecurity.TLS


def _restart_agreement(cluster_dir: Path, timeout: float, grace: float) -> None:
    """The embedded agreement server again, now asking for the token (its state is on disk;
    the agents' requests wait meanwhile, as the view does, never the traffic), run from the
    release the nodes run: the one that made the cluster may know no ACLs."""
    with cluster_lock(cluster_dir):
        state = require_state(cluster_dir)
        if state.consul is None or state.consul_acl:
            return
        localcluster.stop_agreement(state, grace)
        state.consul.argv[0] = interpreter_of(state.nodes[0])
        state.consul_acl = True
        save_state(state)
        localcluster.start_agreement(state, timeout)
        if not _asks_for_token(state):
            raise ClusterError(
                f"the agreement server on {state.consul_addr} answers without a token "
                f"(log: {state.consul.log})"
            )


def _asks_for_token(state: ClusterState) -> bool:
    url = f"http://{state.consul_addr}/v1/kv/hexmq/{state.cluster_name}/view"
    try:
        with urllib.request.urlopen(url, timeout=5):
            return False
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code == 403
    except OSError:
        return False


def secure(
    cluster_dir: Path,
    *,
    step_timeout: float = DEFAULT_STEP_TIMEOUT,
    grace: float = localcluster.DEFAULT_GRACE,
    say: Callable[[str], None] = log.info,
) -> ClusterState:
    """Switch the running cluster in `cluster_dir` to mutual TLS, Redis passwords and the
    agreement server's token, one node at a time (the module's steps). A node already past a
    step is not restarted for it, so running it again after an interruption goes on."""
    cluster_dir = cluster_dir.absolute()
    with cluster_lock(cluster_dir):
        state = require_state(cluster_dir)
        _check_ready(state)
        localsecurity.ensure_certificates(state)
        if state.consul is not None:
            localsecurity.ensure_consul_token(state)
        save_state(state)
    wait_whole(state, step_timeout)
    order = localsecurity.MODES
    steps: list[tuple[str, str, Callable[[ClusterState, NodeState], None]]] = [
        (localsecurity.PLAIN_DIALS_TLS, "certificates, dials TLS peers", _serve_plain_dial_tls),
        (localsecurity.TLS_DIALS_PLAIN, "serves mutual TLS, Redis password", _serve_tls_lock_redis),
        (localsecurity.TLS, "TLS only", _tls_only),
    ]
    for number, (mode, what, change) in enumerate(steps, start=1):
        for node in require_state(cluster_dir).nodes:
            if order.index(node.security) >= order.index(mode) and (
                node.redis_auth or mode != localsecurity.TLS_DIALS_PLAIN
            ):
                continue
            say(f"step {number} of 3: node {node.node}: {what}")
            started = time.monotonic()
            _restart(cluster_dir, node, change, step_timeout, grace)
            took = time.monotonic() - started
            say(f"step {number} of 3: node {node.node} back, cluster whole ({took:.1f} s)")
        if number == 1 and not require_state(cluster_dir).consul_acl:
            say("step 1 of 3: the agreement server asks for the token")
            _restart_agreement(cluster_dir, step_timeout, grace)
            wait_whole(require_state(cluster_dir), step_timeout)
    return require_state(cluster_dir)
