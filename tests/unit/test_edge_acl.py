"""ACL files in mosquitto's acl_file format: parsing, errors naming the line, and the checks for
publish, subscribe and delivery."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.edge.acl import Acl, filter_covers

ACL = """\
# anonymous clients
topic read public/#

user alice
topic readwrite sensors/#
topic deny sensors/secret/#
topic read $SYS/#

user bob
topic read sensors/+/temp
topic write  cmd/with space

pattern readwrite clients/%c/#
pattern write users/%u/out
"""


@pytest.fixture
def acl() -> Acl:
    return Acl.parse(ACL, "acl")


def test_user_rules_deny_first(acl: Acl) -> None:
    alice = acl.for_client("a1", "alice")
    assert alice.may_publish("sensors/kitchen/temp")
    assert alice.may_receive("sensors/kitchen/temp")
    assert not alice.may_publish("sensors/secret/key")  # deny, though readwrite came first
    assert not alice.may_receive("sensors/secret/key")
    assert not alice.may_publish("other")
    assert alice.may_receive("$SYS/broker/uptime")
    assert not alice.may_publish("$SYS/broker/uptime")


def test_read_and_write_are_separate(acl: Acl) -> None:
    bob = acl.for_client("b1", "bob")
    assert bob.may_receive("sensors/hall/temp")
    assert not bob.may_publish("sensors/hall/temp")
    assert bob.may_publish("cmd/with space")  # the rest of the line is the filter
    assert not bob.may_receive("cmd/with space")


def test_anonymous_rules_apply_only_without_a_user_name(acl: Acl) -> None:
    assert acl.for_client("x", None).may_receive("public/news")
    assert not acl.for_client("x", "alice").may_receive("public/news")
    assert not acl.for_client("x", "nobody").may_receive("public/news")


def test_patterns_apply_to_everyone_with_substitution(acl: Acl) -> None:
    c = acl.for_client("dev-7", "carol")
    assert c.may_publish("clients/dev-7/status")
    assert c.may_receive("clients/dev-7/cmd")
    assert not c.may_publish("clients/dev-8/status")
    assert c.may_publish("users/carol/out")
    assert not c.may_receive("users/carol/out")
    # %u never matches a client without a user name.
    anon = acl.for_client("dev-9", None)
    assert not anon.may_publish("users//out")
    assert anon.may_publish("clients/dev-9/status")


def test_patterns_skip_ids_and_names_with_wildcards(acl: Acl) -> None:
    # Else a client named "#" would own every clients/... topic.
    assert not acl.for_client("#", None).may_publish("clients/x/status")
    assert not acl.for_client("dev", "+").may_publish("clients/dev/status")


def test_dollar_topics_need_a_dollar_rule() -> None:
    acl = Acl.parse("topic readwrite #\n", "acl")
    anon = acl.for_client("c", None)
    assert anon.may_receive("a/b")
    assert not anon.may_receive("$SYS/x")
    assert not anon.may_subscribe("$SYS/#")


def test_subscribe_needs_a_read_rule_covering_the_filter(acl: Acl) -> None:
    alice = acl.for_client("a1", "alice")
    assert alice.may_subscribe("sensors/#")
    assert alice.may_subscribe("sensors/+/temp")
    assert not alice.may_subscribe("sensors/secret/#")  # covered by the deny rule
    assert not alice.may_subscribe("#")
    assert not alice.may_subscribe("other/+")
    bob = acl.for_client("b1", "bob")
    assert bob.may_subscribe("sensors/hall/temp")
    assert bob.may_subscribe("sensors/+/temp")
    assert not bob.may_subscribe("sensors/#")  # matches more than sensors/+/temp
    assert not bob.may_subscribe("cmd/with space")  # write only


@pytest.mark.parametrize(
    ("rule", "topic_filter", "covered"),
    [
        ("#", "a/b", True),
        ("#", "#", True),
        ("a/#", "a", True),
        ("a/#", "a/+/c", True),
        ("a/+", "a/b", True),
        ("a/+", "a/+", True),
        ("a/+", "a/#", False),
        ("a/b", "a/+", False),
        ("a/+", "a/b/c", False),
        ("a/b/c", "a/b", False),
        ("+/b", "$SYS/b", False),
        ("$SYS/#", "$SYS/+", True),
    ],
)
def test_filter_covers(rule: str, topic_filter: str, covered: bool) -> None:
    assert filter_covers(rule, topic_filter) is covered


def test_verdicts_are_cached_per_connection(acl: Acl) -> None:
    alice = acl.for_client("a1", "alice")
    for _ in range(3):
        assert alice.may_publish("sensors/x")
    assert alice._publish == {"sensors/x": True}  # checked once, then looked up


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("topci read a/b", "unknown keyword 'topci'"),
        ("topic raed a/b", "unknown access 'raed'"),
        ("topic read", "`topic` needs a topic filter"),
        ("topic", "`topic` needs a topic filter"),
        ("pattern write a/#/b", "'#' must be a whole level"),
        ("topic read a/b+", "'+' must be a whole level"),
        ("user", "`user` needs a user name"),
    ],
)
def test_a_bad_line_is_named(line: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        Acl.parse(f"{ACL}\n{line}\n", "/etc/hexmq/acl")
    assert "ACL file /etc/hexmq/acl, line 16:" in str(err.value)
    assert message in str(err.value)


def test_load_names_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"cannot read ACL file {tmp_path}/nope"):
        Acl.load(tmp_path / "nope")
