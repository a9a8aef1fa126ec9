"""deploy/kubernetes against `hexmq cluster up`: every overlay starts the processes a local
cluster of the same shape starts, with the same options, except where the two must differ, each
such difference named with its reason (EXPECTED) and checked for what the manifests must say
instead.

    python -m tests.support.kubernetes_equivalence [-v] [OVERLAY ...]   (make deploy-check)

The manifests' side is tests/support/kubernetes.py: each pod's containers, command lines and
environments resolved as the kubelet would. A hexmq container is parsed by its service's real
parser, HEXMQ_* variables included (tests/support/options.py): a flag or variable the service
does not have, or a value it refuses, is a problem. The local side is
`hexmq_cli.localcluster.plan_up` and `planned_processes` for the overlay's shape (nodes, partitions,
RF, cluster name; the embedded agreement server when the overlay runs consul-dev, else `up
--consul ADDR`), parsed the same way. The two are compared option by option, Redis's directive by
directive (the local redis.conf against the container's arguments). Any other difference is a
problem, and so is one in EXPECTED whose value is not what its check wants.

Which pod stands for which local process: node pod hexmq-node-<i> for node i+1 (Redis,
membership, partition), every edge pod for node 1's edge (a local node's edge; the manifests'
edges belong to no node), the dev overlay's consul-dev for the local cluster's own agreement
server. An overlay whose node pods run `hexmq node` (components/colocated) is compared with `up
--colocated`: node pod hexmq-node-<i> for node i+1's Redis and `hexmq node`, section by section
(each parsed by its service's parser from the environment that section reads), the node's own
edge its edge section, with no edge pods.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexmq.trust.identity import EDGE, MEMBERSHIP, PARTITION
from hexmq_cli import localcluster
from hexmq_cli.clusterstate import NODE_PROCESS, node_sections
from tests.support.kubernetes import (
    OVERLAYS,
    Container,
    Image,
    ManifestError,
    Pod,
    pods,
    redis_directives,
    render,
    section_views,
)
from tests.support.options import OptionsRefused, parse_node, parse_service, section_env

# The workloads, by the names the manifests give them.
NODES, EDGES, CONSUL_DEV = "hexmq-node", "hexmq-edge", "hexmq-consul-dev"
NODE_CONTAINERS = ("redis", "membership", "partition")
# A co-located node pod's: Redis, and `hexmq node` (its sections: membership, partition, edge).
COLOCATED_CONTAINERS = ("redis", NODE_PROCESS)


@dataclass
class Context:
    """What a check of a manifest value may look at."""

    docs: list[dict[str, Any]]
    pods: list[Pod]
    container: Container
    local: Any  # the local process's parsed options (argparse.Namespace) or Redis directives

    @property
    def pod(self) -> Pod:
        return self.container.pod

    def sibling(self, name: str) -> Container:
        """A container of the pod, or a section of its `hexmq node` (a co-located node)."""
        return self.pod.sections.get(name) or self.pod.containers[name]

    def service(self, name: str) -> dict[str, Any]:
        for d in self.docs:
            if d["kind"] == "Service" and d["metadata"]["name"] == name:
                return d
        raise ManifestError(f"no Service {name}")

    def workload(self, name: str) -> list[Pod]:
        return [p for p in self.pods if p.workload == name]


Check = Callable[[Context, Any], str | None]


@dataclass(frozen=True)
class Expected:
    """An option where the manifests differ from `hexmq cluster up` on purpose."""

    why: str
    # What the manifests must say instead: None when they do, else what is wrong.
    check: Check


def _listen(port_name: str) -> Check:
    def check(ctx: Context, value: Any) -> str | None:
        want = f"0.0.0.0:{ctx.container.port(port_name)}"
        return None if value == want else f"expected {want} (container port {port_name})"

    return check


def _metrics(ctx: Context, value: Any) -> str | None:
    """Every address of the pod (its containers share one network), a port of its own, the
    one its probes ask."""
    probes = {ctx.container.probe_port(k) for k in ("readinessProbe", "livenessProbe")}
    if ctx.container.hexmq == "edge":
        # The edge's readiness is gRPC health on --health-listen; /healthz is on this port.
        probes = {ctx.container.probe_port("livenessProbe")}
    if not isinstance(value, str) or not value.startswith("0.0.0.0:"):
        return "expected 0.0.0.0:PORT (the pod's address, for the kubelet's probes)"
    port = int(value.rpartition(":")[2])
    if ctx.container.process is not None:
        return _section_metrics(ctx, value, port)
    if probes != {port}:
        return f"the probes ask port(s) {sorted(p for p in probes if p)}, not {port}"
    taken = [
        c.name
        for c in ctx.pod.containers.values()
        if c is not ctx.container and c.env.get("HEXMQ_METRICS_LISTEN") == value
    ]
    return f"{value} is also {', '.join(taken)}'s" if taken else None


def _section_metrics(ctx: Context, value: str, port: int) -> str | None:
    """A `hexmq node` section's: a container port of its own (each section still serves its
    metrics endpoint, on the process's one registry), and the process's liveness probe asks
    one of the sections' ports."""
    try:
        ctx.container.port(port)
    except ManifestError as exc:
        return str(exc)
    served = {s.name: s.options.get("metrics_listen") for s in ctx.pod.sections.values()}
    taken = [name for name, v in served.items() if name != ctx.container.name and v == value]
    if taken:
        return f"{value} is also the {', '.join(taken)} section's"
    ports = {int(str(v).rpartition(":")[2]) for v in served.values() if v}
    probed = ctx.container.probe_port("livenessProbe")
    return None if probed in ports else f"the liveness probe asks {probed}, no section's port"


