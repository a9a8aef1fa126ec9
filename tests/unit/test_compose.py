"""deploy/compose/compose.yaml against the code: every hexmq command and HEXMQ_* variable in it
is one the service's real parser accepts (so the file cannot drift from the options), every
file a service names is one the file's `secrets` service makes (its own certificate, its own
node's password), no secret is on a command line, and the loader that turns it into local
processes (tests/support/compose_local.py) maps it right."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import shutil
import socket
import subprocess
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from hexmq.redis_security import HEXMQ_USER
from hexmq.trust import certs
from hexmq.trust.identity import Identity
from hexmq_cli import cli, secrets_cli
from hexmq_cli.cli import SERVICE_MODULES
from tests.support.compose_local import (
    ComposeError,
    LocalTopology,
    interpolate,
    load_local_topology,
)
from tests.support.compose_run import (
    COMPLETED,
    HEALTHY,
    MARKER,
    MAX_RESTARTS,
    STARTED,
    LocalCompose,
    _Running,
    depends_on_conditions,
)
from tests.support.options import OptionsRefused, parse_service

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
HAPROXY_CFG = ROOT / "deploy" / "compose" / "haproxy" / "haproxy.cfg"


def counting_ports(start: int = 30000):
    counter = itertools.count(start)
    return lambda: next(counter)


@pytest.fixture(scope="module")
def topology() -> LocalTopology:
    return load_local_topology(COMPOSE, allocate=counting_ports())


def run_secrets_service(topo: LocalTopology) -> None:
    """The file's secrets command, its volume a folder of the test's; the files stay this
    test's user's, root or not (tests/unit/test_secrets_cli.py checks the owners)."""
    (mount,) = topo.services["secrets"].mounts
    mount.local.mkdir(parents=True, exist_ok=True)
    argv = [
        f"{w.partition('=')[0]}={os.geteuid()}" if w.partition("=")[0] in secrets_cli.READERS else w
        for w in topo.services["secrets"].argv[1:]
    ]
    assert cli.main(argv) == 0


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> LocalTopology:
    """The topology with its volumes in a folder, after its secrets service ran: the files
    the services name exist, as when compose starts them."""
    topo = load_local_topology(
        COMPOSE, allocate=counting_ports(), volumes=tmp_path_factory.mktemp("volumes")
    )
    run_secrets_service(topo)
    return topo


HEXMQ_SERVICES = [
    (name, svc.argv[1])
    for name, svc in load_local_topology(COMPOSE, allocate=counting_ports()).services.items()
    if svc.kind == "hexmq" and svc.argv[1] in SERVICE_MODULES
]


def parse_as_the_service_would(service: str, argv: list[str], env: dict[str, str]) -> None:
    try:
        parse_service(service, argv[2:], env)
    except OptionsRefused as exc:
        raise AssertionError(f"{exc} (with {env})") from exc


@pytest.mark.parametrize(("name", "service"), HEXMQ_SERVICES, ids=[n for n, _ in HEXMQ_SERVICES])
def test_every_hexmq_command_in_compose_is_accepted_by_the_services_parser(
    name: str, service: str, secured: LocalTopology
) -> None:
    svc = secured.services[name]
    parse_as_the_service_would(service, svc.argv, svc.env)


def test_an_unknown_variable_in_compose_would_be_caught(topology: LocalTopology) -> None:
    svc = topology.services["edge-1"]
    with pytest.raises(AssertionError, match="no option for HEXMQ_FAILOVER_HOLDD"):
        parse_as_the_service_would("edge", svc.argv, {**svc.env, "HEXMQ_FAILOVER_HOLDD": "5"})


def test_compose_has_three_nodes_of_four_services_each(topology: LocalTopology) -> None:
    kinds = {n: s.kind for n, s in topology.services.items()}
    for node in (1, 2, 3):
        assert kinds[f"redis-{node}"] == "redis"
        for role in ("membership", "partition", "edge"):
            svc = topology.services[f"{role}-{node}"]
            assert svc.argv[:2] == ["hexmq", role]
            assert svc.env["HEXMQ_NODE_ID"] == f"n{node}"
    assert [s.name for s in topology.with_alias("edges")] == ["edge-1", "edge-2", "edge-3"]


def test_service_names_map_to_distinct_loopback_ports(topology: LocalTopology) -> None:
    edge = topology.services["edge-1"]
    assert edge.env["HEXMQ_LISTEN"] == topology.address("edge-1", 1883)
    assert edge.env["HEXMQ_MEMBERSHIP"] == topology.address("membership-1", 7000)
    assert edge.env["HEXMQ_METRICS_LISTEN"] == topology.address("edge-1", 9100)
    partition = topology.services["partition-2"]
    assert partition.env["HEXMQ_REDIS"] == f"redis://{topology.address('redis-2', 6379)}/0"
    membership = topology.services["membership-3"]
    assert membership.env["HEXMQ_CONSUL"] == topology.address("consul", 8500)
    assert membership.env["HEXMQ_PARTITION_ADDR"] == topology.address("partition-3", 7001)
    assert (
        edge.env["OTEL_EXPORTER_OTLP_ENDPOINT"]
        == f"http://{topology.address('otel-collector', 4317)}"
    )
    every = [p for s in topology.services.values() for p in s.ports.values()]
    assert len(every) == len(set(every)), "two (service, port) pairs share a local port"
    # The same container port of two services is two local ports.
    assert topology.port("edge-1", 9100) != topology.port("edge-2", 9100)


def test_ports_stay_distinct_when_the_allocator_repeats_itself() -> None:
    """A free port stays free until a process binds it, so a real allocator can hand the same
    port out twice in a row (CI once gave partition-3 its metrics port as its gRPC port)."""
    repeating = itertools.chain.from_iterable((p, p) for p in itertools.count(31000))
    topo = load_local_topology(COMPOSE, allocate=lambda: next(repeating))
    every = [p for s in topo.services.values() for p in s.ports.values()]
    assert len(every) == len(set(every)), "two (service, port) pairs share a local port"


def test_start_order_follows_depends_on(topology: LocalTopology) -> None:
    order = topology.start_order
    for node in (1, 2, 3):
        assert order.index("consul") < order.index(f"membership-{node}")
        assert order.index(f"redis-{node}") < order.index(f"partition-{node}")
        assert order.index(f"partition-{node}") < order.index(f"edge-{node}")
        assert order.index(f"edge-{node}") < order.index("haproxy")


def test_the_healthcheck_runs_against_the_services_own_port(topology: LocalTopology) -> None:
    edge = topology.services["edge-2"]
    assert edge.healthcheck == ["hexmq", "health"]
    assert edge.env["HEXMQ_METRICS_LISTEN"] == topology.address("edge-2", 9100)


def test_redis_runs_with_the_files_options_on_its_local_port(
    topology: LocalTopology, tmp_path: Path
) -> None:
    argv = topology.redis_argv("redis-1", tmp_path)
    assert argv[:9] == [
        "redis-server",
        "--appendonly",
        "yes",
        "--appendfsync",
        "everysec",
        "--save",
        "",
        "--aclfile",
        "/secrets/redis/n1.acl",
    ]
    assert argv[9:] == [
        "--port",
        str(topology.port("redis-1", 6379)),
        "--bind",
        "127.0.0.1",
        "--dir",
        str(tmp_path),
    ]


def test_haproxy_config_is_rendered_for_local_edges_and_haproxy_accepts_it(
    topology: LocalTopology, tmp_path: Path
) -> None:
    rendered = topology.render_haproxy(HAPROXY_CFG.read_text())
    for node in (1, 2, 3):
        mqtt, health = topology.port(f"edge-{node}", 1883), topology.port(f"edge-{node}", 9100)
        assert f"server edge-{node} 127.0.0.1:{mqtt} check port {health} " in rendered
    assert f"bind {topology.address('haproxy', 1883)}" in rendered
    directives = [ln for ln in rendered.splitlines() if not ln.lstrip().startswith("#")]
    assert not [ln for ln in directives if "resolvers" in ln or "server-template" in ln]
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    config = tmp_path / "haproxy.cfg"
    config.write_text(rendered)
    result = subprocess.run([haproxy, "-c", "-f", str(config)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING" not in result.stdout + result.stderr


def test_haproxy_starts_with_the_files_config_under_a_low_open_file_limit(tmp_path: Path) -> None:
    """HAProxy sizes maxconn to the open files it gets: with podman's default of 1024 (and
    no `ulimits` in the file) it starts and serves. A fixed `maxconn 100000` refused to."""
    topo = load_local_topology(COMPOSE)  # free loopback ports
    config = tmp_path / "haproxy.cfg"
    config.write_text(topo.render_haproxy(HAPROXY_CFG.read_text()))
    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    log = tmp_path / "haproxy.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            ["prlimit", "--nofile=1024:1024", haproxy, "-db", "-f", str(config)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        mqtt = ("127.0.0.1", topo.port("haproxy", 1883))
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"HAProxy exited {proc.returncode}: {log.read_text()}"
            with contextlib.suppress(OSError), socket.create_connection(mqtt, timeout=1):
                break
            assert time.monotonic() < deadline, f"HAProxy never listened: {log.read_text()}"
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(10)


def test_interpolation_takes_defaults_and_the_environment() -> None:
    value = {"a": "${X:-1}", "b": ["${Y-2}", "$$HOME", "${Z}"]}
    assert interpolate(value, {"Z": "z"}, "t") == {"a": "1", "b": ["2", "$HOME", "z"]}
    assert interpolate(value, {"X": "", "Y": "", "Z": "z"}, "t") == {
        "a": "1",
        "b": ["", "$HOME", "z"],
    }
    with pytest.raises(ComposeError, match=r"t.b: \$\{Z\} is not set"):
        interpolate(value, {}, "t")
    topo = load_local_topology(COMPOSE, {"HEXMQ_RF": "3"}, allocate=counting_ports())
    assert topo.services["membership-1"].env["HEXMQ_RF"] == "3"


@pytest.mark.parametrize(
    ("snippet", "message"),
    [
        (
            """
            edge-1:
              image: hexmq:0.1.0
              command: ["edge"]
              environment: {HEXMQ_MEMBERSHIP: "membership-9:7000"}
            """,
            "HEXMQ_MEMBERSHIP names membership-9:7000, but membership-9 is not a service",
        ),
        (
            """
            edge-1:
              image: hexmq:0.1.0
              command: ["serve"]
            """,
            "a hexmq service's command must start with one of edge, partition, membership",
        ),
        (
            """
            edge-1:
              image: hexmq:0.1.0
              command: ["edge"]
              depends_on: [partition-1]
            """,
            "service edge-1 depends on partition-1, which is not defined",
        ),
        (
            """
            a:
              image: hexmq:0.1.0
              command: ["edge"]
              depends_on: [b]
            b:
              image: hexmq:0.1.0
              command: ["edge"]
              depends_on: [a]
            """,
            "depends_on cycle: a -> b -> a",
        ),
    ],
)
def test_what_cannot_be_mapped_is_refused_clearly(
    snippet: str, message: str, tmp_path: Path
) -> None:
    path = tmp_path / "compose.yaml"
    path.write_text("services:\n" + textwrap.indent(textwrap.dedent(snippet), "  "))
    with pytest.raises(ComposeError) as caught:
        load_local_topology(path, allocate=counting_ports())
    assert message in str(caught.value)


# --- running the topology: what can be checked without starting anything ---------------------


def test_depends_on_conditions_are_compose_s() -> None:
    assert depends_on_conditions("a", {"depends_on": ["b", "c"]}) == [
        ("b", STARTED),
        ("c", STARTED),
    ]
    spec = {
        "depends_on": {
            "b": {"condition": "service_healthy"},
            "c": {},
            "d": {"condition": "service_completed_successfully"},
        }
    }
    assert depends_on_conditions("a", spec) == [("b", HEALTHY), ("c", STARTED), ("d", COMPLETED)]
    assert depends_on_conditions("a", {}) == []
    with pytest.raises(ComposeError, match="depends_on b with condition service_finished"):
        depends_on_conditions("a", {"depends_on": {"b": {"condition": "service_finished"}}})


def test_haproxy_needs_the_whole_cluster_and_nothing_of_the_observability_stack(
    topology: LocalTopology, tmp_path: Path
) -> None:
    compose = LocalCompose(topology, COMPOSE, tmp_path)
    needed = compose.needed(["haproxy"])
    nodes = [f"{role}-{n}" for n in (1, 2, 3) for role in ("redis", "membership", "partition")]
    assert set(needed) == {"secrets", "consul", "haproxy", *nodes, "edge-1", "edge-2", "edge-3"}
    assert needed[0] == "secrets"
    assert needed[-1] == "haproxy"
    assert needed.index("consul") < min(needed.index(f"membership-{n}") for n in (1, 2, 3))


def test_a_service_without_a_local_stand_in_is_refused_before_anything_starts(
    topology: LocalTopology, tmp_path: Path
) -> None:
    compose = LocalCompose(topology, COMPOSE, tmp_path)
    with pytest.raises(ComposeError, match=r"service jaeger \(cr.jaegertracing.io/\S+\) has no"):
        compose.up(["jaeger"], timeout=1)
    assert compose.running == {}


def _exited(tmp_path: Path, code: int) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(["/bin/sh", "-c", f"exit {code}"])
    proc.wait(10)
    return proc


def _check_for(compose: LocalCompose, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        compose.check_alive()
        time.sleep(0.02)


def test_a_service_that_exits_is_restarted_as_its_policy_says_then_named(
    topology: LocalTopology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # partition-1 has `restart: unless-stopped`: Docker starts it again after 100 ms, then
    # 200, 400; a test gives up after MAX_RESTARTS and names every exit.
    compose = LocalCompose(topology, COMPOSE, tmp_path)
    started: list[list[int]] = []

    def start(svc: Any, exits: Sequence[int] = ()) -> None:
        started.append(list(exits))
        compose.running[svc.name] = _Running(_exited(tmp_path, 1), log, exits=list(exits))

    monkeypatch.setattr(compose, "_start", start)
    log = tmp_path / "partition-1.log"
    log.write_text("no view from membership within 30s\n")
    compose.running["partition-1"] = _Running(_exited(tmp_path, 1), log)
    with pytest.raises(AssertionError) as gave_up:
        _check_for(compose, seconds=10)
    assert MAX_RESTARTS == 3
    assert started == [[1], [1, 1], [1, 1, 1]]
    assert "partition-1 exited with 1 (and before: [1, 1, 1])" in str(gave_up.value)
    assert "no view from membership" in str(gave_up.value)


def test_a_service_without_a_restart_policy_that_fails_is_named_at_once(
    topology: LocalTopology, tmp_path: Path
) -> None:
    compose = LocalCompose(topology, COMPOSE, tmp_path)
    log = tmp_path / "secrets.log"
    log.write_text("cannot write the CA\n")
    compose.running["secrets"] = _Running(_exited(tmp_path, 2), log)
    with pytest.raises(AssertionError, match=r"secrets exited with 2; its log ends:\n.*CA"):
        compose.check_alive()


def test_a_hexmq_service_gets_the_files_environment_and_not_the_shells(
    topology: LocalTopology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A variable in the shell that runs pytest must not stand in for one the file lacks.
    monkeypatch.setenv("HEXMQ_FAILOVER_HOLD", "3")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    env = LocalCompose(topology, COMPOSE, tmp_path).environment("edge-1")
    ours = {k: v for k, v in env.items() if k.startswith(("HEXMQ_", "OTEL_"))}
    assert ours == topology.services["edge-1"].env
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env[MARKER] == str(tmp_path)


def test_a_membership_setting_the_agent_refuses_would_be_caught(secured: LocalTopology) -> None:
    svc = secured.services["membership-1"]
    with pytest.raises(AssertionError, match="--session-ttl must be 10-86400"):
        parse_as_the_service_would("membership", svc.argv, {**svc.env, "HEXMQ_SESSION_TTL": "5"})


# --- secrets: made by the file's own one-shot service, each service given its own ------------

SECRETS_MOUNT = "/secrets"
# The services of a node that read the secrets volume.
ROLES = ("redis", "membership", "partition", "edge")


def test_the_secrets_command_is_accepted_by_its_parser_and_covers_every_node(
    topology: LocalTopology,
) -> None:
    svc = topology.services["secrets"]
    args = secrets_cli.build_parser("hexmq secrets").parse_args(svc.argv[2:])
    nodes = {s.env["HEXMQ_NODE_ID"] for s in topology.services.values() if "HEXMQ_NODE_ID" in s.env}
    assert args.nodes.split(",") == sorted(nodes)
    assert str(args.dir) == SECRETS_MOUNT
    assert args.consul_config
    # The users of the images that read the files: the hexmq image's (Dockerfile), redis's and
    # consul's (their images' `redis` and `consul` users).
    uid = re.search(r"^ARG HEXMQ_UID=(\d+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert uid
    assert dict(args.owner) == {
        "hexmq": secrets_cli.Owner(int(uid.group(1))),
        "redis": secrets_cli.Owner(999),
        "consul": secrets_cli.Owner(100),
    }


def test_every_service_that_reads_secrets_waits_for_them_and_mounts_them_read_only(
    topology: LocalTopology, tmp_path: Path
) -> None:
    spec = LocalCompose(topology, COMPOSE, tmp_path)._spec
    readers = [n for n in spec if any("/secrets" in str(v) for v in spec[n].get("volumes", []))]
    assert set(readers) >= {"consul", *(f"{r}-{n}" for r in ROLES for n in (1, 2, 3))}
    for name in readers:
        if name == "secrets":
            assert spec[name]["volumes"] == [f"secrets:{SECRETS_MOUNT}"]
            continue
        assert f"secrets:{SECRETS_MOUNT}:ro" in spec[name]["volumes"], name
        assert ("secrets", COMPLETED) in depends_on_conditions(name, spec[name]), name
    assert str(spec["secrets"]["restart"]) == "no"


def test_every_hexmq_service_presents_its_own_nodes_and_roles_certificate(
    topology: LocalTopology,
) -> None:
    for name, role in HEXMQ_SERVICES:
        env = topology.services[name].env
        node = env["HEXMQ_NODE_ID"]
        assert env["HEXMQ_CLUSTER_CA"] == f"{SECRETS_MOUNT}/tls/ca.crt", name
        assert env["HEXMQ_CLUSTER_CERT"] == f"{SECRETS_MOUNT}/tls/{node}/{role}.crt", name
        assert env["HEXMQ_CLUSTER_KEY"] == f"{SECRETS_MOUNT}/tls/{node}/{role}.key", name
        assert "HEXMQ_INSECURE_CLUSTER" not in env, name
        if role == "partition":
            assert env["HEXMQ_REDIS_USER"] == HEXMQ_USER
            assert env["HEXMQ_REDIS_PASSWORD_FILE"] == f"{SECRETS_MOUNT}/redis/{node}.password"
            (redis,) = [
                r.name
                for r in topology.of_kind("redis")
                if topology.address(r.name, 6379) in env["HEXMQ_REDIS"]
            ]
            assert topology.services[redis].argv[-2:] == [
                "--aclfile",
                f"{SECRETS_MOUNT}/redis/{node}.acl",
            ]
            assert (
                topology.services[redis].env["HEXMQ_REDIS_PASSWORD_FILE"]
                == (env["HEXMQ_REDIS_PASSWORD_FILE"])
            ), f"{redis}'s healthcheck logs in as {name} does"
        if role == "membership":
            assert env["HEXMQ_CONSUL_TOKEN_FILE"] == f"{SECRETS_MOUNT}/consul.token"


# What would put a secret on a command line or in the environment Compose shows
# (`docker compose config`, `docker inspect`): options and variables that take the secret itself.
SECRET_OPTIONS = ("--pass", "-a", "--requirepass", "--redis-password", "-token", "--token")
SECRET_VARIABLES = ("HEXMQ_REDIS_PASSWORD", "CONSUL_HTTP_TOKEN", "REDISCLI_AUTH", "CONSUL_TOKEN")


def test_no_secret_is_on_any_command_line_or_in_any_variable_of_the_file() -> None:
    doc = interpolate(yaml.safe_load(COMPOSE.read_text()), {}, "compose")
    for name, spec in doc["services"].items():
        command = spec.get("command", [])
        words = command.split() if isinstance(command, str) else [str(w) for w in command]
        health = [str(w) for w in (spec.get("healthcheck") or {}).get("test", [])]
        for word in [*words, *health]:
            assert word.split("=")[0] not in SECRET_OPTIONS, f"{name}: {word}"
            assert not re.search(r"\w+://[^/\s]*:[^/\s]*@", word), f"{name}: a password in {word}"
        for line in health:
            # The shell may only hand the password to redis-cli through its environment.
            assert not re.search(r"(-a|--pass)\s", line), f"{name}: {line}"
        for key, value in (spec.get("environment") or {}).items():
            assert key not in SECRET_VARIABLES, f"{name}: {key} holds a secret itself"
            assert not re.search(r"\w+://[^/\s]*:[^/\s]*@", str(value)), f"{name}: {key}"
            if re.search(r"PASSWORD|TOKEN|SECRET|_KEY$", key):
                assert str(value).startswith(f"{SECRETS_MOUNT}/"), f"{name}: {key}={value}"


def test_the_secrets_service_makes_every_file_the_services_name(secured: LocalTopology) -> None:
    """The file's secrets command, run here (its volume a folder), makes every file any
    service's environment, command or healthcheck names in the volume, and each certificate
    names the identity of the service given it."""
    topo = secured
    (mount,) = topo.services["secrets"].mounts
    volume = mount.local
    named = set()
    for svc in topo.services.values():
        for value in [*svc.env.values(), *svc.argv, *svc.healthcheck]:
            named |= set(re.findall(rf"{re.escape(str(volume))}/[\w./-]+", value))
    assert named, "the services name files of the secrets volume"
    for path in sorted(named):
        assert Path(path).is_file(), f"{path} is named by a service but not made"
    for name, role in HEXMQ_SERVICES:
        env = topo.services[name].env
        info = certs.describe(Path(env["HEXMQ_CLUSTER_CERT"]))
        assert info.identity == Identity(role, env["HEXMQ_NODE_ID"]), name
    config = json.loads((volume / "consul-acl.json").read_text())
    assert config["acl"]["tokens"]["initial_management"] == (
        (volume / "consul.token").read_text().strip()
    )


def test_volumes_map_to_folders_and_paths_under_them_are_rewritten(tmp_path: Path) -> None:
    topo = load_local_topology(COMPOSE, allocate=counting_ports(), volumes=tmp_path)
    consul = topo.services["consul"]
    assert f"-config-file={tmp_path}/secrets/consul-acl.json" in consul.argv
    assert consul.env["CONSUL_HTTP_TOKEN_FILE"] == f"{tmp_path}/secrets/consul.token"
    redis = topo.services["redis-2"]
    assert redis.argv[-2:] == ["--aclfile", f"{tmp_path}/secrets/redis/n2.acl"]
    assert {(m.target, m.read_only) for m in redis.mounts} == {("/data", False), ("/secrets", True)}
    edge = topo.services["edge-1"]
    assert edge.env["HEXMQ_CLUSTER_KEY"] == f"{tmp_path}/secrets/tls/n1/edge.key"
    # URLs and addresses are not paths.
    assert edge.env["OTEL_EXPORTER_OTLP_ENDPOINT"].startswith("http://127.0.0.1:")
    partition = topo.services["partition-1"]
    assert partition.env["HEXMQ_REDIS"] == f"redis://{topo.address('redis-1', 6379)}/0"
    haproxy = topo.services["haproxy"]
    (config,) = haproxy.mounts
    assert config.local == COMPOSE.parent / "haproxy" / "haproxy.cfg"
    assert not config.named


def test_the_stand_in_for_consul_gets_the_token_of_the_acl_config_consul_loads(
    tmp_path: Path, secured: LocalTopology
) -> None:
    compose = LocalCompose(secured, COMPOSE, tmp_path)
    args = compose._consul_dev_acl(secured.services["consul"])
    assert args[0] == "--acl-token-file"
    (mount,) = secured.services["secrets"].mounts
    assert Path(args[1]).read_text() == (mount.local / "consul.token").read_text()
    assert Path(args[1]).stat().st_mode & 0o777 == 0o600


def test_the_secrets_service_run_by_another_user_than_root_keeps_the_files(
    topology: LocalTopology, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compose = LocalCompose(topology, COMPOSE, tmp_path)
    as_root = compose._hexmq_argv(topology.services["secrets"])
    assert "redis=999" in as_root
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    mine = compose._hexmq_argv(topology.services["secrets"])
    assert [w for w in mine if "=" in w] == ["hexmq=1000", "redis=1000", "consul=1000"]
    assert compose._hexmq_argv(topology.services["edge-1"])[1:] == ["edge"]
