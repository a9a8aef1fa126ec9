"""How `hexmq consul-dev` reads KV keys and query parameters: Consul's rules and texts."""

from __future__ import annotations

import pytest
from multidict import MultiDict

from services.membership.consul_dev.decode import (
    query_bool,
    query_uint,
    refuse_conflicting,
    validate_kv_key,
)
from services.membership.consul_dev.model import ConsulError


@pytest.mark.parametrize("key", ["hexmq/c1/view", "hexmq/c1/members/n-1_a.b,c", "p/"])
def test_keys_of_letters_digits_and_the_safe_punctuation_pass(key: str) -> None:
    validate_kv_key(key)


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("/lead", "key must not begin with a '/'"),
        ("a:b", "key contains invalid character ':' at position 1."),
        ("a/é", "key contains invalid character 'é' at position 2."),
        ("a/../b", "key contains path traversal sequence"),
        ("conf/app.JSON", "key contains suspicious file extension '.json'"),
    ],
)
def test_keys_current_consul_refuses_are_a_400(key: str, text: str) -> None:
    with pytest.raises(ConsulError) as info:
        validate_kv_key(key)
    assert info.value.status == 400
    assert info.value.text.startswith(text)


def test_conflicting_flags_list_the_parameters_sorted() -> None:
    query = MultiDict([("release", "s"), ("cas", "1"), ("flags", "2")])
    with pytest.raises(ConsulError) as info:
        refuse_conflicting(query, "cas", "acquire", "release")
    assert (info.value.status, info.value.text) == (
        400,
        "Conflicting flags: cas=1&flags=2&release=s\n",
    )
    refuse_conflicting(MultiDict([("cas", "1")]), "cas", "acquire", "release")


@pytest.mark.parametrize("text", ["0", "18446744073709551615"])
def test_uint_parameters_take_64_bits(text: str) -> None:
    assert query_uint({"cas": text}, "cas") == int(text)


@pytest.mark.parametrize("text", ["-1", "1.5", "", "18446744073709551616", "x"])
def test_a_uint_parameter_that_is_no_number_is_a_400_naming_it(text: str) -> None:
    with pytest.raises(ConsulError, match="Invalid cas"):
        query_uint({"cas": text}, "cas")


def test_bool_parameters_read_as_go_parse_bool() -> None:
    assert query_bool({}, "passing") is False
    assert query_bool({"passing": ""}, "passing") is True
    assert query_bool({"passing": "1"}, "passing") is True
    assert query_bool({"passing": "false"}, "passing") is False
    with pytest.raises(ConsulError, match=r"Invalid value for \?passing"):
        query_bool({"passing": "maybe"}, "passing")
