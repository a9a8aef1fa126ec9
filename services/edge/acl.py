"""Authorization: mosquitto's acl_file format, and each connection's view of it.

    # comment
    topic read $SYS/#                 # before any `user` line: clients without a user name
    user alice
    topic readwrite sensors/#         # alice's rules
    topic deny sensors/secret/#
    pattern write devices/%c/status   # every client; %c = client id, %u = user name

The access word is `read`, `write`, `readwrite` (the default when left out) or `deny`. A client
is checked against its own rules (its user's, or the anonymous ones), then the patterns; in each
list `deny` rules come first, and the first rule matching the topic decides. No rule: denied.
As in mosquitto, a rule only matches a topic starting with `$` if it starts with `$` itself, and
patterns never apply to a client whose id or user name holds `+` or `#`.

Publishing needs `write` on the topic. Subscribing needs `read` on every topic the filter can
match (one rule whose filter covers it) and no `deny` rule covering it; each delivery is then
checked for `read` again, so a partial `deny` and sessions made under other rules still hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hexmq.mqtt import MQTTError
from hexmq.topics import topic_matches, validate_topic_filter

DENY = 0
READ = 1
WRITE = 2
_ACCESS = {"read": READ, "write": WRITE, "readwrite": READ | WRITE, "deny": DENY}
# Per-connection verdict caches (topic -> allowed) are cleared when they reach this size.
_CACHE_SIZE = 4096


def read_config_text(path: Path, what: str) -> str:
    """A UTF-8 configuration file's text; ValueError naming `what` and the path otherwise."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read {what} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{what} {path} is not UTF-8 text") from None


@dataclass(frozen=True, slots=True)
class AclRule:
    access: int
    topic_filter: str
    line: int


def filter_covers(rule: str, topic_filter: str) -> bool:
    """Whether every topic `topic_filter` can match is matched by `rule` (both valid filters)."""
    if topic_filter.startswith("$") and not rule.startswith("$"):
        return False
    rule_levels = rule.split("/")
    levels = topic_filter.split("/")
    for i, r in enumerate(rule_levels):
        if r == "#":
            return True
        if i >= len(levels):
            return False
        level = levels[i]
        if level == "#":
            return False  # `#` here matches deeper topics that the rest of `rule` may not
        if r != "+" and r != level:
            return False  # also when `level` is `+`: it matches more than one name
    return len(levels) == len(rule_levels)


def _deny_first(rules: list[AclRule]) -> tuple[AclRule, ...]:
    return tuple(sorted(rules, key=lambda r: r.access != DENY))


class Acl:
    """The rules of one ACL file, loaded once at startup."""

    def __init__(
        self,
        anonymous: list[AclRule],
        users: dict[str, list[AclRule]],
        patterns: list[AclRule],
        source: str = "<memory>",
    ) -> None:
        self.anonymous = _deny_first(anonymous)
        self.users = {name: _deny_first(rules) for name, rules in users.items()}
        self.patterns = _deny_first(patterns)
        self.source = source

    @classmethod
    def load(cls, path: Path) -> Acl:
        return cls.parse(read_config_text(path, "ACL file"), str(path))

    @classmethod
    def parse(cls, text: str, source: str) -> Acl:
        anonymous: list[AclRule] = []
        users: dict[str, list[AclRule]] = {}
        patterns: list[AclRule] = []
        current = anonymous
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            where = f"ACL file {source}, line {number}"
            keyword, rest = _split_word(line)
            if keyword == "user":
                if not rest:
                    raise ValueError(f"{where}: `user` needs a user name")
                current = users.setdefault(rest, [])
            elif keyword in ("topic", "pattern"):
                rule = _parse_rule(rest, number, where, keyword)
                (patterns if keyword == "pattern" else current).append(rule)
            else:
                raise ValueError(
                    f"{where}: unknown keyword {keyword!r} (expected user, topic or pattern)"
                )
        return cls(anonymous, users, patterns, source)

    def for_client(
        self, client_id: str, username: str | None, source: AclSource | None = None
    ) -> ClientAcl:
        """The client's rules. With `source`, the edge's current ACL: the client's rules are
        made anew from it when it is reloaded (SIGHUP), at the client's next check."""
        own = self.anonymous if username is None else self.users.get(username, ())
        patterns: list[AclRule] = []
        if not any(c in client_id for c in "+#") and not (
            username is not None and any(c in username for c in "+#")
        ):
            for rule in self.patterns:
                if "%u" in rule.topic_filter and username is None:
                    continue
                expanded = rule.topic_filter.replace("%c", client_id)
                if username is not None:
                    expanded = expanded.replace("%u", username)
                patterns.append(AclRule(rule.access, expanded, rule.line))
        client = ClientAcl((own, tuple(patterns)))
        if source is not None:
            client.follow(source, client_id, username)
        return client


