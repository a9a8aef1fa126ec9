"""deploy/compose/compose.yaml as local processes: the commands and environment of its services,
with service names mapped to loopback addresses and distinct ports.

In compose every container has its own address, so every edge listens on 1883; on one machine
each (service, port) gets a free port of its own on 127.0.0.1, and every `name:port` in a
hexmq service's environment or command (and `0.0.0.0:port`, the service's own listener) is
rewritten to it. So a test starts the very topology the file describes, with the commands and
variables taken from it:

    topo = load_local_topology(COMPOSE)         # ports picked now, free on 127.0.0.1
    for name in topo.start_order:               # depends_on first
        svc = topo.services[name]
        svc.kind                                # hexmq, redis, consul, haproxy or other
        svc.argv, svc.env                       # ["hexmq", "edge"], {"HEXMQ_LISTEN": "127.0.0.1:P"}
    topo.address("edge-1", 1883)                # "127.0.0.1:P"
    topo.redis_argv("redis-1", data_dir)        # redis-server with the file's options
    topo.render_haproxy(cfg_text)               # the HAProxy config, edges by port

Volumes likewise: with `volumes=DIR`, a named volume `V` is the directory DIR/V, a bind mount its
host path, and every path under a service's mount target in its environment, command and
healthcheck (`/secrets/tls/ca.crt`, `-config-file=/secrets/x.json`) becomes the local one; so the
one-shot `secrets` service writes the secrets where the services it serves read them.

Several files (an override on compose.yaml): `merge_files` has the Compose binary merge them
into one, which this reads.

The consul service is not started from the file: the embedded Consul-API server
(`hexmq consul-dev`) stands in for it on `topo.address("consul", 8500)`.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hexmq_cli.cli import SERVICE_MODULES
from hexmq_cli.clusterstate import NODE_PROCESS
from tests.support.ports import free_port

LOOPBACK = "127.0.0.1"
# hexmq commands that run once and exit (a one-shot service, `service_completed_successfully`).
ONE_SHOT_COMMANDS = ("secrets",)
# `${VAR}`, `${VAR:-default}`, `${VAR-default}` (Compose's interpolation); `$$` is a `$`.
_INTERPOLATION = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}")
# host:port where host is a name, an IPv4 wildcard or bracketed IPv6 wildcard.
_HOSTPORT = re.compile(r"(?<![\w.-])(\[::\]|[A-Za-z0-9_.-]+):(\d{1,5})(?![\d.])")
_WILDCARDS = frozenset({"0.0.0.0", "[::]"})
# An absolute path, alone or after `=` (`-config-file=/x`); not the `//host` or `/0` of a URL.
_PATH = re.compile(r"(?<![\w.:/~$-])/[\w.@+-]+(?:/[\w.@+-]+)*/?")


class ComposeError(ValueError):
    """compose.yaml holds something the local topology cannot map; the message says what."""


@dataclass(frozen=True)
class LocalMount:
    """A volume of a service: its path in the container and the directory standing in for it."""

    target: str
    local: Path
    named: bool  # a named volume (created empty on first use), not a bind mount
    read_only: bool


@dataclass
class LocalService:
    name: str
    kind: str
    image: str
    # hexmq services: ["hexmq", SERVICE, ...]; others: the file's command (may be empty).
    argv: list[str]
    env: dict[str, str]
    depends_on: list[str]
    aliases: list[str]
    # container port -> local port on 127.0.0.1
    ports: dict[int, int] = field(default_factory=dict)
    # The healthcheck command, rewritten like argv ([] when none; CMD-SHELL: ["sh", "-c", ...]).
    healthcheck: list[str] = field(default_factory=list)
    # Its volumes, when the topology was loaded with `volumes=`.
    mounts: list[LocalMount] = field(default_factory=list)


@dataclass
class LocalTopology:
    services: dict[str, LocalService]
    start_order: list[str]

    def address(self, service: str, port: int) -> str:
        return f"{LOOPBACK}:{self.port(service, port)}"

    def port(self, service: str, port: int) -> int:
        try:
            return self.services[service].ports[port]
        except KeyError:
            raise ComposeError(f"no local port for {service}:{port}") from None

    def of_kind(self, kind: str) -> list[LocalService]:
        return [self.services[n] for n in self.start_order if self.services[n].kind == kind]

    def with_alias(self, alias: str) -> list[LocalService]:
        return [self.services[n] for n in self.start_order if alias in self.services[n].aliases]

    def redis_argv(
        self, service: str, data_dir: Path, redis_server: str = "redis-server"
    ) -> list[str]:
        """The file's redis-server command, on its local port, with its data in data_dir."""
        svc = self.services[service]
        if svc.kind != "redis":
            raise ComposeError(f"{service} is not a Redis service")
        args = svc.argv[1:] if svc.argv[:1] == ["redis-server"] else svc.argv
        return [
            redis_server,
            *args,
            *("--port", str(self.port(service, 6379))),
            *("--bind", LOOPBACK),
            *("--dir", str(data_dir)),
        ]

    def render_haproxy(self, config: str) -> str:
        """The HAProxy config for local processes: binds on loopback ports, and each
        `server-template NAME N ALIAS:PORT ...` as one `server` per service with that alias
        (DNS discovery has no local equivalent), health-check ports mapped too."""
        haproxy = self.of_kind("haproxy")
        if len(haproxy) != 1:
            raise ComposeError(f"expected one haproxy service, found {len(haproxy)}")
        front = haproxy[0].name
        out: list[str] = []
        skipping_resolvers = False
        for line in config.splitlines():
            words = line.split()
            if skipping_resolvers:
                if line[:1] not in (" ", "\t") and line.strip():
                    skipping_resolvers = False
                else:
                    continue
            if words[:1] == ["resolvers"]:
                skipping_resolvers = True
                continue
            indent = line[: len(line) - len(line.lstrip())]
            if words[:1] == ["bind"] and words[1].startswith(":"):
                port = int(words[1][1:])
                out.append(
                    f"{indent}bind {self.address(front, port)} {' '.join(words[2:])}".rstrip()
                )
            elif words[:1] == ["server-template"]:
                out += self._servers(indent, words)
            elif words[:1] == ["default-server"]:
                kept = _drop_option(words[1:], "resolvers")
                out.append(f"{indent}default-server {' '.join(kept)}")
            else:
                out.append(line)
        return "\n".join(out) + "\n"

    def _servers(self, indent: str, words: list[str]) -> list[str]:
        # server-template PREFIX COUNT HOST:PORT [options]
        prefix, target, options = words[1], words[3], words[4:]
        alias, _, port_text = target.rpartition(":")
        members = self.with_alias(alias)
        if not members:
            raise ComposeError(f"server-template {prefix}: no service has the alias {alias!r}")
        lines = []
        for svc in members:
            opts = list(options)
            if "port" in opts:
                i = opts.index("port")
                opts[i + 1] = str(self.port(svc.name, int(opts[i + 1])))
            address = self.address(svc.name, int(port_text))
            lines.append(f"{indent}server {svc.name} {address} {' '.join(opts)}")
        return lines


