"""The borders of our packages, as docs/architecture.md ("Packages and their borders") states
them, read from the source (tests/support/imports.py: every import counts, type-only and
function-level ones too):

- no import circle within a service, nor within the shared package hexmq/;
- a service imports no other service: the edge, the partition service and the membership agent
  each import only hexmq/ and themselves (what one needs of another lives in hexmq/, as
  hexmq.membership holds the agent's client and the view's readings);
- the partition service speaks no MQTT: it imports no module of the codec (hexmq.mqtt); the
  edge turns its outcomes into reason codes (services/edge/outcomes.py);
- the shared package imports no service, but for the `hexmq` command's dispatch (KNOWN).

Each rule is also run on a small tree with one violating import, so that a rule that could
never fail would show.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.imports import circles, graph, reaching, within, write_tree

SERVICES = ("services.edge", "services.partition", "services.membership")

# The shared package's imports of a service that are known and allowed: the `hexmq` command
# (hexmq/cli.py) runs the services' own subcommands. Nothing else in hexmq/ may import one.
KNOWN: dict[str, set[str]] = {
    "hexmq.cli": {
        "services.edge",
        "services.edge.passwd",
        "services.membership.consul_client",
        "services.membership.consul_client.parse_consul_addr",
    },
}


def import_circles(package: str, root: Path | None = None) -> list[list[str]]:
    return circles(within(graph(package) if root is None else graph(package, root)))


def foreign_services(service: str, root: Path | None = None) -> dict[str, set[str]]:
    """The modules of `service` that import another service, and what of it."""
    edges = graph(service) if root is None else graph(service, root)
    return reaching(edges, *(s for s in SERVICES if s != service))


def mqtt_imports(package: str, root: Path | None = None) -> dict[str, set[str]]:
    edges = graph(package) if root is None else graph(package, root)
    return reaching(edges, "hexmq.mqtt")


def service_imports(root: Path | None = None) -> dict[str, set[str]]:
    """The modules of hexmq/ that import a service, but for KNOWN."""
    edges = graph("hexmq") if root is None else graph("hexmq", root)
    found = reaching(edges, "services")
    return {
        name: extra for name, names in found.items() if (extra := names - KNOWN.get(name, set()))
    }


@pytest.mark.parametrize("package", [*SERVICES, "hexmq"])
def test_no_import_circle(package: str) -> None:
    assert len(graph(package)) > 1
    assert import_circles(package) == []


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_no_other_service(service: str) -> None:
    assert foreign_services(service) == {}


def test_the_partition_imports_no_mqtt_module() -> None:
    assert mqtt_imports("services.partition") == {}


def test_the_shared_package_imports_no_service_but_the_known_ones() -> None:
    assert service_imports() == {}


def test_the_known_exceptions_are_still_there() -> None:
    # An exception no longer needed goes from KNOWN, so that it cannot come back unseen.
    found = reaching(graph("hexmq"), "services")
    assert {name: found.get(name, set()) & allowed for name, allowed in KNOWN.items()} == KNOWN


# ----- each rule fails when someone adds a violating import --------------------------------


def test_a_circle_is_found(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "services/partition/__init__.py": "",
            "services/partition/a.py": "from services.partition import b\n",
            "services/partition/b.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from services.partition.a import A\n"
            ),
        },
    )
    assert import_circles("services.partition", root) == [
        ["services.partition.a", "services.partition.b", "services.partition.a"]
    ]


def test_a_service_importing_another_is_found(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "services/edge/__init__.py": "",
            "services/edge/a.py": "from hexmq import topics\nfrom services.edge import b\n",
            "services/edge/b.py": "def f():\n    from services import membership\n",
        },
    )
    assert foreign_services("services.edge", root) == {"services.edge.b": {"services.membership"}}


def test_an_mqtt_import_in_the_partition_is_found(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "services/partition/__init__.py": "",
            "services/partition/a.py": "from hexmq.mqtt.reason_codes import ReasonCode\n",
            "services/partition/b.py": "from hexmq import mqtt_free, topics\n",
        },
    )
    assert mqtt_imports("services.partition", root) == {
        "services.partition.a": {"hexmq.mqtt.reason_codes", "hexmq.mqtt.reason_codes.ReasonCode"}
    }


def test_a_service_import_in_the_shared_package_is_found(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "hexmq/__init__.py": "",
            "hexmq/cli.py": "from services.edge import passwd\nimport services.partition.main\n",
            "hexmq/view.py": "from services.membership.changes import has_left\n",
        },
    )
    assert service_imports(root) == {
        "hexmq.cli": {"services.partition.main"},
        "hexmq.view": {"services.membership.changes", "services.membership.changes.has_left"},
    }
