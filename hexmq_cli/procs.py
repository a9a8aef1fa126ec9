"""Background processes of a local cluster: spawn, identify, signal, wait, probe.

Linux only (it reads /proc). The cluster manager may exit while its children keep running and a
later `hexmq cluster ...` invocation must signal them, so a process is named by a
`ProcessIdentity` (pid + start time + boot id) that survives in cluster.json, never by a handle
object. Every signal goes through `send_signal`, which checks that identity first: a pid the
kernel has since given to an unrelated process is never signalled.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import socket
import struct
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.1"

# Exit statuses of children this process reaped, kept for error messages ("exited with code 1").
_exit_statuses: dict[int, int] = {}


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """One process instance: a pid is reused by the kernel, (boot, pid, start time) is not."""

    pid: int
    start_ticks: int  # field 22 of /proc/<pid>/stat: clock ticks from boot to process start
    boot_id: str


def boot_id() -> str:
    return Path("/proc/sys/kernel/random/boot_id").read_text().strip()


def _stat_fields(pid: int) -> list[str] | None:
    """Fields 3.. of /proc/<pid>/stat (state first), or None if there is no such process."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Field 2 is the command name in parentheses and may itself contain spaces and ')'.
    return raw[raw.rindex(b")") + 2 :].decode().split()


def identity_of(pid: int) -> ProcessIdentity | None:
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return ProcessIdentity(pid=pid, start_ticks=int(fields[19]), boot_id=boot_id())


def reap(pid: int) -> None:
    """Collect the exit status if `pid` is our exited child (it would stay a zombie otherwise:
    an orphan's zombie is only cleared if PID 1 reaps, which some container inits never do)."""
    try:
        done, status = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return
    if done:
        _exit_statuses[pid] = status


def describe_exit(pid: int) -> str:
    reap(pid)  # a no-op unless it is our child and has exited since it was last looked at
    status = _exit_statuses.get(pid)
    if status is None:
        return "exited"
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with code {os.waitstatus_to_exitcode(status)}"


def is_running(ident: ProcessIdentity) -> bool:
    """True while that very process exists and has not exited (a zombie counts as gone)."""
    reap(ident.pid)
    fields = _stat_fields(ident.pid)
    if fields is not None and fields[0] == "Z":
        # It exited between the reap above and the read of its state: reap it now, so that
        # describe_exit can name its exit status.
        reap(ident.pid)
    if fields is None or fields[0] in ("Z", "X", "x"):
        return False
    return int(fields[19]) == ident.start_ticks and boot_id() == ident.boot_id


def send_signal(ident: ProcessIdentity, sig: int) -> bool:
    """Signal the process if it is still the one we started; False if it is gone."""
    # A pidfd pins the process: once the identity is verified through /proc, the signal can
    # only reach that process even if it exits and its pid is reused in between.
    pidfd: int | None
    try:
        pidfd = os.pidfd_open(ident.pid)
    except ProcessLookupError:
        return False
    except OSError:  # kernel without pidfd (< 5.3): verify, then signal by pid
        pidfd = None
    try:
        if not is_running(ident):
            return False
        if pidfd is None:
            os.kill(ident.pid, sig)
        else:
            signal.pidfd_send_signal(pidfd, sig)
        return True
    except ProcessLookupError:
        return False
    finally:
        if pidfd is not None:
            os.close(pidfd)


def wait_gone(idents: Iterable[ProcessIdentity], timeout: float) -> list[ProcessIdentity]:
    """Wait up to `timeout` seconds for the processes to exit; return those still running."""
    pending = list(idents)
    deadline = time.monotonic() + timeout
    while True:
        pending = [p for p in pending if is_running(p)]
        if not pending or time.monotonic() >= deadline:
            return pending
        time.sleep(0.02)


def terminate(
    idents: Sequence[ProcessIdentity], grace: float, sig: int = signal.SIGTERM
) -> list[ProcessIdentity]:
    """`sig` (SIGTERM), wait up to `grace`, then SIGKILL; return those that had to be killed."""
    signalled = [p for p in idents if send_signal(p, sig)]
    try:
        stubborn = wait_gone(signalled, grace)
    except KeyboardInterrupt:
        # A second Ctrl-C while waiting means "now": do not leave anything behind.
        kill(signalled)
        raise
    kill(stubborn)
    return stubborn