def _pod_name(ctx: Context, value: Any) -> str | None:
    return None if value == ctx.pod.name else f"expected the pod's name, {ctx.pod.name}"


def _secret_file(secret: str, key: Callable[[Context], str]) -> Check:
    def check(ctx: Context, value: Any) -> str | None:
        found = ctx.container.mounted_secret(str(value))
        want = (secret, key(ctx))
        return None if found == want else f"expected key {want[1]} of Secret {secret}, got {found}"

    return check


def _pod_dns(container: str, port_name: str) -> Check:
    """The pod's name under its headless Service, and a container port of `container`."""

    def check(ctx: Context, value: Any) -> str | None:
        svc = ctx.service(ctx.pod.workload)
        if svc["spec"].get("clusterIP") != "None":
            return f"Service {ctx.pod.workload} is not headless: pods have no names in it"
        port = ctx.sibling(container).port(port_name)
        want = f"{ctx.pod.name}.{ctx.pod.workload}.{ctx.pod.namespace}.svc:{port}"
        return None if value == want else f"expected {want} (the pod's DNS name)"

    return check


def _in_pod(container: str) -> Check:
    """127.0.0.1 and the port a container of the same pod listens on."""

    def check(ctx: Context, value: Any) -> str | None:
        sibling = ctx.sibling(container)
        if container == "redis":
            port = sibling.options.get("port")
            want = f"redis://{sibling.options.get('bind')}:{port}/0"
        else:
            port = str(sibling.options.get("listen", "")).rpartition(":")[2]
            want = f"127.0.0.1:{port}"
        return None if value == want else f"expected {want} ({container} in this pod)"

    return check


def _service_of(workload: str, port_name: str) -> Callable[[Context, str], str | None]:
    """None if `value` is HOST:PORT of a Service that selects `workload`'s pods, with a port
    whose targetPort is that container port."""

    def check(ctx: Context, value: str) -> str | None:
        host, _, port = value.rpartition(":")
        name = host.split(".")[0]
        suffix = host[len(name) :]
        if suffix not in ("", f".{ctx.pod.namespace}.svc", f".{ctx.pod.namespace}"):
            return f"{host} is not a Service of namespace {ctx.pod.namespace}"
        try:
            svc = ctx.service(name)
        except ManifestError as exc:
            return str(exc)
        targets = ctx.workload(workload)
        if not targets:
            return f"no pods of {workload}"
        labels = _template_labels(ctx.docs, workload)
        selector = svc["spec"].get("selector", {})
        if not selector or any(labels.get(k) != v for k, v in selector.items()):
            return f"Service {name} does not select the pods of {workload}"
        for p in svc["spec"]["ports"]:
            if str(p["port"]) == port and p.get("targetPort") in (port_name, int(port)):
                return None
        return f"Service {name} has no port {port} to {workload}'s {port_name}"

    return check


def _template_labels(docs: Sequence[dict[str, Any]], workload: str) -> dict[str, str]:
    for d in docs:
        if d["kind"] == "StatefulSet" and d["metadata"]["name"] == workload:
            return dict(d["spec"]["template"]["metadata"].get("labels", {}))
    return {}


