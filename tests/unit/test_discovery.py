"""Node discovery (services/membership/discovery, docs/discovery.md) without the network: the
members file, what a listing names, the polling schedule on a clock the test moves, the DNS
and Consul answers as listings, the options, the agent's gate, and the planner's admission
rule with discovery (a listed node joins, an unlisted one does not, a member that discovery
stops listing stays)."""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hexmq.api.membership.v1 import membership_pb2 as pb
from services.membership import main as membership_main
from services.membership.discovery import consul, dns, static
from services.membership.discovery.gate import DiscoveryGate
from services.membership.discovery.matching import match, names_to_resolve
from services.membership.discovery.model import DiscoveryError, ListedNode, Listing
from services.membership.discovery.options import build_discovery, discovery_settings
from services.membership.discovery.polling import PollSchedule
from services.membership.plan import Discovered, Observed, PlanConfig, Registration, plan
from tests.support.plan_inputs import NOW, SETTLE, reg

# --- the members file ----------------------------------------------------------------------

MEMBERS = """\
# the cluster's nodes
n1 10.0.0.1:2885
n2 10.0.0.2:2885   # the second

n3 [2001:db8::3]:2885
"""


def test_a_members_file_lists_node_ids_with_their_addresses() -> None:
    listing = static.parse_members(MEMBERS, "members")
    assert listing == Listing.of(
        [
            ListedNode("n1", "10.0.0.1", 2885),
            ListedNode("n2", "10.0.0.2", 2885),
            ListedNode("n3", "2001:db8::3", 2885),
        ]
    )
    assert static.parse_members("# nobody yet\n\n", "members") == Listing()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("n1\n", r"/etc/m:1: expected NODE_ID HOST:PORT \(two fields\), got 'n1'"),
        ("n1 10.0.0.1:1 extra\n", r"/etc/m:1: expected NODE_ID HOST:PORT"),
        ("# ok\nn1 10.0.0.1\n", r"/etc/m:2: the address must be HOST:PORT, got '10.0.0.1'"),
        ("n1 10.0.0.1:70000\n", r"/etc/m:1: the address port must be 1-65535"),
        ("n/1 10.0.0.1:1\n", r"/etc/m:1: listed node id 'n/1' is not a node id"),
        ("n1 10.0.0.1:1\nn1 10.0.0.2:1\n", r"/etc/m:2: node n1 is listed on line 1 too"),
        ("n1 10.0.0.1:1\nn2 10.0.0.1:1\n", r"/etc/m:2: address 10.0.0.1:1 is listed on line 1"),
    ],
)
def test_a_bad_line_of_a_members_file_is_named_by_file_and_line(text: str, error: str) -> None:
    with pytest.raises(DiscoveryError, match=error):
        static.parse_members(text, "/etc/m")


def test_a_members_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match=r"cannot read .*absent"):
        static.read_members(tmp_path / "absent")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(DiscoveryError, match="binary: not UTF-8 text"):
        static.read_members(binary)


