"""One local SparkSession for every Spark test: starting one costs 5-15 s here, so every Spark
test shares it (the Spark testing guide's session-scoped fixture), as long as it works.

A test can leave it broken for the next: one that times out inside a Spark call (pytest-timeout
raises in the middle of py4j's wait for an answer) leaves the answer unread on the connection,
and every later call reads the answer of the call before it ("SparkSession does not exist in
the JVM", `KeyError: 'm'`); one may stop the SparkContext or lose the JVM. So `spark` hands each
test a session it checked, and starts a new JVM and session (5-15 s again) when the shared one
is stopped or gone, or when the Spark test before failed.

A timeout does not end a test stuck in a Spark call by itself either: on the way out, pyspark
makes another call on the same connection (SCCallSiteSync's setCallSite), which waits until the
JVM has answered the stuck one, so a job that never ends would hold the test, and the run,
forever. A watchdog kills the JVM a grace period after the test's timeout, which ends both.

A JVM start is timed like a cluster start and kept off the timeout of the test waiting for it;
the Spark tests' timeouts follow the pace (tests/support/start_bounds.py).
"""

from __future__ import annotations

import contextlib
import gc
import signal
import threading
import time
import warnings
from collections.abc import Generator, Iterator

import pytest
from pyspark import SparkContext
from pyspark.sql import SparkSession, SQLContext

from spark.hexmq_traces.job import build_session
from tests.support import start_bounds

JVM_START_BOUND_S = 900  # 5-15 s quiet; 35-290 s seen at load 15-20
WATCHDOG_GRACE_S = 10  # after the test's timeout, for the call to unwind by itself


class SharedSession:
    """The SparkSession the Spark tests of this process share, replaced when it breaks."""

    def __init__(self) -> None:
        self.session: SparkSession | None = None
        self.suspect = False  # the last Spark test failed: the JVM may be mid-call for it

    def usable(self) -> SparkSession:
        if self.session is None or self.suspect or not _alive(self.session):
            self.restart()
        assert self.session is not None
        return self.session

    def restart(self) -> None:
        if self.session is not None:
            _discard_jvm()
        # Not on the time of the test that happens to need it (the start after a failure
        # took 287 s at load 15), but within a bound of its own; timed, so the Spark tests'
        # timeouts follow the machine's pace (tests/support/start_bounds.py).
        with start_bounds.outside_test_timeout(JVM_START_BOUND_S):
            started = time.monotonic()
            # The job's own settings (loopback, no UI, UTC), with fewer shuffle partitions:
            # test frames have a handful of rows, and every partition is a task.
            self.session = build_session(master="local[2]", shuffle_partitions=2)
            self.session.sparkContext.setLogLevel("ERROR")
            start_bounds.record_start(time.monotonic() - started, start_bounds.QUIET_JVM_START_S)
        self.suspect = False

    def kill_jvm(self) -> None:
        """Kill the JVM under a test stuck past its timeout (called from the watchdog thread):
        its stuck call fails, the test ends as failed, the next test gets a new JVM."""
        jvm = getattr(SparkContext._gateway, "proc", None)
        if jvm is not None:
            jvm.kill()

    def close(self) -> None:
        if self.session is not None and _alive(self.session):
            self.session.stop()
        self.session = None


def _alive(session: SparkSession) -> bool:
    """The session's SparkContext runs in a JVM that answers (a call on the py4j connection
    this thread uses; a dead JVM answers with a connection error at once)."""
    try:
        jsc = session.sparkContext._jsc
        return jsc is not None and not jsc.sc().isStopped()
    except Exception:
        return False


def _discard_jvm() -> None:
    """Kill the JVM pyspark started for this process (a timed-out job may still run in it) and
    drop pyspark's handles on it, so that the next session starts a JVM of its own."""
    gateway = SparkContext._gateway
    jvm = getattr(gateway, "proc", None)  # spark-submit, which execs the JVM
    if jvm is not None:
        jvm.kill()
        jvm.wait(30)
        if jvm.stdin is not None:
            jvm.stdin.close()
    with warnings.catch_warnings():
        # SparkContext.stop() warns that the JVM it cannot reach may have crashed: we know.
        warnings.simplefilter("ignore")
        context = SparkContext._active_spark_context
        if context is not None:
            with contextlib.suppress(Exception):
                context.stop()  # closes its accumulator server on this side
        if gateway is not None:
            with contextlib.suppress(Exception):
                gateway.shutdown()  # py4j's connections and threads on this side
        SparkContext._gateway = None
        SparkContext._jvm = None
        SparkContext._active_spark_context = None
        SparkSession._instantiatedSession = None
        SparkSession._activeSession = None
        SQLContext._instantiatedContext = None
        # py4j's sockets to the dead JVM, some never closed on this side: collected here,
        # where their ResourceWarning is expected, not in whichever test runs next (make
        # test once failed a Spark test's setup on one).
        gc.collect()


_SHARED = pytest.StashKey[SharedSession]()


@pytest.fixture(scope="session")
def spark_shared(pytestconfig: pytest.Config) -> Iterator[SharedSession]:
    shared = SharedSession()
    pytestconfig.stash[_SHARED] = shared
    yield shared
    del pytestconfig.stash[_SHARED]
    shared.close()
    _collect_py4j_sockets()


@pytest.fixture
def spark(spark_shared: SharedSession, request: pytest.FixtureRequest) -> Iterator[SparkSession]:
    """The shared session, checked for this test (and replaced if it no longer works)."""
    with warnings.catch_warnings():
        # Starting a session imports much of pyspark, and the collections on the way find
        # sockets that are not this test's: py4j's to a JVM an earlier test's session ran in,
        # or any earlier test's. make test failed this setup twice on one ("unclosed socket",
        # at the import of pyspark_connect), attributed to whichever Spark test came first.
        warnings.simplefilter("ignore", ResourceWarning)
        session = spark_shared.usable()
        gc.collect()
    with watched(spark_shared, request):
        yield session


@contextlib.contextmanager
def watched(shared: SharedSession, request: pytest.FixtureRequest) -> Iterator[None]:
    """Spark calls made inside end with the test's timeout: a watchdog kills the JVM a grace
    period after it (see the module's docstring)."""
    # The test's time left: pytest-timeout's alarm (else the timeout it will set, func_only).
    left = signal.getitimer(signal.ITIMER_REAL)[0] or start_bounds.configured_timeout(request.node)
    if not left:
        yield
        return
    watchdog = threading.Timer(left + WATCHDOG_GRACE_S, shared.kill_jvm)
    watchdog.daemon = True
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
        _collect_py4j_sockets()


def _collect_py4j_sockets() -> None:
    """Collect, here, the sockets py4j leaves to the collector (its connections to a JVM that
    was stopped or killed; a ResourceWarning each): otherwise whichever test comes next on
    this worker fails at its setup when the collector finds one (make test: a Consul KV test
    after the Spark tests, "unclosed <socket.socket [closed] fd=13>")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    shared = item.config.stash.get(_SHARED, None)
    if report.failed and shared is not None and "spark" in getattr(item, "fixturenames", ()):
        # A failure may have interrupted a py4j call (a timeout does): the next test gets a
        # new JVM rather than a connection that may still owe this one an answer.
        shared.suspect = True
    return report
