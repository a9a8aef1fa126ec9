"""The services' real command-line parsers, as `hexmq` builds them."""

from __future__ import annotations

import argparse
import importlib

from hexmq import cli


def service_parser(service: str) -> argparse.ArgumentParser:
    """The real parser of `hexmq SERVICE`, built as `hexmq` builds it."""
    parser = cli.build_parser()
    sub = cli._service_parser(parser, service)
    importlib.import_module(cli.SERVICE_MODULES[service][0]).add_arguments(sub)
    return sub