def kill(idents: Sequence[ProcessIdentity]) -> None:
    """SIGKILL and wait until the processes are really gone (their ports are free then)."""
    killed = [p for p in idents if send_signal(p, signal.SIGKILL)]
    left = wait_gone(killed, 10.0)
    if left:  # uninterruptible sleep (D state) for 10 s: report rather than hang
        pids = ", ".join(str(p.pid) for p in left)
        raise OSError(f"processes {pids} did not die after SIGKILL")


# Signals whose disposition the child must not inherit from us: Python ignores SIGPIPE and
# SIGXFSZ, and the manager may have its own SIGINT/SIGTERM/SIGHUP handlers.
_RESET_SIGNALS = (
    signal.SIGPIPE,
    signal.SIGXFSZ,
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
)


def spawn(argv: Sequence[str], log_path: Path, env: Mapping[str, str]) -> ProcessIdentity:
    """Start argv in the background, in its own session, stdout and stderr appended to log_path.

    Its own session: Ctrl-C in the manager's terminal must not reach the services before the
    manager stops them in order. posix_spawn rather than subprocess.Popen: the caller usually
    exits while the child runs, so there is no handle object to keep alive or warn about.
    """
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        pid = os.posix_spawn(
            argv[0],
            list(argv),
            dict(env),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_DUP2, fd, 1),
                (os.POSIX_SPAWN_DUP2, fd, 2),
            ],
            setsid=True,
            setsigdef=_RESET_SIGNALS,
            setsigmask=(),
        )
    finally:
        os.close(fd)
    ident = identity_of(pid)
    # Our unreaped child always has a /proc entry, even if it already exited.
    assert ident is not None
    return ident


def pids_with_env(name: str, value: str) -> list[int]:
    """Pids of live processes whose initial environment holds name=value (leak checks)."""
    wanted = f"{name}={value}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone meanwhile, or another user's process
            continue
        if wanted in environ.split(b"\0"):
            ident = identity_of(int(entry.name))
            if ident is not None and is_running(ident):
                found.append(ident.pid)
    return sorted(found)


def log_tail(path: Path, lines: int = 20) -> list[str]:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            data = f.read()
    except FileNotFoundError:
        return []
    return data.decode(errors="replace").splitlines()[-lines:]


# --- ports and readiness probes (loopback only) ---------------------------------------------


