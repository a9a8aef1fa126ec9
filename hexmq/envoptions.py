"""Every option of a service from the environment: `--node-id` is also HEXMQ_NODE_ID.

Containers and service managers configure a process through its environment more easily than
through its command line, so `hexmq edge|partition|membership` read HEXMQ_<OPTION> (the long
option without its dashes, upper case, dashes as underscores) for every option they define.
This is done once, here, over the finished argparse parser, so an option added to a service
later gets its variable with nothing more to do:

- a variable gives the option's default; the command line still wins;
- an option that is required is satisfied by its variable;
- a flag (`--tls-require-client-cert`) takes true/false, yes/no, on/off or 1/0; an on/off pair
  (`--allow-anonymous` / `--no-allow-anonymous`) has one variable, named after the positive;
- a repeatable option (`--auth-method`) takes a comma-separated list; given on the command
  line, it replaces the variable's list rather than adding to it;
- an empty variable counts as unset (compose files often write `HEXMQ_X: ""`);
- a bad value is refused before the service starts, naming the variable and the option.

docs/operations.md lists every variable in one table; tests/unit/test_env_options.py checks
the table against the parsers, so it cannot drift.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

PREFIX: Final = "HEXMQ_"

# HEXMQ_ variables that are not options: no option may take one of these names.
NOT_OPTIONS: Final = {
    "HEXMQ_LOG_FORMAT": "json: one JSON object per log line",
    "HEXMQ_CLUSTER_DIR": "set by `hexmq cluster` in the processes it starts (leak checks)",
    # A secret has no option: an option's value can be given on a command line, which `ps`
    # shows to every local user (--redis-password-file is the option that names a file).
    "HEXMQ_REDIS_PASSWORD": "hexmq partition: the password of its Redis user (never an option)",
}

_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off"})

# Action kinds by how a variable expresses them: one value (`--x VALUE`), a list (repeatable
# options), a flag (store_true/store_false are store_const subclasses).
_VALUE_ACTIONS: Final = argparse._StoreAction
_LIST_ACTIONS: Final = argparse._AppendAction | argparse._ExtendAction
_FLAG_ACTIONS: Final = argparse._StoreConstAction | argparse.BooleanOptionalAction


class EnvOptionError(ValueError):
    """A HEXMQ_ variable whose value the option does not accept; the message names both."""


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's options that take a variable: every action with a long option string,
    except --help and --version."""
    return [
        a
        for a in parser._actions
        if any(s.startswith("--") for s in a.option_strings)
        and not isinstance(a, argparse._HelpAction | argparse._VersionAction)
    ]


def option_name(action: argparse.Action) -> str:
    """The option the variable is named after: the first long option string (for an on/off
    pair, the positive one)."""
    return next(s for s in action.option_strings if s.startswith("--"))


def variable_for(action: argparse.Action) -> str:
    """`--max-packet-size` -> HEXMQ_MAX_PACKET_SIZE."""
    return PREFIX + option_name(action)[2:].upper().replace("-", "_")


def supported(action: argparse.Action) -> bool:
    """Whether a variable can express this option (every kind the services use)."""
    if isinstance(action, _FLAG_ACTIONS):
        return True
    if isinstance(action, _VALUE_ACTIONS):
        return action.nargs in (None, "?", "+", "*")
    return isinstance(action, _LIST_ACTIONS) and action.nargs in (None, "?")


def parse_bool(text: str) -> bool:
    word = text.strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise ValueError("expected true or false (also yes/no, on/off, 1/0)")


@dataclass
class EnvironmentOptions:
    """What the environment supplied to one parser. Call
    `finish(namespace)` on the parsed namespace (repeatable options: the command line wins)."""

    used: dict[str, tuple[str, str]] = field(default_factory=dict)  # dest -> (variable, option)
    _lists: dict[str, list[Any]] = field(default_factory=dict)

    def finish(self, namespace: argparse.Namespace) -> argparse.Namespace:
        for dest, from_env in self._lists.items():
            value = getattr(namespace, dest, None)
            # argparse appends command-line values to a copy of the default list: when it
            # grew, the command line gave values and they alone count.
            if isinstance(value, list) and value is not from_env and len(value) > len(from_env):
                setattr(namespace, dest, value[len(from_env) :])
        return namespace

    def describe(self) -> str:
        """`--listen (HEXMQ_LISTEN), ...`: which options came from the environment, for an
        error that names only the option."""
        return ", ".join(f"{option} ({variable})" for variable, option in self.used.values())


def _convert(parser: argparse.ArgumentParser, action: argparse.Action, text: str) -> Any:
    """One value as the command line would take it: its type, then its choices (argparse's
    own conversion, so the messages are the ones the command line gives)."""
    value = parser._get_value(action, text)
    parser._check_value(action, value)
    return value


def _value_of(parser: argparse.ArgumentParser, action: argparse.Action, raw: str) -> Any:
    if isinstance(action, argparse.BooleanOptionalAction):
        return parse_bool(raw)
    if isinstance(action, argparse._StoreConstAction):
        return action.const if parse_bool(raw) else action.default
    if isinstance(action, _LIST_ACTIONS) or action.nargs in ("+", "*"):
        items = [item.strip() for item in raw.split(",") if item.strip()]
        if not items:
            raise ValueError("expected a comma-separated list")
        return [_convert(parser, action, item) for item in items]
    return _convert(parser, action, raw)


def apply_environment(
    parser: argparse.ArgumentParser, env: Mapping[str, str]
) -> EnvironmentOptions:
    """Make every set HEXMQ_ variable the default of its option in `parser` (and the option
    no longer required), and say in each option's help which variable it reads.

    Raises EnvOptionError naming the variable and the option for a value the option refuses,
    and TypeError for an option kind no variable can express (a programming error)."""
    applied = EnvironmentOptions()
    for action in options(parser):
        if not supported(action):
            raise TypeError(
                f"{option_name(action)}: {type(action).__name__} options cannot be given by "
                "environment variable; use store, store_true/false, BooleanOptionalAction or "
                "append"
            )
        variable = variable_for(action)
        if action.help is not None and action.help != argparse.SUPPRESS:
            action.help = f"{action.help} [env {variable}]"
        raw = env.get(variable, "")
        if not raw.strip():
            continue
        try:
            value = _value_of(parser, action, raw)
        except (argparse.ArgumentError, ValueError, TypeError) as exc:
            why = exc.message if isinstance(exc, argparse.ArgumentError) else str(exc)
            raise EnvOptionError(f"{variable}={raw!r} (for {option_name(action)}): {why}") from None
        action.default = value
        action.required = False
        applied.used[action.dest] = (variable, option_name(action))
        if isinstance(value, list):
            applied._lists[action.dest] = value
    return applied
