"""The services' real command-line parsers, as `hexmq` builds them."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Mapping, Sequence
from typing import NoReturn

from hexmq import envoptions
from hexmq_cli import cli


def service_parser(service: str) -> argparse.ArgumentParser:
    """The real parser of `hexmq SERVICE`, built as `hexmq` builds it."""
    parser = cli.build_parser()
    sub = cli._service_parser(parser, service)
    importlib.import_module(cli.SERVICE_MODULES[service][0]).add_arguments(sub)
    return sub


class OptionsRefused(ValueError):
    """What a service would refuse at start: an unknown flag or variable, a bad value."""


def parse_service(
    service: str,
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    allowed_unknown: frozenset[str] = frozenset(),
    check_agent: bool = True,
) -> argparse.Namespace:
    """`hexmq SERVICE ARGS` with `env` as the service parses them (HEXMQ_* variables as its
    options, the command line winning), or OptionsRefused naming what it refuses. A HEXMQ_*
    variable that is no option of the service (nor one of envoptions.NOT_OPTIONS) is refused
    too, unless `allowed_unknown` lists it: the service would ignore it silently. For the
    membership agent, `check_agent` also runs the checks it makes before it starts (they read
    its Consul token file)."""
    parser = service_parser(service)
    try:
        applied = envoptions.apply_environment(parser, env)
    except envoptions.EnvOptionError as exc:
        raise OptionsRefused(f"hexmq {service}: {exc}") from None
    # argparse reports a usage error by exiting, after printing it; keep its message.
    errors: list[str] = []

    def error(message: str) -> NoReturn:
        errors.append(message)
        raise SystemExit(2)

    setattr(parser, "error", error)  # noqa: B010 (an instance's own, as argparse calls it)
    try:
        namespace = applied.finish(parser.parse_args(list(args)))
    except SystemExit:
        raise OptionsRefused(
            f"hexmq {service} refuses {list(args)}: {'; '.join(errors) or 'usage error'}"
        ) from None
    if service == "membership" and check_agent:
        # The agent checks more than argparse does before it starts: node id, cluster name,
        # every address, Consul's session TTL bounds, discovery's options.
        from services.membership.main import agent_config

        try:
            agent_config(namespace)
        except ValueError as exc:
            raise OptionsRefused(f"hexmq membership refuses its options: {exc}") from None
    known = {envoptions.variable_for(a) for a in envoptions.options(parser)}
    unknown = sorted(
        k
        for k in env
        if k.startswith(envoptions.PREFIX)
        and k not in known
        and k not in envoptions.NOT_OPTIONS
        and k not in allowed_unknown
    )
    if unknown:
        raise OptionsRefused(f"hexmq {service} has no option for {', '.join(unknown)}")
    return namespace


def parse_node(
    args: Sequence[str],
    env: Mapping[str, str],
    *,
    allowed_unknown: frozenset[str] = frozenset(),
    check_agent: bool = True,
) -> dict[str, argparse.Namespace]:
    """`hexmq node ARGS` with `env` as `hexmq node` parses them (hexmq_cli/node.py): each
    section by its service's real parser (parse_service), from HEXMQ_<OPTION> and, winning,
    HEXMQ_NODE_<SERVICE>_<OPTION>; then the node's own checks (one node id, the process-wide
    pacing agreed). {service: its options}, or OptionsRefused. A HEXMQ_* variable no section
    reads is refused, as parse_service refuses one its service does not read."""
    from hexmq_cli import node

    try:
        sections = node.split_sections(list(args))
    except node.NodeUsageError as exc:
        raise OptionsRefused(f"hexmq node: {exc}") from None
    known: set[str] = set(envoptions.NOT_OPTIONS)
    for service in node.SECTIONS:
        for action in envoptions.options(service_parser(service)):
            variable = envoptions.variable_for(action)
            known.add(variable)
            known.add(node.NODE_PREFIX + service.upper() + "_" + variable[len(envoptions.PREFIX) :])
    unknown = sorted(
        k
        for k in env
        if k.startswith(envoptions.PREFIX) and k not in known and k not in allowed_unknown
    )
    if unknown:
        raise OptionsRefused(f"no section of hexmq node has an option for {', '.join(unknown)}")
    # What one section reads and another does not is the other's, not unknown.
    others = frozenset(k for k in env if k.startswith(envoptions.PREFIX)) | allowed_unknown
    out = {
        service: parse_service(
            service,
            sections.get(service, []),
            node.section_environment(service, env),
            allowed_unknown=others,
            check_agent=check_agent,
        )
        for service in node.SECTIONS
    }
    try:
        node.parse_sections(list(args), env)
    except node.NodeUsageError as exc:
        raise OptionsRefused(f"hexmq node: {exc}") from None
    return out


def section_env(service: str, env: Mapping[str, str]) -> dict[str, str]:
    """The variables one section of `hexmq node` reads, as its service alone would be given
    them: HEXMQ_NODE_<SERVICE>_<OPTION> as HEXMQ_<OPTION> (winning), and no other section's
    HEXMQ_NODE_<SERVICE>_* (HEXMQ_NODE_ID stays: it is --node-id)."""
    from hexmq_cli import node

    prefixes = tuple(f"{node.NODE_PREFIX}{s.upper()}_" for s in node.SECTIONS)
    return {
        k: v
        for k, v in node.section_environment(service, env).items()
        if not k.startswith(prefixes)
    }
