"""The borders of our packages, as docs/architecture.md ("Packages and their borders") states
them, read from the source (tests/support/imports.py: every import counts, type-only and
function-level ones too):

- no import circle within a service, nor within the shared package hexmq/;
- a service imports no other service: the edge, the partition service and the membership agent
  each import only hexmq/ and themselves (what one needs of another lives in hexmq/, as
  hexmq.membership holds the agent's client and the view's readings);
- the partition service speaks no MQTT: it imports no module of the codec (hexmq.mqtt); the
  edge turns its outcomes into reason codes (services/edge/outcomes.py);
- the shared package imports no service and nothing of the `hexmq` command's package
  (hexmq_cli/, which may import everything); no service imports the command's package either.
  (`python -m hexmq.cli` still runs the command, by module name only: hexmq/cli.py imports
  nothing of hexmq_cli; tests/unit/test_localcluster.py checks that importing it loads none.)

Each rule is also run on a small tree with one violating import, so that a rule that could
never fail would show.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.imports import circles, graph, reaching, within, write_tree

SERVICES = ("services.edge", "services.partition", "services.membership")
# The `hexmq` command and the local-cluster tooling: above the services and the shared package.
COMMAND = "hexmq_cli"


def import_circles(package: str, root: Path | None = None) -> list[list[str]]:
    return circles(within(graph(package) if root is None else graph(package, root)))


def foreign_services(service: str, root: Path | None = None) -> dict[str, set[str]]:
    """The modules of `service` that import another service, and what of it."""
    edges = graph(service) if root is None else graph(service, root)
    return reaching(edges, *(s for s in SERVICES if s != service))


def mqtt_imports(package: str, root: Path | None = None) -> dict[str, set[str]]:
    edges = graph(package) if root is None else graph(package, root)
    return reaching(edges, "hexmq.mqtt")


def upward_imports(root: Path | None = None) -> dict[str, set[str]]:
    """The modules of hexmq/ that import a service or the command's package, and what of it."""
    edges = graph("hexmq") if root is None else graph("hexmq", root)
    return reaching(edges, "services", COMMAND)


def command_imports(service: str, root: Path | None = None) -> dict[str, set[str]]:
    """The modules of `service` that import the command's package, and what of it."""
    edges = graph(service) if root is None else graph(service, root)
    return reaching(edges, COMMAND)


@pytest.mark.parametrize("package", [*SERVICES, "hexmq", COMMAND])
def test_no_import_circle(package: str) -> None:
    assert len(graph(package)) > 1
    assert import_circles(package) == []


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_no_other_service(service: str) -> None:
    assert foreign_services(service) == {}


def test_the_partition_imports_no_mqtt_module() -> None:
    assert mqtt_imports("services.partition") == {}


def test_the_shared_package_imports_no_service_nor_the_command() -> None:
    assert upward_imports() == {}


@pytest.mark.parametrize("service", SERVICES)
def test_a_service_imports_nothing_of_the_command(service: str) -> None:
    assert command_imports(service) == {}


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


def test_a_service_or_command_import_in_the_shared_package_is_found(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "hexmq/__init__.py": "",
            "hexmq/cli.py": "import runpy\ndef main():\n    from hexmq_cli.cli import main\n",
            "hexmq/view.py": "from services.membership.changes import has_left\n",
            "hexmq/topics.py": "from hexmq import mqtt\nfrom hexmq.mqtt import errors\n",
        },
    )
    assert upward_imports(root) == {
        "hexmq.cli": {"hexmq_cli.cli", "hexmq_cli.cli.main"},
        "hexmq.view": {"services.membership.changes", "services.membership.changes.has_left"},
    }


def test_a_command_import_in_a_service_is_found(tmp_path: Path) -> None:
    root = write_tree(
        tmp_path,
        {
            "services/membership/__init__.py": "",
            "services/membership/main.py": "from hexmq import envoptions\nimport hexmq_cli\n",
            "services/membership/agent.py": "from hexmq.membership import client\n",
        },
    )
    assert command_imports("services.membership", root) == {
        "services.membership.main": {"hexmq_cli"}
    }
