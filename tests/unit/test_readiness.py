"""Readiness: the edge's predicate, the loop-bound probe the HTTP thread asks, /healthz and
/readyz on a real metrics HTTP server, and `hexmq health` (the image's HEALTHCHECK) against it."""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry, Counter

from hexmq import health, service
from hexmq.api.membership.v1 import membership_pb2 as mpb
from hexmq.hashring import assign
from hexmq.readiness import (
    STARTING,
    STOPPING,
    LoopReadiness,
    Readiness,
    declared_by_health,
)
from hexmq.telemetry import start_metrics_server
from hexmq_cli import healthprobe
from services.edge.readiness import edge_readiness
from services.membership.main import membership_readiness


@dataclass
class FakeLink:
    ready: bool


def view_of(*nodes: str, partitions: int = 16, rf: int = 2) -> mpb.View:
    table = assign(nodes, partitions, rf)
    return mpb.View(
        epoch=3,
        partition_count=partitions,
        replication_factor=rf,
        members=[
            mpb.Member(node_id=n, partition_addr=f"{n}:7001", mqtt_addr=f"{n}:1883") for n in nodes
        ],
        partitions=[
            mpb.PartitionAssignment(partition=p, epoch=3, replicas=r, in_sync=r)
            for p, r in enumerate(table)
        ],
    )


# ----- the edge's predicate ---------------------------------------------------------------


def test_edge_without_a_view_is_not_ready() -> None:
    assert edge_readiness("n1", None, {}) == Readiness(False, "no view from membership yet")


def test_edge_whose_node_is_not_in_the_view_is_not_ready() -> None:
    view = view_of("n1", "n2")
    answer = edge_readiness("n3", view, {"n1": FakeLink(True), "n2": FakeLink(True)})
    assert answer == Readiness(False, "node n3 is not in view 3")


def test_a_standalone_edge_needs_no_node_of_its_own_in_the_view() -> None:
    # An edge of a pool (`--standalone`, its id no member's): ready once it routes everything.
    view = view_of("n1", "n2")
    links = {"n1": FakeLink(True), "n2": FakeLink(True)}
    assert edge_readiness("edge-0", view, links, standalone=True) == Readiness(
        True, "view 3: routes all 16 partitions"
    )
    assert edge_readiness("edge-0", None, links, standalone=True) == Readiness(
        False, "no view from membership yet"
    )
    links["n2"] = FakeLink(False)
    assert not edge_readiness("edge-0", view, links, standalone=True).ready


def test_edge_is_ready_when_every_partition_master_has_a_ready_link() -> None:
    view = view_of("n1", "n2", "n3")
    links = {n: FakeLink(True) for n in ("n1", "n2", "n3")}
    assert edge_readiness("n1", view, links) == Readiness(True, "view 3: routes all 16 partitions")


def test_edge_is_not_ready_while_a_master_link_is_down_or_missing() -> None:
    view = view_of("n1", "n2", "n3")
    mastered_by_n2 = sum(1 for p in view.partitions if p.replicas[0] == "n2")
    mastered_by_n3 = sum(1 for p in view.partitions if p.replicas[0] == "n3")
    assert mastered_by_n2 > 0
    assert mastered_by_n3 > 0
    links = {"n1": FakeLink(True), "n2": FakeLink(False)}  # n3: no link at all yet
    answer = edge_readiness("n1", view, links)
    assert not answer.ready
    assert answer.reason == (
        f"view 3: {mastered_by_n2 + mastered_by_n3} of 16 partitions have no master this edge "
        "can reach (masters n2, n3)"
    )
    # A follower's link does not matter: only masters route.
    links = {"n1": FakeLink(True), "n2": FakeLink(True), "n3": FakeLink(True)}
    assert edge_readiness("n1", view, links).ready


# ----- the membership agent's: its node in the view ------------------------------------------


def test_membership_agent_is_ready_once_the_view_lists_its_node() -> None:
    assert membership_readiness("n1", None) == Readiness(False, "no view agreed yet")
    view = view_of("n1", "n2")
    assert membership_readiness("n1", view) == Readiness(True, "view 3: 2 members")
    # Its node out of the view (not admitted yet, failed, left): it still serves the view, but
    # an orchestrator must not count the node as up (a rolling update waits for it).
    assert membership_readiness("n3", view) == Readiness(False, "view 3 does not list node n3")


# ----- the probe as another thread sees it --------------------------------------------------


async def ask_from_thread(readiness: LoopReadiness) -> Readiness:
    return await asyncio.to_thread(readiness)


async def test_loop_readiness_runs_the_probe_on_the_services_loop() -> None:
    readiness = LoopReadiness()
    assert await ask_from_thread(readiness) == STARTING
    ran_on: list[int] = []

    def probe() -> Readiness:
        ran_on.append(threading.get_ident())
        return Readiness(True, "fine")

    readiness.bind(asyncio.get_running_loop(), probe)
    assert await ask_from_thread(readiness) == Readiness(True, "fine")
    assert ran_on == [threading.get_ident()]  # this test runs on the loop's thread
    readiness.stopping()
    assert await ask_from_thread(readiness) == STOPPING
    assert readiness.check_on_loop() == STOPPING


