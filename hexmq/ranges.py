"""Partition lists for log lines: "3-7, 9, 12-13"."""

from __future__ import annotations

from collections.abc import Iterable


def ranges(numbers: Iterable[int]) -> str:
    """Sorted, with runs of consecutive numbers as first-last."""
    out: list[str] = []
    ns = sorted(set(numbers))
    i = 0
    while i < len(ns):
        j = i
        while j + 1 < len(ns) and ns[j + 1] == ns[j] + 1:
            j += 1
        out.append(str(ns[i]) if i == j else f"{ns[i]}-{ns[j]}")
        i = j + 1
    return ", ".join(out)
