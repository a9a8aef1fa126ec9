"""deploy/compose/compose.yaml run as local processes (issue 13): the file's own commands,
environment, healthchecks, depends_on conditions and HAProxy config, with service names mapped
to loopback ports (tests/support/compose_local.py) and `hexmq consul-dev` in place of the
consul service (tests/support/compose_run.py). If an option, a variable, an address or a
readiness the file relies on stops matching the services, these tests fail.

A real OTLP receiver listens where the file sends traces (the otel-collector service's port),
so the services' exporters, configured by the file's OTEL_* variables, have a Collector.

The file is secure by default (its one-shot `secrets` service makes the CA, certificates, Redis
passwords and the Consul token in volume `secrets`, here a folder of the test's): the test's
own gRPC calls present an operator certificate of that volume's CA, and the attacks the issue
lists against the compose topology's configuration are refused.

compose.colocated.yaml, merged on it as Compose merges the two, runs the same way: each node
one `hexmq node` process beside its Redis.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.api.membership.v1 import membership_pb2_grpc as mpb_grpc
from hexmq.api.partition.v1 import partition_pb2 as pb
from hexmq.api.partition.v1 import partition_pb2_grpc as pb_grpc
from hexmq.node_protocol import THIS_RELEASE
from hexmq.trust.identity import OPERATOR, Identity
from tests.support import start_bounds
from tests.support.compose_local import LocalTopology, load_local_topology, merge_files
from tests.support.compose_run import LocalCompose
from tests.support.eventually import eventually_sync as wait_for
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.support.trust import tls_for
from tests.support.unique import uid
from tests.support.workload import Publisher, Subscriber, check

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
COLOCATED = ROOT / "deploy" / "compose" / "compose.colocated.yaml"
NODE_ROLES = ("edge", "partition", "membership", "redis")
MQTT_BACKEND = "edges-mqtt"


@dataclass
class Running:
    """The topology serving behind HAProxy, with three persistent QoS 1 subscribers (one per
    edge, by HAProxy's leastconn) and a QoS 1 publisher, all through HAProxy."""

    topo: LocalTopology
    compose: LocalCompose
    collector: OtlpReceiver
    serving_after: float
    subs: list[Subscriber] = field(default_factory=list)
    # client id -> the edge service HAProxy gave it to
    placed: dict[str, str] = field(default_factory=dict)
    publisher: Publisher | None = None
    publisher_edge: str = ""

    @property
    def mqtt(self) -> int:
        return self.topo.port("haproxy", 1883)

    def servers(self) -> dict[str, str]:
        return {e: s.status for e, s in self.compose.haproxy_servers(MQTT_BACKEND).items()}

    def acked_after(self, count: int, timeout: float) -> None:
        """Until the publisher has `count` more acknowledgements than now."""
        publisher = self.publisher
        assert publisher is not None
        target = len(publisher.acked) + count
        wait_for(lambda: len(publisher.acked) >= target, timeout, f"{count} more acks")

    def finish(self) -> Publisher:
        """Stop the publisher; every subscriber has every acknowledged message, in order, and
        the publisher saw no refusal and no unanswered publish."""
        publisher = self.publisher
        assert publisher is not None
        publisher.stop()
        wanted = {publisher.payload(n) for n in publisher.acked}
        wait_for(
            lambda: all(wanted <= set(s.payloads()) for s in self.subs),
            15,
            "every acknowledged message at every subscriber",
        )
        check([publisher], self.subs).assert_clean()
        assert not publisher.refused
        assert not publisher.unanswered
        return publisher


def volumes(workdir: Path) -> Path:
    """Where the file's named volumes are, `secrets` among them."""
    return workdir / "volumes"


def secrets_dir(topo: LocalTopology) -> Path:
    """The secrets volume, as the file mounts it in the secrets service."""
    (mount,) = [m for m in topo.services["secrets"].mounts if m.target == "/secrets"]
    return mount.local


@contextlib.contextmanager
def running_topology(
    workdir: Path, interpolation: dict[str, str], overrides: tuple[Path, ...] = ()
) -> Iterator[Running]:
    """compose.yaml running, with `overrides` merged on it as `docker compose -f` would
    (compose_local.merge_files)."""
    compose_file = COMPOSE
    if overrides:
        workdir.mkdir(parents=True, exist_ok=True)
        merged = workdir / "compose.merged.json"
        compose_file = merge_files([COMPOSE, *overrides], merged, interpolation)
    topo = load_local_topology(compose_file, interpolation, volumes=volumes(workdir))
    edges = [s.name for s in topo.with_alias("edges")]
    collector = OtlpReceiver(port=topo.port("otel-collector", 4317)).start()
    began = time.monotonic()
    run: Running | None = None
    try:
        with LocalCompose(topo, compose_file, workdir) as compose:
            # A start of the whole topology (a secrets job, Consul, three nodes, HAProxy): its
            # bounds follow the machine's pace (tests/support/start_bounds.py; a clean clone
            # under CI once took more than 40 s).
            with start_bounds.outside_test_timeout(start_bounds.scaled(240)):
                compose.up(["haproxy"], timeout=start_bounds.scaled(120))
                compose.wait_healthy(edges, timeout=start_bounds.scaled(60))
            run = Running(topo, compose, collector, 0.0)
            wait_for(
                lambda: set(run.servers().values()) == {"UP"},
                10,
                "HAProxy's checks of every edge's /readyz pass",
            )
            run.serving_after = time.monotonic() - began
            assert sorted(run.servers()) == edges

            tag = uid(8)
            for i in range(len(edges)):
                sub = Subscriber(f"s{i}-{tag}", run.mqtt, f"compose/{tag}/#", qos=1)
                run.subs.append(sub)
                run.placed[sub.client_id] = connect_through(compose, sub)
            assert sorted(run.placed.values()) == edges, f"leastconn spread them: {run.placed}"

            publisher = Publisher(f"p-{tag}", run.mqtt, f"compose/{tag}/t", qos=1)
            run.publisher = publisher
            publisher.start(interval=0.05)
            wait_for(lambda: len(publisher.acked) >= 5, 10, "the publisher's first acks")
            by_edge = compose.haproxy_servers(MQTT_BACKEND)
            (run.publisher_edge,) = [e for e in edges if by_edge[e].connections == 2]
            wait_for(
                lambda: all(len(s.payloads()) >= 5 for s in run.subs),
                10,
                "every subscriber gets the publisher's messages through HAProxy",
            )
            yield run
    finally:
        if run is not None:
            if run.publisher is not None:
                run.publisher.stop()
            for sub in run.subs:
                sub.close()
        collector.stop()


def connect_through(compose: LocalCompose, sub: Subscriber) -> str:
    """Connect the subscriber through HAProxy; the edge service HAProxy gave it to."""
    before = compose.haproxy_servers(MQTT_BACKEND)
    sub.connect(timeout=10)
    after = compose.haproxy_servers(MQTT_BACKEND)
    (edge,) = [e for e in after if after[e].connections == before[e].connections + 1]
    return edge


def local_port(sub: Subscriber) -> int:
    client = sub._client
    assert client is not None
    sock = client.socket()
    assert sock is not None
    port: int = sock.getsockname()[1]
    return port


def connect_spans(spans: list[ReceivedSpan]) -> dict[int, str]:
    """Client port -> the node whose edge traced its CONNECT (from the PROXY header)."""
    return {
        int(s.attributes["client.port"]): str(s.resource["hexmq.node"])
        for s in spans
        if s.name == "mqtt.connect" and "client.port" in s.attributes
    }


def operator_channel(topo: LocalTopology, service: str, port: int) -> grpc.Channel:
    """A channel to a hexmq service of the topology, as an operator of the secrets volume's
    CA (the services take nothing else)."""
    role, _, n = service.rpartition("-")
    tls = tls_for(secrets_dir(topo) / "tls", OPERATOR, "tests")
    return tls.sync_channel(topo.address(service, port), peer=Identity(role, f"n{n}"))


def agreed_view(topo: LocalTopology, membership: str) -> mpb.View:
    with operator_channel(topo, membership, 7000) as channel:
        stub = mpb_grpc.MembershipServiceStub(channel)
        view: mpb.View = stub.GetView(mpb.GetViewRequest(), timeout=5)
        return view


def test_compose_topology_round_trip_through_haproxy_and_clients_resume_after_a_node_is_killed(
    tmp_path: Path, cluster_prerequisites: None
) -> None:
    """The file's defaults (256 partitions, RF 2), every span sampled (HEXMQ_TRACE_SAMPLE,
    the file's own knob). The node (edge, partition, membership, Redis) of a subscriber not
    sharing the publisher's edge is killed: that subscriber reconnects through HAProxy at once
    and resumes its session on another edge (session present, nothing acknowledged lost,
    order kept), the others stay connected, the publisher sees no error, and HAProxy takes
    the dead edge out."""
    with running_topology(tmp_path / "compose", {"HEXMQ_TRACE_SAMPLE": "1.0"}) as run:
        # The file's OTEL_* variables reach the Collector's address, and HAProxy's PROXY v2
        # header gives each edge the client's own address (its port is the client's socket,
        # not HAProxy's).
        ports = {local_port(s): run.placed[s.client_id].replace("edge-", "n") for s in run.subs}
        run.collector.wait_for(lambda spans: ports.items() <= connect_spans(spans).items(), 10)
        run.collector.wait_for(
            lambda spans: (
                {"hexmq-edge", "hexmq-partition", "hexmq-membership"}
                <= {str(s.resource["service.name"]) for s in spans}
            ),
            10,
        )

        kill_a_node_and_resume(run, lambda n: [f"{role}-{n}" for role in NODE_ROLES])


def kill_a_node_and_resume(run: Running, processes: Callable[[str], list[str]]) -> None:
    """Kill the node (`processes` of its number) of a subscriber not sharing the publisher's
    edge: that subscriber reconnects through HAProxy at once and resumes its session on
    another edge, the others stay connected, the publisher sees no error and loses nothing,
    and HAProxy takes the dead edge out."""
    victim = next(s for s in run.subs if run.placed[s.client_id] != run.publisher_edge)
    edge = run.placed[victim.client_id]
    run.compose.kill(processes(edge.rpartition("-")[2]))
    wait_for(lambda: not victim.connected(), 5, f"{victim.client_id} sees its edge die")
    # At once, before HAProxy's checks can have marked the dead edge down.
    started = time.monotonic()
    assert victim.move(run.mqtt, timeout=10), "session present after the reconnect"
    resumed_in = time.monotonic() - started
    assert run.compose.haproxy_servers(MQTT_BACKEND)[edge].connections == 0

    run.acked_after(10, timeout=15)
    publisher = run.finish()
    assert victim.resumed == [True]
    assert all(s.connected() for s in run.subs if s is not victim)
    wait_for(lambda: run.servers()[edge] == "DOWN", 10, f"HAProxy marks {edge} down")
    print(
        f"up and every edge UP in HAProxy after {run.serving_after:.1f} s; resumed through "
        f"HAProxy in {resumed_in:.2f} s; the publisher's longest gap between acks "
        f"{publisher.longest_gap():.2f} s"
    )


def test_colocated_compose_topology_round_trip_and_clients_resume_after_a_node_is_killed(
    tmp_path: Path, cluster_prerequisites: None
) -> None:
    """compose.yaml with compose.colocated.yaml, as `docker compose -f ... -f ...` merges them:
    each node one `hexmq node` process (its commands and variables from the file, sections and
    all) beside its Redis, healthy once in the view; HAProxy finds the nodes' edges by the
    `edges` alias and checks their /readyz. A round trip through HAProxy, then a node's
    process and Redis killed: its subscriber resumes through HAProxy on another node."""
    with running_topology(tmp_path / "compose", {}, (COLOCATED,)) as run:
        assert sorted(run.servers()) == ["node-1", "node-2", "node-3"]
        assert run.compose.topology.services["node-1"].argv[:2] == ["hexmq", "node"]
        kill_a_node_and_resume(run, lambda n: [f"node-{n}", f"redis-{n}"])


@pytest.mark.fault
def test_a_membership_agent_restarted_alone_takes_its_node_out_of_the_view_and_back(
    tmp_path: Path, cluster_prerequisites: None
) -> None:
    """docs/deploy.md, "membership: Restart alone": a stopped agent ends its node's Consul
    session, so the node leaves the view at once (its partitions fail over); started again,
    the node is admitted again and takes back its partitions by handover. Clients through
    HAProxy see neither an error nor a disconnect, and lose nothing."""
    with running_topology(tmp_path / "compose", {}) as run:
        node = next(e for e in run.placed.values() if e != run.publisher_edge)
        n = node.removeprefix("edge-")
        other = next(f"membership-{k}" for k in "123" if k != n)
        before = agreed_view(run.topo, other)
        masters_before = sum(p.replicas[0] == f"n{n}" for p in before.partitions)
        assert masters_before > 0

        asked = time.monotonic()
        run.compose.stop([f"membership-{n}"])
        stopped = time.monotonic()  # its process has exited, its session ended
        wait_for(
            lambda: f"n{n}" not in {m.node_id for m in agreed_view(run.topo, other).members},
            5,
            f"n{n} leaves the view once its agent stopped",
        )
        left_after = time.monotonic() - stopped
        run.compose.up([f"membership-{n}"], timeout=20)
        wait_for(
            lambda: (
                sum(p.replicas[0] == f"n{n}" for p in agreed_view(run.topo, other).partitions)
                == masters_before
            ),
            30,
            f"n{n} admitted again and master of its {masters_before} partitions again",
        )
        back_after = time.monotonic() - stopped

        run.acked_after(10, timeout=15)
        publisher = run.finish()
        assert all(s.connected() for s in run.subs)
        assert all(s.resumed == [] for s in run.subs)
        print(
            f"membership-{n} took {stopped - asked:.2f} s to stop; n{n} left the view "
            f"{left_after:.2f} s after that, was master of its "
            f"partitions again after {back_after:.1f} s; the publisher's longest gap between "
            f"acks {publisher.longest_gap():.2f} s"
        )


def redis_answer(port: int, *commands: bytes) -> bytes:
    """What the Redis on `port` answers to inline commands on one fresh connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"".join(c + b"\r\n" for c in commands))
        answer = b""
        while answer.count(b"\r\n") < len(commands) and (chunk := sock.recv(4096)):
            answer += chunk
        return answer


def command_lines(compose: LocalCompose) -> dict[str, str]:
    """The command line of every process the topology runs, as `ps` shows it to any user."""
    lines = {}
    for name, run in compose.running.items():
        if run.proc.poll() is None:
            raw = Path(f"/proc/{run.proc.pid}/cmdline").read_bytes()
            lines[name] = raw.replace(b"\0", b" ").decode()
    return lines


def test_the_compose_topology_refuses_what_has_no_certificate_password_or_token(
    tmp_path: Path, cluster_prerequisites: None
) -> None:
    """The issue's attacks against the compose topology's configuration, the topology started
    as the file says (secrets service first): a gRPC Link to a partition service in plain text
    fails at the handshake; the node's Redis without the password answers NOAUTH; the agreement
    server without the token answers 403. Each with the secrets volume's credentials gets in,
    and no secret is on any process's command line."""
    workdir = tmp_path / "compose"
    topo = load_local_topology(COMPOSE, {}, volumes=volumes(workdir))
    with LocalCompose(topo, COMPOSE, workdir) as compose:
        partitions = [s.name for s in topo.with_alias("partitions")]
        with start_bounds.outside_test_timeout(start_bounds.scaled(240)):
            compose.up(["haproxy"], timeout=start_bounds.scaled(120))
            compose.wait_healthy(partitions, timeout=start_bounds.scaled(60))
        secrets = secrets_dir(topo)
        assert compose.completed("secrets")

        # gRPC: no certificate, no Link. The operator's certificate gets past the handshake,
        # and the partition service refuses it a Link (an edge's call) by its identity.
        hello = pb.Hello(edge_id="n1", edge_incarnation=1, protocol=THIS_RELEASE.to_proto())
        target = topo.address("partition-1", 7001)
        with grpc.insecure_channel(target) as plain:
            stream = pb_grpc.PartitionServiceStub(plain).Link(
                iter([pb.EdgeFrame(hello=hello)]), timeout=5
            )
            with pytest.raises(grpc.RpcError) as refused:
                next(iter(stream))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE, refused.value
        with operator_channel(topo, "partition-1", 7001) as channel:
            stream = pb_grpc.PartitionServiceStub(channel).Link(
                iter([pb.EdgeFrame(hello=hello)]), timeout=5
            )
            with pytest.raises(grpc.RpcError) as refused:
                next(iter(stream))
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED, refused.value
        assert agreed_view(topo, "membership-2").members, "the operator reads the view"

        # Redis: nothing without the password, but to authenticate.
        port = topo.port("redis-1", 6379)
        assert redis_answer(port, b"PING").startswith(b"-NOAUTH"), "no password"
        assert redis_answer(port, b"HGETALL hx:0:sessions").startswith(b"-NOAUTH")
        password = (secrets / "redis" / "n1.password").read_text().strip()
        assert redis_answer(port, b"AUTH hexmq " + password.encode(), b"PING") == (
            b"+OK\r\n+PONG\r\n"
        )

        # The agreement server (Consul's stand-in, with Consul's ACL config): 403 without the
        # token, whatever is asked; the token the membership agents send reads the view.
        base = f"http://{topo.address('consul', 8500)}"
        view_key = f"{base}/v1/kv/hexmq/hexmq/view"
        for method, url, body in (
            ("GET", view_key, None),
            ("PUT", view_key, b"forged"),
            ("PUT", f"{base}/v1/session/create", b"{}"),
        ):
            request = urllib.request.Request(url, data=body, method=method)
            with pytest.raises(urllib.error.HTTPError) as denied:
                urllib.request.urlopen(request, timeout=5)
            denied.value.close()
            assert denied.value.code == 403, (method, url)
        token = (secrets / "consul.token").read_text().strip()
        config = json.loads((secrets / "consul-acl.json").read_text())
        assert config["acl"]["tokens"]["initial_management"] == token
        request = urllib.request.Request(view_key, headers={"X-Consul-Token": token})
        with urllib.request.urlopen(request, timeout=5) as answer:
            assert answer.status == 200

        # Nothing secret on a command line, nor in the file's environment.
        secret_values = [token, *(f.read_text().strip() for f in secrets.glob("redis/*.password"))]
        for name, line in command_lines(compose).items():
            assert not [v for v in secret_values if v in line], f"{name}: a secret in {line!r}"
        for name, svc in topo.services.items():
            assert not [v for v in secret_values if v in json.dumps(svc.env)], name
        # Each key, token and password readable by its owner only.
        private = [*secrets.glob("tls/n*/*.key"), secrets / "consul.token"]
        private += [*secrets.glob("redis/*"), secrets / "consul-acl.json", secrets / "tls/ca.key"]
        assert {oct(os.stat(f).st_mode & 0o777) for f in private} == {"0o600"}
