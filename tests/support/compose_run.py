"""Run a LocalTopology (tests/support/compose_local.py) as local processes, the way
`docker compose up` runs compose.yaml: a service starts once every `depends_on` condition of
it holds (service_started: its dependency runs; service_healthy: the dependency's healthcheck
passes; service_completed_successfully: the dependency, a one-shot, exited 0), independent
services start side by side, a service that exits by itself is started again as its `restart`
policy says (Docker's waits; a test names it after MAX_RESTARTS), and `kill` is `docker
compose kill` (a killed service stays down, as Docker leaves a container it was told to kill).

    topo = load_local_topology(COMPOSE, volumes=tmp_path / "volumes")
    with LocalCompose(topo, COMPOSE, tmp_path) as compose:
        compose.up(["haproxy"], timeout=40)        # haproxy and everything it depends on
        compose.wait_healthy(["edge-1"], timeout=20)
        compose.haproxy_servers("edges-mqtt")      # {"edge-1": ServerState("UP", 1), ...}
        compose.kill(["edge-2", "partition-2", "membership-2", "redis-2"])
    # leaving the block stops every process it started, dependents first (SIGTERM, then
    # SIGKILL), by its Popen handle

How each kind runs here:

- hexmq: the file's command through this venv's `hexmq` entry point (the image's), with the
  file's environment and nothing of the test's own but PATH (so a HEXMQ_* variable in the
  shell that runs pytest cannot make the file look right) and PYTHONUNBUFFERED, which the
  image sets. Healthy: the file's healthcheck command, run with that same environment, as
  Docker runs it inside the container. A service without a restart policy that exits 0 (the
  one-shot `secrets`) has completed; one the file runs as root (user 0) runs as this user, so
  run by a user other than root, its `--owner` files stay that user's.
- redis: the file's redis-server command on its loopback port (`LocalTopology.redis_argv`),
  with its ACL file from the secrets volume. Healthy: the file's healthcheck (a shell command
  with `redis-cli ... ping`) run with the service's environment and a `redis-cli` first on PATH
  that adds the local port; without one, PING answered PONG.
- haproxy: the file's HAProxy config, rendered for loopback (`LocalTopology.render_haproxy`),
  in the foreground (`haproxy -db`). Started: every frontend accepts.
- consul: `hexmq consul-dev` on the consul service's loopback address stands in for it. The
  ACL config Consul would load (`-config-file` JSON) is read for it: ACLs on with default deny
  and an initial management token become `--acl-token-file` with that token (consul-dev cannot
  read Consul's config). Healthy: it serves the HTTP API, asked with the token the service's
  CONSUL_HTTP_TOKEN_FILE names, as the file's `consul` healthcheck command sends it.

Other kinds (the Collector, Jaeger, Prometheus ...) have no local equivalent: `up` refuses a
target that needs one, naming it. Healthchecks are polled every HEALTH_INTERVAL seconds
rather than the file's `interval` (5 s), so that the test takes seconds; what they ask is the
file's.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from hexmq_cli import procs
from tests.support.compose_local import LOOPBACK, ComposeError, LocalService, LocalTopology

HEXMQ = Path(sys.executable).with_name("hexmq")
# Each check of a hexmq service starts a process (~0.15 s of CPU): often enough to start fast,
# seldom enough not to load a 2-core machine while nine services start.
HEALTH_INTERVAL = 0.5
# What compose's `depends_on` conditions mean, in the order a dependency reaches them.
STARTED, HEALTHY = "service_started", "service_healthy"
COMPLETED = "service_completed_successfully"
CONDITIONS = (STARTED, HEALTHY, COMPLETED)
# Users a compose `user:` names that are root.
_ROOT_USERS = frozenset({"0", "0:0", "root", "root:root"})
# Restart policies as Docker follows them: the first restart after 100 ms, each next one
# after twice the wait; past MAX_RESTARTS a test fails, naming the exits.
RESTART_FIRST_DELAY = 0.1
MAX_RESTARTS = 3
# The variable every process started here carries, so that a leftover can be found by it.
MARKER = "COMPOSE_LOCAL_RUN_DIR"


@dataclass(frozen=True)
class ServerState:
    """One server line of HAProxy's stats: its check status (UP, DOWN, ...) and current
    connections."""

    status: str
    connections: int


@dataclass
class _Running:
    proc: subprocess.Popen[bytes]
    log: Path
    healthy: bool = False
    last_check: float = 0.0
    # Its exits so far that its restart policy restarted it after (codes), and when the
    # pending restart is due (monotonic seconds; 0: none pending).
    exits: list[int] = field(default_factory=list)
    restart_at: float = 0.0


@dataclass
class LocalCompose:
    topology: LocalTopology
    compose_file: Path
    workdir: Path
    running: dict[str, _Running] = field(default_factory=dict)
    # The file's services as written (depends_on conditions, volumes).
    _spec: dict[str, Any] = field(default_factory=dict)
    # Services killed on purpose: their exit is not a failure.
    _killed: set[str] = field(default_factory=set)
    # service -> [(dependency, condition)], from the file (the loader keeps names only), for
    # the services `up` was asked to start.
    _conditions: dict[str, list[tuple[str, str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._spec = yaml.safe_load(self.compose_file.read_text())["services"]

    def completed(self, name: str) -> bool:
        """A one-shot service (no restart policy) that exited 0: done, not failed."""
        run = self.running.get(name)
        restart = str(self._spec[name].get("restart", "no"))
        return run is not None and run.proc.poll() == 0 and restart == "no"

    def __enter__(self) -> LocalCompose:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()

    # --- up ---------------------------------------------------------------------------------

    def needed(self, targets: Iterable[str]) -> list[str]:
        """The targets and everything they depend on, in start order."""
        wanted: set[str] = set()
        todo = list(targets)
        while todo:
            name = todo.pop()
            if name not in self.topology.services:
                raise ComposeError(f"no service {name!r} in {self.compose_file}")
            if name not in wanted:
                wanted.add(name)
                todo += self.topology.services[name].depends_on
        return [n for n in self.topology.start_order if n in wanted]

    def up(self, targets: Sequence[str], timeout: float) -> None:
        """Start the targets and their dependencies, each once its conditions hold; return when
        every target has started (as `docker compose up -d` does). AssertionError naming the
        service and its log if one dies or a condition does not hold within `timeout`."""
        services = self.needed(targets)
        for name in services:
            self._conditions[name] = depends_on_conditions(name, self._spec[name])
            svc = self.topology.services[name]
            if svc.kind not in ("hexmq", "redis", "haproxy", "consul"):
                raise ComposeError(
                    f"service {name} ({svc.image}) has no local stand-in; it is needed by "
                    f"{', '.join(targets)}"
                )
        deadline = time.monotonic() + timeout
        pending = [n for n in services if n not in self.running]
        while pending:
            self.check_alive()
            for name in list(pending):
                if all(self._holds(dep, cond) for dep, cond in self._conditions[name]):
                    self._start(self.topology.services[name])
                    pending.remove(name)
            if pending and time.monotonic() >= deadline:
                waiting = {
                    n: [f"{d} {c}" for d, c in self._conditions[n] if not self._holds(d, c)]
                    for n in pending
                }
                raise AssertionError(
                    f"compose up: not started within {timeout:g} s: {waiting}\n{self.log_tails()}"
                )
            if pending:
                time.sleep(0.05)
        # A process that runs may not listen yet: HAProxy's frontends are what tests use.
        for name in targets:
            svc = self.topology.services[name]
            if svc.kind == "haproxy":
                ports = sorted(svc.ports.values())
                while not all(procs.tcp_accepts(p) for p in ports):
                    self.check_alive()
                    if time.monotonic() >= deadline:
                        raise AssertionError(f"{name} does not listen on {ports} in {timeout:g} s")
                    time.sleep(0.05)

    def wait_healthy(self, names: Sequence[str], timeout: float) -> None:
        """Until each service's healthcheck has passed once."""
        deadline = time.monotonic() + timeout
        while not all(self._holds(n, HEALTHY) for n in names):
            self.check_alive()
            if time.monotonic() >= deadline:
                sick = [n for n in names if not self._holds(n, HEALTHY)]
                raise AssertionError(f"not healthy within {timeout:g} s: {sick}")
            time.sleep(0.05)

    def _holds(self, name: str, condition: str) -> bool:
        if condition == COMPLETED:
            return self.completed(name)
        run = self.running.get(name)
        if run is None or run.proc.poll() is not None:
            return False
        if condition == STARTED:
            return True
        if not run.healthy and time.monotonic() - run.last_check >= HEALTH_INTERVAL:
            run.last_check = time.monotonic()
            run.healthy = self._healthcheck(self.topology.services[name])
        return run.healthy

    def _healthcheck(self, svc: LocalService) -> bool:
        if svc.kind == "redis":
            if not svc.healthcheck:
                return procs.redis_ready(self.topology.port(svc.name, 6379))
            env = {**self._base_env(), **svc.env, "PATH": self._redis_cli_path(svc)}
            return _passes(svc.healthcheck, env)
        if svc.kind == "consul":
            token_file = svc.env.get("CONSUL_HTTP_TOKEN_FILE")
            token = Path(token_file).read_text().strip() if token_file else None
            url = f"http://{self.topology.address(svc.name, 8500)}/v1/agent/self"
            return _http_ok(url, token)
        if svc.kind == "haproxy":
            return True  # the file gives HAProxy no healthcheck: started is all there is
        if not svc.healthcheck:
            raise ComposeError(f"service {svc.name} has no healthcheck to wait for")
        argv = [str(HEXMQ) if svc.healthcheck[0] == "hexmq" else svc.healthcheck[0]]
        return _passes(argv + svc.healthcheck[1:], self.environment(svc.name))

    def environment(self, name: str) -> dict[str, str]:
        """A hexmq service's process environment: the file's variables, PATH (this venv's
        `hexmq` first) and what the image sets that matters here (PYTHONUNBUFFERED)."""
        svc = self.topology.services[name]
        return {
            "PATH": f"{HEXMQ.parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
            "PYTHONUNBUFFERED": "1",
            MARKER: str(self.workdir),
            **svc.env,
        }

    def _redis_cli_path(self, svc: LocalService) -> str:
        """PATH with a `redis-cli` first that talks to the service's local port: the file's
        healthcheck runs in the container, where Redis is on the default port."""
        folder = self.workdir / f"{svc.name}.bin"
        wrapper = folder / "redis-cli"
        if not wrapper.exists():
            folder.mkdir(exist_ok=True)
            real = shutil.which("redis-cli") or "/usr/bin/redis-cli"
            port = self.topology.port(svc.name, 6379)
            wrapper.write_text(f'#!/bin/sh\nexec {real} -h {LOOPBACK} -p {port} "$@"\n')
            wrapper.chmod(0o755)
        return f"{folder}{os.pathsep}{os.environ.get('PATH', os.defpath)}"

    def _consul_dev_acl(self, svc: LocalService) -> list[str]:
        """consul-dev's `--acl-token-file` for the ACL config the consul service loads (its
        `-config-file` JSON files), [] when that enables no ACLs."""
        acl: dict[str, Any] = {}
        for i, word in enumerate(svc.argv):
            path = None
            if word.startswith(("-config-file=", "--config-file=")):
                path = word.partition("=")[2]
            elif word in ("-config-file", "--config-file"):
                path = svc.argv[i + 1]
            if path is not None:
                if not path.endswith(".json"):
                    raise ComposeError(f"{svc.name}: only JSON config files are read here: {path}")
                acl.update(json.loads(Path(path).read_text()).get("acl", {}))
        if not acl.get("enabled"):
            return []
        token = (acl.get("tokens") or {}).get("initial_management")
        if acl.get("default_policy") != "deny" or not token:
            raise ComposeError(
                f"{svc.name}: consul-dev stands in for ACLs with default_policy deny and an "
                f"initial_management token only, not {acl}"
            )
        token_file = self.workdir / f"{svc.name}.acl-token"
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return ["--acl-token-file", str(token_file)]

    def _hexmq_argv(self, svc: LocalService) -> list[str]:
        argv = [str(HEXMQ), *svc.argv[1:]]
        user = str(self._spec[svc.name].get("user", ""))
        if user in _ROOT_USERS and os.geteuid() != 0:
            # Files it would give to the containers' users stay this user's: every local
            # process runs as this user.
            mine = str(os.geteuid())
            argv = [
                f"{w.partition('=')[0]}={mine}" if i and argv[i - 1] == "--owner" else w
                for i, w in enumerate(argv)
            ]
        return argv

    def _start(self, svc: LocalService, exits: Sequence[int] = ()) -> None:
        log = self.workdir / f"{svc.name}.log"
        for mount in svc.mounts:
            if mount.named:
                mount.local.mkdir(parents=True, exist_ok=True)
        if svc.kind == "hexmq":
            argv, env = self._hexmq_argv(svc), self.environment(svc.name)
        elif svc.kind == "redis":
            data = self.workdir / svc.name
            data.mkdir(exist_ok=True)
            argv, env = self.topology.redis_argv(svc.name, data), self._base_env()
        elif svc.kind == "haproxy":
            argv, env = self._haproxy_argv(svc), self._base_env()
        else:  # consul: the embedded Consul-API server in its place
            data = self.workdir / svc.name
            listen = self.topology.address(svc.name, 8500)
            argv = [str(HEXMQ), "consul-dev", "--listen", listen, "--data-dir", str(data)]
            argv += self._consul_dev_acl(svc)
            env = self._base_env()
        with log.open("ab") as out:
            out.write(f"---- {' '.join(argv)}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, env=env, cwd=self.workdir
            )
        self.running[svc.name] = _Running(proc, log, exits=list(exits))

    def _base_env(self) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", os.defpath), MARKER: str(self.workdir)}

    def _haproxy_argv(self, svc: LocalService) -> list[str]:
        haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
        source = self.compose_file.parent / _haproxy_config_source(svc.name, self._spec[svc.name])
        config = self.workdir / "haproxy.cfg"
        rendered = self.topology.render_haproxy(source.read_text())
        config.write_text(rendered)
        return [haproxy, "-db", "-f", str(config)]

    # --- while it runs ----------------------------------------------------------------------

    def check_alive(self) -> None:
        """Restart a service that exited as its restart policy says Docker would, after
        Docker's wait (RESTART_FIRST_DELAY, doubling); AssertionError naming one that exited
        and may not be restarted, or exited more than MAX_RESTARTS times (and its log's end).
        A partition service whose agent was not serving within its --startup-timeout exits 1
        (a loaded machine: the 30 s passed while nine services started on two cores), and
        `restart: unless-stopped` has Docker start it again: so here too."""
        now = time.monotonic()
        for name, run in list(self.running.items()):
            code = run.proc.poll()
            if code is None or name in self._killed or self.completed(name):
                continue
            if run.restart_at:
                if now >= run.restart_at:
                    self._start(self.topology.services[name], exits=[*run.exits, code])
                continue
            if not self._restarts(name, code) or len(run.exits) >= MAX_RESTARTS:
                tail = "\n".join(procs.log_tail(run.log))
                before = f" (and before: {run.exits})" if run.exits else ""
                raise AssertionError(f"{name} exited with {code}{before}; its log ends:\n{tail}")
            run.restart_at = now + RESTART_FIRST_DELAY * 2 ** len(run.exits)

    def _restarts(self, name: str, code: int) -> bool:
        """Whether Docker restarts the service after it exited with `code` by itself."""
        policy = str(self._spec[name].get("restart", "no"))
        return policy in ("always", "unless-stopped") or (
            policy.startswith("on-failure") and code != 0
        )

    def kill(self, names: Sequence[str]) -> None:
        """SIGKILL the services and wait until they are gone (`docker compose kill`)."""
        for name in names:
            run = self.running[name]
            self._killed.add(name)
            if run.proc.poll() is None:
                run.proc.send_signal(signal.SIGKILL)
        for name in names:
            self.running[name].proc.wait(10)

    def stop(self, names: Sequence[str], grace: float = 5.0) -> None:
        """SIGTERM the services and wait (`docker compose stop`); `up` starts them again."""
        for name in names:
            self.running[name].proc.send_signal(signal.SIGTERM)
        for name in names:
            run = self.running.pop(name)
            try:
                run.proc.wait(grace)
            except subprocess.TimeoutExpired:
                run.proc.kill()
                run.proc.wait(10)
                raise AssertionError(f"{name} ignored SIGTERM for {grace:g} s") from None

    def down(self, grace: float = 5.0) -> None:
        """Stop everything started here as `docker compose down` does: a service once every
        service depending on it has stopped, those side by side (SIGTERM, then SIGKILL past
        `grace`). AssertionError if a process started here outlives it."""
        live = {n for n, run in self.running.items() if run.proc.poll() is None}
        while live:
            layer = [
                n
                for n in live
                if not any(n in self.topology.services[d].depends_on for d in live if d != n)
            ]
            for name in layer:
                self.running[name].proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            for name in layer:
                proc = self.running[name].proc
                try:
                    proc.wait(max(deadline - time.monotonic(), 0.01))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
            live -= set(layer)
        left = procs.pids_with_env(MARKER, str(self.workdir))
        if left:
            raise AssertionError(f"processes {left} started for {self.workdir} still run")

    def haproxy_servers(self, backend: str) -> dict[str, ServerState]:
        """The servers of one HAProxy backend, from its stats page (`/stats;csv`)."""
        (front,) = self.topology.of_kind("haproxy")
        url = f"http://{self.topology.address(front.name, 8404)}/stats;csv"
        with urllib.request.urlopen(url, timeout=3) as response:
            text = response.read().decode().lstrip("# ")
        servers = {}
        for row in csv.DictReader(io.StringIO(text)):
            if row["pxname"] == backend and row["svname"] not in ("FRONTEND", "BACKEND"):
                servers[row["svname"]] = ServerState(row["status"], int(row["scur"] or 0))
        return servers

    def log_tails(self, lines: int = 8) -> str:
        return "\n".join(
            f"-- {name}:\n" + "\n".join(procs.log_tail(run.log, lines))
            for name, run in self.running.items()
        )


