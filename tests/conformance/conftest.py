"""Clusters shared by the conformance modules, started once for the whole package.

One module per MQTT area splits tests that used to share a module's cluster, so the clusters
the tests need are package-scoped here instead: each is started when a test first asks for it
and brought down (by the same teardown as `hexmq_cluster`) after the package's last test.
Tests that kill or stop nodes still start their own with `hexmq_cluster`.

- `node`: one node, default options.
- `trio`: three nodes, 32 partitions, RF 2 (tests pick client ids by partition for 32).
- `trio_256`: three nodes, the default 256 partitions, RF 2.
- `limits_node`: one node announcing Receive Maximum 5 and Topic Alias Maximum 4.
- `access_cluster`: one node that password- and ACL-protected edges join; `access_port` is
  the MQTT port of such an edge (tests.support.access has its users and rules).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from tests.conftest import HexmqCluster, _cluster_factory
from tests.support.access import ACL, write_passwords
from tests.support.edgeproc import edge_process
from tests.support.v5client import close_open_clients


@pytest.fixture(scope="package")
def hexmq_cluster_package(
    tmp_path_factory: pytest.TempPathFactory, cluster_prerequisites: None
) -> Iterator[Callable[..., HexmqCluster]]:
    """`hexmq_cluster_module` with package scope: clusters shared by every conformance module."""
    with _cluster_factory(tmp_path_factory.mktemp("conformance-clusters")) as make:
        yield make


@pytest.fixture(scope="package")
def node(hexmq_cluster_package: Callable[..., HexmqCluster]) -> HexmqCluster:
    return hexmq_cluster_package(nodes=1)


@pytest.fixture(scope="package")
def trio(hexmq_cluster_package: Callable[..., HexmqCluster]) -> HexmqCluster:
    return hexmq_cluster_package(nodes=3, partitions=32, extra=["--rf", "2"])


@pytest.fixture(scope="package")
def trio_256(hexmq_cluster_package: Callable[..., HexmqCluster]) -> HexmqCluster:
    return hexmq_cluster_package(nodes=3, extra=["--rf", "2"])


@pytest.fixture(scope="package")
def limits_node(hexmq_cluster_package: Callable[..., HexmqCluster]) -> HexmqCluster:
    return hexmq_cluster_package(
        nodes=1, extra=["--edge-arg=--receive-maximum=5", "--edge-arg=--topic-alias-maximum=4"]
    )


@pytest.fixture(scope="package")
def access_cluster(hexmq_cluster_package: Callable[..., HexmqCluster]) -> HexmqCluster:
    return hexmq_cluster_package(nodes=1)


@pytest.fixture(scope="package")
def access_port(
    access_cluster: HexmqCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[int]:
    """An extra edge with --password-file (tests.support.access.USERS) and --acl-file (ACL)."""
    work = tmp_path_factory.mktemp("access")
    write_passwords(work / "passwd")
    (work / "acl").write_text(ACL)
    args = [f"--password-file={work / 'passwd'}", f"--acl-file={work / 'acl'}"]
    with edge_process(access_cluster, work, args, name="auth1") as proc:
        yield proc.port


@pytest.fixture(autouse=True)
async def _close_v5_clients() -> AsyncIterator[None]:
    """Every client tests.support.v5client opened for a test, closed when it ends."""
    yield
    await close_open_clients()
