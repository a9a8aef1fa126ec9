"""HEXMQ_<OPTION> variables (hexmq.envoptions): every option of every service has one, the
docs table lists exactly those, and the variables behave as docs/operations.md says."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from hexmq import envoptions
from hexmq_cli import cli
from tests.support.options import service_parser

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "operations.md"
ROW = re.compile(r"^\| `(HEXMQ_[A-Z0-9_]+)` \| `(--[a-z0-9-]+)` \| ([a-z, -]+) \|$")


def every_option() -> dict[tuple[str, str], set[str]]:
    """(variable, option) -> the services that have it."""
    found: dict[tuple[str, str], set[str]] = {}
    for service in cli.SERVICE_MODULES:
        for action in envoptions.options(service_parser(service)):
            key = (envoptions.variable_for(action), envoptions.option_name(action))
            found.setdefault(key, set()).add(service)
    return found


def documented() -> dict[tuple[str, str], set[str]]:
    text = DOC.read_text()
    section = text.split("## Options from the environment", 1)[1].split("\n## ", 1)[0]
    rows: dict[tuple[str, str], set[str]] = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            variable, option, services = match.groups()
            assert (variable, option) not in rows, f"{variable} listed twice in {DOC.name}"
            rows[variable, option] = {s.strip() for s in services.split(",")}
    return rows


@pytest.mark.parametrize("service", sorted(cli.SERVICE_MODULES))
def test_every_option_of_every_service_has_a_variable(service: str) -> None:
    parser = service_parser(service)
    actions = envoptions.options(parser)
    assert actions, f"hexmq {service} has no options?"
    variables = [envoptions.variable_for(a) for a in actions]
    assert len(set(variables)) == len(variables), "two options share a variable"
    for action, variable in zip(actions, variables, strict=True):
        assert envoptions.supported(action), f"{envoptions.option_name(action)} has no variable"
        assert variable not in envoptions.NOT_OPTIONS, f"{variable} is reserved"
        assert re.fullmatch(r"HEXMQ_[A-Z0-9_]+", variable)
    # Applying an empty environment works for every kind of option the service has.
    envoptions.apply_environment(parser, {})


def test_the_docs_table_lists_exactly_the_options_of_the_services() -> None:
    options, table = every_option(), documented()

    def row(key: tuple[str, str], services: set[str]) -> str:
        order = [s for s in cli.SERVICE_MODULES if s in services]
        return f"| `{key[0]}` | `{key[1]}` | {', '.join(order)} |"

    missing = [row(k, v) for k, v in options.items() if table.get(k) != v]
    stale = [row(k, v) for k, v in table.items() if options.get(k) != v]
    why = "docs/operations.md 'Options from the environment' is out of date"
    assert not missing, f"{why}; rows to add or fix:\n" + "\n".join(missing)
    assert not stale, f"{why}; rows to remove:\n" + "\n".join(stale)


def test_a_variable_satisfies_a_required_option_and_the_command_line_wins() -> None:
    parser = service_parser("edge")
    env = {"HEXMQ_NODE_ID": "n7", "HEXMQ_LISTEN": "0.0.0.0:1883", "HEXMQ_MEMBERSHIP": "m:7000"}
    applied = envoptions.apply_environment(parser, env)
    args = applied.finish(parser.parse_args(["--listen", "127.0.0.1:1999"]))
    assert (args.node_id, args.listen, args.membership) == ("n7", "127.0.0.1:1999", "m:7000")
    assert "--node-id (HEXMQ_NODE_ID)" in applied.describe()


def test_values_take_the_options_type_and_flags_take_booleans() -> None:
    parser = service_parser("edge")
    env = {
        "HEXMQ_MAX_PACKET_SIZE": "2048",
        "HEXMQ_SYS_INTERVAL": "2.5",
        "HEXMQ_PASSWORD_FILE": "/etc/hexmq/passwd",
        "HEXMQ_TLS_REQUIRE_CLIENT_CERT": "Yes",
        "HEXMQ_ALLOW_ANONYMOUS": "off",
        "HEXMQ_ACL_DENY_REASON_CODE": "0x80",
        "HEXMQ_MAX_CONNECTIONS": "",  # empty: unset
    }
    applied = envoptions.apply_environment(parser, env)
    args = applied.finish(
        parser.parse_args(["--node-id", "a", "--listen", "h:1", "--membership", "m:1"])
    )
    assert args.max_packet_size == 2048
    assert args.sys_interval == 2.5
    assert args.password_file == Path("/etc/hexmq/passwd")
    assert args.tls_require_client_cert is True
    assert args.allow_anonymous is False
    assert args.acl_deny_reason_code == 0x80
    assert args.max_connections == 0
    # The command line still wins over a flag's variable.
    args = applied.finish(
        parser.parse_args(
            ["--node-id", "a", "--listen", "h:1", "--membership", "m:1", "--allow-anonymous"]
        )
    )
    assert args.allow_anonymous is True


def test_a_repeatable_option_takes_a_list_that_the_command_line_replaces() -> None:
    parser = service_parser("edge")
    applied = envoptions.apply_environment(parser, {"HEXMQ_PROXY_PROTOCOL": "tcp, ws"})
    base = ["--node-id", "a", "--listen", "h:1", "--membership", "m:1"]
    assert applied.finish(parser.parse_args(base)).proxy_protocol == ["tcp", "ws"]
    args = applied.finish(parser.parse_args([*base, "--proxy-protocol", "ws"]))
    assert args.proxy_protocol == ["ws"]


@pytest.mark.parametrize(
    ("service", "variable", "value", "message"),
    [
        ("edge", "HEXMQ_MAX_PACKET_SIZE", "1M", "invalid int value: '1M'"),
        ("edge", "HEXMQ_PROXY_PROTOCOL", "tcp,udp", "invalid choice: 'udp'"),
        ("edge", "HEXMQ_ALLOW_ANONYMOUS", "maybe", "expected true or false"),
        ("edge", "HEXMQ_ACL_DENY_REASON_CODE", "0x99", "is not one of 0x80, 0x83, 0x87"),
        ("partition", "HEXMQ_QUEUE_OVERFLOW", "drop-all", "invalid choice: 'drop-all'"),
        ("membership", "HEXMQ_RF", "three", "invalid int value: 'three'"),
        ("edge", "HEXMQ_AUTH_PLUGIN", " , ", "expected a comma-separated list"),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable_and_option(
    service: str, variable: str, value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main([service, "--node-id", "n1"], env={variable: value})
    assert code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    option = "--" + variable.removeprefix("HEXMQ_").lower().replace("_", "-")
    assert f"hexmq {service}: error: {variable}={value!r} (for {option}): " in err
    assert message in err


def test_a_missing_required_option_mentions_the_variables(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert cli.main(["partition"], env={}) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "required: --node-id, --listen, --redis, --membership" in err
    assert "HEXMQ_* environment variables" in err


def test_help_names_each_options_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["membership", "--help"], env={}) == 0
    out = " ".join(capsys.readouterr().out.split())
    for variable in ("HEXMQ_NODE_ID", "HEXMQ_LISTEN", "HEXMQ_METRICS_LISTEN", "HEXMQ_TRACE_DIR"):
        assert f"[env {variable}]" in out


def test_an_option_kind_no_variable_can_express_is_a_programming_error() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--verbose", action="count", default=0)
    with pytest.raises(TypeError, match="--verbose: _CountAction"):
        envoptions.apply_environment(parser, {})


def test_a_service_refusal_after_parsing_lists_the_options_from_the_environment(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    env = {"HEXMQ_NODE_ID": "n1", "HEXMQ_LISTEN": "127.0.0.1:1", "HEXMQ_MEMBERSHIP": "nowhere"}
    assert cli.main(["edge"], env=env) == cli.EXIT_USAGE
    assert "--membership must be HOST:PORT, got 'nowhere'" in caplog.text
    err = capsys.readouterr().err
    assert "options from the environment: --node-id (HEXMQ_NODE_ID)" in err
    assert "--membership (HEXMQ_MEMBERSHIP)" in err
