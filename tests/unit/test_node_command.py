"""`hexmq node` (hexmq_cli/node.py): its sections, their environment, and the order it starts
and stops the services of a co-located node in."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from hexmq import envoptions
from hexmq.inproc import LocalChannel, NodeServers
from hexmq.service import StopEvent
from hexmq.trust.identity import EDGE, PARTITION, Identity
from hexmq_cli import cli, node
from services.edge import main as edge_main
from services.edge.config import EdgeConfig
from services.edge.server import Edge
from tests.support.options import service_parser

SECTIONS = [
    *("--", "membership", "--node-id", "n1", "--listen", "127.0.0.1:7001"),
    *("--partition-addr", "127.0.0.1:7002", "--mqtt-addr", "127.0.0.1:1883"),
    *("--", "partition", "--node-id", "n1", "--listen", "127.0.0.1:7002"),
    *("--redis", "redis://127.0.0.1:7000/0", "--membership", "127.0.0.1:7001"),
    *("--", "edge", "--node-id", "n1", "--listen", "127.0.0.1:1883"),
    *("--membership", "127.0.0.1:7001"),
]


def test_each_section_is_parsed_by_its_services_own_parser() -> None:
    sections = node.parse_sections(SECTIONS, {"HEXMQ_INSECURE_CLUSTER": "true"})
    assert [s.service for s in sections] == ["membership", "partition", "edge"]
    by = {s.service: s.args for s in sections}
    assert by["membership"].partition_addr == "127.0.0.1:7002"
    assert by["partition"].redis == "redis://127.0.0.1:7000/0"
    assert by["edge"].listen == "127.0.0.1:1883"
    assert all(s.args.insecure_cluster for s in sections)


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        (SECTIONS[1:], "first word must be --"),
        (["--", "redis", "x"], "'redis' is not a service"),
        (SECTIONS[:8], "no partition or edge section"),
        ([*SECTIONS, "--", "edge", "--node-id", "n1"], "edge section is given twice"),
    ],
)
def test_a_command_line_that_makes_no_node_is_refused(argv: list[str], why: str) -> None:
    with pytest.raises(node.NodeUsageError, match=why):
        node.parse_sections(argv, {})


def test_the_sections_must_name_one_node() -> None:
    other = [w if w != "n1" or i < 20 else "n2" for i, w in enumerate(SECTIONS)]
    with pytest.raises(node.NodeUsageError, match="different nodes"):
        node.parse_sections(other, {})


def test_a_services_own_variable_wins_over_the_shared_one(tmp_path: Path) -> None:
    env = {
        "HEXMQ_CLUSTER_CERT": str(tmp_path / "shared.crt"),
        "HEXMQ_NODE_EDGE_CLUSTER_CERT": str(tmp_path / "edge.crt"),
        "HEXMQ_NODE_PARTITION_CLUSTER_CERT": str(tmp_path / "partition.crt"),
    }
    by = {s.service: s.args for s in node.parse_sections(SECTIONS, env)}
    assert by["edge"].cluster_cert == tmp_path / "edge.crt"
    assert by["partition"].cluster_cert == tmp_path / "partition.crt"
    assert by["membership"].cluster_cert == tmp_path / "shared.crt"


def test_no_option_variable_looks_like_a_sections_own() -> None:
    """HEXMQ_NODE_<SERVICE>_ never names an option of any service by itself."""
    for service in cli.SERVICE_MODULES:
        for action in envoptions.options(service_parser(service)):
            for section in node.SECTIONS:
                prefix = f"{node.NODE_PREFIX}{section.upper()}_"
                assert not envoptions.variable_for(action).startswith(prefix)


def test_hexmq_node_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["node", "membership"], env={}) == 2
    assert "first word must be --" in capsys.readouterr().err
    assert cli.main(["node", "--help"], env={}) == 0
    assert "HEXMQ_NODE_<SERVICE>_<OPTION>" in capsys.readouterr().out
    # A section's --help is its service's, whatever else is (not) given.
    assert cli.main(["node", "--", "edge", "--help"], env={}) == 0
    assert "--max-connections" in capsys.readouterr().out


class _Services:
    """Stand-in mains that record when each is told to stop and how."""

    def __init__(self, fail: str | None = None, times: int = -1) -> None:
        self.events: list[str] = []
        self.fail = fail
        self.times = times  # how many of `fail`'s runs fail (-1: every one)
        self.started = asyncio.Event()
        self.runs: dict[str, int] = {}  # runs that went on past the start, per service
        self.step = asyncio.Event()  # set at each failure and each run

    async def until(self, done: Callable[[], bool]) -> None:
        while not done():
            self.step.clear()
            await self.step.wait()

    def main(self, service: str) -> node.ServiceMain:
        async def run(stop: StopEvent) -> int:
            if service == self.fail and self.times != 0:
                self.times -= 1
                await asyncio.sleep(0.01)
                self.events.append(f"{service} failed")
                self.step.set()
                return 3
            self.runs[service] = self.runs.get(service, 0) + 1
            self.step.set()
            self.started.set()
            await stop.wait()
            how = "leave" if stop.leave else "plain"
            if stop.leave:
                try:
                    await asyncio.wait_for(stop.plain.wait(), 1)
                    how += " cut short"
                except TimeoutError:
                    pass
            self.events.append(f"{service} {how}")
            await asyncio.sleep(0.01)
            self.events.append(f"{service} stopped")
            return 0

        return run

    def mains(self) -> dict[str, node.ServiceMain]:
        return {s: self.main(s) for s in node.SECTIONS}


async def test_a_plain_stop_stops_edge_then_partition_then_membership() -> None:
    services, stop = _Services(), StopEvent()
    running = asyncio.create_task(node.run_node(services.mains(), stop))
    await services.started.wait()
    stop.plain.set()
    stop.set()
    assert await running == 0
    assert services.events == [
        "edge plain",
        "edge stopped",
        "partition plain",
        "partition stopped",
        "membership plain",
        "membership stopped",
    ]


async def test_a_leave_tells_every_service_at_once_and_a_plain_stop_cuts_it_short() -> None:
    services, stop = _Services(), StopEvent()
    running = asyncio.create_task(node.run_node(services.mains(), stop))
    await services.started.wait()
    stop.leave = True
    stop.set()
    await asyncio.sleep(0.05)
    assert services.events == []  # all three are leaving
    stop.plain.set()
    assert await running == 0
    assert sorted(e for e in services.events if "cut short" in e) == [
        "edge leave cut short",
        "membership leave cut short",
        "partition leave cut short",
    ]


async def test_a_service_that_ends_by_itself_stops_the_node_with_its_code() -> None:
    services = _Services(fail="membership")
    code = await asyncio.wait_for(node.run_node(services.mains(), StopEvent()), 5)
    assert code == 3
    assert services.events == [
        "membership failed",
        "edge plain",
        "edge stopped",
        "partition plain",
        "partition stopped",
    ]


@pytest.fixture
def quick_restarts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node, "RESTART_FIRST_S", 0.01)
    monkeypatch.setattr(node, "RESTART_MAX_S", 0.04)


@pytest.mark.usefixtures("quick_restarts")
async def test_a_partition_service_that_ends_by_itself_starts_again_and_the_node_goes_on() -> None:
    # Its Redis lost, it stops so that its state reloads (twice here, then it stays up): the
    # edge and the agent go on, and the node stops only when asked.
    services, stop = _Services(fail="partition", times=2), StopEvent()
    running = asyncio.create_task(node.run_node(services.mains(), stop))
    await services.until(lambda: "partition" in services.runs)
    assert not running.done()
    assert services.events.count("partition failed") == 2
    assert "edge plain" not in services.events
    assert "membership plain" not in services.events
    stop.plain.set()
    stop.set()
    assert await asyncio.wait_for(running, 5) == 0
    assert services.events[-6:] == [
        "edge plain",
        "edge stopped",
        "partition plain",
        "partition stopped",
        "membership plain",
        "membership stopped",
    ]


@pytest.mark.usefixtures("quick_restarts")
async def test_a_stop_while_the_partition_service_waits_to_start_again_stops_the_node() -> None:
    services, stop = _Services(fail="partition"), StopEvent()
    running = asyncio.create_task(node.run_node(services.mains(), stop))
    await services.until(lambda: services.events.count("partition failed") >= 3)
    stop.plain.set()
    stop.set()
    assert await asyncio.wait_for(running, 5) == 3  # the partition service's code
    assert "partition" not in services.runs
    assert services.events[-4:] == [
        "edge plain",
        "edge stopped",
        "membership plain",
        "membership stopped",
    ]


def test_restarts_wait_longer_while_the_partition_service_keeps_failing() -> None:
    restarts = node.Restarts()
    first, most, steady = node.RESTART_FIRST_S, node.RESTART_MAX_S, node.RESTART_STEADY_S
    assert restarts.after({"partition": 1}, 0.0) == ("partition", first)
    waits = []
    now = 0.0
    for _ in range(8):
        restarts.started("partition", now)
        now += 1.0  # ends again a second after it started
        again = restarts.after({"partition": 1}, now)
        assert again is not None
        waits.append(again[1])
    assert waits[:2] == [2 * first, 4 * first]
    assert waits[-1] == most
    restarts.started("partition", now)
    assert restarts.after({"partition": 1}, now + steady) == ("partition", first)
    # Anything else stops the node: the agent or the edge, two at once, a clean exit.
    assert restarts.after({"membership": 1}, now) is None
    assert restarts.after({"edge": 1}, now) is None
    assert restarts.after({"partition": 1, "edge": 1}, now) is None
    assert restarts.after({"partition": 0}, now) is None


def _edge(colocated: NodeServers | None) -> Edge:
    from hexmq.trust.grpc_tls import ClusterTLS

    config = EdgeConfig(node_id="n1", host="127.0.0.1", port=0, membership="127.0.0.1:1")
    return Edge(config, cluster_tls=ClusterTLS.insecure(), colocated=colocated)


async def test_a_colocated_edge_calls_its_own_partition_service_in_process_only() -> None:
    colocated = NodeServers("n1")
    edge = _edge(colocated)
    own = edge._dial_partition("n1", "127.0.0.1:7002")
    assert isinstance(own, LocalChannel)
    assert own._caller == Identity(EDGE, "n1")
    other = edge._dial_partition("n2", "127.0.0.1:7012")
    assert not isinstance(other, LocalChannel)
    await other.close()
    assert not isinstance(_edge(None)._dial_partition("n1", "127.0.0.1:7002"), LocalChannel)
    to_agent = colocated.to_membership(PARTITION, "hexmq")
    assert to_agent._caller == Identity(PARTITION, "n1")


def test_a_colocated_nodes_edge_keeps_the_nodes_id(caplog: pytest.LogCaptureFixture) -> None:
    env = {"HEXMQ_INSECURE_CLUSTER": "true"}
    sections = node.parse_sections([*SECTIONS, "--edge-id", "n1-e2"], env)
    further = next(s.args for s in sections if s.service == "edge")
    assert edge_main.prepare(further, NodeServers("n1")) == 2
    assert "the edge section of `hexmq node` is the node's own edge" in caplog.text
    # The same options make a further edge of a node of separate processes.
    assert callable(edge_main.prepare(further))
    own = next(s.args for s in node.parse_sections(SECTIONS, env) if s.service == "edge")
    assert callable(edge_main.prepare(own, NodeServers("n1")))


def test_the_process_wide_pacing_must_be_the_same_in_every_section() -> None:
    at_edge = [*SECTIONS, "--batch-interval-us", "500"]
    with pytest.raises(node.NodeUsageError, match="--batch-interval-us differs"):
        node.parse_sections(at_edge, {})
    everywhere = {"HEXMQ_BATCH_INTERVAL_US": "500"}
    sections = node.parse_sections(SECTIONS, everywhere)
    assert {s.args.batch_interval_us for s in sections if "batch_interval_us" in vars(s.args)} == {
        500
    }


def test_the_log_is_as_verbose_as_the_most_verbose_section() -> None:
    argv = [*SECTIONS[:8], "--log-level", "debug", *SECTIONS[8:]]
    assert node.log_level(node.parse_sections(argv, {})) == "DEBUG"
    assert node.log_level(node.parse_sections(SECTIONS, {})) == "INFO"