def _membership_service(ctx: Context, value: Any) -> str | None:
    return _service_of(NODES, "membership")(ctx, str(value))


def _consul(ctx: Context, value: Any) -> str | None:
    if not ctx.workload(CONSUL_DEV):
        return None  # an external Consul: the ConfigMap names it, nothing here to match
    return _service_of(CONSUL_DEV, "http")(ctx, str(value))


def _expect(ctx: Context, value: Any) -> str | None:
    nodes = len(ctx.workload(NODES))
    if isinstance(value, int) and 1 <= value <= nodes:
        return None
    return f"the first view would wait for {value} nodes, and {NODES} has {nodes} replicas"


def _discovery(ctx: Context, value: Any) -> str | None:
    return None if value == "dns" else "expected dns (the headless Service's records)"


def _discovery_name(ctx: Context, value: Any) -> str | None:
    svc = ctx.service(NODES)
    if not svc["spec"].get("publishNotReadyAddresses"):
        return f"Service {NODES} must publish not-ready pods: a node is ready once admitted"
    want = f"{NODES}.{ctx.pod.namespace}.svc"
    return None if value == want else f"expected {want}"


def _equals(want: Any, what: str) -> Check:
    def check(ctx: Context, value: Any) -> str | None:
        return None if value == want else f"expected {want!r} ({what})"

    return check


def _host_port(ctx: Context, value: Any) -> str | None:
    return None if isinstance(value, str) and ":" in value else "expected HOST:PORT"


def _claim(ctx: Context, value: Any) -> str | None:
    claim = ctx.container.mounted_claim(str(value))
    return None if claim else f"{value} is not a volume of the pod's own (volumeClaimTemplates)"


def _consul_token(ctx: Context, value: Any) -> str | None:
    return _secret_file("hexmq-consul", lambda _: "token")(ctx, value)


def _tls(role: str) -> dict[str, Expected]:
    secret = f"hexmq-{role}-tls"
    holders = "edge" if role == EDGE else "node"
    why = (
        f"files of Secret {secret} (mounted read-only), not DIR/tls: every {holders}'s {role} "
        "certificate is in it, each pod takes its own by name"
    )
    return {
        "cluster_ca": Expected(why, _secret_file(secret, lambda _: "ca.crt")),
        "cluster_cert": Expected(why, _secret_file(secret, lambda c: f"{c.pod.name}.crt")),
        "cluster_key": Expected(why, _secret_file(secret, lambda c: f"{c.pod.name}.key")),
    }


NODE_ID = Expected(
    "the pod's name (stable: StatefulSet ordinal), not n<i>; node i of `cluster up` is pod "
    "ordinal i-1",
    _pod_name,
)
LISTEN_ANY = "every address of the pod, not a loopback port of the node's block"
METRICS = Expected(
    "every address of the pod, on a port of its own in the pod (the kubelet probes it)", _metrics
)
STARTUP = Expected(
    "a pod's containers start together, and images may take minutes to pull: 120 s, not 30",
    _equals(120.0, "HEXMQ_STARTUP_TIMEOUT"),
)

