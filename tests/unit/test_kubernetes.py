"""deploy/kubernetes without a cluster: every overlay renders (`kubectl kustomize`), is valid
against the Kubernetes JSON schemas (kubernetes-validate, strict) of the oldest and newest
Kubernetes it supports, runs the processes `hexmq cluster up` runs with the same options but
where tests/support/kubernetes_equivalence.py says why not (and a flag that does not exist, or
differs unsaid, fails), gets every file it names from the Secrets make-secrets.sh makes, and
keeps the lifecycle docs/kubernetes.md describes (readiness in the view, graceful leave, one
node at a time)."""

from __future__ import annotations

import base64
import copy
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hexmq import __version__
from hexmq.trust import certs
from hexmq.trust.identity import Identity
from hexmq_cli import localcluster
from tests.support.kubernetes import Image, kubectl, pods, render
from tests.support.kubernetes_equivalence import (
    CONSUL_DEV,
    EDGES,
    NODES,
    Comparison,
    compare,
    redis_conf_directives,
)

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p for p in (KUBERNETES / "overlays").iterdir() if p.is_dir())
# The Kubernetes versions the manifests are for: the oldest (gRPC probes are GA from 1.27) and
# the newest kubernetes-validate has schemas of. The Makefile's deploy-check uses the same.
KUBERNETES_VERSIONS = ("1.27.0", "1.37.0")
IDS = [p.name for p in OVERLAYS]
# The overlays built on dev (consul-dev in the cluster), and the one of co-located nodes.
ON_DEV = ("dev", "colocated")
COLOCATED = "colocated"


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {p.name: render(p) for p in OVERLAYS}


def test_there_is_a_dev_a_production_and_a_colocated_overlay() -> None:
    assert {"dev", "production", COLOCATED} <= {p.name for p in OVERLAYS}


