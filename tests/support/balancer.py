"""A round-robin TCP balancer on loopback, as a client sees a cluster behind HAProxy's
`balance roundrobin` in TCP mode: each new connection goes to the next target in turn, and its
bytes are forwarded both ways until either side closes. Consecutive connections of one client
program land on different nodes, which is what the cross-node tests want."""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence


class RoundRobinBalancer:
    def __init__(self, targets: Sequence[tuple[str, int]]) -> None:
        if not targets:
            raise ValueError("a balancer needs at least one target")
        self.targets = list(targets)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._next = 0
        self._sockets: list[socket.socket] = []
        self._closed = False
        # Which target each accepted connection went to, in order (tests may check the spread).
        self.placements: list[int] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                index = self._next
                self._next = (self._next + 1) % len(self.targets)
            try:
                upstream = socket.create_connection(self.targets[index], timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                if self._closed:
                    client.close()
                    upstream.close()
                    return
                self.placements.append(index)
                self._sockets += [client, upstream]
            link = _Link(client, upstream)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=link.pump, args=(src, dst), daemon=True).start()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._listener.close()
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            _shutdown(s)
            s.close()

    def __enter__(self) -> RoundRobinBalancer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Link:
    """One client connection and its upstream: closed when both directions have ended."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.sockets = (client, upstream)
        self._lock = threading.Lock()
        self._open_directions = 2

    def pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Forward until src ends, then pass the end on as a half-close, as a TCP balancer
        does (a DISCONNECT the broker sends just before it closes still reaches the client)."""
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        with self._lock:
            self._open_directions -= 1
            done = self._open_directions == 0
        if done:
            for s in self.sockets:
                s.close()


def _shutdown(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
