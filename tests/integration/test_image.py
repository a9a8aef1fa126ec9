"""The container image without a Docker engine: the Dockerfile's final stage is checked as
written, and its contents are built the way its stages build them, then its entry points are
started as the image's non-root user.

What this proves: the final stage runs as a numeric non-root uid with `hexmq` as entry point
and `hexmq health` as HEALTHCHECK, and installs no build tools; the build context the
.dockerignore lets through holds everything the package needs (a wheel is built from exactly
the files the build stage COPYs); that wheel, installed into a fresh virtual environment of
another interpreter, gives a `hexmq` entry point that runs as uid 10001 (no passwd entry, no
home, no write access to its own files), starts the membership, partition and edge services,
and that the HEALTHCHECK command run as that uid reports each of them ready.

What it does not prove: the base image's contents (python:3.11.11-slim-bookworm is not
pulled; Debian's /usr/bin/python3.11 stands in), the build stage's dependency resolution (the
dependencies come from this checkout's .venv, pinned by the same constraints.txt), the image's
layers and file ownership, the useradd line, and the traces stage. No base image can be pulled
here (STACK.md), so nothing runs inside a real container.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hexmq.trust import certs
from tests.support import trust
from tests.support.dockerfile import DockerIgnore, Stage, parse_dockerfile
from tests.support.ports import free_ports
from tests.support.processes import end

ROOT = Path(__file__).resolve().parents[2]
DEBIAN_PYTHON = Path("/usr/bin/python3.11")
BUILD_TOOLS = ("apt-get", "apt ", "pip ", "gcc", "make ", "build-essential", "curl", "wget")


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile((ROOT / "Dockerfile").read_text())


def final(stages: list[Stage]) -> Stage:
    return stages[-1]


def image_user(stage: Stage) -> tuple[int, int]:
    user = stage.last("USER")
    assert user is not None, "the final stage sets no USER: it would run as root"
    uid, _, gid = user.args.partition(":")
    assert uid.isdigit(), f"USER {user.args}: use a numeric uid (Kubernetes runAsNonRoot)"
    return int(uid), int(gid or uid)


def test_final_stage_runs_hexmq_as_a_non_root_user_with_a_healthcheck(stages: list[Stage]) -> None:
    stage = final(stages)
    assert stage.name == "hexmq"
    assert stage.base.startswith("python:3.11")
    assert stage.base.endswith("-slim-bookworm")
    uid, gid = image_user(stage)
    assert uid >= 1000
    assert gid >= 1000
    entrypoint = stage.last("ENTRYPOINT")
    assert entrypoint is not None
    assert entrypoint.exec_form() == ["hexmq"]
    healthcheck = stage.last("HEALTHCHECK")
    assert healthcheck is not None
    assert healthcheck.exec_form() == ["hexmq", "health"]
    # No build tools: the final stage only adds the user and copies the built environment.
    for run in stage.all("RUN"):
        assert not any(tool in run.args for tool in BUILD_TOOLS), run.args
    copies = stage.all("COPY")
    assert [c.args for c in copies] == ["--from=build /opt/hexmq /opt/hexmq"]
    env = final_env(stage)
    assert env["HEXMQ_METRICS_LISTEN"] == "0.0.0.0:9100"  # what the HEALTHCHECK asks
    # The other stages are pinned too, and the Spark stage does not run as root either.
    traces = next(s for s in stages if s.name == "traces")
    assert image_user(traces)[0] >= 1000


def test_dockerignore_keeps_the_context_to_what_the_build_copies() -> None:
    ignore = DockerIgnore.load(ROOT / ".dockerignore")
    for kept in ("pyproject.toml", "README.md", "constraints.txt", "hexmq_cli/cli.py"):
        assert not ignore.excluded(kept), kept
    for left_out in (
        ".venv/bin/python",
        ".git/HEAD",
        "tests/unit/test_compose.py",
        "hexmq/__pycache__/cli.cpython-311.pyc",
        "bench/results/x.json",
        "deploy/compose/compose.yaml",
    ):
        assert ignore.excluded(left_out), left_out


def final_env(stage: Stage) -> dict[str, str]:
    env: dict[str, str] = {}
    for instruction in stage.all("ENV"):
        for word in shlex.split(instruction.args):
            key, _, value = word.partition("=")
            env[key] = value
    return env


def build_context(stage: Stage, into: Path) -> None:
    """The build stage's COPY instructions from the repository, through .dockerignore, into
    `into` as the stage's filesystem root (WORKDIR respected)."""
    ignore = DockerIgnore.load(ROOT / ".dockerignore")
    workdir = Path("/")
    for instruction in stage.instructions:
        if instruction.keyword == "WORKDIR":
            workdir = workdir / instruction.args
        if instruction.keyword != "COPY":
            continue
        words = instruction.args.split()
        assert not words[0].startswith("--from"), "the build stage copies from the context only"
        *sources, dest = words
        base = into / (workdir / dest).relative_to("/")
        for source in sources:
            if (ROOT / source).is_file():
                assert not ignore.excluded(source), f"COPY {source}: left out by .dockerignore"
                target = base / Path(source).name if dest.endswith("/") else base
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / source, target)
                continue
            for path in sorted((ROOT / source).rglob("*")):
                relative = path.relative_to(ROOT).as_posix()
                if path.is_file() and not ignore.excluded(relative):
                    out = base / path.relative_to(ROOT / source)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, out)


