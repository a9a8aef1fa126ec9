"""Process scaffolding shared by the services: logging, the event loop, signal handling."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable


def setup_logging(service: str, node_id: str, level: str = "INFO") -> None:
    logging.basicConfig(
        level=level.upper(),
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s {service}[{node_id}] %(name)s: %(message)s",
    )


def run_service(main: Callable[[asyncio.Event], Awaitable[int]]) -> int:
    """Run `main(stop_event)` on uvloop (when installed); SIGTERM and SIGINT set the event, and
    `main` is expected to shut down in stages and return its exit code."""

    async def wrapper() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        return await main(stop)

    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(wrapper())