# service -> option (argparse dest) -> why the manifests differ from `hexmq cluster up`, and
# what they must say instead. Every other option must be equal.
EXPECTED: dict[str, dict[str, Expected]] = {
    "membership": {
        "node_id": NODE_ID,
        "listen": Expected(LISTEN_ANY, _listen("membership")),
        "advertise": Expected(
            "other nodes reach the agent at the pod's DNS name (cluster up: its --listen)",
            _pod_dns("membership", "membership"),
        ),
        "partition_addr": Expected(
            "the partition service's pod DNS name, as peers and edges reach it",
            _pod_dns("partition", "partition"),
        ),
        "mqtt_addr": Expected(
            "a node pod has no edge: the address clients use (ConfigMap hexmq mqtt-addr)",
            _host_port,
        ),
        "metrics_listen": METRICS,
        "consul": Expected(
            "Consul as the pods reach it: consul-dev's Service (dev) or an external Consul",
            _consul,
        ),
        "consul_token_file": Expected(
            "the token in Secret hexmq-consul (an external Consul's too, which `cluster up "
            "--consul` gives none)",
            _consul_token,
        ),
        "expect": Expected(
            "the nodes the first view waits for: the replicas the cluster was made with (cluster "
            "up: its --nodes); scaling later leaves it",
            _expect,
        ),
        "discovery": Expected(
            "who belongs: the node pods, by the headless Service's DNS records (cluster up has "
            "no DNS to ask; its agents admit every node that registers)",
            _discovery,
        ),
        "discovery_dns_name": Expected(
            "the headless Service hexmq-node, not-ready pods published", _discovery_name
        ),
        **_tls(MEMBERSHIP),
    },
    "partition": {
        "node_id": NODE_ID,
        "listen": Expected(LISTEN_ANY, _listen("partition")),
        "redis": Expected("the Redis container of the same pod, on its own port", _in_pod("redis")),
        "membership": Expected("the agent in the same pod, on its own port", _in_pod("membership")),
        "redis_password_file": Expected(
            "key <node>.password of Secret hexmq-redis, not DIR/node<i>/redis.password",
            _secret_file("hexmq-redis", lambda c: f"{c.pod.name}.password"),
        ),
        "metrics_listen": METRICS,
        "startup_timeout": STARTUP,
        **_tls(PARTITION),
    },
    "edge": {
        "node_id": Expected(
            "an edge of the pool has an id of its own, its pod's name: no node's",
            _pod_name,
        ),
        "standalone": Expected(
            "the edges are a workload of their own, scaled on their own, belonging to no node",
            _equals(True, "HEXMQ_STANDALONE"),
        ),
        "listen": Expected(LISTEN_ANY, _listen("mqtt")),
        "ws_listen": Expected(
            "MQTT over WebSocket too, as compose.yaml serves it", _listen("mqtt-ws")
        ),
        "health_listen": Expected(
            "gRPC health in plain text for the kubelet's grpc readiness probe",
            lambda ctx, v: (
                None
                if v == f"0.0.0.0:{ctx.container.probe_port('readinessProbe')}"
                else "expected the readiness probe's port"
            ),
        ),
        "membership": Expected(
            "any node's agent, through Service hexmq-membership (cluster up: its node's)",
            _membership_service,
        ),
        "metrics_listen": METRICS,
        "startup_timeout": STARTUP,
        **_tls(EDGE),
    },
    "consul-dev": {
        "listen": Expected(LISTEN_ANY, _listen("http")),
        "data_dir": Expected("the pod's own volume, not DIR/consul", _claim),
        "acl_token_file": Expected(
            "the agents' token, Secret hexmq-consul (cluster up: DIR/consul.token)",
            _consul_token,
        ),
    },
}

# Where a co-located node (`hexmq node`, against `up --colocated`) differs otherwise: its edge
# section is the node's own edge, as up's, reaching its agent in process.
COLOCATED_EXPECTED: dict[str, dict[str, Expected]] = {
    "membership": {
        **EXPECTED["membership"],
        "mqtt_addr": Expected(
            "the address clients use (ConfigMap hexmq mqtt-addr): Service hexmq-mqtt, in front "
            "of every node's edge (cluster up: its node's edge's)",
            _host_port,
        ),
    },
    "partition": EXPECTED["partition"],
    "consul-dev": EXPECTED["consul-dev"],
    "edge": {
        **{k: v for k, v in EXPECTED["edge"].items() if k not in ("standalone", "node_id")},
        "node_id": NODE_ID,
        "membership": Expected(
            "the agent in the same process, on its own port", _in_pod("membership")
        ),
    },
}

# Redis directive -> why the manifests differ there, and their check. Every other directive
# (appendonly, appendfsync, save, bind ...) must be equal.
REDIS_EXPECTED: dict[str, Expected] = {
    "port": Expected(
        "Redis's own port in the pod (the partition service's --redis names it)",
        lambda ctx, v: None if v == "6379" else "expected 6379",
    ),
    "dir": Expected("the pod's own volume, not DIR/node<i>/redis", _claim),
    "logfile": Expected(
        "to stderr, the container's log (cluster up: DIR/node<i>/redis.log)",
        _equals(None, "no logfile"),
    ),
    "protected-mode": Expected(
        "Redis's default (yes), which cluster up writes out", _equals(None, "the default")
    ),
    "daemonize": Expected("Redis's default (no)", _equals(None, "the default")),
    "set-proc-title": Expected(
        "cluster up finds its processes by argv; a container needs not",
        _equals(None, "the default"),
    ),
    "user": Expected(
        "the ACL in --aclfile, key <node>.acl of Secret hexmq-redis (the same users and rules: "
        "the secrets test compares them), not in redis.conf; no `operator` user, which only "
        "`hexmq cluster` uses",
        _equals(None, "no inline user"),
    ),
    "aclfile": Expected(
        "the ACL file of Secret hexmq-redis",
        _secret_file("hexmq-redis", lambda c: f"{c.pod.name}.acl"),
    ),
}