async def test_the_static_backend_follows_edits_and_keeps_the_last_good_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "members"
    path.write_text("n1 127.0.0.1:7001\n")
    seen: asyncio.Queue[Listing] = asyncio.Queue()

    async def follow() -> None:
        async for listing in static.StaticDiscovery(path, interval_s=0.05).listings():
            seen.put_nowait(listing)

    task = asyncio.create_task(follow())
    try:
        first = await asyncio.wait_for(seen.get(), 2)
        assert {n.node_id for n in first.nodes} == {"n1"}
        path.write_text("n1 127.0.0.1:7001\nn2 127.0.0.1:7002\n")
        second = await asyncio.wait_for(seen.get(), 2)
        assert {n.node_id for n in second.nodes} == {"n1", "n2"}
        with caplog.at_level(logging.WARNING, "hexmq.membership"):
            path.write_text("n1 127.0.0.1:7001\nn3\n")  # a broken save: nothing changes
            await asyncio.sleep(0.3)
        assert seen.empty()
        assert "members:2: expected NODE_ID HOST:PORT" in caplog.text
        assert "keeping the last listing (n1 at 127.0.0.1:7001, n2 at 127.0.0.1:7002)" in (
            caplog.text
        )
        path.write_text("n2 127.0.0.1:7002\n")
        third = await asyncio.wait_for(seen.get(), 2)
        assert {n.node_id for n in third.nodes} == {"n2"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


# --- listed nodes and matching ---------------------------------------------------------------


def test_a_listed_node_needs_an_id_or_a_host_and_normalises_its_host() -> None:
    with pytest.raises(DiscoveryError, match="needs a node id, a host, or both"):
        ListedNode()
    with pytest.raises(DiscoveryError, match="must be 1-65535 and come with a host"):
        ListedNode("n1", port=7001)
    with pytest.raises(DiscoveryError, match="is not an IP address"):
        ListedNode(host="n1.example", addresses=frozenset({"n1.example"}))
    assert ListedNode(host="Node-1.Example.") == ListedNode(host="node-1.example")
    assert ListedNode(host="[2001:DB8::1]").host == "2001:db8::1"


def registration(node: str, partition_addr: str, incarnation: int = 1) -> Registration:
    return Registration(node, partition_addr, "127.0.0.1:1883", "127.0.0.1:2884", incarnation, 0)


REGISTRY = {
    "n1": registration("n1", "10.0.0.1:2885"),
    "n2": registration("n2", "10.0.0.2:2885"),
    "n3": registration("n3", "partition-3:2885"),
    "n4": registration("n4", "10.0.0.4:2885", incarnation=0),  # registered, not serving
}


def test_a_listed_node_id_names_that_registration_at_its_address() -> None:
    listing = Listing.of([ListedNode("n1", "10.0.0.1", 2885), ListedNode("n2")])
    outcome = match(listing, REGISTRY)
    assert outcome.discovered == Discovered(frozenset({"n1", "n2"}), missing=0)
    # A listed address that is not where the node registered: not listed, and said why.
    outcome = match(Listing.of([ListedNode("n1", "10.0.0.9", 2885)]), REGISTRY)
    assert outcome.discovered == Discovered(frozenset(), missing=1)
    assert outcome.conflicts == {"n1": "n1 at 10.0.0.9:2885"}


def test_a_listed_address_names_the_registrations_there() -> None:
    listing = Listing.of([ListedNode(host="10.0.0.1"), ListedNode(host="10.0.0.2", port=9)])
    assert match(listing, REGISTRY).discovered == Discovered(frozenset({"n1"}), missing=1)
    # A registration by host name matches the IP it resolves to, once the agent resolved it.
    listing = Listing.of([ListedNode(host="10.0.0.3")])
    assert names_to_resolve(listing, REGISTRY) == {"partition-3"}
    assert match(listing, REGISTRY).discovered.listed == frozenset()
    resolved = {"partition-3": frozenset({"10.0.0.3"})}
    assert match(listing, REGISTRY, resolved).discovered.listed == {"n3"}
    # An SRV target with its addresses needs no resolving of its own.
    srv = Listing.of([ListedNode(host="n1.hexmq.test", port=2885, addresses={"10.0.0.1"})])
    assert names_to_resolve(srv, {"n1": REGISTRY["n1"]}) == set()
    assert match(srv, REGISTRY).discovered.listed == {"n1"}


def test_missing_counts_listed_entries_without_a_serving_registration() -> None:
    listing = Listing.of([ListedNode("n1"), ListedNode("n4"), ListedNode("n9")])
    assert match(listing, REGISTRY).discovered == Discovered(frozenset({"n1", "n4"}), missing=2)
    assert match(None, REGISTRY).discovered == Discovered(frozenset(), missing=0)


# --- the polling schedule ----------------------------------------------------------------------


def test_polling_publishes_changes_only_and_keeps_the_last_listing_on_failure() -> None:
    one = Listing.of([ListedNode("n1")])
    two = Listing.of([ListedNode("n1"), ListedNode("n2")])
    schedule = PollSchedule(interval_s=8.0, now=100.0)
    assert schedule.due_in(100.0) == 0  # the first read at once
    assert schedule.succeeded(one, 100.0).publish == one
    assert schedule.due_in(100.0) == 8.0
    assert schedule.succeeded(one, 108.0).publish is None  # the same: not news
    # Failures keep `one`, are logged once, and are retried sooner: 1, 2, 4, then 8 s.
    first = schedule.failed("timed out", 116.0)
    assert (first.publish, first.log_error) == (None, "timed out")
    assert schedule.due_in(116.0) == 1.0
    assert schedule.failed("timed out", 117.0).log_error == ""
    assert schedule.due_in(117.0) == 2.0
    schedule.failed("timed out", 119.0)
    assert schedule.due_in(119.0) == 4.0
    schedule.failed("timed out", 123.0)
    assert schedule.due_in(123.0) == 8.0
    assert schedule.last == one
    back = schedule.succeeded(two, 131.0)
    assert (back.publish, back.log_recovered) == (two, True)
    with pytest.raises(ValueError, match="more than 0 seconds"):
        PollSchedule(0, 0.0)


# --- DNS and Consul answers as listings ------------------------------------------------------


def test_dns_answers_become_listings() -> None:
    assert dns.address_listing(["10.0.0.1", "10.0.0.2"]) == Listing.of(
        [ListedNode(host="10.0.0.1"), ListedNode(host="10.0.0.2")]
    )
    srv = dns.srv_listing(
        [("n1.hexmq.test.", 2885), (".", 2885), ("N2.hexmq.test.", 2886)],
        {"n1.hexmq.test": frozenset({"10.0.0.1"})},
    )
    assert srv == Listing.of(
        [
            ListedNode(host="n1.hexmq.test", port=2885, addresses=frozenset({"10.0.0.1"})),
            ListedNode(host="n2.hexmq.test", port=2886),  # "." is "no service here"
        ]
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.53", ("127.0.0.53", 53)),
        ("127.0.0.53:5353", ("127.0.0.53", 5353)),
        ("::1", ("::1", 53)),
        ("[::1]:5353", ("::1", 5353)),
    ],
)
def test_a_dns_server_is_an_ip_with_an_optional_port(text: str, expected: tuple[str, int]) -> None:
    assert dns.parse_dns_server(text) == expected


