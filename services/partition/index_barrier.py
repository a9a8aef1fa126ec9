"""IndexBarrier: a SUBACK that put a new filter into the edges' subscription index waits until
every linked edge has applied that index update.

Without it, a client could hear SUBACK from its own edge while another edge still routes by an
index without the filter, and a message published there after the SUBACK would miss the new
subscriber, which a single broker never does. Index updates are numbered (IndexUpdate.seq);
each edge answers IndexAck(seq) once it has applied one; the snapshot a new link starts with
carries the current number. An edge that does not answer within TIMEOUT_S stops holding SUBACKs
back (it is logged): a hung edge must not stall every subscriber.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from services.partition.links import EdgeLink

log = logging.getLogger(__name__)

TIMEOUT_S = 2.0


@dataclass(slots=True, eq=False)
class _Waiter:
    seq: int
    pending: set[EdgeLink]
    release: Callable[[], None]
    timer: asyncio.TimerHandle | None = None


class IndexBarrier:
    def __init__(self) -> None:
        self.seq = 0
        self._waiting: list[_Waiter] = []
        self.timeouts = 0

    def next_seq(self) -> int:
        self.seq += 1
        return self.seq

    def wait(self, seq: int, links: Iterable[EdgeLink], release: Callable[[], None]) -> None:
        """Call `release()` once every link in `links` has acknowledged `seq`."""
        pending = {link for link in links if not link.closed and link.index_acked < seq}
        if not pending:
            release()
            return
        waiter = _Waiter(seq, pending, release)
        waiter.timer = asyncio.get_running_loop().call_later(TIMEOUT_S, self._expire, waiter)
        self._waiting.append(waiter)

    def acked(self, link: EdgeLink, seq: int) -> None:
        if seq > link.index_acked:
            link.index_acked = seq
        self._settle(lambda waiter: link in waiter.pending and seq >= waiter.seq, link)

    def link_closed(self, link: EdgeLink) -> None:
        self._settle(lambda waiter: link in waiter.pending, link)

    def _settle(self, concerns: Callable[[_Waiter], bool], link: EdgeLink) -> None:
        done = []
        for waiter in self._waiting:
            if concerns(waiter):
                waiter.pending.discard(link)
                if not waiter.pending:
                    done.append(waiter)
        for waiter in done:
            self._finish(waiter)

    def _expire(self, waiter: _Waiter) -> None:
        if waiter in self._waiting:
            self.timeouts += 1
            log.warning(
                "edges %s did not apply index update %d within %.0fs; answering anyway",
                ", ".join(sorted(link.edge_id for link in waiter.pending)),
                waiter.seq,
                TIMEOUT_S,
            )
            self._finish(waiter)

    def _finish(self, waiter: _Waiter) -> None:
        self._waiting.remove(waiter)
        if waiter.timer is not None:
            waiter.timer.cancel()
        waiter.release()
