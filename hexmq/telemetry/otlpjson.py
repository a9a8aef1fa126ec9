"""Spans as OTLP JSON lines, the format of the OpenTelemetry Collector's file exporter.

Each line is one ExportTraceServiceRequest: {"resourceSpans": [{"resource": ..., "scopeSpans":
[{"scope": ..., "spans": [...]}]}]}. It is built by the same encoder as the OTLP exporters and
printed by protobuf's json_format, then adjusted where OTLP JSON differs from plain ProtoJSON:

- traceId, spanId, parentSpanId (also in links) are lowercase hex, not base64;
- enums are integers ("kind": 2, "status": {"code": 1});
- field names are lowerCamelCase; 64-bit integers (startTimeUnixNano, intValue) are strings;
- fields at their default are left out: a root span has no parentSpanId, an unset status is {}.

A reader (the Spark job) should therefore read with an explicit schema and treat a missing and an
empty parentSpanId alike.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from google.protobuf import json_format
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

logger = logging.getLogger(__name__)

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_BACKUPS = 8

_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids(obj: dict[str, Any]) -> None:
    for key in _ID_FIELDS:
        value = obj.get(key)
        if value:
            obj[key] = base64.b64decode(value).hex()


def spans_to_otlp_json(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """One ExportTraceServiceRequest for `spans`, as an OTLP JSON object."""
    doc: dict[str, Any] = json_format.MessageToDict(
        encode_spans(spans), use_integers_for_enums=True
    )
    for resource_spans in doc.get("resourceSpans", ()):
        for scope_spans in resource_spans.get("scopeSpans", ()):
            for span in scope_spans.get("spans", ()):
                _hex_ids(span)
                for link in span.get("links", ()):
                    _hex_ids(link)
    return doc


def spans_to_otlp_json_line(spans: Sequence[ReadableSpan]) -> bytes:
    """The line the file exporter writes for one batch, newline included."""
    return json.dumps(spans_to_otlp_json(spans), separators=(",", ":")).encode() + b"\n"


class RotatingOtlpJsonFileExporter(SpanExporter):
    """Appends one OTLP JSON line per export batch to `path` and rotates it by size.

    When the next line would take the file past `max_bytes`, the file is renamed to
    `<name>.<NNNNNN>` (NNNNNN counts up and is never reused, so a rotated file keeps its name
    until it is deleted, and names sort by age) and a new file is started; only the newest
    `backups` rotated files are kept. `edge-n1.jsonl` and `edge-n1.jsonl.000003` both match
    the glob `*.jsonl*` and a Spark directory read. Lines are written whole and flushed per
    batch; a crash can at worst leave a torn last line, which a PERMISSIVE JSON reader skips.
    Called by one batch processor thread at a time; the lock only guards against shutdown.
    """

    def __init__(
        self, path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, backups: int = DEFAULT_BACKUPS
    ) -> None:
        if max_bytes <= 0 or backups < 0:
            raise ValueError("max_bytes must be positive and backups not negative")
        self.path = path
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        path.parent.mkdir(parents=True, exist_ok=True)
        self._rotated_re = re.compile(re.escape(path.name) + r"\.(\d+)$")
        self._next_index = max(self._rotated_indexes(), default=0) + 1
        self._file: IO[bytes] | None = open(path, "ab")  # noqa: SIM115 - kept open across calls
        self._size = self._file.tell()

    def _rotated_indexes(self) -> list[int]:
        indexes = []
        for entry in self.path.parent.iterdir():
            m = self._rotated_re.match(entry.name)
            if m:
                indexes.append(int(m.group(1)))
        return sorted(indexes)

    def rotated_files(self) -> list[Path]:
        """Rotated files, oldest first."""
        return [self.path.with_name(f"{self.path.name}.{i:06d}") for i in self._rotated_indexes()]

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        line = spans_to_otlp_json_line(spans)
        with self._lock:
            if self._file is None:
                return SpanExportResult.FAILURE
            try:
                if self._size and self._size + len(line) > self.max_bytes:
                    self._rotate()
                self._file.write(line)
                self._file.flush()
                self._size += len(line)
            except OSError:
                logger.exception("cannot write spans to %s", self.path)
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def _rotate(self) -> None:
        assert self._file is not None
        self._file.close()
        os.replace(self.path, self.path.with_name(f"{self.path.name}.{self._next_index:06d}"))
        self._next_index += 1
        rotated = self._rotated_indexes()
        for index in rotated[: max(0, len(rotated) - self.backups)]:
            try:
                self.path.with_name(f"{self.path.name}.{index:06d}").unlink()
            except FileNotFoundError:
                pass
        self._file = open(self.path, "ab")  # noqa: SIM115
        self._size = 0

    def shutdown(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True  # every export already flushed its line