def redis_conf_directives(text: str) -> dict[str, str]:
    """A redis.conf's directives (`user` lines joined: their rules, passwords hashed)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, value = line.partition(" ")
        if name == "user":
            out["user"] = (out.get("user", "") + "\n" + value).strip()
        else:
            out[name] = value.strip('"')
    return out


@dataclass(frozen=True)
class Difference:
    """An option where the manifests differ on purpose."""

    service: str
    option: str
    local: Any
    manifests: Any
    why: str


@dataclass
class Comparison:
    overlay: Path
    # (service, how many pods) compared
    compared: dict[str, int] = field(default_factory=dict)
    # (service, option): equal in every pod
    same: dict[str, set[str]] = field(default_factory=dict)
    differences: dict[tuple[str, str], Difference] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    # Which processes stand for which, in one line.
    processes: str = ""

    def report(self, *, verbose: bool = False) -> str:
        """Per service: the options alike and those that differ on purpose (with `verbose`,
        each one's reason and the two values); then every problem."""
        lines = [f"{self.overlay}:", f"  processes: {self.processes}"]
        for service, count in self.compared.items():
            same = sorted(self.same.get(service, set()))
            differ = sorted(o for s, o in self.differences if s == service)
            lines.append(
                f"  {service} x{count}: {len(same)} option(s) as `hexmq cluster up` gives them; "
                f"{len(differ)} differ on purpose: {', '.join(differ) or '-'}"
            )
            if verbose:
                lines.append(f"    alike: {', '.join(same) or '-'}")
                for option in differ:
                    d = self.differences[service, option]
                    lines.append(
                        f"    {option}: {d.why} (cluster up: {d.local!r}; here: {d.manifests!r})"
                    )
        lines += [f"  PROBLEM: {p}" for p in self.problems]
        return "\n".join(lines)


def _values(namespace: argparse.Namespace) -> dict[str, Any]:
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(namespace).items()}


def _parse(
    service: str,
    argv: Sequence[str],
    env: Mapping[str, str],
    image: frozenset[str],
    container: Container | None = None,
) -> dict[str, Any]:
    """A hexmq service's options. In a container, the membership agent's own checks run too,
    with its Consul token file stood in for (the Secret's file is not on this machine: the
    secrets test reads make-secrets.sh's); `hexmq cluster up`'s plan (no container) is what up
    starts, and tests start it for real."""
    namespace = parse_service(service, argv, env, allowed_unknown=image, check_agent=False)
    if service == "membership" and container is not None:
        from services.membership.main import agent_config

        with tempfile.TemporaryDirectory() as tmp:
            stand_in = copy.copy(namespace)
            token = namespace.consul_token_file
            if token is not None and container.mounted_secret(str(token)):
                stand_in.consul_token_file = Path(tmp) / "token"
                stand_in.consul_token_file.write_text("00000000-0000-0000-0000-000000000000\n")
            try:
                agent_config(stand_in)
            except ValueError as exc:
                raise OptionsRefused(f"hexmq membership refuses its options: {exc}") from None
    return _values(namespace)


def _local_args(planned: localcluster.PlannedProcess) -> list[str]:
    """`python -P -m hexmq.cli SERVICE ARGS...` -> ARGS."""
    argv = list(planned.argv)
    start = argv.index("hexmq.cli") + 1
    if argv[start] != planned.service:
        raise ManifestError(f"{argv}: not hexmq {planned.service}")
    return argv[start + 1 :]


def _local_sections(
    planned: localcluster.PlannedProcess,
) -> list[tuple[str, localcluster.PlannedProcess]]:
    """`up --colocated`'s `hexmq node` process as the three processes its sections stand for:
    each section's words as `hexmq SERVICE WORDS`, with the variables that section reads."""
    out = []
    for service, words in node_sections(planned.argv).items():
        env = section_env(service, planned.env)
        argv = ("hexmq.cli", service, *words)
        out.append((service, localcluster.PlannedProcess(planned.node, service, argv, env)))
    return out


