"""Start and stop `hexmq consul-dev` processes for tests: loopback only, stopped by pid.

server = start_consul_dev(tmp_path / "consul-dev.log")      # a free port (--listen :0)
... make_consul(server.addr) ...
assert server.stop() == 0                                    # SIGTERM, then wait

`write_token_file(path)` makes a management token file for `--acl-token-file` (a fresh random
token each time): start_consul_dev(log, "--acl-token-file", str(path)).
"""

from __future__ import annotations

import os
import secrets
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HEXMQ = Path(sys.executable).with_name("hexmq")
SERVING = "serving on "


@dataclass
class ConsulDev:
    proc: subprocess.Popen[bytes]
    addr: str  # HOST:PORT, or https://HOST:PORT when it serves HTTPS
    log: Path

    @property
    def port(self) -> int:
        return int(self.addr.rsplit(":", 1)[1])

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        """Signal the process (by its pid) and wait; SIGKILL if it outstays `timeout`."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
                raise AssertionError(
                    f"hexmq consul-dev (pid {self.proc.pid}) ignored signal {sig} for {timeout}s"
                ) from None
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        return self.proc.returncode


def start_consul_dev(
    log: Path, *args: str, listen: str = "127.0.0.1:0", timeout: float = 20.0
) -> ConsulDev:
    """Run `hexmq consul-dev --listen LISTEN ARGS...` until it says where it serves."""
    with log.open("ab") as log_file:
        proc = subprocess.Popen(
            [str(HEXMQ), "consul-dev", "--listen", listen, *args],
            stdout=subprocess.PIPE,
            stderr=log_file,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    line = b""
    while not line.endswith(b"\n"):
        remaining = deadline - time.monotonic()
        ready, _, _ = select.select([proc.stdout], [], [], max(remaining, 0))
        if not ready:
            proc.kill()
            proc.wait(5)
            raise AssertionError(
                f"hexmq consul-dev did not start in {timeout}s:\n{log.read_text()}"
            )
        chunk = os.read(proc.stdout.fileno(), 1)
        if not chunk:
            proc.wait(5)
            raise AssertionError(
                f"hexmq consul-dev exited with {proc.returncode}:\n{log.read_text()}"
            )
        line += chunk
    text = line.decode().strip()
    assert text.startswith(SERVING), text
    url = text[len(SERVING) :]
    return ConsulDev(proc, url.removeprefix("http://"), log)


def write_token_file(path: Path, token: str | None = None) -> str:
    """Write a token (a fresh random one by default) to `path`, replacing the file in one
    step (as an operator's rotation should); the token."""
    token = token if token is not None else secrets.token_hex(16)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(token + "\n")
    os.replace(tmp, path)
    return token
