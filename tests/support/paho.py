"""Runs the vendored Paho interoperability suite (tests/third_party/paho_testing) against one
MQTT address, as the suite's own `__main__` would with `-h HOST -p PORT`, and prints one JSON
object with the results on stdout (the suite's own output goes to stderr):

    python -m tests.support.paho --suite v5 --host 127.0.0.1 --port 1883 [TEST ...]

The suite's files are used unedited. Its modules read the broker's address (and, for 3.1.1,
the topics) from module globals that their `__main__` sets from the command line; this runner
sets the same globals to the same values and runs the module's `Test` case with unittest, in
unittest's own order. `client_test.py`'s `__main__` cannot take `-p` (unittest.main() refuses
the argument it leaves in sys.argv), hence a runner. Paho's `mqtt/__init__.py` is not vendored
(it imports Paho's own broker), so `mqtt` is a namespace package of the two parts the clients
need, `mqtt.clients` and `mqtt.formats`.

Run it in a process of its own: the suite keeps its clients in module globals and its
receivers in threads that outlive a test.

What the suite expects of the broker (`paho_edge_options`): subscriptions to `test/nosubscribe`
refused with 0x80 (test_subscribe_failure); for the 5.0 suite, Server Keep Alive 60 for a client
asking 120 (test_server_keep_alive: `--max-keepalive=60`, which refuses the 3.1.1 suite's Keep
Alive 0, as mosquitto's max_keepalive does).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
import traceback
import unittest
from pathlib import Path
from typing import Any

SUITE_DIR = (
    Path(__file__).resolve().parents[1] / "third_party" / "paho_testing" / "interoperability"
)
MODULES = {"v5": "client_test5", "v311": "client_test"}
_TOPICS = ("TopicA", "TopicA/B", "Topic/C", "TopicA/C", "/TopicA")
_WILDTOPICS = ("TopicA/+", "+/C", "#", "/#", "/+", "+/+", "TopicA/#")
_V5_PREFIX = "client_test5/"
# The globals each module's __main__ sets (client_test5.py's setUpClass then sets topics,
# wildtopics and nosubscribe_topics again, unprefixed: setData).
GLOBALS: dict[str, dict[str, object]] = {
    "v5": {
        "topic_prefix": _V5_PREFIX,
        "topics": [_V5_PREFIX + t for t in _TOPICS],
        "wildtopics": [_V5_PREFIX + t for t in _WILDTOPICS],
        "nosubscribe_topics": ("test/nosubscribe",),
    },
    "v311": {
        "topics": _TOPICS,
        "wildtopics": _WILDTOPICS,
        "nosubscribe_topics": ("test/nosubscribe",),
    },
}
# Test counts of the two suites at the vendored commit (27 + 10 = the 37 of issue 29).
TEST_COUNTS = {"v5": 27, "v311": 10}
# Tests that publish right after another client's SUBSCRIBE, before its SUBACK: after
# `bclient.subscribe(...)` they wait for `callback.subscribeds` (aclient's, already there)
# instead of `callback2.subscribeds` (client_test5.py lines 554 and 682), and aclient publishes
# at once. One broker reads the two sockets in the order the bytes came; across nodes no node
# can know that order, and hexmq promises a subscription to PUBLISHes read from its SUBACK on
# (docs/conformance.md, "Ordering: one node and across nodes"). Through a balancer that puts
# the two clients on different nodes they fail whenever the PUBLISH's node routes it before
# the SUBSCRIBE's partition has announced the filter (issue 29 item 7).
RACE_BEFORE_SUBACK: dict[str, frozenset[str]] = {
    "v5": frozenset({"test_request_response", "test_subscribe_options"}),
    "v311": frozenset(),
}
# Anonymous clients may do anything but subscribe to the suite's forbidden topic; `#` does
# not cover topics starting with `$`, and test_dollar_topics publishes to `$TopicA/B` (the
# test expects it accepted, and not delivered to a `+/+` subscription).
ACL = """\
topic deny test/nosubscribe
topic readwrite #
topic readwrite $TopicA/#
"""


def paho_edge_options(acl_file: Path) -> list[str]:
    """`hexmq edge` options that configure an edge as the suite expects (acl_file is written
    here); the 5.0 suite's edge also takes `--max-keepalive=60` (the 3.1.1 one must not)."""
    acl_file.write_text(ACL)
    return [f"--acl-file={acl_file}", "--acl-deny-reason-code=0x80"]


def paho_edge_args(acl_file: Path) -> list[str]:
    """The same as `hexmq cluster up` arguments, for every edge of the cluster."""
    return [f"--edge-arg={option}" for option in paho_edge_options(acl_file)]


class _Result(unittest.TextTestResult):
    """unittest's result, keeping each test's outcome and time for the JSON summary."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.outcomes: dict[str, dict[str, object]] = {}
        self._started = 0.0

    def startTest(self, test: unittest.TestCase) -> None:
        self._started = time.monotonic()
        super().startTest(test)

    def _record(self, test: unittest.TestCase, outcome: str, err: Any) -> None:
        self.outcomes[test.id().rsplit(".", 1)[-1]] = {
            "outcome": outcome,
            "seconds": round(time.monotonic() - self._started, 2),
            "error": "".join(traceback.format_exception(*err)) if err else "",
        }

    def addSuccess(self, test: unittest.TestCase) -> None:
        super().addSuccess(test)
        self._record(test, "passed", None)

    def addFailure(self, test: unittest.TestCase, err: Any) -> None:
        super().addFailure(test, err)
        self._record(test, "failed", err)

    def addError(self, test: unittest.TestCase, err: Any) -> None:
        super().addError(test, err)
        self._record(test, "error", err)


def run(suite_name: str, host: str, port: int, names: list[str]) -> dict[str, object]:
    sys.path.insert(0, str(SUITE_DIR))
    module = importlib.import_module(MODULES[suite_name])
    module.host, module.port = host, port
    for name, value in GLOBALS[suite_name].items():
        setattr(module, name, value)
    loader = unittest.TestLoader()
    if names:
        suite = loader.loadTestsFromNames([f"Test.{n}" for n in names], module)
    else:
        suite = loader.loadTestsFromTestCase(module.Test)
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=2, resultclass=_Result)
    started = time.monotonic()
    result = runner.run(suite)
    assert isinstance(result, _Result)
    passed = sum(1 for o in result.outcomes.values() if o["outcome"] == "passed")
    return {
        "suite": suite_name,
        "ran": result.testsRun,
        "passed": passed,
        "seconds": round(time.monotonic() - started, 1),
        "tests": result.outcomes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", choices=sorted(MODULES), required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("tests", nargs="*", help="test method names (default: all)")
    args = parser.parse_args(argv)
    out, sys.stdout = sys.stdout, sys.stderr  # the suite prints as it goes
    summary = run(args.suite, args.host, args.port, args.tests)
    out.write(json.dumps(summary) + "\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