def shape(docs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The cluster the manifests make: nodes, partitions, RF, its name, its Consul."""
    (config,) = [d for d in docs if d["kind"] == "ConfigMap" and "rf" in d.get("data", {})]
    data = config["data"]
    (nodes,) = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == NODES]
    return {
        "nodes": int(nodes["spec"].get("replicas", 1)),
        "partitions": int(data["partitions"]),
        "rf": int(data["rf"]),
        "cluster": data["cluster"],
        "consul": data["consul"],
        "expect": int(data["expect"]),
    }


def compare(overlay: Path, workdir: Path, docs: list[dict[str, Any]] | None = None) -> Comparison:
    """The overlay's processes against those `hexmq cluster up` plans for the same shape."""
    docs = render(overlay) if docs is None else docs
    result = Comparison(overlay)
    image = Image.load()
    all_pods = pods(docs, image)
    size = shape(docs)
    embedded = any(p.workload == CONSUL_DEV for p in all_pods)
    colocated = any(NODE_PROCESS in p.containers for p in all_pods if p.workload == NODES)
    state = localcluster.plan_up(
        workdir / size["cluster"],
        nodes=size["nodes"],
        partitions=size["partitions"],
        rf=size["rf"],
        consul=None if embedded else size["consul"],
        colocated=colocated,
    )
    planned = {(p.node, p.service): p for p in localcluster.planned_processes(state)}
    edges = sum(p.workload == EDGES for p in all_pods)
    agreement = "consul-dev (cluster up's own)" if embedded else f"external Consul {size['consul']}"
    if colocated:
        result.processes = (
            f"{size['nodes']} node pods of {', '.join(COLOCATED_CONTAINERS)} (cluster up "
            f"--colocated's nodes 1-{size['nodes']}, `hexmq node` section by section); "
            f"{edges} edge pods; agreement: {agreement}"
        )
    else:
        result.processes = (
            f"{size['nodes']} node pods of {', '.join(NODE_CONTAINERS)} (cluster up's nodes 1-"
            f"{size['nodes']}, less their edges); {edges} edge pods of their own (each against "
            f"node 1's edge); agreement: {agreement}"
        )
    tables = COLOCATED_EXPECTED if colocated else EXPECTED

    def read(container: Container, service: str) -> bool:
        """Parse what the container runs into container.options; False (a problem) if it
        does not run `service` or its service refuses what it is given."""
        try:
            if container.process is not None:
                container.options = _parse(
                    service,
                    container.argv[2:],
                    container.env,
                    container.image_env | frozenset(container.process.env),
                    container,
                )
            elif service == "redis":
                if container.argv[0] != "redis-server":
                    raise ManifestError(f"runs {container.argv[0]}, not redis-server")
                container.options = redis_directives(container.argv[1:])
            else:
                if container.hexmq != service:
                    raise ManifestError(f"runs {container.argv[:2]}, not hexmq {service}")
                container.options = _parse(
                    service, container.argv[2:], container.env, container.image_env, container
                )
        except (OptionsRefused, ManifestError) as exc:
            result.problems.append(f"{container}: {exc}")
            return False
        return True

    def compare_one(container: Container, local: localcluster.PlannedProcess) -> None:
        service = local.service
        result.compared[service] = result.compared.get(service, 0) + 1
        if service == "redis":
            theirs = redis_conf_directives(local.config or "")
            table = REDIS_EXPECTED
        else:
            theirs = _parse(service, _local_args(local), local.env, frozenset())
            table = tables[service]
        ours = container.options
        ctx = Context(docs, all_pods, container, theirs)
        same = result.same.setdefault(service, set())
        for option in sorted(set(ours) | set(theirs)):
            mine, local_value = ours.get(option), theirs.get(option)
            expected = table.get(option)
            if expected is None:
                if mine == local_value:
                    same.add(option)
                else:
                    result.problems.append(
                        f"{container}: {option} is {mine!r}, `hexmq cluster up` gives "
                        f"{local_value!r} (say why in tests/support/kubernetes.py EXPECTED, or "
                        "make them equal)"
                    )
                continue
            try:
                wrong = expected.check(ctx, mine)
            except ManifestError as exc:
                wrong = str(exc)
            if wrong:
                result.problems.append(f"{container}: {option}={mine!r}: {wrong}")
            if mine == local_value:
                same.add(option)
            else:
                result.differences[service, option] = Difference(
                    service, option, local_value, mine, expected.why
                )

    # Which local process each container stands for.
    pairs: list[tuple[Container, localcluster.PlannedProcess]] = []
    for pod in all_pods:
        if pod.workload == NODES and colocated:
            if sorted(pod.containers) != sorted(COLOCATED_CONTAINERS):
                result.problems.append(
                    f"pod {pod.name} runs {sorted(pod.containers)}, a co-located node is "
                    f"{list(COLOCATED_CONTAINERS)}"
                )
                continue
            node = pod.containers[NODE_PROCESS]
            try:
                if node.hexmq != NODE_PROCESS:
                    raise ManifestError(f"runs {node.argv[:2]}, not hexmq {NODE_PROCESS}")
                # What only the node as a whole checks: every variable read by some section,
                # one node id, the process-wide pacing agreed.
                parse_node(
                    node.argv[2:], node.env, allowed_unknown=node.image_env, check_agent=False
                )
                pod.sections = section_views(node)
            except (OptionsRefused, ManifestError) as exc:
                result.problems.append(f"{node}: {exc}")
                continue
            pairs.append((pod.containers["redis"], planned[pod.ordinal + 1, "redis"]))
            pairs += [
                (pod.sections[service], section)
                for service, section in _local_sections(planned[pod.ordinal + 1, NODE_PROCESS])
            ]
        elif pod.workload == NODES:
            if sorted(pod.containers) != sorted(NODE_CONTAINERS):
                result.problems.append(
                    f"pod {pod.name} runs {sorted(pod.containers)}, a node is "
                    f"{list(NODE_CONTAINERS)}"
                )
                continue
            pairs += [
                (pod.containers[name], planned[pod.ordinal + 1, name]) for name in NODE_CONTAINERS
            ]
        elif pod.workload == EDGES:
            (container,) = pod.containers.values()
            pairs.append((container, planned[1, "edge"]))
        elif pod.workload == CONSUL_DEV:
            (container,) = pod.containers.values()
            pairs.append((container, planned[None, "consul-dev"]))
        else:
            result.problems.append(f"StatefulSet {pod.workload}: no local process stands for it")
    if not colocated and not any(p.workload == EDGES for p in all_pods):
        result.problems.append(f"no {EDGES} pods: nothing serves MQTT")
    read_ok = [read(container, local.service) for container, local in pairs]
    for ok, (container, local) in zip(read_ok, pairs, strict=True):
        if ok:
            compare_one(container, local)
    # Options the manifests set somewhere and leave at the default elsewhere are differences
    # in one pod and equal in another: only what is equal everywhere counts as the same.
    for service, option in result.differences:
        result.same.get(service, set()).discard(option)
    _check_users(image, all_pods, result)
    return result


def _check_users(image: Image, all_pods: Sequence[Pod], result: Comparison) -> None:
    """hexmq containers run as the image's user, non-root, with nothing to write but
    volumes."""
    for pod in all_pods:
        for c in pod.containers.values():
            context = c.spec.get("securityContext", {})
            if c.hexmq and context.get("runAsUser") != image.user:
                result.problems.append(f"{c}: runAsUser is not the image's user {image.user}")
            if not context.get("readOnlyRootFilesystem"):
                result.problems.append(f"{c}: its root filesystem is writable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.support.kubernetes_equivalence",
        description="Check that each Kubernetes overlay starts the processes `hexmq cluster up` "
        "starts, with the same options but where a reason says why not.",
    )
    parser.add_argument("overlays", nargs="*", type=Path, help="default: every overlay")
    parser.add_argument("-v", "--verbose", action="store_true", help="each difference's reason")
    args = parser.parse_args(argv)
    overlays = args.overlays or sorted(p for p in OVERLAYS.iterdir() if p.is_dir())
    failed = False
    with tempfile.TemporaryDirectory(prefix="hexmq-k8s-") as tmp:
        for i, overlay in enumerate(overlays):
            try:
                comparison = compare(overlay, Path(tmp) / str(i))
            except ManifestError as exc:
                print(f"{overlay}: PROBLEM: {exc}")
                failed = True
                continue
            print(comparison.report(verbose=args.verbose))
            failed = failed or bool(comparison.problems)
    if failed:
        print("the manifests and `hexmq cluster up` differ where nothing says why (above)")
        return 1
    print("kubernetes: every overlay runs what `hexmq cluster up` runs, alike but where said")
    return 0


if __name__ == "__main__":
    sys.exit(main())
