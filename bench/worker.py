"""A load-generator process: some publishers and/or the subscriber of one run.

Driven by the orchestrator over JSON lines (stdin in, stdout out; stderr is for people):

    in:  {spec}                       the run: QoS, rate, which clients live here and on which
                                      broker port (and, subscribers, with which filter)
    out: {"event": "ready"}           connected (and subscribed): ready for the clock
    in:  {"cmd": "go", timeline}      absolute monotonic times of start, window and stop
    out: {"event": "published", ...}  (publishers) how many messages each one sent and got acked
    in:  {"cmd": "expect", "sent"}    (subscriber) what to wait for before counting losses
    out: {"event": "result", ...}     everything measured; then the process exits

Run as ``python -m bench.worker``; never by hand.
"""

from __future__ import annotations

import asyncio
import json
import mmap
import sys
from array import array
from collections.abc import Callable
from typing import Any

from bench.clients import Publisher, PublishFrames, Subscriber, Timeline, now_ns
from bench.stats import latency_summary

# After the publishers are done, a QoS 0 subscriber stops waiting once nothing has arrived for
# this long (QoS 0 may drop; QoS 1 waits for every acknowledged message instead).
QOS0_QUIET_S = 1.0


class Control:
    """The JSON-lines channel to the orchestrator."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()

    async def read(self) -> dict[str, Any]:
        # A thread for the blocking readline: stdin is a pipe, and this is off the measured path.
        line = await self._loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            raise SystemExit("bench worker: the orchestrator went away")
        message: dict[str, Any] = json.loads(line)
        return message

    @staticmethod
    def send(message: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()


async def _sleep_until(t_ns: int) -> None:
    delay = (t_ns - now_ns()) / 1e9
    if delay > 0:
        await asyncio.sleep(delay)


async def _wait_for(predicate: Callable[[], bool], deadline_ns: int) -> bool:
    """Poll ``predicate`` until true or the deadline: only used after the measurement window."""
    while not predicate():
        if now_ns() >= deadline_ns:
            return False
        await asyncio.sleep(0.02)
    return True


def map_progress(path: str, n_publishers: int) -> mmap.mmap:
    """The subscriber's progress per publisher, shared through a small file mapped by every
    generator process (QoS 0 window publishers read it; see bench.clients.PUBLISH_MODES)."""
    with open(path, "r+b") as f:
        return mmap.mmap(f.fileno(), 8 * n_publishers)


async def run(spec: dict[str, Any], control: Control) -> dict[str, Any]:
    version: int = spec["protocol_version"]
    qos: int = spec["qos"]
    n_publishers: int = spec["n_publishers"]
    host = spec["host"]
    rate: float | None = spec["rate"]
    tag: str = spec["client_prefix"]

    progress_map = map_progress(spec["progress_path"], n_publishers)
    progress = memoryview(progress_map).cast("q")

    # Subscribers first, and subscribed, before any publisher connects (see bench.shapes).
    subscribers = [
        Subscriber(f"{tag}-sub{s['index']}", version, n_publishers, qos, progress, s["publishers"])
        for s in spec["subscribers"]
    ]
    await asyncio.gather(
        *(
            sub.open(host, s["port"])
            for sub, s in zip(subscribers, spec["subscribers"], strict=True)
        )
    )
    await asyncio.gather(
        *(
            sub.subscribe(s["filter"])
            for sub, s in zip(subscribers, spec["subscribers"], strict=True)
        )
    )
    publishers = [
        Publisher(
            p["index"],
            f"{tag}-pub{p['index']}",
            version,
            PublishFrames(version, p["topic"], qos, spec["payload_size"]),
            mode=spec["mode"],
            inflight=spec["inflight"],
            rate=rate / n_publishers if rate else None,
            phase=p["index"] / n_publishers,
            progress=progress,
        )
        for p in spec["publishers"]
    ]
    await asyncio.gather(
        *(pub.open(host, p["port"]) for pub, p in zip(publishers, spec["publishers"], strict=True))
    )
    control.send({"event": "ready"})

    go = await control.read()
    timeline = Timeline(go["start"], go["window"], go["window_end"], go["stop"])
    drain_ns = int(spec["drain_timeout"] * 1e9)
    for sub in subscribers:
        sub.timeline = timeline
    await _sleep_until(timeline.start)
    for pub in publishers:
        pub.begin(timeline)

    result: dict[str, Any] = {"event": "result", "publishers": None, "subscriber": None}
    if publishers:
        await _wait_for(lambda: all(p.done.done() for p in publishers), timeline.stop + drain_ns)
        lags = array("q")
        for pub in publishers:
            lags.extend(pub.stats.lag_ns)
        result["publishers"] = {
            str(p.index): {
                "sent": p.stats.sent,
                "acked": p.stats.acked,
                "window_sent": p.stats.window_sent,
                "unacked": len(p.unacked),
                "unexpected_acks": p.stats.unexpected_acks,
                "failed_acks": p.stats.failed_acks,
                "window_resets": p.stats.window_resets,
                "failure": p.failure,
            }
            for p in publishers
        }
        result["pacing_lag"] = latency_summary(lags)
        control.send(
            {
                "event": "published",
                "sent": {str(p.index): p.stats.sent for p in publishers},
                "unacked": {str(p.index): sorted(p.unacked.values()) for p in publishers},
            }
        )
        for pub in publishers:
            pub.close()

    if subscribers:
        expect = await control.read()
        sent = {int(k): v for k, v in expect["sent"].items()}
        unacked = {int(k): set(v) for k, v in expect["unacked"].items()}
        result["subscriber"] = await _collect(subscribers, sent, unacked, qos, drain_ns)
        for sub in subscribers:
            sub.close()
    await asyncio.sleep(0.05)  # let the DISCONNECTs leave before the loop closes
    progress.release()
    progress_map.close()
    return result


# Loss details per (subscriber, publisher) kept in the result: the count is always complete.
MISSING_DETAIL = 10


async def _collect(
    subscribers: list[Subscriber],
    sent: dict[int, int],
    unacked: dict[int, set[int]],
    qos: int,
    drain_ns: int,
) -> dict[str, Any]:
    """Wait for every subscriber to have what was sent to it, then count, over all of them."""
    waited_from = now_ns()

    def complete() -> bool:
        if all(sub.unique[i] >= sent.get(i, 0) for sub in subscribers for i in sub.expected):
            return True
        last = max([waited_from, *(sub.last_delivery for sub in subscribers)])
        return qos == 0 and now_ns() - last > QOS0_QUIET_S * 1e9

    # `lost` below means "not delivered within the drain timeout": if the wait timed out, the
    # broker may still be holding them (a backlog), which the report says.
    drained = await _wait_for(complete, now_ns() + drain_ns)
    missing: dict[str, Any] = {}
    lost = 0
    for j, sub in enumerate(subscribers):
        for i in sub.expected:
            n = sent.get(i, 0)
            count, first = sub.missing(i, n)
            # A QoS 1 message never acknowledged to its publisher may be lost without breaking
            # the contract: count it apart.
            seen = sub.seen[i]
            assert seen is not None
            maybe = sum(1 for seq in unacked.get(i, ()) if not seen[seq])
            lost += count - maybe
            if count and len(missing) < MISSING_DETAIL:
                key = str(i) if len(subscribers) == 1 else f"sub{j}/pub{i}"
                missing[key] = {"count": count, "unacked": maybe, "first": first}
    totals: dict[str, int] = {}
    for sub in subscribers:
        for key, value in sub.summary().items():
            totals[key] = totals.get(key, 0) + value
    latencies = array("q")
    for sub in subscribers:
        latencies.extend(sub.stats.latency_ns)
    failures = [f"sub{j}: {sub.failure}" for j, sub in enumerate(subscribers) if sub.failure]
    return {
        **totals,
        "subscribers": len(subscribers),
        "expected": sum(sent.get(i, 0) for sub in subscribers for i in sub.expected),
        "lost": lost,
        "missing": missing,
        "drain_s": round((now_ns() - waited_from) / 1e9, 2),
        "drain_timed_out": not drained,
        "latency": latency_summary(latencies),
        "failure": "; ".join(failures[:5]) if failures else None,
    }


async def _main() -> None:
    control = Control()
    spec = await control.read()
    try:
        result = await run(spec, control)
    except Exception as exc:
        control.send({"event": "error", "error": f"{type(exc).__name__}: {exc}"})
        raise
    control.send(result)


def main() -> None:
    # uvloop when available, as the broker's services use it: the generator must be cheap.
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(_main())


if __name__ == "__main__":
    main()
