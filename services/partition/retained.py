"""The retained messages of the partitions a node masters, indexed by topic level (issue 25).

A SUBSCRIBE's retained messages used to be found by testing every stored topic against the new
filters: 50,000 retained messages made each SUBSCRIBE cost a partition service about 240 ms of
CPU. `TopicTree` holds the stored topic names level by level, so a filter walks only the
branches it can match: a literal level is one dictionary lookup, `+` visits the children of
one node, `#` the subtree it covers. A SUBSCRIBE then costs what it matches (and, for a `+`,
the names at that level), not what is stored (bench/retained.py, docs/benchmarks.md).

`RetainedMessages` is the node's store: topic -> (partition, message) for lookups and
snapshots, the tree for queries, and counts and bytes per partition for the cluster's caps
(`--max-retained-messages`, `--max-retained-bytes`; services/partition/delivery.py).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator

from hexmq.api.common.v1 import common_pb2 as common_pb


class _Level:
    """One level of stored topic names: its children by name (None until it has one), and
    whether a stored topic ends here."""

    __slots__ = ("children", "topic")

    def __init__(self) -> None:
        self.children: dict[str, _Level] | None = None
        self.topic: str | None = None


class TopicTree:
    """Topic names (never filters) by level, matched by topic filters."""

    def __init__(self) -> None:
        self._root = _Level()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def add(self, topic: str) -> None:
        node = self._root
        for level in topic.split("/"):
            children = node.children
            if children is None:
                children = node.children = {}
            child = children.get(level)
            if child is None:
                child = children[level] = _Level()
            node = child
        if node.topic is None:
            node.topic = topic
            self._size += 1

    def remove(self, topic: str) -> bool:
        """Remove a stored topic; the levels it leaves empty go too."""
        path: list[tuple[_Level, str]] = []
        node = self._root
        for level in topic.split("/"):
            children = node.children
            child = children.get(level) if children is not None else None
            if child is None:
                return False
            path.append((node, level))
            node = child
        if node.topic is None:
            return False
        node.topic = None
        self._size -= 1
        for parent, level in reversed(path):
            if node.topic is not None or node.children:
                break
            assert parent.children is not None
            del parent.children[level]
            node = parent
        return True

    def match(self, topic_filter: str) -> list[str]:
        """The stored topics `topic_filter` (a valid, non-shared filter) matches. A filter
        starting with a wildcard matches no topic starting with `$` [MQTT-4.7.2-1]."""
        levels = topic_filter.split("/")
        last = len(levels) - 1
        found: list[str] = []
        stack: list[tuple[_Level, int]] = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            level = levels[i]
            if level == "#":
                # "a/#" matches "a" itself and everything below it.
                if node.topic is not None and i > 0:
                    found.append(node.topic)
                _collect(node, found, skip_dollar=i == 0)
                continue
            children = node.children
            if children is None:
                continue
            if level == "+":
                for name, child in children.items():
                    if i == 0 and name.startswith("$"):
                        continue
                    if i == last:
                        if child.topic is not None:
                            found.append(child.topic)
                    else:
                        stack.append((child, i + 1))
                continue
            found_child = children.get(level)
            if found_child is None:
                continue
            child = found_child
            if i == last:
                if child.topic is not None:
                    found.append(child.topic)
            else:
                stack.append((child, i + 1))
        return found


def _collect(node: _Level, found: list[str], *, skip_dollar: bool) -> None:
    """Every stored topic below `node` (not `node`'s own)."""
    children = node.children
    if not children:
        return
    stack = [
        child for name, child in children.items() if not (skip_dollar and name.startswith("$"))
    ]
    while stack:
        n = stack.pop()
        if n.topic is not None:
            found.append(n.topic)
        if n.children:
            stack.extend(n.children.values())


def retained_size(msg: common_pb.Message) -> int:
    """What a retained message counts against `--max-retained-bytes`: its topic and payload."""
    return len(msg.topic.encode()) + len(msg.payload)


class RetainedMessages:
    """The retained messages of the partitions mastered here."""

    def __init__(self) -> None:
        self._by_topic: dict[str, tuple[int, common_pb.Message]] = {}
        self._tree = TopicTree()
        # Per partition: how many, and their bytes (retained_size).
        self.counts: dict[int, int] = {}
        self.sizes: dict[int, int] = {}
        self.count = 0
        self.size = 0
        # Of which the broker's own $SYS/ topics (a few dozen per node, not the clients').
        self.sys_count = 0
        self.sys_size = 0

    def __len__(self) -> int:
        return self.count

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_topic)

    def __contains__(self, topic: object) -> bool:
        return topic in self._by_topic

    def __getitem__(self, topic: str) -> tuple[int, common_pb.Message]:
        return self._by_topic[topic]

    def get(self, topic: str) -> tuple[int, common_pb.Message] | None:
        return self._by_topic.get(topic)

    def items(self) -> Iterator[tuple[str, tuple[int, common_pb.Message]]]:
        return iter(self._by_topic.items())

    def put(self, p: int, msg: common_pb.Message) -> None:
        """Set the topic's retained message (replacing one)."""
        topic = msg.topic
        old = self._by_topic.get(topic)
        if old is not None:
            self._uncount(old[0], old[1])
        else:
            self._tree.add(topic)
        self._by_topic[topic] = (p, msg)
        size = retained_size(msg)
        self.counts[p] = self.counts.get(p, 0) + 1
        self.sizes[p] = self.sizes.get(p, 0) + size
        self.count += 1
        self.size += size
        if topic.startswith("$SYS/"):
            self.sys_count += 1
            self.sys_size += size

    def delete(self, topic: str) -> bool:
        old = self._by_topic.pop(topic, None)
        if old is None:
            return False
        self._tree.remove(topic)
        self._uncount(old[0], old[1])
        return True

    def _uncount(self, p: int, msg: common_pb.Message) -> None:
        size = retained_size(msg)
        self.counts[p] -= 1
        self.sizes[p] -= size
        self.count -= 1
        self.size -= size
        if msg.topic.startswith("$SYS/"):
            self.sys_count -= 1
            self.sys_size -= size

    def match(
        self, filters: Iterable[str], now_ms: int, mastered: Container[int]
    ) -> list[common_pb.Message]:
        """The unexpired retained messages of `mastered` partitions matching any of
        `filters`, each once."""
        seen: set[str] = set()
        found: list[common_pb.Message] = []
        by_topic = self._by_topic
        for topic_filter in filters:
            for topic in self._tree.match(topic_filter):
                if topic in seen:
                    continue
                seen.add(topic)
                p, msg = by_topic[topic]
                if p not in mastered:
                    continue
                if msg.expires_at_ms and msg.expires_at_ms <= now_ms:
                    continue
                found.append(msg)
        return found

    def unload(self, partitions: set[int]) -> None:
        """Forget these partitions' retained messages (no longer mastered here)."""
        for topic in [t for t, (q, _m) in self._by_topic.items() if q in partitions]:
            self.delete(topic)
        for p in partitions:
            self.counts.pop(p, None)
            self.sizes.pop(p, None)