@pytest.mark.parametrize("text", ["dns.example", "127.0.0.1:x", "127.0.0.1:0", "[::1]x"])
def test_a_bad_dns_server_is_named(text: str) -> None:
    with pytest.raises(DiscoveryError, match="--discovery-dns-server"):
        dns.parse_dns_server(text)


def health_entry(sid: str, meta: dict[str, str], address: str = "", port: int = 0) -> Any:
    return {
        "Node": {"Node": "consul-1", "Address": "10.0.0.100"},
        "Service": {"ID": sid, "Service": "hexmq", "Address": address, "Port": port, "Meta": meta},
        "Checks": [],
    }


def test_consul_health_entries_become_listings(caplog: pytest.LogCaptureFixture) -> None:
    entries = [
        health_entry("n1", {"node_id": "n1"}, "10.0.0.1", 2885),  # an agent's own
        health_entry("web-7", {}, "10.0.0.2", 2885),  # registered by hand: an address
        health_entry("old", {}, "", 2885),  # no service address: its node's
        health_entry("bad", {"node_id": "n/1"}, "10.0.0.3", 2885),
    ]
    with caplog.at_level(logging.WARNING, "hexmq.membership"):
        listing = consul.health_listing(entries, "consul (service hexmq)")
    assert listing == Listing.of(
        [
            ListedNode("n1", "10.0.0.1", 2885),
            ListedNode(host="10.0.0.2", port=2885),
            ListedNode(host="10.0.0.100", port=2885),
        ]
    )
    assert "service instance 'bad': listed node id 'n/1' is not a node id" in caplog.text