def run(argv: list[str]) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"{' '.join(argv)}:\n{result.stdout}{result.stderr}"


@pytest.fixture(scope="module")
def image_root(stages: list[Stage]) -> Iterator[Path]:
    """/opt/hexmq built as the Dockerfile builds it, in a directory uid 10001 can read."""
    if not DEBIAN_PYTHON.exists() or shutil.which("setpriv") is None:
        pytest.fail(
            "this test needs /usr/bin/python3.11 and setpriv (Debian: python3.11, util-linux)"
        )
    top = Path(tempfile.mkdtemp(prefix="hexmq-image-"))
    try:
        top.chmod(0o755)
        build = next(s for s in stages if s.name == "build")
        context = top / "context"
        build_context(build, context)
        wheels = top / "wheels"
        pip = [sys.executable, "-m", "pip"]
        run(
            [
                *pip,
                "wheel",
                "-q",
                "--no-deps",
                "--no-build-isolation",
                "-w",
                str(wheels),
                str(context / "src"),
            ]
        )
        venv = top / "opt" / "hexmq"
        subprocess.run([str(DEBIAN_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True)
        (wheel,) = wheels.glob("hexmq-*.whl")
        python = str(venv / "bin" / "python")
        run([*pip, "--python", python, "install", "-q", "--no-deps", "--no-index", str(wheel)])
        # The dependencies: this checkout's, after the image's own site-packages; plus those
        # that only the stand-in interpreter needs (redis-py needs async-timeout before
        # Python 3.11.3), found by pip check as a resolver on that interpreter would.
        site = next((venv / "lib").glob("python3*/site-packages"))
        (site / "zz-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
        check = subprocess.run([*pip, "--python", python, "check"], capture_output=True, text=True)
        missing = re.findall(r"requires ([A-Za-z0-9_.-]+), which is not installed", check.stdout)
        if missing:
            run([*pip, "--python", python, "install", "-q", "--no-deps", *sorted(set(missing))])
        subprocess.run(["chmod", "-R", "a+rX,go-w", str(top)], check=True)
        yield venv
    finally:
        shutil.rmtree(top, ignore_errors=True)


def as_image_user(stages: list[Stage], venv: Path, argv: list[str]) -> list[str]:
    uid, gid = image_user(final(stages))
    return ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *argv]


def image_environment(stages: list[Stage], venv: Path, **extra: str) -> dict[str, str]:
    env = {k: v.replace("/opt/hexmq", str(venv)) for k, v in final_env(final(stages)).items()}
    env["PATH"] = env["PATH"].replace("$PATH", "/usr/bin:/bin")
    return {**env, "HOME": "/nonexistent", "LANG": "C.UTF-8", **extra}


def test_entry_points_start_as_the_non_root_user(stages: list[Stage], image_root: Path) -> None:
    env = image_environment(stages, image_root)
    cmd = final(stages).last("CMD")
    assert cmd is not None
    for args in (
        cmd.exec_form(),
        ["edge", "--help"],
        ["partition", "--help"],
        ["membership", "--help"],
        ["health", "--help"],
    ):
        result = subprocess.run(
            as_image_user(stages, image_root, ["hexmq", *args]),
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",  # the final stage sets no WORKDIR
        )
        assert result.returncode == 0, f"hexmq {' '.join(args)}: {result.stderr}"
    where = subprocess.run(
        as_image_user(
            stages,
            image_root,
            ["python", "-c", "import os, hexmq; print(os.getuid(), hexmq.__file__)"],
        ),
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    ).stdout.split()
    uid, _ = image_user(final(stages))
    assert where[0] == str(uid)
    assert where[1].startswith(str(image_root)), "the image's own hexmq, not the checkout's"


@contextlib.contextmanager
def started(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, cwd="/")
    try:
        yield proc
    finally:
        end(proc)


def uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            real, effective, *_ = line.split()[1:]
            assert real == effective
            return int(real)
    raise AssertionError(f"no Uid line for pid {pid}")


def healthy(stages: list[Stage], venv: Path, env: dict[str, str], log: Path) -> None:
    """Run the image's HEALTHCHECK command as the image user until it passes (30 s at most)."""
    healthcheck = final(stages).last("HEALTHCHECK")
    assert healthcheck is not None
    deadline = time.monotonic() + 30
    while True:
        result = subprocess.run(
            as_image_user(stages, venv, healthcheck.exec_form()),
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            cwd="/",
        )
        if result.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"HEALTHCHECK never passed: {result.stdout}\n{log.read_text()}")
        time.sleep(0.2)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory uid 10001 can read (pytest's tmp_path is under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="hexmq-image-run-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_the_services_start_as_the_non_root_user_and_pass_the_healthcheck(
    stages: list[Stage], image_root: Path, shared_dir: Path
) -> None:
    tmp_path = shared_dir
    redis_port, membership, partition, mqtt, m1, m2, m3, consul = free_ports(8)
    redis = [
        shutil.which("redis-server") or "redis-server",
        "--port",
        str(redis_port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--dir",
        str(tmp_path),
    ]
    services = [
        (
            "membership",
            m1,
            [
                *("--node-id", "n1", "--listen", f"127.0.0.1:{membership}"),
                *("--consul", f"127.0.0.1:{consul}", "--cluster", "image"),
                *("--partition-addr", f"127.0.0.1:{partition}", "--mqtt-addr", f"127.0.0.1:{mqtt}"),
                *("--expect", "1"),
            ],
        ),
        (
            "partition",
            m2,
            [
                "--node-id",
                "n1",
                "--listen",
                f"127.0.0.1:{partition}",
                "--redis",
                f"redis://127.0.0.1:{redis_port}/0",
                "--membership",
                f"127.0.0.1:{membership}",
            ],
        ),
        (
            "edge",
            m3,
            [
                "--node-id",
                "n1",
                "--listen",
                f"127.0.0.1:{mqtt}",
                "--membership",
                f"127.0.0.1:{membership}",
            ],
        ),
    ]
    # The agreement store compose runs is a Consul server; here the image's own embedded one.
    agreement = ["hexmq", "consul-dev", "--listen", f"127.0.0.1:{consul}"]
    certs.make_ca(tmp_path / "tls")
    with contextlib.ExitStack() as stack:
        stack.enter_context(started(redis, dict(os.environ), tmp_path / "redis.log"))
        env = image_environment(stages, image_root)
        stack.enter_context(
            started(as_image_user(stages, image_root, agreement), env, tmp_path / "consul.log")
        )
        # All three first: a membership agent is ready once the view it agrees on admits its
        # node, which needs the node's partition service.
        running = []
        uid, gid = image_user(final(stages))
        for name, metrics_port, args in services:
            # Its cluster certificate, as a deployment gives it: readable by the image's user.
            tls = trust.files_for(tmp_path / "tls", name, "n1")
            os.chown(tls.key, uid, gid)
            # HEXMQ_METRICS_LISTEN as the image sets it, on a port of this test's own.
            env = image_environment(
                stages,
                image_root,
                HEXMQ_METRICS_LISTEN=f"127.0.0.1:{metrics_port}",
                HEXMQ_CLUSTER_CA=str(tls.ca),
                HEXMQ_CLUSTER_CERT=str(tls.cert),
                HEXMQ_CLUSTER_KEY=str(tls.key),
            )
            log = tmp_path / f"{name}.log"
            proc = stack.enter_context(
                started(as_image_user(stages, image_root, ["hexmq", name, *args]), env, log)
            )
            running.append((name, proc, env, log))
        for name, proc, env, log in running:
            healthy(stages, image_root, env, log)
            assert proc.poll() is None
            assert uid_of(proc.pid) == image_user(final(stages))[0], name
