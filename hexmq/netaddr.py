"""host:port parsing shared by every service's command line."""

from __future__ import annotations


def parse_hostport(value: str, *, what: str = "address") -> tuple[str, int]:
    """'127.0.0.1:1883' -> ('127.0.0.1', 1883); a clear ValueError otherwise."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{what} must be HOST:PORT, got {value!r}")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"{what} port must be 1-65535, got {port}")
    return host.strip("[]"), port
