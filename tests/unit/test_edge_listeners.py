"""The edge's listeners with --reuse-port: several edge processes of a node share its port, and a
listener that would take a port already taken says which port and what to do about it."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
from types import SimpleNamespace
from typing import cast

import pytest

from hexmq_cli import procs
from services.edge import main as edge_main
from services.edge.config import EdgeConfig
from services.edge.connection import ConnectionHost
from services.edge.listeners import start_listeners


def _edge(port: int, *, reuse_port: bool, edge_id: str = "") -> ConnectionHost:
    config = EdgeConfig(
        node_id="n1",
        host="127.0.0.1",
        port=port,
        membership="127.0.0.1:1",
        edge_id=edge_id,
        reuse_port=reuse_port,
    )
    return cast(ConnectionHost, SimpleNamespace(config=config))


def _port_of(server: asyncio.Server) -> int:
    port: int = server.sockets[0].getsockname()[1]
    return port


async def _close(servers: list[asyncio.Server]) -> None:
    for server in servers:
        server.close()
        await server.wait_closed()


def test_an_edge_id_defaults_to_its_node_id() -> None:
    plain = EdgeConfig(node_id="n1", host="h", port=1, membership="m:1")
    assert (plain.edge_id, plain.node_first_edge) == ("n1", True)
    further = EdgeConfig(node_id="n1", host="h", port=1, membership="m:1", edge_id="n1-e2")
    assert (further.edge_id, further.node_first_edge) == ("n1-e2", False)


async def test_edges_with_reuse_port_share_the_port() -> None:
    first = await start_listeners(_edge(0, reuse_port=True), None)
    port = _port_of(first[0])
    try:
        second = await start_listeners(_edge(port, reuse_port=True, edge_id="n1-e2"), None)
        try:
            assert _port_of(second[0]) == port
            assert second[0].sockets[0].getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)
        finally:
            await _close(second)
    finally:
        await _close(first)


@pytest.mark.parametrize(("first_reuses", "second_reuses"), [(True, False), (False, True)])
async def test_a_port_taken_without_reuse_is_refused_naming_the_port(
    first_reuses: bool, second_reuses: bool
) -> None:
    first = await start_listeners(_edge(0, reuse_port=first_reuses), None)
    port = _port_of(first[0])
    try:
        with pytest.raises(OSError) as refused:
            await start_listeners(_edge(port, reuse_port=second_reuses, edge_id="n1-e2"), None)
        text = str(refused.value.strerror)
        assert text.startswith(f"--listen 127.0.0.1:{port}: ")
        assert "each of them has --reuse-port" in text
    finally:
        await _close(first)


def test_edge_id_is_for_a_nodes_further_edges_only() -> None:
    def args(edge_id: str | None, standalone: bool = False) -> argparse.Namespace:
        return argparse.Namespace(node_id="n1", edge_id=edge_id, standalone=standalone)

    assert edge_main.edge_id_of(args(None)) == "n1"
    assert edge_main.edge_id_of(args("n1-e2")) == "n1-e2"
    assert edge_main.edge_id_of(args(None, standalone=True)) == "n1"
    with pytest.raises(ValueError, match="--standalone edge's id is --node-id"):
        edge_main.edge_id_of(args("n1-e2", standalone=True))
    with pytest.raises(ValueError, match="empty or with spaces"):
        edge_main.edge_id_of(args(" n1-e2"))


async def test_the_cluster_tool_tells_which_process_listens_on_a_shared_port() -> None:
    first = await start_listeners(_edge(0, reuse_port=True), None)
    port = _port_of(first[0])
    try:
        assert procs.listens_on(os.getpid(), port)
        assert not procs.listens_on(os.getpid(), port, "127.0.0.2")
        assert not procs.listens_on(os.getppid(), port)
    finally:
        await _close(first)
    assert not procs.listens_on(os.getpid(), port)