class AclSource(Protocol):
    """Where the edge's current ACL is (services/edge/access.py, AccessControl): a reload
    replaces `acl` and raises `acl_generation`."""

    acl: Acl | None
    acl_generation: int


def _split_word(text: str) -> tuple[str, str]:
    """The first word and the (stripped) rest; the rest may hold spaces."""
    parts = text.split(None, 1)
    if not parts:
        return "", ""
    return parts[0], parts[1].strip() if len(parts) > 1 else ""


def _parse_rule(rest: str, number: int, where: str, keyword: str) -> AclRule:
    word, after = _split_word(rest)
    if word in _ACCESS:
        access, topic_filter = _ACCESS[word], after
    elif not after:
        access, topic_filter = READ | WRITE, rest
    else:
        # mosquitto would take "raed a/b" as the filter "raed a/b"; a typo here should not
        # silently grant or deny the wrong thing.
        raise ValueError(f"{where}: unknown access {word!r} (read, write, readwrite or deny)")
    if not topic_filter:
        raise ValueError(f"{where}: `{keyword}` needs a topic filter")
    try:
        validate_topic_filter(topic_filter)
    except MQTTError as exc:
        raise ValueError(f"{where}: {exc.message}") from None
    return AclRule(access, topic_filter, number)


class ClientAcl:
    """One connection's rules (its own, then the expanded patterns), with cached verdicts so
    that the publish and delivery paths pay one dict lookup per known topic."""

    __slots__ = ("_generation", "_lists", "_publish", "_receive", "_source", "_who")

    def __init__(self, lists: tuple[tuple[AclRule, ...], ...]) -> None:
        self._lists = lists
        self._publish: dict[str, bool] = {}
        self._receive: dict[str, bool] = {}
        self._source: AclSource | None = None
        self._generation = 0
        self._who: tuple[str, str | None] = ("", None)

    def follow(self, source: AclSource, client_id: str, username: str | None) -> None:
        """Take the client's rules from `source` again whenever its ACL is reloaded."""
        self._source = source
        self._generation = source.acl_generation
        self._who = (client_id, username)

    def _current(self) -> None:
        """The ACL was reloaded since these rules were made: make them (and the verdicts)
        anew, for the same client id and user name."""
        source = self._source
        assert source is not None
        self._generation = source.acl_generation
        acl = source.acl
        self._lists = acl.for_client(*self._who)._lists if acl is not None else ()
        self._publish.clear()
        self._receive.clear()

    def may_publish(self, topic: str) -> bool:
        source = self._source
        if source is not None and source.acl_generation != self._generation:
            self._current()
        allowed = self._publish.get(topic)
        if allowed is None:
            if len(self._publish) >= _CACHE_SIZE:
                self._publish.clear()
            allowed = self._publish[topic] = self._check_topic(topic, WRITE)
        return allowed

    def may_receive(self, topic: str) -> bool:
        source = self._source
        if source is not None and source.acl_generation != self._generation:
            self._current()
        allowed = self._receive.get(topic)
        if allowed is None:
            if len(self._receive) >= _CACHE_SIZE:
                self._receive.clear()
            allowed = self._receive[topic] = self._check_topic(topic, READ)
        return allowed

    def may_subscribe(self, topic_filter: str) -> bool:
        source = self._source
        if source is not None and source.acl_generation != self._generation:
            self._current()
        for rules in self._lists:
            for rule in rules:
                if not filter_covers(rule.topic_filter, topic_filter):
                    continue
                if rule.access == DENY:
                    return False
                if rule.access & READ:
                    return True
        return False

    def _check_topic(self, topic: str, access: int) -> bool:
        dollar = topic.startswith("$")
        for rules in self._lists:
            for rule in rules:
                if dollar and not rule.topic_filter.startswith("$"):
                    continue
                if topic_matches(rule.topic_filter, topic):
                    if rule.access == DENY:
                        return False
                    if rule.access & access:
                        return True
        return False
