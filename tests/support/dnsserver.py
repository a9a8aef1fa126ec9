"""A DNS server the tests control: dnslib answering A, AAAA and SRV queries over UDP on a
loopback address and port, from records the test sets and changes while it runs.

    server = ZoneServer("127.0.0.53")
    server.set("hexmq.test", "A", ["127.0.0.2", "127.0.0.3"])
    server.set("_partition._tcp.hexmq.test", "SRV", [("n1.hexmq.test", 7001)])
    server.start()          # then resolve from 127.0.0.53:server.port
    server.failing = True   # answer SERVFAIL to everything (a broken server)
    server.stop()

A name with no records of the asked type but records of another answers NOERROR with no
answer; a name with none at all answers NXDOMAIN, as a real server does.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Sequence
from typing import Any

from dnslib import AAAA, QTYPE, RCODE, RR, SRV, A, DNSRecord
from dnslib.server import DNSLogger, DNSServer

TTL = 1


def _key(name: str) -> str:
    return name.rstrip(".").lower()


class _Resolver:
    def __init__(self, zone: ZoneServer) -> None:
        self.zone = zone

    def resolve(self, request: DNSRecord, handler: Any) -> DNSRecord:
        reply = request.reply()
        qname = str(request.q.qname)
        qtype = QTYPE[request.q.qtype]
        with self.zone.lock:
            self.zone.queries.append((_key(qname), qtype))
            if self.zone.failing:
                reply.header.rcode = RCODE.SERVFAIL
                return reply
            records = self.zone.records.get(_key(qname), {})
            values = list(records.get(qtype, ()))
        if not records:
            reply.header.rcode = RCODE.NXDOMAIN
            return reply
        for value in values:
            if qtype == "A":
                rdata: Any = A(value)
            elif qtype == "AAAA":
                rdata = AAAA(value)
            else:
                target, port = value
                rdata = SRV(priority=0, weight=0, port=port, target=target)
            reply.add_answer(RR(qname, getattr(QTYPE, qtype), rdata=rdata, ttl=TTL))
        return reply


class ZoneServer:
    def __init__(self, address: str = "127.0.0.1", port: int = 0) -> None:
        self.address = address
        self.port = port or _free_udp_port(address)
        self.records: dict[str, dict[str, list[Any]]] = {}
        self.queries: list[tuple[str, str]] = []
        self.failing = False
        self.lock = threading.Lock()
        self._server: DNSServer | None = None

    @property
    def server_arg(self) -> str:
        """The --discovery-dns-server value that asks this server."""
        return f"{self.address}:{self.port}"

    def set(self, name: str, rtype: str, values: Sequence[Any]) -> None:
        """Replace the records of one type of a name ([]: none of that type)."""
        if rtype not in ("A", "AAAA", "SRV"):
            raise ValueError(f"this test server serves A, AAAA and SRV, not {rtype}")
        with self.lock:
            types = self.records.setdefault(_key(name), {})
            if values:
                types[rtype] = list(values)
            else:
                types.pop(rtype, None)
                if not types:
                    del self.records[_key(name)]

    def start(self) -> None:
        quiet = DNSLogger(log="", logf=lambda _text: None)
        self._server = DNSServer(
            _Resolver(self), address=self.address, port=self.port, logger=quiet
        )
        self._server.start_thread()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server.server.server_close()
            self._server = None


def _free_udp_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])
