"""Structured logs: one JSON object per line on stderr, with the current trace and span ids.

Chosen with HEXMQ_LOG_FORMAT=json (see `json_logs_requested`); the plain format stays the
default because people read it in terminals.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from typing import IO, Any

from opentelemetry import trace

# Attributes every LogRecord has; anything else on a record came from `extra=` and is logged.
_RECORD_FIELDS = frozenset(
    vars(logging.LogRecord("", 0, "", 0, "", None, None)).keys() | {"message", "asctime"}
)
_OWN_KEYS = frozenset(
    {"ts", "level", "service", "node", "logger", "msg", "trace_id", "span_id", "exc", "stack"}
)


def json_logs_requested(env: Mapping[str, str] = os.environ) -> bool:
    return env.get("HEXMQ_LOG_FORMAT", "").strip().lower() == "json"


class JsonFormatter(logging.Formatter):
    """Formats a record as one line of JSON:

    {"ts": "2026-11-21T10:15:00.123Z", "level": "INFO", "service": "edge", "node": "n1",
     "logger": "hexmq.edge", "msg": "...", "trace_id": "<32 hex>", "span_id": "<16 hex>",
     "exc": "Traceback ...", ...extra fields}

    trace_id/span_id are those of the span current where the record was made, when there is a
    valid one (also when it is not sampled: the ids still match the neighbours' logs).
    """

    def __init__(self, service: str, node_id: str) -> None:
        super().__init__()
        self.service = service
        self.node_id = node_id

    def format(self, record: logging.LogRecord) -> str:
        # Milliseconds and a Z: sortable as text, parsed by every log shipper.
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        doc: dict[str, Any] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "service": self.service,
            "node": self.node_id,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        # Handlers run in the thread (and asyncio task context) that logged, so the current
        # span here is the one the record belongs to.
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            doc["trace_id"] = format(ctx.trace_id, "032x")
            doc["span_id"] = format(ctx.span_id, "016x")
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        doc.update(
            (key, value)
            for key, value in vars(record).items()
            if key not in _RECORD_FIELDS and key not in _OWN_KEYS
        )
        # default=str: an extra that is not JSON (a Path, an exception) still logs, as text.
        return json.dumps(doc, default=str, ensure_ascii=False)


class _JsonHandler(logging.StreamHandler[IO[str]]):
    """Marks the handler setup_json_logging installed, so a second call replaces it."""


def setup_json_logging(
    service: str, node_id: str, level: str = "INFO", *, stream: IO[str] | None = None
) -> None:
    """Log JSON lines to `stream` (default stderr) from the root logger at `level`.

    Call once at process start, instead of the plain setup. Other handlers on the root logger
    are left alone (pytest's capture, for one); a previous JSON handler is replaced."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        if isinstance(handler, _JsonHandler):
            root.removeHandler(handler)
            handler.close()
    handler = _JsonHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter(service, node_id))
    root.addHandler(handler)
    root.setLevel(level.upper())
