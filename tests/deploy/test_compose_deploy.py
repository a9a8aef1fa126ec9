"""deploy/compose for real (`make test-deploy`, marker `deploy`, not in `make test`): the image
built from the project's Dockerfile and the topology run by Compose v2 with the machine's
container engine (tests/support/container_engine.py: Docker if it answers, else podman behind
its Docker-API socket), with the stand-in base images of compose.standin.yaml where the
registry images cannot be pulled (scripts/deploy-images.sh).

What a user of compose relies on: MQTT through HAProxy, spread over every edge; a persistent
QoS 1 subscriber on one node keeps receiving, and a QoS 1 publisher on another keeps being
acknowledged, while a third node's containers are killed, nothing acknowledged lost; the
killed node's containers started again rejoin (in the view, HAProxy sends it clients again);
`down -v` leaves no container, volume or network. Measured and printed (and written to
$HEXMQ_DEPLOY_RESULTS if set, as JSON): image size, build time, time from `up` to the first
acknowledged publish through HAProxy, the longest gaps of the publisher and the subscriber
while the node is down, the rejoin time, `down`'s time.
"""

from __future__ import annotations

import contextlib
import csv
import io
import itertools
import json
import os
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
import yaml

from tests.support.container_engine import Compose, ContainerEngine, EngineError
from tests.support.unique import uid
from tests.support.workload import Publisher, Subscriber, check

pytestmark = [pytest.mark.deploy, pytest.mark.timeout(3600)]

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "deploy" / "compose"
STANDIN = COMPOSE_DIR / "compose.standin.yaml"
HEXMQ_IMAGE = "hexmq:0.1.0"
NODE_ROLES = ("edge", "partition", "membership", "redis")
MQTT_BACKEND = "edges-mqtt"
# `up -d` runs, at most (a dependency unhealthy on an overloaded host fails one).
UP_ATTEMPTS = 2
# How long the publisher runs with a node down before the node comes back.
DOWN_FOR_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Deployment:
    engine: ContainerEngine
    compose: Compose
    mqtt: int
    stats: int
    work: Path
    results: dict[str, Any] = field(default_factory=dict)

    def haproxy_servers(self) -> dict[str, dict[str, str]]:
        """HAProxy's MQTT backend servers (its stats CSV): slot -> the row."""
        url = f"http://127.0.0.1:{self.stats}/stats;csv"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode().lstrip("# ")
        return {
            row["svname"]: row
            for row in csv.DictReader(io.StringIO(text))
            if row["pxname"] == MQTT_BACKEND and row["svname"] not in ("FRONTEND", "BACKEND")
        }

    def up_slots(self) -> int:
        """HAProxy's MQTT slots that are UP (its stats CSV; the others wait for a name)."""
        return sum(1 for row in self.haproxy_servers().values() if row["status"] == "UP")

    def edge_connections(self) -> dict[str, int]:
        """Each running edge's MQTT connections, from its own metrics (hexmq_connections):
        which edge HAProxy gave a client to (its stats show no address for a slot found by
        DNS)."""
        script = (
            "import urllib.request; print(urllib.request.urlopen("
            "'http://127.0.0.1:9100/metrics', timeout=10).read().decode())"
        )
        found = {}
        for c in self.engine.project_containers(self.compose.project):
            if c["Service"].startswith("edge-") and c["Running"]:
                metrics = self.engine.run("exec", c["Id"], "python", "-c", script, timeout=60)
                found[c["Service"]] = int(
                    sum(
                        float(line.split()[-1])
                        for line in metrics.splitlines()
                        if line.startswith("hexmq_connections")
                    )
                )
        return found

    def placed(
        self, edges: list[str], before: dict[str, int], who: str
    ) -> tuple[str, dict[str, int]]:
        """The edge HAProxy gave `who`'s new connection to (the one edge whose count went up by
        one since `before`), and the counts then. An edge samples its connections gauge
        periodically (services/edge/main.py), so a connection shows after up to a period:
        read until exactly one edge shows it (read at once, none did: a failed run)."""
        found: list[str] = []
        counts: dict[str, int] = {}

        def one() -> bool:
            nonlocal found, counts
            counts = self.edge_connections()
            found = [e for e in edges if counts[e] == before[e] + 1]
            return len(found) == 1

        wait_until(one, 30, f"{who}'s edge among the edges' connections")
        return found[0], counts

    def healthy(self, services: list[str]) -> bool:
        """Every one of these services' containers runs and its healthcheck passes."""
        states = {
            c["Service"]: c["Healthy"]
            for c in self.engine.project_containers(self.compose.project)
            if c["Service"] in services
        }
        return all(states.get(s) for s in services)


