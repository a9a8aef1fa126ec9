"""Topic names, topic filters, matching and the subscription trie (MQTT 5.0 4.7, 4.8.2)."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hexmq.mqtt import TopicFilterInvalid, TopicNameInvalid
from hexmq.topics import (
    TopicTrie,
    split_shared,
    topic_matches,
    validate_topic_filter,
    validate_topic_name,
)

VALID_NAMES = [
    "a",
    "/",
    "a/b",
    "/finance",
    "$SYS/broker",
    "a//b",
    " ",
    "Accounts payable",
    "\u20ac",
]
INVALID_NAMES = [
    ("", "MQTT-4.7.3-1"),
    ("a/+", "MQTT-4.7.0-1"),
    ("#", "MQTT-4.7.0-1"),
    ("a/b#", "MQTT-4.7.0-1"),
    ("a\x00", "MQTT-4.7.3-2"),
    ("a\ud800", "MQTT-1.5.4-1"),
    ("a" * 65536, "MQTT-4.7.3-3"),
]


@pytest.mark.parametrize("topic", VALID_NAMES)
def test_valid_topic_names(topic: str) -> None:
    validate_topic_name(topic)


@pytest.mark.parametrize(("topic", "rule"), INVALID_NAMES, ids=[r for _, r in INVALID_NAMES])
def test_invalid_topic_names(topic: str, rule: str) -> None:
    with pytest.raises(TopicNameInvalid) as info:
        validate_topic_name(topic)
    assert rule in info.value.message
    assert info.value.reason_code == 0x90


def test_topic_name_limits() -> None:
    validate_topic_name("\u20ac", max_length=3)  # 3 bytes of UTF-8
    with pytest.raises(TopicNameInvalid):
        validate_topic_name("\u20aca", max_length=3)
    validate_topic_name("a/b", max_levels=2)
    with pytest.raises(TopicNameInvalid):
        validate_topic_name("a/b/c", max_levels=2)


VALID_FILTERS = [
    "#",
    "+",
    "a/#",
    "+/+",
    "/+",
    "+/",
    "a/+/b",
    "sport/tennis/#",
    "$SYS/#",
    "a//b",
    "$share",  # not a shared subscription: no "/" after it
    "$share/g/a/#",
    "$share/g/#",
    "$share/g//",
    "$share/group-1/+/x",
]
INVALID_FILTERS = [
    ("", "MQTT-4.7.3-1"),
    ("a#", "MQTT-4.7.1-1"),
    ("a/#/b", "MQTT-4.7.1-1"),
    ("#/a", "MQTT-4.7.1-1"),
    ("a/b#", "MQTT-4.7.1-1"),
    ("a+", "MQTT-4.7.1-2"),
    ("a/+b", "MQTT-4.7.1-2"),
    ("++", "MQTT-4.7.1-2"),
    ("a\x00", "MQTT-4.7.3-2"),
    ("$share//a", "MQTT-4.8.2-1"),
    ("$share/g", "MQTT-4.8.2-2"),
    ("$share/g/", "MQTT-4.8.2-2"),
    ("$share/g+/a", "MQTT-4.8.2-2"),
    ("$share/#/a", "MQTT-4.8.2-2"),
    ("$share/g/a/#/b", "MQTT-4.7.1-1"),
]


@pytest.mark.parametrize("topic_filter", VALID_FILTERS)
def test_valid_topic_filters(topic_filter: str) -> None:
    validate_topic_filter(topic_filter)


@pytest.mark.parametrize(
    ("topic_filter", "rule"), INVALID_FILTERS, ids=[f"{f!r}" for f, _ in INVALID_FILTERS]
)
def test_invalid_topic_filters(topic_filter: str, rule: str) -> None:
    with pytest.raises(TopicFilterInvalid) as info:
        validate_topic_filter(topic_filter)
    assert rule in info.value.message
    assert info.value.reason_code == 0x8F


def test_topic_filter_limits() -> None:
    validate_topic_filter("a/+/#", max_levels=3)
    with pytest.raises(TopicFilterInvalid):
        validate_topic_filter("a/+/b/#", max_levels=3)
    # The $share/{group}/ prefix does not count as levels.
    validate_topic_filter("$share/g/a/b", max_levels=2)
    with pytest.raises(TopicFilterInvalid):
        validate_topic_filter("abcd", max_length=3)


def test_split_shared() -> None:
    assert split_shared("$share/g/a/b") == ("g", "a/b")
    assert split_shared("$share/g/") == ("g", "")
    assert split_shared("a/b") == (None, "a/b")
    assert split_shared("$share") == (None, "$share")
    with pytest.raises(TopicFilterInvalid):
        split_shared("$share/g")


# The examples of 4.7.1.2, 4.7.1.3 and 4.7.2.
MATCHES = [
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("#", "sport/tennis", True),
    ("#", "/", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/ranking", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("+", "finance", True),
    ("a/b", "a/b", True),
    ("a/b", "a/b/c", False),
    ("a/b/c", "a/b", False),
    ("ACCOUNTS", "Accounts", False),
    ("#", "$SYS/monitor/Clients", False),  # [MQTT-4.7.2-1]
    ("+/monitor/Clients", "$SYS/monitor/Clients", False),  # [MQTT-4.7.2-1]
    ("$SYS/#", "$SYS/monitor/Clients", True),
    ("$SYS/monitor/+", "$SYS/monitor/Clients", True),
    ("$share/g/sport/#", "sport/tennis", True),
    ("$share/g/#", "$SYS/x", False),
    ("a/+/c", "a//c", True),
]


@pytest.mark.parametrize(("topic_filter", "topic", "expected"), MATCHES)
def test_topic_matches(topic_filter: str, topic: str, expected: bool) -> None:
    assert topic_matches(topic_filter, topic) is expected


def test_trie_basics() -> None:
    trie: TopicTrie[str, int] = TopicTrie()
    for topic_filter in ("#", "a/#", "+/b", "a/b", "a/+", "a/b/#", "$share/g/a/b"):
        trie.add(topic_filter, "c1", 1)
    trie.add("a/b", "c2", 2)
    assert len(trie) == 8
    assert sorted(trie.filters()) == sorted(
        ["#", "a/#", "+/b", "a/b", "a/+", "a/b/#", "$share/g/a/b"]
    )
    found = sorted(trie.match("a/b"))
    assert found == sorted(
        [
            ("#", "c1", 1),
            ("a/#", "c1", 1),
            ("+/b", "c1", 1),
            ("a/b", "c1", 1),
            ("a/b", "c2", 2),
            ("a/+", "c1", 1),
            ("a/b/#", "c1", 1),  # "#" also matches the parent level
            ("$share/g/a/b", "c1", 1),
        ]
    )
    # Replacing keeps one entry.
    trie.add("a/b", "c2", 3)
    assert len(trie) == 8
    assert ("a/b", "c2", 3) in list(trie.match("a/b"))


def test_trie_dollar_topics() -> None:
    trie: TopicTrie[str, None] = TopicTrie()
    for topic_filter in ("#", "+/x", "$SYS/#", "$SYS/+"):
        trie.add(topic_filter, "k", None)
    assert sorted(f for f, _, _ in trie.match("$SYS/x")) == ["$SYS/#", "$SYS/+"]
    assert sorted(f for f, _, _ in trie.match("a/x")) == ["#", "+/x"]


def test_trie_remove_and_prune() -> None:
    trie: TopicTrie[str, int] = TopicTrie()
    trie.add("a/b/c", "k1", 1)
    trie.add("a/b/c", "k2", 2)
    trie.add("a/+", "k1", 1)
    assert not trie.remove("a/b/c", "nobody")
    assert not trie.remove("x/y", "k1")
    assert not trie.remove("a/b", "k1")
    assert trie.remove("a/b/c", "k1")
    assert not trie.remove("a/b/c", "k1")
    assert list(trie.match("a/b/c")) == [("a/b/c", "k2", 2)]
    assert sorted(trie.filters()) == ["a/+", "a/b/c"]
    assert trie.remove("a/b/c", "k2")
    assert list(trie.filters()) == ["a/+"]
    assert trie.remove("a/+", "k1")
    assert len(trie) == 0
    assert not trie._root.children  # every node was pruned


def test_trie_rejects_invalid_filters() -> None:
    trie: TopicTrie[str, int] = TopicTrie()
    with pytest.raises(TopicFilterInvalid):
        trie.add("a/#/b", "k", 1)
    assert len(trie) == 0


def test_trie_can_change_while_iterating_matches() -> None:
    trie: TopicTrie[int, int] = TopicTrie()
    for key in range(10):
        trie.add("a/#", key, key)
    for topic_filter, key, _ in trie.match("a/b"):
        trie.remove(topic_filter, key)
    assert len(trie) == 0


def test_trie_ignores_wildcards_in_a_topic_name() -> None:
    # Topic names never hold wildcards; were one passed, nothing may match twice.
    trie: TopicTrie[str, int] = TopicTrie()
    trie.add("a/+", "k", 1)
    trie.add("a/#", "k", 2)
    assert sorted(trie.match("a/+")) == [("a/#", "k", 2), ("a/+", "k", 1)]


# --- Property test: the trie agrees with topic_matches -------------------------------------------

levels = st.sampled_from(["a", "b", "$x", "", "c d"])
topics = st.lists(levels, min_size=1, max_size=4).map("/".join)


@st.composite
def topic_filters(draw: st.DrawFn) -> str:
    parts = draw(st.lists(levels | st.just("+"), min_size=1, max_size=4))
    if draw(st.booleans()):
        parts.append("#")
    text = "/".join(parts) or "+"  # "" is no filter [MQTT-4.7.3-1]
    if draw(st.integers(0, 4)) == 0:
        text = f"$share/{draw(st.sampled_from(['g', 'h']))}/{text}"
    return text


@settings(max_examples=300, deadline=None)
@given(
    entries=st.lists(st.tuples(topic_filters(), st.integers(0, 3)), max_size=25),
    removals=st.lists(st.tuples(topic_filters(), st.integers(0, 3)), max_size=10),
    probes=st.lists(topics, min_size=1, max_size=8),
)
def test_trie_agrees_with_topic_matches(
    entries: list[tuple[str, int]], removals: list[tuple[str, int]], probes: list[str]
) -> None:
    trie: TopicTrie[int, str] = TopicTrie()
    model: dict[tuple[str, int], str] = {}
    for i, (topic_filter, key) in enumerate(entries):
        trie.add(topic_filter, key, f"v{i}")
        model[(topic_filter, key)] = f"v{i}"
    for topic_filter, key in removals:
        assert trie.remove(topic_filter, key) == ((topic_filter, key) in model)
        model.pop((topic_filter, key), None)
    assert len(trie) == len(model)
    assert set(trie.filters()) == {f for f, _ in model}
    for topic in probes:
        found = list(trie.match(topic))
        assert len(found) == len(set(found))  # each entry once
        expected = {(f, k, v) for (f, k), v in model.items() if topic_matches(f, topic)}
        assert set(found) == expected
    for topic_filter, key in list(model):
        assert trie.remove(topic_filter, key)
    assert not trie._root.children


def test_trie_matches_100k_filters_without_scanning() -> None:
    trie: TopicTrie[int, None] = TopicTrie()
    for i in range(100_000):
        site, device = i % 100, i // 100
        trie.add(f"site/{site}/device/{device}/+", i, None)
    trie.add("site/#", -1, None)
    trie.add("+/7/device/#", -2, None)
    start = time.perf_counter()
    for n in range(1000):
        found = list(trie.match(f"site/7/device/{n}/temp"))
        assert {k for _, k, _ in found} == {-1, -2, n * 100 + 7}
    per_match = (time.perf_counter() - start) / 1000
    # A scan of 100k filters costs tens of milliseconds; a trie walk, microseconds. The bound is
    # loose so a busy CI machine cannot fail it.
    assert per_match < 0.002
