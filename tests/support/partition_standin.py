"""A stand-in for a node's partition service, where only its membership side is under test:
a real process that serves the standard gRPC health check on --listen (what peers' agents
probe) and watches its agent with an incarnation (what admits the node to the view).

    python -m tests.support.partition_standin --node-id N --listen HOST:PORT \
        --membership HOST:PORT     # HEXMQ_CLUSTER_CA/CERT/KEY: its partition certificate

SIGUSR1 stops the health server while the watch stays open (the process is alive to its own
agent but refuses its peers' probes); SIGTERM or SIGINT ends it. It prints "serving
<incarnation>" once its health server is up, and "view <epoch>" for every view it receives.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import time
from pathlib import Path

import grpc

from hexmq.api.membership.v1 import membership_pb2 as pb
from hexmq.health import SERVING, add_health
from hexmq.membership.client import ViewWatcher
from hexmq.trust.grpc_tls import ClusterTLS, TLSFiles
from hexmq.trust.identity import MEMBERSHIP, PARTITION, Identity


async def main(args: argparse.Namespace) -> None:
    incarnation = args.incarnation or time.time_ns()
    # Mutual TLS with the certificate the test gave it (HEXMQ_CLUSTER_*), as a partition
    # service of its node: the agent admits only that to watch with an incarnation.
    env = os.environ
    tls = ClusterTLS(
        Identity(PARTITION, args.node_id),
        TLSFiles(
            Path(env["HEXMQ_CLUSTER_CA"]),
            Path(env["HEXMQ_CLUSTER_CERT"]),
            Path(env["HEXMQ_CLUSTER_KEY"]),
        ),
    )
    server = grpc.aio.server()
    health = add_health(server)
    tls.add_port(server, args.listen)
    await server.start()
    await health.set("", SERVING)
    print(f"serving {incarnation}", flush=True)

    async def on_view(view: pb.View) -> None:
        print(f"view {view.epoch}", flush=True)

    watcher = ViewWatcher(
        args.membership,
        on_view,
        incarnation=incarnation,
        dial=lambda: tls.channel(args.membership, peer=Identity(MEMBERSHIP, args.node_id)),
    )
    watcher.start()
    stop = asyncio.Event()
    refuse = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGINT too, explicitly (AgentCluster.stop's plain stop): started from a shell's background
    # job (`make test &`) it inherits SIGINT ignored, and then waited out end()'s 10 s grace
    # to be killed, three times a test (30 s of every membership agent test's teardown).
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, refuse.set)
    either = [asyncio.create_task(stop.wait()), asyncio.create_task(refuse.wait())]
    await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
    if not stop.is_set():
        await server.stop(grace=None)
        print("refusing", flush=True)
        await stop.wait()
    for task in either:
        task.cancel()
    await watcher.stop()
    await server.stop(grace=None)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--node-id", required=True)
    parser.add_argument("--listen", required=True)
    parser.add_argument("--membership", required=True)
    parser.add_argument("--incarnation", type=int, default=0)
    asyncio.run(main(parser.parse_args()))
