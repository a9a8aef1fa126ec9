"""The membership agent's discovery options (`--discovery ...`, each also a HEXMQ_* variable),
checked into `DiscoverySettings`, and the backend they build (docs/discovery.md)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from services.membership.discovery import consul, dns, static
from services.membership.discovery.model import Discovery, DiscoveryContext, DiscoveryError
from services.membership.discovery.plugins import GROUP, load_plugin

BUILTINS: Final = (static.NAME, consul.NAME, dns.NAME)
DEFAULT_INTERVAL_S: Final = 5.0
DEFAULT_DNS_TIMEOUT_S: Final = 2.0

# Which backend each specific option belongs to (argparse dest -> backend).
_OWNERS: Final = {
    "discovery_static_file": (static.NAME,),
    "discovery_dns_name": (dns.NAME,),
    "discovery_dns_records": (dns.NAME,),
    "discovery_dns_server": (dns.NAME,),
    "discovery_dns_timeout": (dns.NAME,),
    "discovery_consul_service": (consul.NAME,),
    "discovery_consul_tag": (consul.NAME,),
    "discovery_interval": (static.NAME, dns.NAME),
}


def add_discovery_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "discovery",
        "which nodes may join the cluster (docs/discovery.md); default: every node "
        "that registers in Consul under --cluster",
    )
    group.add_argument(
        "--discovery",
        default=None,
        metavar="BACKEND",
        help=f"{', '.join(BUILTINS)}, or a plugin's name (entry point group {GROUP})",
    )
    group.add_argument(
        "--discovery-interval",
        type=float,
        default=None,
        metavar="S",
        help=f"static, dns: seconds between reads of the file or the name (default "
        f"{DEFAULT_INTERVAL_S:g})",
    )
    group.add_argument(
        "--discovery-static-file",
        type=Path,
        default=None,
        metavar="FILE",
        help="static: the members file, one `NODE_ID HOST:PORT` (partition address) a line",
    )
    group.add_argument(
        "--discovery-dns-name", default=None, metavar="NAME", help="dns: the name to resolve"
    )
    group.add_argument(
        "--discovery-dns-records",
        default=None,
        choices=dns.RECORD_KINDS,
        help="dns: address (A and AAAA, one IP a node) or srv (target and port a node); "
        "default address",
    )
    group.add_argument(
        "--discovery-dns-server",
        default=None,
        metavar="IP[:PORT]",
        help="dns: ask this server (default: the system's, /etc/resolv.conf)",
    )
    group.add_argument(
        "--discovery-dns-timeout",
        type=float,
        default=None,
        metavar="S",
        help=f"dns: seconds an answer may take (default {DEFAULT_DNS_TIMEOUT_S:g})",
    )
    group.add_argument(
        "--discovery-consul-service",
        default=None,
        metavar="NAME",
        help="consul: the catalog service the nodes register as (default "
        f"{consul.DEFAULT_SERVICE})",
    )
    group.add_argument(
        "--discovery-consul-tag",
        default=None,
        metavar="TAG",
        help="consul: only instances with this tag (default: the --cluster name, which every "
        "agent tags its node with)",
    )
    group.add_argument(
        "--discovery-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a setting for a discovery plugin (repeatable)",
    )


@dataclass(frozen=True, slots=True)
class DiscoverySettings:
    """A checked --discovery configuration."""

    backend: str  # static, consul, dns, or a plugin's name
    interval_s: float = DEFAULT_INTERVAL_S
    static_file: Path | None = None
    dns_settings: dns.DnsSettings | None = None
    consul_service: str = consul.DEFAULT_SERVICE
    consul_tag: str = ""
    options: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        if self.backend == static.NAME:
            return f"static ({self.static_file})"
        if self.backend == dns.NAME and self.dns_settings is not None:
            return f"dns ({self.dns_settings.records} {self.dns_settings.name})"
        if self.backend == consul.NAME:
            return f"consul (service {self.consul_service}, tag {self.consul_tag})"
        return f"plugin {self.backend}"


def _given(args: argparse.Namespace, dest: str) -> bool:
    return getattr(args, dest, None) is not None


def parse_plugin_options(pairs: list[str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise DiscoveryError(f"--discovery-option must be KEY=VALUE, got {pair!r}")
        if key.strip() in options:
            raise DiscoveryError(f"--discovery-option {key.strip()} is given twice")
        options[key.strip()] = value.strip()
    return options


def discovery_settings(args: argparse.Namespace, cluster: str) -> DiscoverySettings | None:
    """The checked settings (None: no discovery), or DiscoveryError naming the option."""
    backend = args.discovery
    if backend is None:
        stray = [d for d in _OWNERS if _given(args, d)]
        if args.discovery_option:
            stray.append("discovery_option")
        if stray:
            return _refuse_stray(stray, "no --discovery")
        return None
    backend = backend.strip()
    stray = [d for d, owners in _OWNERS.items() if _given(args, d) and backend not in owners]
    if stray:
        return _refuse_stray(stray, f"--discovery {backend}")
    if args.discovery_option and backend in BUILTINS:
        raise DiscoveryError(
            f"--discovery-option is for plugins; --discovery {backend} takes its own options"
        )
    interval = DEFAULT_INTERVAL_S if args.discovery_interval is None else args.discovery_interval
    if not interval > 0:
        raise DiscoveryError(f"--discovery-interval must be more than 0 seconds, got {interval}")
    if backend == static.NAME:
        if args.discovery_static_file is None:
            raise DiscoveryError("--discovery static needs --discovery-static-file FILE")
        return DiscoverySettings(backend, interval, static_file=args.discovery_static_file)
    if backend == dns.NAME:
        if not args.discovery_dns_name:
            raise DiscoveryError("--discovery dns needs --discovery-dns-name NAME")
        server = args.discovery_dns_server
        timeout = args.discovery_dns_timeout
        settings = dns.DnsSettings(
            name=args.discovery_dns_name,
            records=args.discovery_dns_records or "address",
            interval_s=interval,
            timeout_s=DEFAULT_DNS_TIMEOUT_S if timeout is None else timeout,
            server=dns.parse_dns_server(server) if server else None,
        )
        return DiscoverySettings(backend, interval, dns_settings=settings)
    if backend == consul.NAME:
        service = args.discovery_consul_service or consul.DEFAULT_SERVICE
        tag = cluster if args.discovery_consul_tag is None else args.discovery_consul_tag
        consul.check_service_and_tag(service, tag)
        return DiscoverySettings(backend, consul_service=service, consul_tag=tag)
    if not backend:
        raise DiscoveryError("--discovery must name a backend")
    return DiscoverySettings(backend, options=parse_plugin_options(args.discovery_option))


def _refuse_stray(dests: list[str], given: str) -> DiscoverySettings:
    options = ", ".join("--" + d.replace("_", "-") for d in dests)
    raise DiscoveryError(f"{options} given with {given}: they would be ignored")


def build_discovery(settings: DiscoverySettings, context: DiscoveryContext) -> Discovery:
    """The backend, checked as far as it can be before it runs: the members file is read once
    (a bad line stops the agent at startup), a plugin is loaded and made."""
    if settings.backend == static.NAME:
        assert settings.static_file is not None
        static.read_members(settings.static_file)
        return static.StaticDiscovery(settings.static_file, settings.interval_s)
    if settings.backend == dns.NAME:
        assert settings.dns_settings is not None
        return dns.DnsDiscovery(settings.dns_settings)
    if settings.backend == consul.NAME:
        return consul.ConsulCatalogDiscovery(
            consul.ConsulCatalogSettings(
                context.consul_addr,
                settings.consul_service,
                settings.consul_tag,
                credentials=context.consul_credentials,
            )
        )
    plugin_context = DiscoveryContext(
        node_id=context.node_id,
        cluster=context.cluster,
        partition_addr=context.partition_addr,
        mqtt_addr=context.mqtt_addr,
        membership_addr=context.membership_addr,
        consul_addr=context.consul_addr,
        options=dict(settings.options),
        consul_credentials=context.consul_credentials,
    )
    return load_plugin(settings.backend, plugin_context, BUILTINS)
