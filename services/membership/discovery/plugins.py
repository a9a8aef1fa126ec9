"""Third-party discovery backends, found by entry point in the group `hexmq.discovery`
(docs/discovery.md, "Writing a plugin"; examples/discovery-plugin is a worked one).

A distribution declares, in its pyproject.toml,

    [project.entry-points."hexmq.discovery"]
    shared-dir = "hexmq_shared_dir:make"

and `hexmq membership --discovery shared-dir` calls `make(context)` once at startup with a
`DiscoveryContext`; it returns a `Discovery` (an object with `name` and `listings()`).
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Final

from services.membership.discovery.model import Discovery, DiscoveryContext, DiscoveryError

GROUP: Final = "hexmq.discovery"


def installed() -> dict[str, list[EntryPoint]]:
    """Plugin name -> the entry points that offer it (more than one is a conflict)."""
    found: dict[str, list[EntryPoint]] = {}
    for ep in entry_points(group=GROUP):
        found.setdefault(ep.name, []).append(ep)
    return found


def _origin(ep: EntryPoint) -> str:
    dist = ep.dist
    where = f"{dist.name} {dist.version}" if dist is not None else "an unknown distribution"
    return f"{ep.value} (from {where})"


def load_plugin(name: str, context: DiscoveryContext, builtins: tuple[str, ...]) -> Discovery:
    """The plugin's Discovery for `context`; DiscoveryError naming the plugin otherwise."""
    offers = installed()
    eps = offers.get(name, [])
    if not eps:
        plugins = ", ".join(sorted(offers)) or "none installed"
        raise DiscoveryError(
            f"--discovery {name!r}: not a built-in backend ({', '.join(builtins)}) and no "
            f"plugin of that name in entry point group {GROUP} (plugins: {plugins})"
        )
    if len(eps) > 1:
        raise DiscoveryError(
            f"--discovery {name!r}: offered by more than one entry point in {GROUP}: "
            + "; ".join(_origin(ep) for ep in eps)
        )
    ep = eps[0]
    try:
        factory = ep.load()
    except Exception as exc:  # an import of third-party code: anything can go wrong
        raise DiscoveryError(
            f"discovery plugin {name!r}: cannot load {_origin(ep)}: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(factory):
        raise DiscoveryError(f"discovery plugin {name!r}: {_origin(ep)} is not callable")
    try:
        discovery = factory(context)
    except (ValueError, TypeError, OSError) as exc:
        raise DiscoveryError(f"discovery plugin {name!r}: {exc}") from exc
    if not isinstance(discovery, Discovery):
        raise DiscoveryError(
            f"discovery plugin {name!r}: {_origin(ep)} returned {type(discovery).__name__}, "
            "not a Discovery (an object with `name` and `listings()`)"
        )
    return discovery