def port_in_use(port: int, host: str = LOOPBACK) -> bool:
    """True if a server could not bind host:port (default 127.0.0.1) now.

    SO_REUSEADDR like the services' own listeners (asyncio and redis set it), so TIME_WAIT
    leftovers of an earlier run do not count as "in use", while any listener does.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def listens_on(pid: int, port: int, host: str = LOOPBACK) -> bool:
    """Whether process `pid` holds a TCP socket listening on host:port (IPv4), read from
    /proc: with SO_REUSEPORT several processes listen on one port, and a connection to it
    does not say which one answered."""
    wanted = f"{_proc_net_addr(host)}:{port:04X}"
    inodes = set()
    try:
        # The process's own network namespace's table (a node may run in one of its own).
        with open(f"/proc/{pid}/net/tcp") as table:
            next(table)
            for line in table:
                fields = line.split()
                # local_address, st 0A (LISTEN), inode
                if fields[1] == wanted and fields[3] == "0A":
                    inodes.add(f"socket:[{fields[9]}]")
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(fd) in inodes:
                return True
        except OSError:
            continue
    return False


def _proc_net_addr(host: str) -> str:
    """An IPv4 address as /proc/net/tcp writes it (the 32-bit value in host byte order)."""
    packed = socket.inet_aton(host)
    return f"{int.from_bytes(packed, sys.byteorder):08X}"


def tcp_accepts(port: int, timeout: float = 0.5, host: str = LOOPBACK) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def _resp(*words: str) -> bytes:
    out = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def redis_ready(
    port: int,
    timeout: float = 0.5,
    host: str = LOOPBACK,
    credentials: tuple[str, str] | None = None,
) -> bool:
    """PING answered by +PONG: listening is not enough, Redis answers -LOADING while it
    replays its append-only file, and the partition service would see those errors. A Redis
    that asks for a password answers -NOAUTH whether it is loading or not: `credentials`
    (user, password) authenticate first."""
    request = _resp("PING")
    want = b"+PONG"
    if credentials is not None:
        request = _resp("AUTH", *credentials) + request
        want = b"+OK\r\n+PONG"
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(request)
            answer = b""
            while len(answer) < len(want) and (chunk := s.recv(64)):
                answer += chunk
            return answer.startswith(want)
    except OSError:
        return False


def _mqtt_string(text: str) -> bytes:
    raw = text.encode()
    return struct.pack("!H", len(raw)) + raw


def mqtt_connect_packet(client_id: str, keepalive: int = 30) -> bytes:
    """An MQTT 3.1.1 CONNECT with clean session and no will, user name or password."""
    body = _mqtt_string("MQTT") + bytes([4, 0x02]) + struct.pack("!H", keepalive)
    body += _mqtt_string(client_id)
    assert len(body) < 128  # one-byte remaining length
    return bytes([0x10, len(body)]) + body


MQTT_DISCONNECT = b"\xe0\x00"


def probe_client_id() -> str:
    # 3.1.1 servers must accept 1-23 characters of [0-9a-zA-Z]; anything else may be refused.
    return "hexmqprobe" + secrets.token_hex(6)


@dataclass(frozen=True, slots=True)
class ConnectAnswer:
    """What an MQTT listener did with a probe's CONNECT: the CONNACK return code (None without
    a valid CONNACK), and whether it closed the connection without one (`refused`: the edge
    turned the probe away itself, for a client limit such as --max-packet-size, without asking
    its partition; a held CONNECT times out instead)."""

    code: int | None
    refused: bool = False


def mqtt_connect_answer(
    port: int, client_id: str | None = None, timeout: float = 2.0, host: str = LOOPBACK
) -> ConnectAnswer:
    """CONNECT to host:port and read the answer (mqtt_connack)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(mqtt_connect_packet(client_id or probe_client_id()))
            answer = b""
            while len(answer) < 4:
                chunk = s.recv(4 - len(answer))
                if not chunk:
                    return ConnectAnswer(None, refused=not answer)
                answer += chunk
            if answer[0] != 0x20 or answer[1] != 2:
                return ConnectAnswer(None)
            if answer[3] == 0:
                with contextlib.suppress(OSError):
                    s.sendall(MQTT_DISCONNECT)
            return ConnectAnswer(answer[3])
    except ConnectionResetError:
        return ConnectAnswer(None, refused=True)
    except OSError:
        return ConnectAnswer(None)


def mqtt_connack(
    port: int, client_id: str | None = None, timeout: float = 2.0, host: str = LOOPBACK
) -> int | None:
    """CONNECT to host:port; the CONNACK return code, or None without a valid CONNACK.

    Accepting TCP is not readiness for a broker: only an answered CONNECT shows that the edge
    reached its partition and membership services. Clean session, and by default a fresh
    client id, so the probe never takes over a real client's session.
    """
    return mqtt_connect_answer(port, client_id, timeout, host).code


def ready_view_epoch(port: int, timeout: float = 2.0, host: str = LOOPBACK) -> int | None:
    """The view epoch an edge's /readyz (on its metrics port) reports itself ready at ("ready:
    view N: routes all ..."), or None while it is not ready (services/edge/readiness.py)."""
    url = f"http://{f'[{host}]' if ':' in host else host}:{port}/readyz"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = response.read(4096).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        exc.close()  # 503, not ready (its socket closed now, not whenever it is collected)
        return None
    except (urllib.error.URLError, OSError, ValueError):
        return None
    words = body.split()
    if words[:2] != ["ready:", "view"] or len(words) < 3:
        return None
    epoch = words[2].rstrip(":")
    return int(epoch) if epoch.isdigit() else None