# --- options ---------------------------------------------------------------------------------


def parse(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    membership_main.add_arguments(parser)
    return parser.parse_args(
        [
            *("--node-id", "n1", "--listen", "127.0.0.1:7001", "--cluster", "prod"),
            *("--partition-addr", "127.0.0.1:7002", "--mqtt-addr", "127.0.0.1:1883"),
            *extra,
        ]
    )


def test_without_discovery_every_registered_node_is_a_candidate_and_expect_is_one() -> None:
    config = membership_main.agent_config(parse())
    assert (config.discovery, config.expect) == (None, 1)
    assert (config.service_name, config.service_tags) == ("hexmq", ("prod",))


def test_with_discovery_expect_is_derived_unless_given(tmp_path: Path) -> None:
    members = tmp_path / "members"
    members.write_text("n1 127.0.0.1:7002\n")
    args = ("--discovery", "static", "--discovery-static-file", str(members))
    config = membership_main.agent_config(parse(*args))
    assert config.expect is None
    assert config.discovery is not None
    assert (config.discovery.backend, config.discovery.static_file) == ("static", members)
    assert membership_main.agent_config(parse(*args, "--expect", "2")).expect == 2


def test_consul_discovery_registers_the_node_under_its_service_and_tag() -> None:
    config = membership_main.agent_config(parse("--discovery", "consul"))
    assert config.discovery is not None
    assert (config.discovery.consul_service, config.discovery.consul_tag) == ("hexmq", "prod")
    assert (config.service_name, config.service_tags) == ("hexmq", ("prod",))
    config = membership_main.agent_config(
        parse(
            *("--discovery", "consul", "--discovery-consul-service", "mqtt"),
            *("--discovery-consul-tag", "eu"),
        )
    )
    assert (config.service_name, config.service_tags) == ("mqtt", ("prod", "eu"))


def test_dns_discovery_settings() -> None:
    config = membership_main.agent_config(
        parse(
            *("--discovery", "dns", "--discovery-dns-name", "_p._tcp.hexmq.test"),
            *("--discovery-dns-records", "srv", "--discovery-dns-server", "127.0.0.53:5353"),
            *("--discovery-interval", "0.5", "--discovery-dns-timeout", "1"),
        )
    )
    assert config.discovery is not None
    assert config.discovery.dns_settings == dns.DnsSettings(
        "_p._tcp.hexmq.test", "srv", 0.5, 1.0, ("127.0.0.53", 5353)
    )


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (("--discovery", "static"), "--discovery static needs --discovery-static-file FILE"),
        (("--discovery", "dns"), "--discovery dns needs --discovery-dns-name NAME"),
        (
            ("--discovery-dns-name", "x.test"),
            "--discovery-dns-name given with no --discovery: they would be ignored",
        ),
        (
            ("--discovery", "consul", "--discovery-interval", "1"),
            "--discovery-interval given with --discovery consul",
        ),
        (
            ("--discovery", "dns", "--discovery-dns-name", "a b"),
            "--discovery-dns-name must be a DNS name",
        ),
        (
            ("--discovery", "dns", "--discovery-dns-name", "x.test", "--discovery-interval", "0"),
            "--discovery-interval must be more than 0 seconds",
        ),
        (
            ("--discovery", "dns", "--discovery-dns-name", "x.test"),
            None,
        ),
        (
            ("--discovery", "consul", "--discovery-consul-tag", "a&b"),
            "--discovery-consul-tag must be a Consul service name or tag",
        ),
        (
            ("--discovery", "static", "--discovery-option", "a=1"),
            "--discovery-option is for plugins",
        ),
        (
            ("--discovery", "my-plugin", "--discovery-option", "novalue"),
            "--discovery-option must be KEY=VALUE, got 'novalue'",
        ),
    ],
)
def test_a_bad_discovery_option_is_named(extra: tuple[str, ...], error: str | None) -> None:
    if error is None:
        membership_main.agent_config(parse(*extra))
        return
    with pytest.raises(ValueError, match=error):
        membership_main.agent_config(parse(*extra))


