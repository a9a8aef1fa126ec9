"""What the membership plan's tests feed it: a clock reading, the settle time, and a node's
registration (its addresses made from its name)."""

from __future__ import annotations

from services.membership.plan import Registration

SETTLE = 1000
NOW = 10_000


def reg(node: str, incarnation: int = 1, since: int = 0) -> Registration:
    n = node.removeprefix("n")
    return Registration(
        node, f"127.0.0.1:70{n}", f"127.0.0.1:18{n}", f"127.0.0.1:80{n}", incarnation, since
    )
