"""The edge's session core imports neither asyncio nor gRPC, not even through what it imports.
(That the edge has no import circle, as no service has, is tests/unit/test_service_imports.py.)"""

from __future__ import annotations

import subprocess
import sys

from tests.support.imports import ROOT, circles


def test_the_circle_finder_finds_circles() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]


def test_the_session_core_imports_neither_asyncio_nor_grpc() -> None:
    probe = (
        "import sys; import services.edge.session; "
        "print(sorted(m for m in ('asyncio', 'grpc') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]"