def wait_until(predicate: Any, timeout: float, what: str, every: float = 1.0) -> float:
    """Seconds it took for predicate() to hold; AssertionError after `timeout`."""
    began = time.monotonic()
    while True:
        with contextlib.suppress(OSError, ValueError, KeyError):
            if predicate():
                return time.monotonic() - began
        assert time.monotonic() - began < timeout, f"{what}: not within {timeout:.0f} s"
        time.sleep(every)


def first_acknowledged_publish(port: int, stop: threading.Event, out: dict[str, float]) -> None:
    """Connect through HAProxy and publish QoS 1 until one is acknowledged: when, in out."""
    while not stop.is_set():
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"first-{uid(6)}")
        try:
            client.connect("127.0.0.1", port, keepalive=30)
            client.loop_start()
            info = client.publish("deploy/first", b"1", qos=1)
            info.wait_for_publish(timeout=10)
            if info.is_published():
                out["acked_at"] = time.monotonic()
                return
        except (OSError, RuntimeError, ValueError):
            pass
        finally:
            client.loop_stop()
            with contextlib.suppress(OSError):
                client.disconnect()
        stop.wait(0.5)


def ports_override(tmp: Path, mqtt: int, stats: int, consul: int) -> Path:
    """This test's ports, free ones on loopback only, so it runs beside anything."""
    path = tmp / "compose.test-ports.yaml"
    override = {
        "services": {
            "haproxy": {"ports": [f"127.0.0.1:{mqtt}:1883", f"127.0.0.1:{stats}:8404"]},
            "consul": {"ports": [f"127.0.0.1:{consul}:8500"]},
        }
    }
    path.write_text(yaml.safe_dump(override).replace("ports:", "ports: !override"))
    return path


@pytest.fixture
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    work = tmp_path_factory.mktemp("deploy")
    with ContainerEngine.start(work / "engine") as engine:
        files = [COMPOSE_DIR / "compose.yaml"]
        registry_images = ["python:3.11.11-slim-bookworm", "redis:7.4.1-alpine"]
        standins = not engine.images_pullable(registry_images, timeout=60)
        if standins:
            assert STANDIN.exists()
            files.append(STANDIN)
            # Made once and kept in the engine's store (the script skips those present).
            script = ROOT / "scripts" / "deploy-images.sh"
            subprocess.run([str(script), engine.name], env=engine.env, check=True)
        mqtt, stats, consul = free_port(), free_port(), free_port()
        files.append(ports_override(work, mqtt, stats, consul))
        project = f"hexmqdeploy{uid(6).lower()}"
        ca = "".join(
            p.read_text() for p in sorted(Path("/usr/local/share/ca-certificates").glob("*.crt"))
        )
        compose = engine.compose(project, files, {"HEXMQ_BUILD_CA_CERTS": ca})
        run = Deployment(engine, compose, mqtt, stats, work)
        run.results.update(engine=engine.name, standins=standins, project=project)
        try:
            yield run
        finally:
            with contextlib.suppress(Exception):
                (work / "compose.log").write_text(compose.run("logs", "--no-color", check=False))
            compose.run("down", "-v", "--remove-orphans", "--timeout", "5", check=False)
            out = os.environ.get("HEXMQ_DEPLOY_RESULTS")
            if out:
                Path(out).write_text(json.dumps(run.results, indent=2) + "\n")
            print(json.dumps(run.results, indent=2))