@pytest.mark.parametrize("overlay", IDS)
def test_every_image_is_pinned_and_hexmqs_is_this_release(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    images = {
        c["image"]
        for d in rendered[overlay]
        if d["kind"] == "StatefulSet"
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    for image in images:
        name, _, tag = image.rpartition("/")[2].partition(":")
        assert re.search(r"\d", tag), f"{image}: pin a version, not a moving name"
        if name == "hexmq":
            assert tag == __version__, f"{image}: set the overlays' tag at a release"


@pytest.mark.parametrize("overlay", IDS)
def test_every_overlay_is_valid_for_the_kubernetes_versions_it_is_for(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    for doc in rendered[overlay]:
        for version in KUBERNETES_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)


def test_schema_validation_refuses_a_misspelt_field(
    rendered: dict[str, list[dict[str, Any]]],
) -> None:
    wrong = copy.deepcopy(
        next(
            d
            for d in rendered["dev"]
            if d["kind"] == "StatefulSet" and d["metadata"]["name"] == NODES
        )
    )
    wrong["spec"]["minReadySecondz"] = wrong["spec"].pop("minReadySeconds")
    with pytest.raises(kubernetes_validate.ValidationError, match="minReadySecondz"):
        kubernetes_validate.validate(wrong, KUBERNETES_VERSIONS[0], strict=True)


@pytest.mark.parametrize("overlay", IDS)
def test_every_overlay_runs_what_hexmq_cluster_up_runs(
    overlay: str, rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    result = compare(KUBERNETES / "overlays" / overlay, tmp_path, rendered[overlay])
    assert result.problems == [], result.report(verbose=True)
    assert result.compared["redis"] == result.compared["membership"] == 3
    assert result.compared["partition"] == 3
    assert result.compared["edge"] >= 2
    # Options that must be alike are, e.g. the first view's shape and every limit.
    assert {"expect", "partitions", "rf", "cluster", "session_ttl"} <= result.same["membership"]
    assert {"max_queued_messages", "redis_user", "replica_lag_timeout"} <= result.same["partition"]
    assert {"failover_hold", "max_packet_size", "proxy_protocol"} <= result.same["edge"]
    assert {"appendonly", "appendfsync", "save"} <= result.same["redis"]
    # A co-located node's edge is its node's own, as `up --colocated`'s: not standalone.
    assert (("edge", "standalone") in result.differences) == (overlay != COLOCATED)
    if overlay == COLOCATED:
        assert result.compared["edge"] == 3
        assert "standalone" in result.same["edge"]
    assert ("consul-dev" in result.compared) == (overlay in ON_DEV)


def problems_of(overlay: str, docs: list[dict[str, Any]], tmp_path: Path) -> list[str]:
    result: Comparison = compare(KUBERNETES / "overlays" / overlay, tmp_path, docs)
    return result.problems


def container(docs: list[dict[str, Any]], workload: str, name: str) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == workload]
    (spec,) = [c for c in doc["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    assert isinstance(spec, dict)
    return spec


def set_env(spec: dict[str, Any], name: str, value: str) -> None:
    spec["env"] = [e for e in spec["env"] if e["name"] != name] + [{"name": name, "value": value}]


def test_a_flag_or_variable_the_service_does_not_have_is_caught(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    docs = copy.deepcopy(rendered["dev"])
    set_env(container(docs, EDGES, "edge"), "HEXMQ_FAILOVER_HOLDD", "5")
    container(docs, NODES, "partition")["args"] = ["partition", "--no-such-flag"]
    problems = "\n".join(problems_of("dev", docs, tmp_path))
    assert "hexmq edge has no option for HEXMQ_FAILOVER_HOLDD" in problems
    assert "unrecognized arguments: --no-such-flag" in problems


def test_a_value_the_service_refuses_is_caught(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    docs = copy.deepcopy(rendered["production"])
    set_env(container(docs, NODES, "membership"), "HEXMQ_SESSION_TTL", "5")
    set_env(container(docs, EDGES, "edge"), "HEXMQ_MAX_PACKET_SIZE", "1M")
    problems = "\n".join(problems_of("production", docs, tmp_path))
    assert "--session-ttl must be 10-86400" in problems
    assert "HEXMQ_MAX_PACKET_SIZE='1M'" in problems


def test_an_option_that_differs_from_cluster_up_unsaid_is_caught(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    docs = copy.deepcopy(rendered["dev"])
    set_env(container(docs, NODES, "membership"), "HEXMQ_SESSION_TTL", "20")
    redis = container(docs, NODES, "redis")
    redis["args"][redis["args"].index("everysec")] = "always"
    problems = "\n".join(problems_of("dev", docs, tmp_path))
    assert "session_ttl is 20, `hexmq cluster up` gives 10" in problems
    assert "appendfsync is 'always', `hexmq cluster up` gives 'everysec'" in problems


def test_a_difference_on_purpose_must_still_say_the_right_thing(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    docs = copy.deepcopy(rendered["dev"])
    set_env(container(docs, NODES, "partition"), "HEXMQ_REDIS", "redis://127.0.0.1:6380/0")
    set_env(container(docs, NODES, "partition"), "HEXMQ_METRICS_LISTEN", "0.0.0.0:9100")
    set_env(container(docs, EDGES, "edge"), "HEXMQ_MEMBERSHIP", "hexmq-nodes:7000")
    membership = container(docs, NODES, "membership")
    set_env(membership, "HEXMQ_CLUSTER_CERT", "/etc/hexmq/tls/hexmq-node-0.crt")
    problems = "\n".join(problems_of("dev", docs, tmp_path))
    assert "expected redis://127.0.0.1:6379/0 (redis in this pod)" in problems
    assert "the probes ask port(s) [9101], not 9100" in problems
    assert "no Service hexmq-nodes" in problems
    assert "pod hexmq-node-1 container membership: cluster_cert=" in problems


def test_a_colocated_nodes_sections_are_checked_as_its_services_would_be(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """Each section of a co-located node pod's `hexmq node` against its service in `up
    --colocated`: a variable no section reads, a value a section differs in unsaid, a section
    given another role's certificate, two sections on one metrics port."""
    docs = copy.deepcopy(rendered[COLOCATED])
    node = container(docs, NODES, "node")
    set_env(node, "HEXMQ_NODE_EDGE_FAILOVER_HOLDD", "5")
    problems = "\n".join(problems_of(COLOCATED, docs, tmp_path))
    assert "no section of hexmq node has an option for HEXMQ_NODE_EDGE_FAILOVER_HOLDD" in problems
    docs = copy.deepcopy(rendered[COLOCATED])
    node = container(docs, NODES, "node")
    set_env(node, "HEXMQ_NODE_EDGE_MAX_PACKET_SIZE", "1000")
    set_env(node, "HEXMQ_NODE_PARTITION_CLUSTER_CERT", "/etc/hexmq/tls/edge/$(HEXMQ_NODE_ID).crt")
    set_env(node, "HEXMQ_NODE_EDGE_METRICS_LISTEN", "0.0.0.0:9101")
    problems = "\n".join(problems_of(COLOCATED, docs, tmp_path))
    assert "container node section edge: max_packet_size is 1000, `hexmq cluster up` gives" in (
        problems
    )
    assert (
        "section partition: cluster_cert='/etc/hexmq/tls/edge/hexmq-node-0.crt': expected key "
        "hexmq-node-0.crt of Secret hexmq-partition-tls, got ('hexmq-edge-tls'" in problems
    )
    assert "0.0.0.0:9101 is also the partition section's" in problems


def test_the_first_view_waits_for_no_more_nodes_than_the_statefulset_has(
    rendered: dict[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    docs = copy.deepcopy(rendered["dev"])
    (config,) = [d for d in docs if d["kind"] == "ConfigMap"]
    config["data"]["expect"] = "5"
    problems = "\n".join(problems_of("dev", docs, tmp_path))
    assert "expect=5: the first view would wait for 5 nodes, and hexmq-node has 3" in problems
    # A StatefulSet scaled up since: the first view's size stays what it was.
    config["data"]["expect"] = "2"
    assert problems_of("dev", docs, tmp_path) == []


# --- Secrets -----------------------------------------------------------------------------------


def make_secrets(
    tmp_path: Path, nodes: int, edges: int, *, colocated: bool = False
) -> dict[str, dict[str, bytes]]:
    """deploy/kubernetes/make-secrets.sh, run with this checkout's hexmq: Secret -> key ->
    content."""
    env = {
        **os.environ,
        "HEXMQ": f"{sys.executable} -m hexmq_cli",
        "KUBECTL": kubectl(),
        "PYTHONPATH": str(ROOT),
    }
    result = subprocess.run(
        [
            str(KUBERNETES / "make-secrets.sh"),
            *("--nodes", str(nodes), "--edges", str(edges), "--dir", str(tmp_path / "s")),
            *(["--colocated"] if colocated else []),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    secrets = {}
    for doc in yaml.safe_load_all(result.stdout):
        assert doc["kind"] == "Secret"
        secrets[doc["metadata"]["name"]] = {
            k: base64.b64decode(v) for k, v in doc.get("data", {}).items()
        }
    return secrets


@pytest.fixture(scope="module")
def dev_secrets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    # What docs/kubernetes.md has the dev overlay's reader run: --nodes 3 --edges 4.
    return make_secrets(tmp_path_factory.mktemp("secrets"), nodes=3, edges=4)


@pytest.fixture(scope="module")
def colocated_secrets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    # The co-located overlay's: --nodes 3 --edges 0 --colocated (no pool of edges).
    return make_secrets(tmp_path_factory.mktemp("secrets"), nodes=3, edges=0, colocated=True)


@pytest.mark.parametrize("overlay", IDS)
def test_make_secrets_makes_every_file_the_containers_name(
    overlay: str,
    rendered: dict[str, list[dict[str, Any]]],
    dev_secrets: dict[str, dict[str, bytes]],
    colocated_secrets: dict[str, dict[str, bytes]],
    tmp_path: Path,
) -> None:
    from tests.support.kubernetes import secret_files

    if overlay == COLOCATED:
        dev_secrets = colocated_secrets
    named = secret_files(pods(rendered[overlay], Image.load()))
    assert {s for s, _ in named} == {
        "hexmq-membership-tls",
        "hexmq-partition-tls",
        "hexmq-edge-tls",
        "hexmq-redis",
        "hexmq-consul",
    }
    for (secret, key), users in sorted(named.items()):
        assert key in dev_secrets[secret], f"{secret} has no {key}, which {users} read"
    # Each certificate names the identity of the role and pod that read it.
    for secret, files in dev_secrets.items():
        role = secret.removeprefix("hexmq-").removesuffix("-tls")
        for key, data in files.items():
            if key.endswith(".crt") and key != "ca.crt":
                path = tmp_path / key
                path.write_bytes(data)
                assert certs.describe(path).identity == Identity(role, key.removesuffix(".crt"))


def test_the_secrets_hold_each_nodes_redis_acl_as_cluster_up_writes_it(
    dev_secrets: dict[str, dict[str, bytes]], tmp_path: Path
) -> None:
    """The users and rules of redis.conf's ACL (cluster up) and of the Secret's ACL file are
    the same, but for the password hashes and `hexmq cluster`'s own operator user."""
    state = localcluster.plan_up(tmp_path / "hexmq", nodes=1)
    (redis,) = [p for p in localcluster.planned_processes(state) if p.service == "redis"]
    local = redis_conf_directives(redis.config or "")["user"].splitlines()

    def rules(lines: list[str]) -> list[str]:
        return [re.sub(r"#[0-9a-f]{64}", "#HASH", ln) for ln in lines if "operator" not in ln]

    acl = dev_secrets["hexmq-redis"]["hexmq-node-0.acl"].decode().splitlines()
    assert rules([ln.removeprefix("user ") for ln in acl if ln.strip()]) == rules(local)
    password = dev_secrets["hexmq-redis"]["hexmq-node-0.password"].decode().strip()
    assert password
    assert password not in "\n".join(acl)


def test_no_secret_is_on_a_command_line_or_in_a_variable(
    rendered: dict[str, list[dict[str, Any]]], dev_secrets: dict[str, dict[str, bytes]]
) -> None:
    values = {v.decode().strip() for files in dev_secrets.values() for v in files.values()}
    secrets = {v for v in values if "BEGIN CERTIFICATE" not in v and "user " not in v}
    for overlay, docs in rendered.items():
        for pod in pods(docs, Image.load()):
            for c in pod.containers.values():
                for word in [*c.argv, *c.env.values()]:
                    assert not any(s in word for s in secrets), f"{overlay} {c}"
                for name, value in c.env.items():
                    if re.search(r"PASSWORD|TOKEN|SECRET|_KEY$", name):
                        assert c.mounted_secret(value), f"{overlay} {c}: {name}={value}"


# --- lifecycle: readiness, leaving, one at a time ----------------------------------------------


@pytest.mark.parametrize("overlay", IDS)
def test_nodes_are_ready_in_the_view_leave_gracefully_and_go_one_at_a_time(
    overlay: str, rendered: dict[str, list[dict[str, Any]]]
) -> None:
    docs = rendered[overlay]
    by_name = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    nodes = by_name["StatefulSet", NODES]
    spec = nodes["spec"]
    # Every node at once (the first view waits for `expect` of them); updates one at a time.
    assert spec["podManagementPolicy"] == "Parallel"
    assert spec["updateStrategy"]["type"] == "RollingUpdate"
    assert "maxUnavailable" not in spec["updateStrategy"].get("rollingUpdate", {})
    # The leave (--leave-timeout, default 60 s) fits in the grace period.
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] > 60
    if overlay == COLOCATED:
        colocated_node_lifecycle(docs, by_name)
    else:
        separate_node_lifecycle(docs, by_name)
    # Discovery lists pods before they are ready (a node is ready once admitted).
    assert by_name["Service", NODES]["spec"]["publishNotReadyAddresses"] is True
    # No <SERVICE>_PORT variables next to the HEXMQ_* options.
    for d in docs:
        if d["kind"] == "StatefulSet":
            assert d["spec"]["template"]["spec"]["enableServiceLinks"] is False
    assert (("StatefulSet", CONSUL_DEV) in by_name) == (overlay in ON_DEV)


def env_value(spec: dict[str, Any], name: str) -> str:
    (value,) = [e["value"] for e in spec["env"] if e["name"] == name]
    return str(value)


def budget_fits(by_name: dict[tuple[str, str], Any], workload: str) -> None:
    """Evictions: one pod of the workload at a time."""
    budget = by_name["PodDisruptionBudget", workload]["spec"]
    assert budget["maxUnavailable"] == 1
    selected = by_name["StatefulSet", workload]["spec"]["selector"]["matchLabels"]
    assert budget["selector"]["matchLabels"] == selected


def separate_node_lifecycle(
    docs: list[dict[str, Any]], by_name: dict[tuple[str, str], Any]
) -> None:
    # Ready: the membership agent's /readyz (the view lists this node).
    membership = container(docs, NODES, "membership")
    assert membership["readinessProbe"]["httpGet"]["path"] == "/readyz"
    # Redis stays up until the partition service, done leaving, has exited.
    redis = container(docs, NODES, "redis")
    partition_metrics = env_value(container(docs, NODES, "partition"), "HEXMQ_METRICS_LISTEN")
    wait = " ".join(redis["lifecycle"]["preStop"]["exec"]["command"])
    assert f"127.0.0.1:{partition_metrics.rpartition(':')[2]}/healthz" in wait
    for workload in (NODES, EDGES):
        budget_fits(by_name, workload)
    # Edges: standalone, ready by gRPC health, a short drain before SIGTERM.
    edges = by_name["StatefulSet", EDGES]["spec"]["template"]["spec"]
    edge = container(docs, EDGES, "edge")
    assert {"name": "HEXMQ_STANDALONE", "value": "true"} in edge["env"]
    assert edge["readinessProbe"]["grpc"]["port"] == 9090
    assert (
        int(edge["lifecycle"]["preStop"]["exec"]["command"][1])
        < (edges["terminationGracePeriodSeconds"])
    )


def colocated_node_lifecycle(
    docs: list[dict[str, Any]], by_name: dict[tuple[str, str], Any]
) -> None:
    """A co-located node pod: Redis and `hexmq node`, ready when its edge takes clients (the
    node in the view, every partition routed), the clients' Service in front of the node pods,
    no pool of edges."""
    node = container(docs, NODES, "node")
    assert node["args"][0] == "node"
    health = env_value(node, "HEXMQ_HEALTH_LISTEN")
    assert node["readinessProbe"]["grpc"]["port"] == int(health.rpartition(":")[2])
    # Redis stays up until the process, its partition section done leaving, has exited.
    redis = container(docs, NODES, "redis")
    partition_metrics = env_value(node, "HEXMQ_NODE_PARTITION_METRICS_LISTEN")
    wait = " ".join(redis["lifecycle"]["preStop"]["exec"]["command"])
    assert f"127.0.0.1:{partition_metrics.rpartition(':')[2]}/healthz" in wait
    grace = by_name["StatefulSet", NODES]["spec"]["template"]["spec"]
    assert int(node["lifecycle"]["preStop"]["exec"]["command"][1]) < (
        grace["terminationGracePeriodSeconds"] - 60
    )
    budget_fits(by_name, NODES)
    for kind in ("StatefulSet", "Service", "PodDisruptionBudget"):
        assert (kind, EDGES) not in by_name
    labels = by_name["StatefulSet", NODES]["spec"]["template"]["metadata"]["labels"]
    mqtt = by_name["Service", "hexmq-mqtt"]["spec"]
    assert all(labels.get(k) == v for k, v in mqtt["selector"].items())
    assert {p["targetPort"] for p in mqtt["ports"]} <= {p["name"] for p in node["ports"]}
