"""MQTT topic names, topic filters and the subscription trie (MQTT 5.0 section 4.7, 4.8.2).

Topic names are what PUBLISH carries; topic filters are what SUBSCRIBE carries and may hold the
wildcards ``+`` (one whole level) and ``#`` (the rest, last level only). A filter
``$share/{ShareName}/{filter}`` is a shared subscription: it matches what ``{filter}`` matches,
and the share name says which group of sessions takes turns receiving.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

from hexmq.mqtt.errors import TopicFilterInvalid, TopicNameInvalid
from hexmq.mqtt.packets import SHARED_PREFIX

__all__ = [
    "SHARED_PREFIX",
    "TopicTrie",
    "split_shared",
    "topic_matches",
    "validate_topic_filter",
    "validate_topic_name",
]

_MAX_LENGTH = 65535  # [MQTT-4.7.3-3]: at most 65,535 bytes of UTF-8


def _check_text(
    text: str, max_length: int, error: type[TopicNameInvalid | TopicFilterInvalid]
) -> None:
    kind = "topic name" if error is TopicNameInvalid else "topic filter"
    if not text:
        raise error(f"empty {kind} [MQTT-4.7.3-1]")
    if "\x00" in text:
        raise error(f"{kind} contains U+0000 [MQTT-4.7.3-2]")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise error(f"{kind} is not valid Unicode (lone surrogate) [MQTT-1.5.4-1]") from None
    if size > max_length:
        raise error(f"{kind} is {size} bytes, more than {max_length} [MQTT-4.7.3-3]")


def validate_topic_name(
    topic: str, *, max_length: int = _MAX_LENGTH, max_levels: int | None = None
) -> None:
    """Raise :class:`TopicNameInvalid` unless ``topic`` may be published to.

    ``max_length`` (bytes) and ``max_levels`` are the broker's own limits, tighter than MQTT's.
    """
    _check_text(topic, max_length, TopicNameInvalid)
    if "+" in topic or "#" in topic:
        raise TopicNameInvalid(f"wildcard in topic name {topic!r} [MQTT-4.7.0-1]")
    if max_levels is not None and topic.count("/") >= max_levels:
        raise TopicNameInvalid(f"topic name has more than {max_levels} levels")


def split_shared(topic_filter: str) -> tuple[str | None, str]:
    """``("group", "a/+")`` for ``"$share/group/a/+"``, ``(None, f)`` for a non-shared filter.

    Raises :class:`TopicFilterInvalid` for a ``$share/`` filter with no ``/`` after the share name;
    the rest of the grammar is :func:`validate_topic_filter`'s.
    """
    if not topic_filter.startswith(SHARED_PREFIX):
        return None, topic_filter
    group, sep, inner = topic_filter[len(SHARED_PREFIX) :].partition("/")
    if not sep:
        raise TopicFilterInvalid(
            f"shared subscription {topic_filter!r} has no topic filter [MQTT-4.8.2-2]"
        )
    return group, inner


def validate_topic_filter(
    topic_filter: str, *, max_length: int = _MAX_LENGTH, max_levels: int | None = None
) -> None:
    """Raise :class:`TopicFilterInvalid` unless ``topic_filter`` may be subscribed to.

    ``max_levels`` counts the levels of the filter proper, without a ``$share/{group}/`` prefix.
    """
    _check_text(topic_filter, max_length, TopicFilterInvalid)
    group, inner = split_shared(topic_filter)
    if group is not None:
        if not group:
            raise TopicFilterInvalid("empty ShareName [MQTT-4.8.2-1]")
        if "+" in group or "#" in group:
            raise TopicFilterInvalid(f"wildcard in ShareName {group!r} [MQTT-4.8.2-2]")
        if not inner:
            raise TopicFilterInvalid("shared subscription without a topic filter [MQTT-4.8.2-2]")
    if "+" in inner or "#" in inner:
        levels = inner.split("/")
        last = len(levels) - 1
        for i, level in enumerate(levels):
            if "#" in level and (level != "#" or i != last):
                raise TopicFilterInvalid(
                    f"'#' must be a whole level and the last one: {topic_filter!r} [MQTT-4.7.1-1]"
                )
            if "+" in level and level != "+":
                raise TopicFilterInvalid(
                    f"'+' must be a whole level: {topic_filter!r} [MQTT-4.7.1-2]"
                )
    if max_levels is not None and inner.count("/") >= max_levels:
        raise TopicFilterInvalid(f"topic filter has more than {max_levels} levels")


def topic_matches(topic_filter: str, topic: str) -> bool:
    """Whether a (valid) filter matches a (valid) topic name.

    ``#`` also matches its parent level (``a/#`` matches ``a``), ``+`` matches an empty level, and
    a filter starting with a wildcard never matches a topic starting with ``$`` [MQTT-4.7.2-1].
    A shared filter matches what its inner filter matches.
    """
    _, topic_filter = split_shared(topic_filter)
    if topic.startswith("$") and topic_filter[:1] in ("+", "#"):
        return False
    filter_levels = topic_filter.split("/")
    topic_levels = topic.split("/")
    n = len(topic_levels)
    for i, level in enumerate(filter_levels):
        if level == "#":
            return True
        if i >= n or (level != "+" and level != topic_levels[i]):
            return False
    return len(filter_levels) == n


K = TypeVar("K")
V = TypeVar("V")


class _Node(Generic[K, V]):
    __slots__ = ("children", "entries")

    def __init__(self) -> None:
        # Keyed by level text; the wildcards are children named "+" and "#".
        self.children: dict[str, _Node[K, V]] = {}
        # Subscriptions whose filter ends at this node: (original filter, key) -> value.
        self.entries: dict[tuple[str, K], V] = {}


class TopicTrie(Generic[K, V]):
    """Subscriptions indexed by filter level, so matching a topic walks only matching branches.

    Each entry is a ``(filter, key)`` pair with a value, e.g. ``(filter, client_id) -> options``.
    Shared filters are indexed by their inner filter and reported under their full text.
    """

    def __init__(self) -> None:
        self._root: _Node[K, V] = _Node()
        self._filters: dict[str, int] = {}  # filter -> number of keys subscribed with it
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def filters(self) -> Iterator[str]:
        """Each distinct filter with at least one entry."""
        return iter(list(self._filters))

    def add(self, topic_filter: str, key: K, value: V) -> None:
        """Add or replace the entry for ``(topic_filter, key)``; invalid filters raise."""
        validate_topic_filter(topic_filter)
        _, inner = split_shared(topic_filter)
        node = self._root
        for level in inner.split("/"):
            child = node.children.get(level)
            if child is None:
                child = node.children[level] = _Node()
            node = child
        entry = (topic_filter, key)
        if entry not in node.entries:
            self._size += 1
            self._filters[topic_filter] = self._filters.get(topic_filter, 0) + 1
        node.entries[entry] = value

    def remove(self, topic_filter: str, key: K) -> bool:
        """Remove the entry; False if there was none. Nodes left empty are pruned."""
        if topic_filter not in self._filters:
            return False
        _, inner = split_shared(topic_filter)
        path: list[tuple[_Node[K, V], str]] = []
        node = self._root
        for level in inner.split("/"):
            child = node.children.get(level)
            if child is None:
                return False
            path.append((node, level))
            node = child
        if node.entries.pop((topic_filter, key), _MISSING) is _MISSING:
            return False
        self._size -= 1
        remaining = self._filters[topic_filter] - 1
        if remaining:
            self._filters[topic_filter] = remaining
        else:
            del self._filters[topic_filter]
        for parent, level in reversed(path):
            if node.entries or node.children:
                break
            del parent.children[level]
            node = parent
        return True

    def entries_of(self, topic_filter: str) -> list[tuple[K, V]]:
        """The ``(key, value)`` entries of exactly this filter."""
        if topic_filter not in self._filters:
            return []
        node = self._root
        for level in split_shared(topic_filter)[1].split("/"):
            node = node.children[level]
        return [(k, v) for (f, k), v in node.entries.items() if f == topic_filter]

    def match(self, topic: str) -> Iterator[tuple[str, K, V]]:
        """Every ``(filter, key, value)`` whose filter matches ``topic``, each once.

        Collected before the first is returned, so the caller may change the trie meanwhile.
        """
        levels = topic.split("/")
        n = len(levels)
        # [MQTT-4.7.2-1]: no first-level wildcard for $-topics ($SYS/...).
        dollar = topic.startswith("$")
        found: list[tuple[str, K, V]] = []
        stack = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            children = node.children
            wildcards_ok = i or not dollar
            if wildcards_ok:
                multi = children.get("#")
                if multi is not None:  # "a/#" matches "a", "a/b", "a/b/c" ...
                    found.extend((f, k, v) for (f, k), v in multi.entries.items())
            if i == n:
                found.extend((f, k, v) for (f, k), v in node.entries.items())
                continue
            level = levels[i]
            # A topic name holds no wildcards; were one passed anyway, a literal "+" or "#"
            # level must not reach the wildcard nodes a second time.
            if level != "+" and level != "#":
                child = children.get(level)
                if child is not None:
                    stack.append((child, i + 1))
            if wildcards_ok:
                single = children.get("+")
                if single is not None:
                    stack.append((single, i + 1))
        return iter(found)


_MISSING = object()