def test_compose_runs_for_real_and_survives_a_node_killed(deployment: Deployment) -> None:
    run, compose, engine = deployment, deployment.compose, deployment.engine
    results = run.results

    # The image, built once (the secrets service's build; the other services name it).
    began = time.monotonic()
    compose.run("build", "--progress", "plain", "secrets", timeout=3600)
    results["build_s"] = round(time.monotonic() - began, 1)
    results["image_mb"] = round(engine.image_size(HEXMQ_IMAGE) / 1e6)

    with engine.healthchecks(compose.project):
        # Up, and the first QoS 1 publish through HAProxy acknowledged.
        stop = threading.Event()
        first: dict[str, float] = {}
        prober = threading.Thread(
            target=first_acknowledged_publish, args=(run.mqtt, stop, first), daemon=True
        )
        began = time.monotonic()
        prober.start()
        try:
            # A service that turns unhealthy on the way fails `up` (a node taken out of the
            # view on a host overloaded to a load of 40-50 does); its restart policy brings it
            # back, and `up` again goes on from there, as a user would run it again. Counted.
            for attempt in range(1, UP_ATTEMPTS + 1):
                try:
                    compose.run("up", "-d", timeout=1200)
                    break
                except EngineError as exc:
                    results.setdefault("up_failures", []).append(str(exc).splitlines()[-1])
                    if attempt == UP_ATTEMPTS:
                        raise
            results["up_returned_s"] = round(time.monotonic() - began, 1)
            prober.join(600)
        finally:
            stop.set()
        assert "acked_at" in first, "no QoS 1 publish through HAProxy was acknowledged"
        results["up_to_first_ack_s"] = round(first["acked_at"] - began, 1)

        # Every edge takes clients through HAProxy: three slots UP, and leastconn spreads
        # three clients over three different edges (Docker's 127.0.0.11 hard-coded resolved
        # every slot to the same edge under podman).
        edges = ["edge-1", "edge-2", "edge-3"]
        wait_until(lambda: run.up_slots() == 3, 300, "HAProxy: three edges UP")
        results["all_edges_up_s"] = round(time.monotonic() - began, 1)
        serving = [*edges, "haproxy", "membership-1", "membership-2", "membership-3"]
        wait_until(
            lambda: run.healthy(serving), 300, "edges, agents (in the view), HAProxy healthy"
        )
        results["all_healthy_s"] = round(time.monotonic() - began, 1)

        # A persistent QoS 1 subscriber and a QoS 1 publisher through HAProxy, on two
        # different edges (leastconn); the third node is the one killed.
        tag = uid(8)
        before = run.edge_connections()
        sub = Subscriber(f"s-{tag}", run.mqtt, f"deploy/{tag}/#", qos=1)
        sub.connect(timeout=30)
        sub_edge, after = run.placed(edges, before, "the subscriber")
        publisher = Publisher(f"p-{tag}", run.mqtt, f"deploy/{tag}/t", qos=1)
        publisher.start(interval=0.05)
        wait_until(lambda: len(publisher.acked) >= 20, 60, "the publisher's first acks", 0.2)
        wait_until(lambda: len(sub.payloads()) >= 20, 60, "the subscriber's first messages", 0.2)
        pub_edge, now = run.placed(edges, after, "the publisher")
        assert pub_edge != sub_edge, f"leastconn put both on {pub_edge}"
        (victim,) = [e for e in edges if e not in (sub_edge, pub_edge)]
        # A client of the node to be killed (subscribed to the publisher's messages).
        third = Subscriber(f"t-{tag}", run.mqtt, f"deploy/{tag}/#", qos=1)
        third.connect(timeout=30)
        third_edge, _ = run.placed(edges, now, "the third client")
        assert third_edge == victim, "HAProxy reaches all three"
        node = victim.removeprefix("edge-")
        results["placement"] = {"subscriber": sub_edge, "publisher": pub_edge, "killed": victim}

        # The third node's containers killed under traffic.
        killed = [f"{role}-{node}" for role in NODE_ROLES]
        acked_before = len(publisher.acked)
        killed_at = time.monotonic()
        # The engine's log timestamps are UTC: where the kill falls among them.
        results["killed_at"] = datetime.now(UTC).isoformat(timespec="milliseconds")
        compose.run("kill", *killed)
        # Where a dead node's time goes (measured, not asserted): when HAProxy marks its edge
        # down, and when its client sees its connection end (a dead container's address is
        # silent: no reset reaches anyone).
        seen: dict[str, float] = {}
        while time.monotonic() - killed_at < DOWN_FOR_S:
            if "haproxy_marked_down" not in seen and run.up_slots() < 3:
                seen["haproxy_marked_down"] = time.monotonic() - killed_at
            if "killed_nodes_client_disconnected" not in seen and not third.connected():
                seen["killed_nodes_client_disconnected"] = time.monotonic() - killed_at
            time.sleep(0.5)
        results["after_kill_s"] = {k: round(v, 1) for k, v in seen.items()}
        down_window = (killed_at, time.monotonic())
        # The failover's figures, in the results even when the rejoin below fails (a host
        # overloaded by other work); taken again after it, with the events that end a gap
        # still open now.
        results["publisher"] = longest_gap(publisher.acked.values(), down_window, "longest_ack_gap")
        results["subscriber"] = longest_gap(sub.received_at, down_window, "longest_gap")
        assert len(publisher.acked) > acked_before + 20, "the publisher kept being acknowledged"
        assert sub.connected(), "the subscriber of a surviving node stayed connected"

        # Started again: the node rejoins (its agent and edge ready: in the view), and HAProxy
        # sends it clients again.
        restarted_at = time.monotonic()
        compose.run("start", *killed, timeout=600)
        wait_until(
            lambda: run.healthy([f"membership-{node}", victim]) and run.up_slots() == 3,
            600,
            f"{victim}'s node back in the view and UP in HAProxy",
        )
        results["rejoin_s"] = round(time.monotonic() - restarted_at, 1)
        publisher.stop()
        wanted = {publisher.payload(n) for n in publisher.acked}
        wait_until(
            lambda: wanted <= set(sub.payloads()), 60, "every acknowledged message delivered"
        )
        check([publisher], [sub]).assert_clean()
        results["publisher"] = {
            "acked": len(publisher.acked),
            "unanswered": len(publisher.unanswered),
            "refused": len(publisher.refused),
            **longest_gap(publisher.acked.values(), down_window, "longest_ack_gap"),
        }
        results["subscriber"] = {
            "received": len(sub.payloads()),
            **longest_gap(sub.received_at, down_window, "longest_gap"),
        }
        assert not publisher.refused
        sub.close()
        third.close()

        # Without a Collector (no stand-in), each process says so once, not once per batch:
        # the publisher's node's services (never killed), one line per process each. A
        # container the engine restarted (its restart policy: a partition service that saw no
        # view within its --startup-timeout on a loaded host exits) ran more than one, and its
        # log holds every one's lines.
        pub_node = pub_edge.removeprefix("edge-")
        restarts = engine.restarts(compose.project)
        export_errors: dict[str, list[str]] = {}
        for service in [f"{r}-{pub_node}" for r in NODE_ROLES[:3]]:
            logs = compose.run("logs", "--no-color", service)
            export_errors[service] = [ln for ln in logs.splitlines() if "exporting traces" in ln]
        results["otlp_export_error_lines"] = sum(len(lines) for lines in export_errors.values())
        results["restarts"] = {s: n for s, n in restarts.items() if n}
        for service, lines in export_errors.items():
            assert len(lines) <= 1 + restarts.get(service, 0), (service, restarts, lines)

    # Every service's log, with the engine's timestamps, for what a run measured (down -v
    # deletes the containers and their logs).
    logs = compose.run("logs", "--no-color", "--timestamps", check=False)
    (run.work / "services.log").write_text(logs)

    # Down: graceful and quick, and nothing of the project left.
    began = time.monotonic()
    progress = compose.run_timed("down", "-v", timeout=900)
    results["down_s"] = round(time.monotonic() - began, 1)
    # When each container stopped, from the start of `down` (Compose's progress lines).
    results["down_stopped_at_s"] = {
        line.split()[1].removeprefix(f"{compose.project}-"): at
        for at, line in progress
        if line.split()[:1] == ["Container"] and line.split()[-1:] == ["Stopped"]
    }
    assert engine.project_leftovers(compose.project) == {}


def gap_within(times: Any, window: tuple[float, float]) -> tuple[float, float]:
    """The longest time between consecutive events, over the events in or next to window, and
    when it began, in seconds from the window's start (negative: before it)."""
    start, end = window
    ordered = sorted(times)
    inside = [t for t in ordered if start <= t <= end]
    before = [t for t in ordered if t < start][-1:]
    # Nothing after the window (none yet, or none came): the gap open at its end counts up to
    # it (a publisher never acknowledged again showed a longest gap of 0).
    after = [t for t in ordered if t > end][:1] or [end]
    points = [*before, *inside, *after]
    gaps = [(b - a, a - start) for a, b in itertools.pairwise(points)]
    return max(gaps, default=(0.0, 0.0))


def longest_gap(times: Any, window: tuple[float, float], name: str) -> dict[str, float]:
    """{name_s: the longest gap, name_began_s: when it began after the kill} (gap_within)."""
    gap, began = gap_within(times, window)
    return {f"{name}_s": round(gap, 2), f"{name}_began_s": round(began, 2)}