def depends_on_conditions(name: str, spec: dict[str, Any]) -> list[tuple[str, str]]:
    """A service's `depends_on` as (dependency, condition); the short (list) form means
    service_started, as in Compose. A condition this runner cannot wait for is refused."""
    deps = spec.get("depends_on") or []
    if isinstance(deps, list):
        return [(str(d), STARTED) for d in deps]
    found = []
    for dep, how in deps.items():
        condition = (how or {}).get("condition", STARTED)
        if condition not in CONDITIONS:
            raise ComposeError(
                f"service {name}: depends_on {dep} with condition {condition}, which the local "
                f"run cannot wait for ({', '.join(CONDITIONS)})"
            )
        found.append((str(dep), condition))
    return found


def _haproxy_config_source(name: str, spec: dict[str, Any]) -> str:
    """The host side of the volume that mounts HAProxy's config in the file."""
    for volume in spec.get("volumes", []):
        if isinstance(volume, dict):  # long syntax (Compose's merged files)
            if volume.get("target") == "/usr/local/etc/haproxy/haproxy.cfg":
                return str(volume["source"])
            continue
        host, _, rest = str(volume).partition(":")
        if rest.startswith("/usr/local/etc/haproxy/haproxy.cfg"):
            return host
    raise ComposeError(f"service {name}: no volume mounts /usr/local/etc/haproxy/haproxy.cfg")


def _passes(argv: list[str], env: dict[str, str]) -> bool:
    """A healthcheck command exits 0; one that does not end in time fails, as in Docker
    (a loaded machine can take seconds to start Python)."""
    try:
        result = subprocess.run(argv, env=env, capture_output=True, timeout=10, check=False)
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0


def _http_ok(url: str, token: str | None = None) -> bool:
    headers = {"X-Consul-Token": token} if token else {}
    try:
        with urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=1
        ) as response:
            return bool(response.status == 200)
    except OSError:
        return False