async def test_a_blocked_loop_is_not_ready() -> None:
    readiness = LoopReadiness(timeout=0.2)
    readiness.bind(asyncio.get_running_loop(), lambda: Readiness(True, "fine"))
    answer: list[Readiness] = []
    asker = threading.Thread(target=lambda: answer.append(readiness()))
    asker.start()
    time.sleep(0.5)  # noqa: ASYNC251  (blocks the loop on purpose, as a stuck service would)
    asker.join(5)
    assert answer == [Readiness(False, "event loop did not answer within 0.2 s")]


async def test_a_probe_that_raises_reads_as_not_ready() -> None:
    readiness = LoopReadiness()

    def broken() -> Readiness:
        raise KeyError("n9")

    readiness.bind(asyncio.get_running_loop(), broken)
    answer = await ask_from_thread(readiness)
    assert not answer.ready
    assert answer.reason == "readiness probe failed: KeyError('n9')"


async def test_declared_health_is_the_default_readiness() -> None:
    class Server:  # what add_HealthServicer_to_server needs of a server
        def add_generic_rpc_handlers(self, handlers: object) -> None: ...

        def add_registered_method_handlers(self, name: str, handlers: object) -> None: ...

    servicer = health.add_health(Server())
    health._declare(None)
    assert not declared_by_health().ready
    await servicer.set("", health.SERVING)
    assert declared_by_health() == Readiness(True, "serving")
    await servicer.enter_graceful_shutdown()
    assert declared_by_health() == Readiness(False, "gRPC health is NOT_SERVING")
    health._declare(None)


# ----- HTTP: /healthz, /readyz beside /metrics, and `hexmq health` --------------------------


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_metrics_port_answers_healthz_readyz_and_metrics() -> None:
    registry = CollectorRegistry()
    Counter("hexmq_probe_test", "a metric", registry=registry).inc()
    state = {"answer": Readiness(False, "no view from membership yet")}
    server = start_metrics_server(
        "127.0.0.1", 0, registry=registry, readiness=lambda: state["answer"]
    )
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert get(f"{base}/healthz") == (200, "ok\n")
        assert get(f"{base}/readyz") == (503, "not ready: no view from membership yet\n")
        status, text = get(f"{base}/metrics")
        assert status == 200
        assert "hexmq_probe_test_total 1.0" in text
        state["answer"] = Readiness(True, "view 3: routes all 16 partitions")
        assert get(f"{base}/readyz") == (200, "ready: view 3: routes all 16 partitions\n")

        # The HEALTHCHECK command, reading the service's own --metrics-listen variable.
        env = {"HEXMQ_METRICS_LISTEN": f"0.0.0.0:{server.port}"}
        assert healthprobe.main([], env) == 0
        assert healthprobe.main(["--live"], env) == 0
        state["answer"] = Readiness(False, "shutting down")
        assert healthprobe.main([], env) == 1
        assert healthprobe.main(["--live"], env) == 0
    finally:
        server.close()
    assert healthprobe.main(["--live", "--timeout", "1"], env) == 1  # nobody answers


def test_metrics_server_without_readiness_says_starting() -> None:
    server = start_metrics_server("127.0.0.1", 0, registry=CollectorRegistry())
    try:
        assert get(f"http://127.0.0.1:{server.port}/readyz") == (503, "not ready: starting\n")
    finally:
        server.close()


@pytest.mark.parametrize(
    ("listen", "url"),
    [
        ("0.0.0.0:9100", "http://127.0.0.1:9100/readyz"),
        ("[::]:9100", "http://[::1]:9100/readyz"),
        ("10.1.2.3:9100", "http://10.1.2.3:9100/readyz"),
        ("edge-1:9100", "http://edge-1:9100/readyz"),
    ],
)
def test_health_probe_url_from_the_metrics_listen_address(listen: str, url: str) -> None:
    assert healthprobe.probe_url(listen, "/readyz") == url


def test_health_probe_needs_an_address(capsys: pytest.CaptureFixture[str]) -> None:
    assert healthprobe.main([], {}) == 2
    assert "set HEXMQ_METRICS_LISTEN" in capsys.readouterr().err
    assert healthprobe.main([], {"HEXMQ_METRICS_LISTEN": "9100"}) == 2
    assert "HEXMQ_METRICS_LISTEN must be HOST:PORT, got '9100'" in capsys.readouterr().err


async def test_a_closed_services_readiness_is_no_longer_withdrawn_on_a_signal() -> None:
    # A co-located node starts its partition service again in the process (hexmq_cli/node.py):
    # each run's readiness is the signal handler's while it runs, and only then.
    args = argparse.Namespace(trace_dir=None, metrics_listen=None)
    before = list(service._readiness)
    first = service.start_observability("partition", "n1", args)
    second = service.start_observability("partition", "n1", args)
    assert service._readiness == [*before, first.readiness, second.readiness]
    await first.close()
    assert service._readiness == [*before, second.readiness]
    await second.close()
    assert service._readiness == before