def test_a_members_file_with_a_bad_line_stops_the_agent_at_startup(tmp_path: Path) -> None:
    members = tmp_path / "members"
    members.write_text("n1 127.0.0.1:7002\nn2 nowhere\n")
    args = parse("--discovery", "static", "--discovery-static-file", str(members))
    config = membership_main.agent_config(args)
    assert config.discovery is not None
    with pytest.raises(DiscoveryError, match=rf"{members}:2: the address must be HOST:PORT"):
        build_discovery(config.discovery, membership_main.discovery_context(config))
    assert membership_main.run(args) == 2


def test_an_unknown_backend_names_the_builtins_and_the_plugins() -> None:
    settings = discovery_settings(parse("--discovery", "nope"), "prod")
    assert settings is not None
    config = membership_main.agent_config(parse("--discovery", "nope"))
    with pytest.raises(
        DiscoveryError,
        match=r"--discovery 'nope': not a built-in backend \(static, consul, dns\) and no plugin "
        r"of that name in entry point group hexmq.discovery",
    ):
        build_discovery(settings, membership_main.discovery_context(config))


# --- the agent's gate ------------------------------------------------------------------------


class Scripted:
    """A backend that yields the given listings (raising where an item is an exception), then
    waits."""

    name = "scripted"

    def __init__(self, *steps: Any) -> None:
        self.steps = list(steps)
        self.starts = 0

    async def listings(self) -> AsyncIterator[Listing]:
        self.starts += 1
        while self.steps:
            step = self.steps.pop(0)
            if isinstance(step, Exception):
                raise step
            yield step
        await asyncio.Event().wait()


async def test_the_gate_restarts_a_failing_backend_and_keeps_its_last_listing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    one = Listing.of([ListedNode("n1")])
    two = Listing.of([ListedNode("n1"), ListedNode("n2")])
    backend = Scripted(one, RuntimeError("source gone"), "not a listing", two)
    changes: list[Listing | None] = []
    gate = DiscoveryGate(
        backend,
        node_id="n1",
        describe="scripted",
        on_change=lambda: changes.append(gate.listing),
        restart_pause_s=0.01,
    )
    with caplog.at_level(logging.INFO, "hexmq.membership"):
        task = asyncio.create_task(gate.run())
        try:
            for _ in range(200):
                if gate.listing == two:
                    break
                await asyncio.sleep(0.01)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    assert changes == [one, two]
    assert backend.starts == 2
    assert "discovery scripted failed; keeping its last listing" in caplog.text
    assert "discovery scripted yielded str, not a Listing; ignored" in caplog.text


async def test_the_gate_explains_who_is_not_admitted_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = DiscoveryGate(Scripted(), node_id="n1", describe="static (m)", on_change=lambda: None)
    gate.listing = Listing.of([ListedNode("n1"), ListedNode("n2", "10.0.0.9", 2885)])
    registry = {n: REGISTRY[n] for n in ("n1", "n2", "n3")}
    with caplog.at_level(logging.WARNING, "hexmq.membership"):
        for _ in range(3):  # every plan asks; each line is said once
            assert gate.discovered(registry, {"n1", "n3"}).listed == {"n1"}
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "discovery static (m) lists n2 at 10.0.0.9:2885, but n2 registered its partition "
        "service at 10.0.0.2:2885: not admitted",
        "member n3 is not listed by discovery static (m); it stays a member until it leaves "
        "or fails, and is not admitted again while unlisted",
    ]
    await gate.stop()


