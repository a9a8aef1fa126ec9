"""A TCP proxy that can go silent, for tests of what a network cut does to long-lived
requests without a network namespace: `freeze()` stops forwarding on every connection (their
bytes are read and dropped, as packets a cut drops), `thaw()` forwards again, but only on
connections opened after it: the old ones stay silent for good, as connections whose
retransmissions a cut pushed far out (TCP backs off up to minutes) look to the application."""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass, field


@dataclass
class _Link:
    generation: int
    sockets: list[socket.socket] = field(default_factory=list)


class FreezableProxy:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._generation = 0
        self._frozen: set[int] = set()
        self._links: list[_Link] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def freeze(self) -> None:
        with self._lock:
            self._frozen.add(self._generation)

    def thaw(self) -> None:
        with self._lock:
            self._generation += 1

    def _silent(self, link: _Link) -> bool:
        with self._lock:
            return link.generation in self._frozen

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                link = _Link(self._generation, [client, upstream])
                if self._closed:
                    _close(link)
                    return
                self._links.append(link)
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(link, src, dst), daemon=True).start()

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                if not self._silent(link):
                    dst.sendall(data)
        except OSError:
            pass
        if not self._silent(link):
            for s in link.sockets:
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._listener.close()
            for link in self._links:
                _close(link)


def _close(link: _Link) -> None:
    for s in link.sockets:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
