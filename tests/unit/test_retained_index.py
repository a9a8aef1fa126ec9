"""The retained messages' topic tree (services/partition/retained.py): a filter finds exactly
the stored topics topic_matches says it matches, and visits only the branches it can match."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hexmq.api.common.v1.common_pb2 import Message
from hexmq.topics import topic_matches
from services.partition.retained import RetainedMessages, TopicTree

LEVELS = st.sampled_from(["a", "b", "$SYS", "$x", "", "c"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=4).map("/".join).filter(bool)
FILTER_LEVELS = st.sampled_from(["a", "b", "$SYS", "", "+", "#"])
FILTERS = (
    st.lists(FILTER_LEVELS, min_size=1, max_size=4)
    .filter(lambda levels: "#" not in levels[:-1])
    .map("/".join)
)


@settings(max_examples=400, deadline=None)
@given(st.sets(TOPICS, max_size=30), FILTERS)
def test_the_tree_matches_what_topic_matches_matches(topics: set[str], topic_filter: str) -> None:
    tree = TopicTree()
    for topic in topics:
        tree.add(topic)
    expected = sorted(t for t in topics if topic_matches(topic_filter, t))
    assert sorted(tree.match(topic_filter)) == expected


@settings(max_examples=200, deadline=None)
@given(st.sets(TOPICS, max_size=30), st.data())
def test_removed_topics_are_gone_and_their_empty_levels_too(
    topics: set[str], data: st.DataObject
) -> None:
    tree = TopicTree()
    for topic in topics:
        tree.add(topic)
    gone = data.draw(st.sets(st.sampled_from(sorted(topics)))) if topics else set()
    for topic in gone:
        assert tree.remove(topic)
        assert not tree.remove(topic)
    assert len(tree) == len(topics) - len(gone)
    assert sorted(tree.match("#")) == sorted(t for t in topics - gone if not t.startswith("$"))
    if gone == topics:
        assert tree._root.children in (None, {})


def test_a_filter_visits_what_it_matches_not_what_is_stored(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # 100,000 topics under 10,000 groups: `ret/123/+` reads one group, whatever else is stored.
    retained = RetainedMessages()
    for i in range(100_000):
        retained.put(i % 7, Message(topic=f"ret/{i // 10}/{i % 10}", payload=b"v"))
    visited: list[str] = []
    tree = retained._tree
    original = tree.match

    def counting(topic_filter: str) -> list[str]:
        found = original(topic_filter)
        visited.extend(found)
        return found

    monkeypatch.setattr(tree, "match", counting)
    found = retained.match(["ret/123/+", "ret/123/4"], 0, range(7))
    assert sorted(m.topic for m in found) == [f"ret/123/{k}" for k in range(10)]
    assert len(visited) == 11  # 10 for the wildcard filter, 1 again for the literal one


def test_counts_and_bytes_follow_puts_replacements_deletes_and_unloads() -> None:
    retained = RetainedMessages()
    retained.put(1, Message(topic="a/b", payload=b"12345"))  # 3 + 5
    retained.put(2, Message(topic="c", payload=b"1"))  # 1 + 1
    retained.put(1, Message(topic="a/b", payload=b"1"))  # replaced: 3 + 1
    assert (retained.count, retained.size) == (2, 6)
    assert (retained.counts, retained.sizes) == ({1: 1, 2: 1}, {1: 4, 2: 2})
    assert retained.delete("c")
    assert not retained.delete("c")
    retained.put(3, Message(topic="d", payload=b"1"))
    retained.unload({1})
    assert (list(retained), retained.count, retained.size) == (["d"], 1, 2)


def test_expired_and_unmastered_messages_are_not_found() -> None:
    retained = RetainedMessages()
    retained.put(1, Message(topic="a/1", payload=b"v", expires_at_ms=1000))
    retained.put(1, Message(topic="a/2", payload=b"v"))
    retained.put(2, Message(topic="a/3", payload=b"v"))
    assert [m.topic for m in retained.match(["a/+"], 999, {1, 2})] != []
    assert sorted(m.topic for m in retained.match(["a/+"], 1000, {1})) == ["a/2"]