async def test_the_gate_resolves_registration_names_and_plans_again() -> None:
    asked: list[str] = []

    async def resolve(name: str) -> frozenset[str]:
        asked.append(name)
        return frozenset({"10.0.0.3"})

    replans: list[int] = []
    gate = DiscoveryGate(
        Scripted(),
        node_id="n1",
        describe="dns",
        on_change=lambda: replans.append(1),
        resolve=resolve,
    )
    gate.listing = Listing.of([ListedNode(host="10.0.0.3")])
    registry = {"n3": REGISTRY["n3"]}
    assert gate.discovered(registry, ()).listed == frozenset()  # not resolved yet
    for _ in range(100):
        if replans:
            break
        await asyncio.sleep(0.01)
    assert asked == ["partition-3"]
    assert gate.discovered(registry, ()).listed == {"n3"}
    await gate.stop()


# --- the planner with discovery ----------------------------------------------------------------


def cfg(expect: int | None) -> PlanConfig:
    return PlanConfig("n1", 8, 2, expect, SETTLE)


def obs(nodes: dict[str, int], listed: set[str] | None, missing: int = 0) -> Observed:
    discovered = None if listed is None else Discovered(frozenset(listed), missing)
    return Observed({n: reg(n, i) for n, i in nodes.items()}, {}, (), discovered)


def test_the_first_view_waits_for_every_listed_node_when_expect_is_derived() -> None:
    serving = {"n1": 1, "n2": 1, "n3": 1}
    # n3 is listed but not registered yet: one missing.
    assert plan(None, obs(serving, {"n1", "n2"}, missing=1), cfg(None), NOW) is None
    view = plan(None, obs(serving, {"n1", "n2", "n3"}), cfg(None), NOW)
    assert view is not None
    assert [m.node_id for m in view.members] == ["n1", "n2", "n3"]
    # An unlisted serving node is not in the first view.
    view = plan(None, obs({**serving, "n4": 1}, {"n1", "n2", "n3"}), cfg(None), NOW)
    assert view is not None
    assert [m.node_id for m in view.members] == ["n1", "n2", "n3"]
    # Nothing listed yet (or an empty listing): no view.
    assert plan(None, obs(serving, set()), cfg(None), NOW) is None


def test_an_explicit_expect_counts_only_listed_nodes() -> None:
    serving = {"n1": 1, "n2": 1, "n3": 1}
    assert plan(None, obs(serving, {"n1"}, missing=2), cfg(2), NOW) is None
    view = plan(None, obs(serving, {"n1", "n2"}, missing=5), cfg(2), NOW)
    assert view is not None
    assert [m.node_id for m in view.members] == ["n1", "n2"]


def test_without_discovery_the_first_view_is_as_before() -> None:
    view = plan(None, obs({"n1": 1, "n2": 0}, None), cfg(None), NOW)  # expect None: one node
    assert view is not None
    assert [m.node_id for m in view.members] == ["n1"]


def steady_view() -> pb.View:
    view = plan(None, obs({"n1": 1, "n2": 1}, None), cfg(2), NOW)
    assert view is not None
    return view


def test_a_registered_node_joins_only_once_discovery_lists_it() -> None:
    view = steady_view()
    nodes = {"n1": 1, "n2": 1, "n3": 1}
    assert plan(view, obs(nodes, {"n1", "n2"}), cfg(None), NOW) is None
    new = plan(view, obs(nodes, {"n1", "n2", "n3"}), cfg(None), NOW)
    assert new is not None
    assert [m.node_id for m in new.members] == ["n1", "n2", "n3"]
    assert "n3" in new.target_members


def test_a_member_that_discovery_stops_listing_stays_a_member() -> None:
    view = steady_view()
    assert plan(view, obs({"n1": 1, "n2": 1}, {"n1"}), cfg(None), NOW) is None
    # ... until it is lost by the rules of docs/failover.md (here: its registration went).
    new = plan(view, obs({"n1": 1}, {"n1"}), cfg(None), NOW)
    assert new is not None
    assert [m.node_id for m in new.members] == ["n1"]
    # And, unlisted, it is not admitted again when it comes back.
    assert plan(new, obs({"n1": 1, "n2": 2}, {"n1"}), cfg(None), NOW) is None
