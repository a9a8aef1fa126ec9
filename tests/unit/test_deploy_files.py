"""The deployment files agree with the code and with each other, where no tool here can run
them: the Grafana dashboard asks only for metrics hexmq defines, the Collector's pipeline uses
only components it declares and writes where the Spark job reads, Prometheus and HAProxy probe
the port the services serve metrics on, and every image is pinned. (`make deploy-check` runs
the tools that do run here: Compose, the compose-spec schema, hadolint, haproxy -c.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from hexmq.telemetry import Metrics

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy" / "compose"


def compose() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return doc


def defined_series() -> set[str]:
    """Every series name hexmq's metrics produce (counters' _total, histograms' _bucket ...)."""

    class NoTracing:
        dropped_spans = 0
        failed_spans = 0

    metrics = Metrics()
    metrics.bind_tracing(NoTracing())
    names: set[str] = set()
    for family in metrics.registry.collect():
        suffixes = {
            "counter": ("_total", "_created"),
            "histogram": ("_bucket", "_sum", "_count", "_created"),
            "gauge": ("",),
        }.get(family.type, ("",))
        names |= {family.name + s for s in suffixes}
    return names


def test_the_dashboard_asks_only_for_metrics_hexmq_defines() -> None:
    dashboard = json.loads((DEPLOY / "grafana" / "dashboards" / "hexmq.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    assert exprs
    used = {m for e in exprs for m in re.findall(r"\bhexmq_[a-z0-9_]+", e)}
    assert used - defined_series() == set()
    # What the issue asks the dashboard to show.
    for metric in (
        "hexmq_connections",
        "hexmq_messages_in_total",
        "hexmq_messages_out_total",
        "hexmq_grpc_latency_seconds_bucket",
        "hexmq_replication_lag",
        "hexmq_view_epoch",
        "hexmq_failovers_total",
    ):
        assert metric in used, metric
    datasource = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text()
    )["datasources"][0]
    uids = {t["datasource"]["uid"] for p in dashboard["panels"] for t in p["targets"]}
    assert uids == {datasource["uid"]}
    panel_ids = [p["id"] for p in dashboard["panels"]]
    assert len(panel_ids) == len(set(panel_ids))


def test_the_collector_pipeline_uses_declared_components_and_writes_where_spark_reads() -> None:
    config = yaml.safe_load((DEPLOY / "otel-collector" / "config.yaml").read_text())
    for name, pipeline in config["service"]["pipelines"].items():
        for section in ("receivers", "processors", "exporters"):
            for component in pipeline.get(section, []):
                assert component in config[section], f"{name}: {section} {component} undefined"
    assert config["exporters"]["file/traces"]["format"] == "json"
    path = Path(config["exporters"]["file/traces"]["path"])
    services = compose()["services"]
    collector_mounts = dict(v.split(":")[:2][::-1] for v in services["otel-collector"]["volumes"])
    spark_mounts = dict(v.split(":")[:2][::-1] for v in services["spark"]["volumes"])
    volume = collector_mounts[str(path.parent)]
    spark_dir = next(d for d, v in spark_mounts.items() if v == volume)
    assert spark_dir in services["spark"]["command"], "the job reads the Collector's volume"
    endpoint = services["edge-1"]["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"]
    assert endpoint.endswith(config["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"][-5:])


def test_prometheus_and_haproxy_probe_the_metrics_port_the_services_serve() -> None:
    services = compose()["services"]
    port = int(services["edge-1"]["environment"]["HEXMQ_METRICS_LISTEN"].rpartition(":")[2])
    prometheus = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    hexmq_jobs = [j for j in prometheus["scrape_configs"] if j["job_name"].startswith("hexmq-")]
    aliases = {
        a
        for s in services.values()
        for net in (s.get("networks") or {}).values()
        for a in (net or {}).get("aliases", [])
    }
    assert {j["job_name"] for j in hexmq_jobs} == {
        "hexmq-edge",
        "hexmq-partition",
        "hexmq-membership",
    }
    for job in hexmq_jobs:
        for sd in job["dns_sd_configs"]:
            assert sd["port"] == port
            assert set(sd["names"]) <= aliases
    haproxy = (DEPLOY / "haproxy" / "haproxy.cfg").read_text()
    templates = [ln.split() for ln in haproxy.splitlines() if ln.strip().startswith("server-")]
    assert len(templates) == 2
    for words in templates:
        assert words[words.index("port") + 1] == str(port)
        assert "send-proxy-v2" in words
    assert "option httpchk GET /readyz" in haproxy


def test_every_image_is_pinned_by_tag() -> None:
    images = [s["image"] for s in compose()["services"].values() if "image" in s]
    dockerfile = (ROOT / "Dockerfile").read_text()
    images += re.findall(r"^FROM (\S+)", dockerfile, re.M)
    images += re.findall(r"^ARG PYTHON_IMAGE=(\S+)", dockerfile, re.M)
    for image in images:
        if image == "${PYTHON_IMAGE}":  # the ARG, checked on its own line
            continue
        if image.startswith("${"):  # the hexmq images: ${HEXMQ_IMAGE:-hexmq:0.1.0}
            image = image.split(":-", 1)[1].rstrip("}")
        name, _, tag = image.rpartition(":")
        assert name, f"{image} has no tag"
        assert tag not in ("latest", ""), image
        assert re.search(r"\d", tag), f"{image}: pin a version, not a moving name"


def test_the_compose_healthcheck_is_the_images() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    match = re.search(r"HEALTHCHECK (.*?)CMD (\[.*?\])", dockerfile, re.S)
    assert match
    healthcheck = compose()["x-hexmq"]["healthcheck"]
    assert healthcheck["test"] == ["CMD", *json.loads(match.group(2))]
    options = dict(re.findall(r"--([a-z-]+)=(\S+)", match.group(1)))
    for option in ("interval", "timeout", "start-period", "retries"):
        assert str(healthcheck[option.replace("-", "_")]) == options[option], option


def seconds(duration: str) -> float:
    """A Compose duration ("15s", "1m30s", "500ms") in seconds."""
    units = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts, duration
    assert "".join(n + u for n, u in parts) == duration, duration
    return sum(float(n) * units[u] for n, u in parts)


# Every container's probe starts at once on `up`; on a loaded 2-core host they took 5-6 s,
# and a 3 s timeout failed `up` ("container hexmq-partition-1-1 is unhealthy", issue 27).
MIN_HEALTHCHECK_TIMEOUT_S = 15.0
# The combinations of files make deploy-check validates (besides compose.yaml alone).
NODE4 = ("compose.yaml", "compose.node4.yaml")
COLOCATED = ("compose.yaml", "compose.colocated.yaml")


def test_healthchecks_hold_on_a_loaded_small_host() -> None:
    for files, at_least in ((NODE4, 14), (COLOCATED, 8)):
        checked = 0
        for name, spec in merged_compose(*files)["services"].items():
            healthcheck = spec.get("healthcheck")
            if healthcheck is None or healthcheck.get("disable"):
                continue
            checked += 1
            assert seconds(healthcheck["timeout"]) >= MIN_HEALTHCHECK_TIMEOUT_S, (files, name)
        assert checked >= at_least, files


def test_haproxy_asks_no_more_open_files_than_a_host_grants() -> None:
    """A fixed global maxconn needs about twice as many open files, which HAProxy refuses to
    start without, and compose `ulimits` above a host's hard limit fail on some hosts: both
    are left to the open files the engine grants, capped by fd-hard-limit."""
    globals_ = haproxy_sections()["global"]
    assert not [w for w in globals_ if w[0] == "maxconn"]
    assert ["fd-hard-limit", "200000"] in globals_
    assert "ulimits" not in compose()["services"]["haproxy"]


def haproxy_sections() -> dict[str, list[list[str]]]:
    """haproxy.cfg's sections ("resolvers dns", "backend edges-mqtt", ...) -> their lines."""
    sections: dict[str, list[list[str]]] = {}
    current: list[list[str]] = []
    for line in (DEPLOY / "haproxy" / "haproxy.cfg").read_text().splitlines():
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if line[:1] not in (" ", "\t"):
            current = sections.setdefault(" ".join(words), [])
        else:
            current.append(words)
    return sections


def test_haproxy_finds_the_edges_through_the_containers_own_resolver() -> None:
    """Docker's embedded DNS (127.0.0.11) is not there under podman: the resolvers come from
    /etc/resolv.conf, which every engine writes, and every server uses them."""
    sections = haproxy_sections()
    resolvers = [name.split()[1] for name in sections if name.startswith("resolvers ")]
    assert len(resolvers) == 1
    (name,) = resolvers
    lines = sections[f"resolvers {name}"]
    assert ["parse-resolv-conf"] in lines
    assert not [words for words in lines if words[0] == "nameserver"]
    (default_server,) = [w for w in sections["defaults"] if w[0] == "default-server"]
    assert default_server[default_server.index("resolvers") + 1] == name


def merged_compose(*files: str) -> dict[str, Any]:
    """The files as Compose v2 merges them (every profile), from the docker-compose binary
    of the dev dependencies (no engine needed)."""
    binary = Path(sys.executable).parent / "docker-compose"
    argv = [str(binary), "--profile", "observability", "--profile", "traces"]
    for name in files:
        argv += ["-f", str(DEPLOY / name)]
    out = subprocess.run(
        [*argv, "config", "--format", "json"], capture_output=True, text=True, check=True
    ).stdout
    doc: dict[str, Any] = json.loads(out)
    return doc


def needs(services: dict[str, Any], name: str) -> set[str]:
    """Every service `name` waits for, through depends_on, transitively."""
    found: set[str] = set()
    todo = [name]
    while todo:
        for dep in services[todo.pop()].get("depends_on", {}):
            if dep not in found:
                found.add(dep)
                todo.append(dep)
    return found


def test_the_hexmq_image_is_built_once() -> None:
    """One service builds each image; the others that run it only name it (a `build` on each
    hexmq service built the same image ten times). Node 4's and the co-located file add no
    build either."""
    for files in (("compose.yaml",), NODE4, COLOCATED):
        services = merged_compose(*files)["services"]
        builds: dict[str, list[str]] = {}
        for name, spec in services.items():
            if "build" in spec:
                builds.setdefault(spec["image"], []).append(name)
        assert builds == {"hexmq:0.1.0": ["secrets"], "hexmq-traces:0.1.0": ["spark"]}, files
        hexmq = [n for n, s in services.items() if s.get("image") == "hexmq:0.1.0"]
        assert len(hexmq) >= (4 if files == COLOCATED else 10)
        # Built before anything runs it: every other service of the image waits for `secrets`
        # (node 4's through secrets-4).
        for name in hexmq:
            if name != "secrets":
                assert "secrets" in needs(services, name), name
        build_args = services["secrets"]["build"].get("args", {})
        assert set(build_args) == {"EXTRA_CA_CERTS"}


def test_every_long_running_service_has_a_healthcheck() -> None:
    """Every service that stays up (a restart policy; not a one-shot) says when it is
    healthy, the observability and traces services too; HAProxy's asks the monitor-uri of
    its config, and the Collector's client comes from the one-shot it waits for."""
    for files in (NODE4, COLOCATED):
        merged = merged_compose(*files)["services"]
        long_running = [n for n, s in merged.items() if s.get("restart") == "unless-stopped"]
        assert {"haproxy", "otel-collector", "jaeger", "prometheus", "grafana"} <= set(long_running)
        for name in long_running:
            healthcheck = merged[name].get("healthcheck") or {}
            assert healthcheck.get("test"), (files, name)
            assert not healthcheck.get("disable"), (files, name)
    services = merged_compose(*NODE4)["services"]
    stats = haproxy_sections()["frontend stats"]
    (port,) = [w[1].lstrip(":") for w in stats if w[0] == "bind"]
    (uri,) = [w[1] for w in stats if w[0] == "monitor-uri"]
    assert services["haproxy"]["healthcheck"]["test"][-1] == f"http://127.0.0.1:{port}{uri}"
    assert ["monitor", "fail", "if", "{", "nbsrv(edges-mqtt)", "lt", "1", "}"] in stats
    collector = services["otel-collector"]
    tool = collector["healthcheck"]["test"][1]
    (tools,) = [v for v in collector["volumes"] if tool.startswith(v["target"] + "/")]
    filler = services["traces-volume"]
    assert any(v["source"] == tools["source"] for v in filler["volumes"])
    assert tool.removeprefix(tools["target"]) in " ".join(filler["command"])
    assert collector["depends_on"]["traces-volume"]["condition"] == "service_completed_successfully"
    config = yaml.safe_load((DEPLOY / "otel-collector" / "config.yaml").read_text())
    port = config["extensions"]["health_check"]["endpoint"].rpartition(":")[2]
    assert f":{port}/" in collector["healthcheck"]["test"][-1]


def test_stop_grace_periods_let_a_leave_finish_and_the_rest_stop_in_time() -> None:
    """SIGTERM to a hexmq service is a leave of up to --leave-timeout: the grace is longer,
    or the engine's SIGKILL cuts it short. Redis, Consul and HAProxy have one of their own
    (HAProxy's soft stop closes what is left by hard-stop-after, within it)."""
    nodes = 0
    for files in (NODE4, COLOCATED):
        services = merged_compose(*files)["services"]
        for name, spec in services.items():
            command = spec.get("command") or []
            if spec.get("image") == "hexmq:0.1.0" and command[:1] in (
                ["membership"],
                ["partition"],
                ["edge"],
                ["node"],
            ):
                # A co-located node's sections leave together (SIGTERM tells all three).
                leave_timeout = float(spec["environment"].get("HEXMQ_LEAVE_TIMEOUT", 60))
                assert seconds(spec["stop_grace_period"]) > leave_timeout + 10, (files, name)
                nodes += command[:1] == ["node"]
            elif name.startswith("redis-") or name in ("consul", "haproxy"):
                assert 5 <= seconds(spec["stop_grace_period"]) <= 30, (files, name)
    assert nodes == 3
    (hard_stop,) = [w for w in haproxy_sections()["global"] if w[0] == "hard-stop-after"]
    assert seconds(hard_stop[1]) < seconds(services["haproxy"]["stop_grace_period"])


def test_the_colocated_file_runs_each_node_as_one_process_in_place_of_its_three() -> None:
    """compose.colocated.yaml: per node one `hexmq node` container, each section accepted by
    its service's parser (HEXMQ_NODE_<SERVICE>_* included) with its own node's and role's
    certificate and a port of its own; healthy once the node is in the view (the agent's
    /readyz); the edge section where HAProxy and Prometheus look (alias `edges`, metrics on the
    port both probe); nothing of the separate services left to start."""
    from tests.support.options import parse_node

    separate = merged_compose("compose.yaml")["services"]
    services = merged_compose(*COLOCATED)["services"]
    edge_metrics = separate["edge-1"]["environment"]["HEXMQ_METRICS_LISTEN"]
    for n in (1, 2, 3):
        for role in ("membership", "partition", "edge"):
            assert f"{role}-{n}" not in services
        spec = services[f"node-{n}"]
        assert spec["command"][0] == "node"
        sections = parse_node(spec["command"][1:], spec["environment"], check_agent=False)
        for role, args in sections.items():
            assert args.node_id == f"n{n}"
            assert str(args.cluster_ca) == "/secrets/tls/ca.crt"
            assert str(args.cluster_cert) == f"/secrets/tls/n{n}/{role}.crt", role
            assert str(args.cluster_key) == f"/secrets/tls/n{n}/{role}.key", role
        listens = [a.listen for a in sections.values()]
        metrics = [a.metrics_listen for a in sections.values()]
        assert len(set(listens + metrics)) == 6, (listens, metrics)
        assert sections["edge"].metrics_listen == edge_metrics
        assert sections["membership"].advertise == f"node-{n}:7000"
        assert sections["membership"].partition_addr == f"node-{n}:7001"
        assert sections["partition"].redis == f"redis://redis-{n}:6379/0"
        assert str(sections["partition"].redis_password_file) == f"/secrets/redis/n{n}.password"
        assert str(sections["membership"].consul_token_file) == "/secrets/consul.token"
        agent_port = sections["membership"].metrics_listen.rpartition(":")[2]
        assert spec["healthcheck"]["test"][-1] == f"http://127.0.0.1:{agent_port}/readyz"
        assert spec["networks"]["default"]["aliases"] == ["edges"]
        assert spec["depends_on"][f"redis-{n}"]["condition"] == "service_healthy"
        assert spec["depends_on"]["consul"]["condition"] == "service_healthy"
        # The rest of the separate edge's container: its stop grace, secrets, image.
        for key in ("stop_grace_period", "volumes", "image", "restart", "init"):
            assert spec[key] == separate[f"edge-{n}"][key], key
    assert set(services["haproxy"]["depends_on"]) == {"node-1", "node-2", "node-3"}


def test_a_node_variable_no_section_reads_or_a_section_refuses_would_be_caught() -> None:
    from tests.support.options import OptionsRefused, parse_node

    spec = merged_compose(*COLOCATED)["services"]["node-1"]
    argv, env = spec["command"][1:], spec["environment"]
    with pytest.raises(OptionsRefused, match="no section of hexmq node has an option for"):
        parse_node(argv, {**env, "HEXMQ_NODE_EDGE_FAILOVER_HOLDD": "5"}, check_agent=False)
    with pytest.raises(OptionsRefused, match="HEXMQ_MAX_PACKET_SIZE='1M'"):
        parse_node(argv, {**env, "HEXMQ_NODE_EDGE_MAX_PACKET_SIZE": "1M"}, check_agent=False)
    with pytest.raises(OptionsRefused, match="the sections name different nodes"):
        parse_node(argv, {**env, "HEXMQ_NODE_EDGE_NODE_ID": "n2"}, check_agent=False)
