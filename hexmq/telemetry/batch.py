"""A batching span processor that counts every span it does not export.

Why not the SDK's BatchSpanProcessor: its queue defaults to 2048 and drops spans with a log line
each ("Queue full, dropping Span") and no count we can read; its check-then-append is not atomic,
so even a wrapper that peeks at the queue would miscount under contention. This one is small:
a bounded deque behind one lock (a span end costs one uncontended acquire), a worker thread that
exports in batches, exact counters, and one warning line per `warn_every` drops.

It drops the newest span when full (the SDK drops the oldest): either way a trace has a hole, and
refusing is cheaper than evicting. Not fork-safe: services do not fork after setup.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Sequence

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

logger = logging.getLogger(__name__)


class ExportLogGate(logging.Filter):
    """Lets an exporter library's first warning or error of an outage through, then none until
    an export succeeds again: without a Collector, the OTLP exporter logged a retry warning and
    an error for every batch, every few seconds, in every service (issue 27). The processor
    that owns the exporter counts the failures and says when exports work again (reopen)."""

    def __init__(self) -> None:
        super().__init__()
        self._open = True
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        with self._lock:
            if not self._open:
                return False
            self._open = False
        record.msg = (
            f"{record.msg} (further export errors are not logged until an export succeeds; "
            'hexmq_spans_dropped_total{reason="export_failed"} counts the spans lost)'
        )
        return True

    def reopen(self) -> None:
        with self._lock:
            self._open = True


class CountingBatchSpanProcessor(SpanProcessor):
    def __init__(
        self,
        exporter: SpanExporter,
        *,
        name: str,
        max_queue_size: int = 65536,
        max_export_batch_size: int = 512,
        schedule_delay_s: float = 1.0,
        warn_every: int = 1000,
        log_gate: ExportLogGate | None = None,
    ) -> None:
        if max_queue_size <= 0 or max_export_batch_size <= 0 or warn_every <= 0:
            raise ValueError("queue size, batch size and warn_every must be positive")
        if schedule_delay_s <= 0:
            raise ValueError("schedule_delay_s must be positive")
        self.name = name
        self.max_queue_size = max_queue_size
        self.max_export_batch_size = min(max_export_batch_size, max_queue_size)
        self._exporter = exporter
        self._delay = schedule_delay_s
        self._warn_every = warn_every
        self._queue: collections.deque[ReadableSpan] = collections.deque()
        # Guards the queue's length check with its append (so drops are exact) and the counters.
        self._lock = threading.Lock()
        # One export at a time: the worker and force_flush both export, and exporters are not
        # reentrant. Held across a batch's pop and export, so a flush that gets it has seen
        # every earlier span leave the queue and reach the exporter.
        self._export_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._dropped = 0
        self._failed = 0
        self._exported = 0
        self._failed_batches = 0
        # Failed exports since the last one that succeeded (an outage, when > 0).
        self._failing = 0
        self._log_gate = log_gate
        self._worker = threading.Thread(target=self._run, name=f"hexmq-spans-{name}", daemon=True)
        self._worker.start()

    @property
    def dropped_spans(self) -> int:
        """Spans refused because the queue was full (or the processor shut down)."""
        return self._dropped

    @property
    def failed_spans(self) -> int:
        """Spans handed to the exporter in a batch whose export failed."""
        return self._failed

    @property
    def exported_spans(self) -> int:
        return self._exported

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    @property
    def exporter(self) -> SpanExporter:
        return self._exporter

    # --- SpanProcessor -------------------------------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        if ctx is None or not ctx.trace_flags.sampled:
            return
        with self._lock:
            if not self._closed and len(self._queue) < self.max_queue_size:
                self._queue.append(span)
                # Wake the worker early only for a full batch; otherwise it wakes on its timer.
                if len(self._queue) >= self.max_export_batch_size and not self._wake.is_set():
                    self._wake.set()
                return
            self._dropped += 1
            dropped = self._dropped
        # Logged outside the lock; the first drop, then one line per warn_every drops.
        if dropped % self._warn_every == 1 or self._warn_every == 1:
            logger.warning(
                "span queue %s full (%d spans) or closed: %d span(s) dropped so far",
                self.name,
                self.max_queue_size,
                dropped,
            )

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Hand every span that ended before this call to the exporter (a failed export counts in
        failed_spans); False if the time ran out first."""
        if self._closed:
            return False
        return self._drain(time.monotonic() + timeout_millis / 1000)

    def shutdown(self, timeout_millis: int = 30000) -> None:
        """Stop taking spans, export what is queued (within the timeout), shut the exporter down.

        Idempotent: the tracer provider's own shutdown calls it again."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        deadline = time.monotonic() + timeout_millis / 1000
        self._wake.set()
        self._worker.join(max(0.0, deadline - time.monotonic()))
        if not self._drain(deadline):
            with self._lock:
                left = len(self._queue)
                self._queue.clear()
                self._dropped += left
            logger.warning("span queue %s: %d span(s) not exported by shutdown", self.name, left)
        if self._dropped:
            logger.warning("span queue %s: %d span(s) dropped in total", self.name, self._dropped)
        self._exporter.shutdown()

    # --- worker --------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._delay)
            # Cleared before draining: a span that sets it meanwhile is either drained now or
            # wakes the next round, never lost.
            self._wake.clear()
            if self._closed:
                break
            self._drain(None)

    def _drain(self, deadline: float | None) -> bool:
        """Export queued spans in batches until the queue is empty (True) or past deadline."""
        timeout = -1.0 if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._export_lock.acquire(timeout=timeout):
            return False
        try:
            while True:
                if deadline is None and self._closed:
                    return False  # the worker stops; shutdown drains the rest within its time
                with self._lock:
                    n = min(len(self._queue), self.max_export_batch_size)
                    if n == 0:
                        return True
                    batch = [self._queue.popleft() for _ in range(n)]
                self._export(batch)
                if deadline is not None and time.monotonic() >= deadline:
                    return not self._queue
        finally:
            self._export_lock.release()

    def _export(self, batch: Sequence[ReadableSpan]) -> None:
        try:
            ok = self._exporter.export(batch) is SpanExportResult.SUCCESS
        except Exception:
            logger.exception("span exporter %s raised", self.name)
            ok = False
        with self._lock:
            if ok:
                self._exported += len(batch)
                outage, self._failing = self._failing, 0
            else:
                self._failed += len(batch)
                self._failed_batches += 1
                self._failing += 1
                failed_batches = self._failed_batches
                failed = self._failed
        if ok:
            if outage:
                logger.info(
                    "span exporter %s exports again, after %d failed export(s)", self.name, outage
                )
                if self._log_gate is not None:
                    self._log_gate.reopen()
            return
        if failed_batches % 100 == 1:
            logger.warning(
                "span exporter %s failed: %d span(s) lost in %d failed export(s) so far",
                self.name,
                failed,
                failed_batches,
            )
