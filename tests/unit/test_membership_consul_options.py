"""The membership agent's Consul token and TLS options (services/membership/main.py):
--consul-token-file (read at start, again on change), --consul-ca, --consul-cert, --consul-key;
refused at start, naming the option, when they cannot be used."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from hexmq.trust.certs import CertFiles, issue_server, make_ca
from services.membership import main as membership_main
from services.membership.discovery.options import build_discovery


def parse(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    membership_main.add_arguments(parser)
    return parser.parse_args(
        [
            *("--node-id", "n1", "--listen", "127.0.0.1:7001", "--cluster", "prod"),
            *("--partition-addr", "127.0.0.1:7002", "--mqtt-addr", "127.0.0.1:1883"),
            *extra,
        ]
    )


def test_without_options_the_agent_sends_no_token_of_its_own() -> None:
    credentials = membership_main.agent_config(parse()).consul_credentials
    assert (credentials.token, credentials.ca, credentials.cert, credentials.key) == (None,) * 4


def test_the_token_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "consul.token"
    path.write_text("first\n")
    config = membership_main.agent_config(parse("--consul-token-file", str(path)))
    token = config.consul_credentials.token
    assert callable(token)
    assert token() == "first"
    tmp = tmp_path / "consul.token.tmp"
    tmp.write_text("second\n")
    os.replace(tmp, path)
    assert token() == "second"
    # Consul catalog discovery sends the same token.
    config = membership_main.agent_config(
        parse("--consul-token-file", str(path), "--discovery", "consul")
    )
    assert config.discovery is not None
    discovery = build_discovery(config.discovery, membership_main.discovery_context(config))
    assert discovery.settings.credentials is config.consul_credentials


def test_https_files_are_checked_at_start(tmp_path: Path) -> None:
    ca = make_ca(tmp_path / "ca")
    client = issue_server(
        tmp_path / "ca", "agent", CertFiles(tmp_path / "c.crt", tmp_path / "c.key"), dns_names=["a"]
    )
    args = (
        *("--consul", "https://127.0.0.1:8501", "--consul-ca", str(ca.cert)),
        *("--consul-cert", str(client.cert), "--consul-key", str(client.key)),
    )
    credentials = membership_main.agent_config(parse(*args)).consul_credentials
    assert (credentials.ca, credentials.cert, credentials.key) == (ca.cert, client.cert, client.key)


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        (("--consul-token-file", "{missing}"), "--consul-token-file {missing}: cannot read it"),
        (("--consul-token-file", "{empty}"), "--consul-token-file {empty} is empty"),
        (("--consul-ca", "{ca}"), "is for an https:// Consul address"),
        (("--consul", "https://h:8501", "--consul-cert", "{cert}"), "needs its key"),
        (("--consul", "https://h:8501", "--consul-ca", "{missing}"), "--consul-ca {missing}"),
        (("--consul", "https://h:8501", "--consul-ca", "{empty}"), "--consul-ca {empty}"),
        (
            ("--consul", "https://h:8501", "--consul-cert", "{cert}", "--consul-key", "{ca_key}"),
            "--consul-cert {cert}, --consul-key {ca_key}: not a usable PEM certificate",
        ),
    ],
)
def test_unusable_consul_options_are_refused_naming_the_option(
    tmp_path: Path, extra: tuple[str, ...], error: str
) -> None:
    ca = make_ca(tmp_path / "ca")
    client = issue_server(
        tmp_path / "ca", "agent", CertFiles(tmp_path / "c.crt", tmp_path / "c.key"), dns_names=["a"]
    )
    (tmp_path / "empty").write_text("")
    names = {
        "missing": str(tmp_path / "missing"),
        "empty": str(tmp_path / "empty"),
        "ca": str(ca.cert),
        "ca_key": str(ca.key),
        "cert": str(client.cert),
    }
    with pytest.raises(ValueError) as info:
        membership_main.agent_config(parse(*(arg.format(**names) for arg in extra)))
    assert error.format(**names) in str(info.value)