def _drop_option(words: list[str], name: str) -> list[str]:
    out, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word == name:
            skip = True
        else:
            out.append(word)
    return out


def interpolate(value: Any, env: Mapping[str, str], where: str) -> Any:
    """Compose's variable interpolation, over every string in `value`."""
    if isinstance(value, dict):
        return {k: interpolate(v, env, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, where) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, how, default = match.group(1), match.group(2), match.group(3)
        current = env.get(name)
        if how == ":-":
            return current if current else default
        if how == "-":
            return current if current is not None else default
        if current is None:
            raise ComposeError(f"{where}: ${{{name}}} is not set and has no default")
        return current

    return _INTERPOLATION.sub(one, value)


def _kind(name: str, spec: Mapping[str, Any], argv: list[str]) -> str:
    image = str(spec.get("image", ""))
    build = spec.get("build")
    if (isinstance(build, dict) and build.get("target") == "hexmq") or image.startswith("hexmq:"):
        return "hexmq"
    for kind in ("redis", "haproxy"):
        if image.split("/")[-1].startswith(f"{kind}:"):
            return kind
    if image.startswith("hashicorp/consul:"):
        return "consul"
    return "other"


def _command(spec: Mapping[str, Any]) -> list[str]:
    command = spec.get("command") or []
    if isinstance(command, str):
        return shlex.split(command)
    return [str(c) for c in command]


def _environment(name: str, spec: Mapping[str, Any]) -> dict[str, str]:
    env = spec.get("environment", {}) or {}
    if isinstance(env, list):  # ["KEY=value", ...]
        pairs = (item.partition("=") for item in env)
        env = {k: v for k, _, v in pairs}
    if not isinstance(env, dict):
        raise ComposeError(f"service {name}: environment must be a mapping or a list")
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _aliases(spec: Mapping[str, Any]) -> list[str]:
    networks = spec.get("networks") or {}
    found: list[str] = []
    if isinstance(networks, dict):
        for net in networks.values():
            if isinstance(net, dict):
                found += [str(a) for a in net.get("aliases", [])]
    return found


def _mounts(name: str, spec: Mapping[str, Any], root: Path, base: Path) -> list[LocalMount]:
    """The service's `volumes` (short `SOURCE:TARGET[:ro]` or long syntax) as local mounts:
    named volume V -> root/V, a bind mount's host path relative to the compose file's folder."""
    found = []
    for entry in spec.get("volumes", []) or []:
        if isinstance(entry, dict):
            source, target = str(entry.get("source", "")), str(entry["target"])
            read_only = bool(entry.get("read_only", False))
        else:
            parts = str(entry).split(":")
            if len(parts) < 2:
                raise ComposeError(f"service {name}: volume {entry!r} has no target")
            source, target = parts[0], parts[1]
            read_only = len(parts) > 2 and "ro" in parts[2].split(",")
        named = not source.startswith(("/", ".", "~"))
        local = root / source if named else (base / source).resolve()
        found.append(LocalMount(target.rstrip("/") or "/", local, named, read_only))
    return found


def map_paths(value: str, mounts: Sequence[LocalMount]) -> str:
    """Every container path in `value` under one of `mounts` as its local path."""
    targets = sorted(mounts, key=lambda m: len(m.target), reverse=True)

    def one(match: re.Match[str]) -> str:
        path = match.group(0)
        for mount in targets:
            if path == mount.target or path.startswith(mount.target + "/"):
                return str(mount.local) + path[len(mount.target) :]
        return path

    return _PATH.sub(one, value) if mounts else value


def _depends_on(spec: Mapping[str, Any]) -> list[str]:
    deps = spec.get("depends_on") or []
    return list(deps) if isinstance(deps, (list, dict)) else []


# Ports each kind listens on in its container, beyond those the hexmq services name.
_KIND_PORTS = {"redis": (6379,), "consul": (8500,)}


def _start_order(services: Mapping[str, LocalService]) -> list[str]:
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "visiting":
            raise ComposeError(f"depends_on cycle: {' -> '.join([*path, name])}")
        state[name] = "visiting"
        for dep in services[name].depends_on:
            if dep not in services:
                raise ComposeError(f"service {name} depends on {dep}, which is not defined")
            visit(dep, [*path, name])
        state[name] = "done"
        order.append(name)

    for name in services:
        visit(name, [])
    return order


def load_local_topology(
    path: Path,
    env: Mapping[str, str] | None = None,
    *,
    allocate: Callable[[], int] = free_port,
    volumes: Path | None = None,
) -> LocalTopology:
    """Read compose.yaml (one file; `extends` is not followed) into local services.

    `env` is the environment Compose would interpolate from (default: none, so the file's
    defaults apply); `allocate` gives a free local port per (service, container port);
    `volumes`, the directory that holds the named volumes (default: paths stay as in the
    file)."""
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or not isinstance(doc.get("services"), dict):
        raise ComposeError(f"{path}: no services")
    env = {} if env is None else env
    services: dict[str, LocalService] = {}
    for name, raw in doc["services"].items():
        spec = interpolate(raw, env, f"services.{name}")
        if "extends" in spec:
            raise ComposeError(f"service {name}: extends is not supported here; load one file")
        command = _command(spec)
        kind = _kind(name, spec, command)
        commands = (*SERVICE_MODULES, NODE_PROCESS, *ONE_SHOT_COMMANDS)
        if kind == "hexmq" and (not command or command[0] not in commands):
            raise ComposeError(
                f"service {name}: a hexmq service's command must start with one of "
                f"{', '.join(commands)}, got {command!r}"
            )
        health = spec.get("healthcheck", {}).get("test", []) if spec.get("healthcheck") else []
        if health[:1] == ["CMD-SHELL"] and len(health) == 2:
            health = ["sh", "-c", str(health[1])]  # what Docker runs for CMD-SHELL
        else:
            health = [str(w) for w in health[1:]] if health[:1] in (["CMD"],) else []
        services[name] = LocalService(
            name=name,
            kind=kind,
            image=str(spec.get("image", "")),
            argv=["hexmq", *command] if kind == "hexmq" else command,
            env=_environment(name, spec),
            depends_on=_depends_on(spec),
            aliases=_aliases(spec),
            healthcheck=health,
            mounts=[] if volumes is None else _mounts(name, spec, volumes, path.parent),
        )

    taken: set[int] = set()

    def local_port(service: str, port: int) -> int:
        """Each (service, container port) its own local port: `allocate` may give a port
        twice (it is free again until a process binds it), so a repeat is drawn again."""
        ports = services[service].ports
        if port not in ports:
            for _ in range(1000):
                local = allocate()
                if local not in taken:
                    break
            else:
                raise ComposeError(f"no distinct free port for {service}:{port}")
            taken.add(local)
            ports[port] = local
        return ports[port]

    def rewrite(owner: str, value: str, what: str) -> str:
        def one(match: re.Match[str]) -> str:
            host, port = match.group(1), int(match.group(2))
            # A container's loopback is its own (a co-located node's healthcheck asks
            # 127.0.0.1:9101, its agent section's port).
            if host in _WILDCARDS or host == LOOPBACK:
                return f"{LOOPBACK}:{local_port(owner, port)}"
            if host in services:
                return f"{LOOPBACK}:{local_port(host, port)}"
            if any(host in s.aliases for s in services.values()):
                raise ComposeError(
                    f"service {owner}: {what} names {host}:{port}, an alias of several "
                    "services; name one service"
                )
            if "." in host or host == "localhost":  # an address or a domain: not a service
                return match.group(0)
            raise ComposeError(
                f"service {owner}: {what} names {host}:{port}, but {host} is not a service of "
                "compose.yaml"
            )

        return _HOSTPORT.sub(one, value)

    for svc in services.values():
        for port in _KIND_PORTS.get(svc.kind, ()):
            local_port(svc.name, port)
        svc.env = {k: map_paths(v, svc.mounts) for k, v in svc.env.items()}
        svc.argv = [map_paths(a, svc.mounts) for a in svc.argv]
        svc.healthcheck = [map_paths(a, svc.mounts) for a in svc.healthcheck]
        if svc.kind != "hexmq":
            continue
        svc.env = {k: rewrite(svc.name, v, k) for k, v in svc.env.items()}
        svc.argv = [rewrite(svc.name, a, "command") for a in svc.argv]
        svc.healthcheck = [rewrite(svc.name, a, "healthcheck") for a in svc.healthcheck]
    for svc in services.values():
        if svc.kind == "haproxy":
            for mapping in spec_ports(doc["services"][svc.name]):
                local_port(svc.name, mapping)
    return LocalTopology(services=services, start_order=_start_order(services))


def merge_files(files: Sequence[Path], dest: Path, env: Mapping[str, str] | None = None) -> Path:
    """The compose files as Compose v2 merges them (`extends`, `!override`, profiles: the
    default ones only), interpolated with `env`, written to `dest` (JSON, which
    load_local_topology reads as YAML): what `docker compose -f A -f B up` runs. The
    docker-compose binary of the dev dependencies; no engine needed."""
    import json
    import os
    import subprocess
    import sys

    binary = Path(sys.executable).parent / "docker-compose"
    argv = [str(binary)]
    for path in files:
        argv += ["-f", str(path.resolve())]
    # Only what is given is interpolated, as load_local_topology's `env`.
    environ = {"PATH": os.environ.get("PATH", os.defpath), **(env or {})}
    out = subprocess.run(
        [*argv, "config", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
        env=environ,
        cwd=files[0].parent,
    ).stdout
    dest.write_text(json.dumps(json.loads(out), indent=1))
    return dest


def spec_ports(spec: Mapping[str, Any]) -> Iterator[int]:
    """The container ports of a service's `ports:` (short syntax: [HOST_IP:]HOST:CONTAINER)."""
    for entry in spec.get("ports", []) or []:
        if isinstance(entry, dict):
            yield int(entry["target"])
        else:
            yield int(str(entry).rpartition(":")[2].partition("/")[0])
