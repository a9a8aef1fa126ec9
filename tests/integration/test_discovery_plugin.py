"""A third-party discovery plugin, loaded by its entry point (group `hexmq.discovery`): the
worked example in examples/discovery-plugin, installed with pip (from a copy, so the source
tree stays clean) into a scratch directory, then found through importlib.metadata in this
process and in a real `hexmq membership` process that has that directory on its PYTHONPATH.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hexmq.trust.identity import MEMBERSHIP
from services.membership.discovery.model import DiscoveryContext, DiscoveryError, Listing
from services.membership.discovery.options import BUILTINS
from services.membership.discovery.plugins import GROUP, installed, load_plugin
from tests.conftest import HEXMQ
from tests.support.ports import free_ports
from tests.support.trust import env_for, own_ca

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "discovery-plugin"


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plugin, pip-installed into a directory of its own."""
    base = tmp_path_factory.mktemp("plugin")
    source = base / "source"
    shutil.copytree(EXAMPLE, source)
    site = base / "site"
    subprocess.run(
        [
            *(sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"),
            *("--no-build-isolation", "--target", str(site), str(source)),
        ],
        check=True,
        timeout=120,
    )
    return site


@pytest.fixture
def on_path(plugin_site: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.syspath_prepend(str(plugin_site))
    yield plugin_site
    sys.modules.pop("hexmq_shared_dir", None)


def context(directory: Path, **options: str) -> DiscoveryContext:
    return DiscoveryContext(
        node_id="n1",
        cluster="c1",
        partition_addr="127.0.0.1:7001",
        mqtt_addr="127.0.0.1:1883",
        membership_addr="127.0.0.1:2884",
        consul_addr="127.0.0.1:8500",
        options={"dir": str(directory), **options},
    )


def test_the_plugin_is_not_found_until_its_distribution_is_installed(tmp_path: Path) -> None:
    assert "shared-dir" not in installed()
    with pytest.raises(DiscoveryError, match="no plugin of that name in entry point group"):
        load_plugin("shared-dir", context(tmp_path), BUILTINS)


async def test_the_example_plugin_loads_by_entry_point_and_follows_its_directory(
    on_path: Path, tmp_path: Path
) -> None:
    assert [ep.value for ep in installed()["shared-dir"]] == ["hexmq_shared_dir:make"]
    nodes = tmp_path / "nodes"
    discovery = load_plugin("shared-dir", context(nodes, interval="0.05"), BUILTINS)
    assert discovery.name == "shared-dir"
    seen: asyncio.Queue[Listing] = asyncio.Queue()

    async def follow() -> None:
        async for listing in discovery.listings():
            seen.put_nowait(listing)

    task = asyncio.create_task(follow())
    try:
        first = await asyncio.wait_for(seen.get(), 5)
        assert {(n.node_id, n.host, n.port) for n in first.nodes} == {("n1", "127.0.0.1", 7001)}
        (nodes / "n2").write_text("127.0.0.2:7001\n")  # another node started
        second = await asyncio.wait_for(seen.get(), 5)
        assert {n.node_id for n in second.nodes} == {"n1", "n2"}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert not (nodes / "n1").exists()  # it removes its own file when it stops


def test_a_plugin_refusing_its_options_is_named(on_path: Path, tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match="discovery plugin 'shared-dir': unknown option"):
        load_plugin("shared-dir", context(tmp_path, colour="blue"), BUILTINS)


def run_agent(site: Path, tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    agent_port, closed_port = free_ports(2)
    env = {**os.environ, "PYTHONPATH": str(site), **env_for(own_ca(), MEMBERSHIP, "n1")}
    argv = [
        *(str(HEXMQ), "membership", "--node-id", "n1", "--listen", f"127.0.0.1:{agent_port}"),
        *("--consul", f"127.0.0.1:{closed_port}", "--cluster", "c1"),
        *("--partition-addr", "127.0.0.1:7001", "--mqtt-addr", "127.0.0.1:1883"),
        *("--discovery", "shared-dir"),
        *extra,
    ]
    return subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )


def test_a_membership_agent_process_runs_the_plugin_from_its_entry_point(
    plugin_site: Path, tmp_path: Path
) -> None:
    nodes = tmp_path / "nodes"
    agent = run_agent(
        plugin_site,
        tmp_path,
        *("--discovery-option", f"dir={nodes}", "--discovery-option", "interval=0.1"),
    )
    try:
        deadline = time.monotonic() + 20
        while not (nodes / "n1").exists():
            assert agent.poll() is None, agent.communicate()[0]
            assert time.monotonic() < deadline, "the plugin never announced the node"
            time.sleep(0.05)
        assert (nodes / "n1").read_text() == "127.0.0.1:7001\n"
    finally:
        agent.send_signal(signal.SIGTERM)
        try:
            out, _ = agent.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            agent.kill()  # never left running past the test
            out, _ = agent.communicate(timeout=10)
            raise AssertionError(f"the agent did not stop on SIGTERM within 20 s:\n{out}") from None
    assert "discovery plugin shared-dir lists: n1 at 127.0.0.1:7001" in out
    assert agent.returncode == 0, out
    assert not (nodes / "n1").exists()


def test_a_membership_agent_stops_at_startup_when_its_plugin_refuses(
    plugin_site: Path, tmp_path: Path
) -> None:
    agent = run_agent(plugin_site, tmp_path)  # no dir=
    out, _ = agent.communicate(timeout=30)
    assert agent.returncode == 2, out
    assert "discovery plugin 'shared-dir': needs --discovery-option dir=PATH" in out
    assert GROUP == "hexmq.discovery"
