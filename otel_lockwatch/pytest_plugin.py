"""The pytest plugin: keep deadlock precursors out of main, as ThreadSanitizer does for C++.

A test suite exercises the code paths that take locks; one run of it shows every lock order
those paths use, whatever the schedule. ``pytest --lockwatch`` instruments the locks for the
session and, at the end, prints every potential deadlock (a cycle in the lock-order graph) with
its witnesses, and the test that first showed each lock order::

    pytest --lockwatch                    # report the lock-order cycles, pass or fail as usual
    pytest --lockwatch-fail-on-cycle      # ... and fail the session when there is one

or in the configuration, ``lockwatch = true`` / ``lockwatch_fail_on_cycle = true`` under
``[pytest]`` (``[tool.pytest.ini_options]`` in ``pyproject.toml``).

An inversion split across two tests is found: ``test_export`` takes ``A`` then ``B``,
``test_import`` takes ``B`` then ``A``; neither test deadlocks alone, and the summary names both.

How it works: the plugin calls ``LockwatchInstrumentor().instrument(manifest=False)`` at
``pytest_configure`` (so locks created while test modules are imported are watched) and
``uninstrument()`` at ``pytest_unconfigure``. After each test phase (setup, call, teardown) it
reads the edges the lock-order graph gained and notes the test that contributed each one. The
cycles it reports are computed at the end from all the edges seen (``_cycles.find_cycles``), so
a test that resets the recorder does not hide an inversion that spans it. The on-cycle policy
(``OTEL_PYTHON_LOCKWATCH_ON_CYCLE``) applies during the run as usual: ``warn`` logs each cycle
in the test that closes it, ``raise`` fails that test.

Under pytest-xdist (``pytest --lockwatch-fail-on-cycle -n 4``) each worker instruments itself
and runs its share of the tests; when it finishes, it hands its edges, each with its first witness
and the test behind it, to the controller as plain data (``config.workeroutput``, which xdist
sends back through execnet). The controller runs no test and instruments nothing: it takes the
union of the workers' edges, keyed by lock class (a class is a name or a creation site, the same
in every worker), keeps each edge's earliest witness, computes the cycles over the union, and
reports and fails exactly as a run without xdist would. So an inversion split across two workers
is found. A worker that dies mid-session sends nothing: the summary says which one.

Caveats: an edge made by a background thread is credited to the test phase during which it was
noticed. The on-cycle policy during the run sees one process's edges: under xdist, ``raise``
fails a test only for a cycle inside its worker (the summary finds the others). If the process is
already instrumented (``opentelemetry-instrument pytest ...``), the plugin reports on that
instrumentation and leaves it in place.

This module is imported by every pytest run of anyone who installs otel-lockwatch (it is a
``pytest11`` entry point): at import and without ``--lockwatch`` it registers its options and
does nothing else; the instrumentation is imported only when asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from collections.abc import Generator

    from .record._witness import Cycle, EdgeWitness

__all__ = ["LockwatchSession"]

_PLUGIN_NAME = "lockwatch-session"
_BEFORE_TESTS = "(before the tests)"
_SESSION_TEARDOWN = "(session teardown)"
_WORKEROUTPUT_KEY = "lockwatch"  # in an xdist worker's config.workeroutput


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("lockwatch", "otel-lockwatch lock-order checking")
    group.addoption(
        "--lockwatch",
        action="store_true",
        default=False,
        help="instrument the locks for the session and report lock-order cycles "
        "(potential deadlocks) at the end.",
    )
    group.addoption(
        "--lockwatch-fail-on-cycle",
        action="store_true",
        default=False,
        help="like --lockwatch, and fail the session when a lock-order cycle was seen.",
    )
    parser.addini("lockwatch", "enable --lockwatch.", type="bool", default=False)
    parser.addini(
        "lockwatch_fail_on_cycle", "enable --lockwatch-fail-on-cycle.", type="bool", default=False
    )


def pytest_configure(config: pytest.Config) -> None:
    fail = bool(
        config.getoption("lockwatch_fail_on_cycle") or config.getini("lockwatch_fail_on_cycle")
    )
    if not (fail or config.getoption("lockwatch") or config.getini("lockwatch")):
        return
    session: LockwatchSession
    if hasattr(config, "workerinput"):
        session = XdistWorkerSession(config.workeroutput)  # type: ignore[attr-defined]
    elif _is_xdist_controller(config):
        session = XdistControllerSession(fail_on_cycle=fail)
    else:
        session = LockwatchSession(fail_on_cycle=fail)
    session.start()
    config.pluginmanager.register(session, _PLUGIN_NAME)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.pluginmanager.get_plugin(_PLUGIN_NAME)
    if session is not None:
        config.pluginmanager.unregister(session, _PLUGIN_NAME)
        session.stop()


def _is_xdist_controller(config: pytest.Config) -> bool:
    """Whether pytest-xdist distributes this session to workers (its own test, made before it
    starts them): then this process runs no test."""
    return (
        config.getoption("dist", "no") != "no"
        and bool(config.getoption("tx", None))
        and not config.getoption("collectonly")
    )


class LockwatchSession:
    """The state of one ``--lockwatch`` session (a pytest plugin object).

    Args:
        fail_on_cycle: set the session's exit status to failure when a cycle was seen.
    """

    def __init__(self, fail_on_cycle: bool = False) -> None:
        self.fail_on_cycle = fail_on_cycle
        # (holding, acquiring) -> (first witness, who contributed it: a test's node id)
        self.edges: dict[tuple[str, str], tuple[EdgeWitness, str]] = {}
        self._instrumentor: Any = None
        self._graph: Any = None
        self._seen = 0  # edges of self._graph already read (the graph only appends)
        self._cycles: list[Cycle] | None = None

    # -- instrumentation -------------------------------------------------------------------
    def start(self) -> None:
        """Instrument the process, unless something already did (then only observe)."""
        from ._instrumentor import LockwatchInstrumentor

        instrumentor = LockwatchInstrumentor()
        if not instrumentor.is_instrumented_by_opentelemetry:
            instrumentor.instrument(manifest=False)
            self._instrumentor = instrumentor
        self.harvest(_BEFORE_TESTS)

    def stop(self) -> None:
        """Undo :meth:`start`'s instrumentation (not someone else's)."""
        if self._instrumentor is not None:
            self._instrumentor.uninstrument()
            self._instrumentor = None

    # -- bookkeeping -----------------------------------------------------------------------
    def harvest(self, who: str) -> None:
        """Note the edges the lock-order graph gained since the last call, crediting ``who``."""
        from ._session import RECORDER

        graph = RECORDER.graph
        if graph is not self._graph:  # first call, or the recorder was reset
            self._graph, self._seen = graph, 0
        elif len(graph) == self._seen:
            return
        witnesses = graph.edges()
        for w in witnesses[self._seen :]:
            self.edges.setdefault((w.holding, w.acquiring), (w, who))
        self._seen = len(witnesses)
        self._cycles = None

    def cycles(self) -> list[Cycle]:
        """The cycles of every edge seen in the session, canonical (``_cycles.find_cycles``)."""
        if self._cycles is None:
            from .record._cycles import find_cycles

            self._cycles = find_cycles([w for w, _ in self.edges.values()])
        return self._cycles

    def contributors(self, cycle: Cycle) -> list[str]:
        """The tests that first showed the edges of ``cycle``, in edge order, without repeats."""
        out: list[str] = []
        for e in cycle.edges:
            who = self.edges[(e.holding, e.acquiring)][1]
            if who not in out:
                out.append(who)
        return out

    # -- hooks -----------------------------------------------------------------------------
    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        try:
            return (yield)
        finally:
            self.harvest(item.nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        try:
            return (yield)
        finally:
            self.harvest(item.nodeid)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item) -> Generator[None, None, None]:
        try:
            return (yield)
        finally:
            self.harvest(item.nodeid)

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.harvest(_SESSION_TEARDOWN)
        if self.fail_on_cycle and self.cycles() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from .record._witness import printable  # names and test ids reach a terminal: escaped

        self.harvest(_SESSION_TEARDOWN)
        tr = terminalreporter
        cycles = self.cycles()
        tr.section("lockwatch: lock-order witnesses")
        n, s = len(cycles), "s" if len(cycles) != 1 else ""
        tr.write_line(
            f"{len(self.edges)} lock-order edge{'s' if len(self.edges) != 1 else ''}, "
            f"{n} potential deadlock{s} (lock-order cycle{s})"
        )
        for cycle in cycles:
            tr.write_line("")
            header, *lines = cycle.format().splitlines()
            tr.write_line(header, red=True, bold=True)
            for line in lines:
                tr.write_line(line, red=True)
            tr.write_line("  first seen in:")
            for e in cycle.edges:
                who = self.edges[(e.holding, e.acquiring)][1]
                tr.write_line(
                    f"    {printable(e.holding)} -> {printable(e.acquiring)}: {printable(who)}"
                )
        if self.edges:
            tr.write_line("")
            tr.write_line("edges (each lock order, and the test that first showed it):")
            for (holding, acquiring), (_, who) in self.edges.items():
                tr.write_line(f"  {printable(holding)} -> {printable(acquiring)}: {printable(who)}")
        if cycles and self.fail_on_cycle:
            tr.write_line("")
            for cycle in cycles:
                tr.write_line(
                    f"lockwatch: FAILED (--lockwatch-fail-on-cycle): lock-order cycle "
                    f"{' -> '.join(printable(n) for n in cycle.locks + cycle.locks[:1])} from "
                    f"{', '.join(printable(who) for who in self.contributors(cycle))}",
                    red=True,
                )


class XdistWorkerSession(LockwatchSession):
    """The session in a pytest-xdist worker: it watches its tests as usual and, instead of
    reporting, hands its edges to the controller.

    Args:
        workeroutput: the worker's ``config.workeroutput``, which xdist sends to the controller
            when the worker finishes (through execnet: plain data only).
    """

    def __init__(self, workeroutput: dict[str, Any]) -> None:
        super().__init__()
        self._workeroutput = workeroutput

    @pytest.hookimpl(trylast=True)  # after pytest's own teardown of what the session set up
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        self.harvest(_SESSION_TEARDOWN)
        self._workeroutput[_WORKEROUTPUT_KEY] = {
            "edges": [{"witness": w.to_json(), "test": who} for w, who in self.edges.values()]
        }

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        """Nothing: the controller reports, and sets the exit status."""


class XdistControllerSession(LockwatchSession):
    """The session in pytest-xdist's controller: it runs no test and watches no lock. Each worker
    sends its edges when it goes down (``pytest_testnodedown``); the report is their union's.

    An edge seen by several workers keeps its earliest witness; the edges are listed in the order
    a run without xdist lists them: by the contributing test's place in the collection, then by
    time. A worker that went down without sending its edges is named in the summary.

    Args:
        fail_on_cycle: set the session's exit status to failure when a cycle was seen.
    """

    def __init__(self, fail_on_cycle: bool = False) -> None:
        super().__init__(fail_on_cycle)
        self.missing: list[str] = []  # "gw1 went down ..." lines for the summary
        self._place: dict[str, int] = {}  # test node id -> its index in the collection

    def start(self) -> None:
        """Nothing: the workers instrument themselves."""

    def harvest(self, who: str) -> None:
        """Nothing: the controller's own locks are not watched."""

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node: Any, ids: list[str]) -> None:
        if not self._place:  # every worker collects the same tests (xdist aborts otherwise)
            self._place = {nodeid: n for n, nodeid in enumerate(ids)}

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        from .record._witness import EdgeWitness

        worker = str(node.gateway.id)
        data = getattr(node, "workeroutput", {}).get(_WORKEROUTPUT_KEY)
        if data is None:
            self.missing.append(f"{worker} went down before sending its lock-order edges")
            return
        try:
            received = [(EdgeWitness.from_json(e["witness"]), e["test"]) for e in data["edges"]]
            if not all(isinstance(who, str) for _, who in received):
                raise ValueError("a test id is not a string")
        except (KeyError, TypeError, ValueError) as exc:
            self.missing.append(f"{worker} sent unreadable lock-order edges ({exc})")
            return
        self.merge(received)

    def merge(self, received: list[tuple[EdgeWitness, str]]) -> None:
        """Add one worker's edges, each with the test that contributed it, to the union."""
        place = self._place

        def rank(who: str) -> int:
            return place.get(who, -1 if who == _BEFORE_TESTS else len(place))

        for w, who in received:
            key = (w.holding, w.acquiring)
            kept = self.edges.get(key)
            if kept is None or (w.at, rank(who)) < (kept[0].at, rank(kept[1])):
                self.edges[key] = (w, who)
        self.edges = dict(
            sorted(self.edges.items(), key=lambda item: (rank(item[1][1]), item[1][0].at))
        )
        self._cycles = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        super().pytest_sessionfinish(session, exitstatus)
        # A check that could not see every worker's edges does not pass (a crashed worker has
        # already failed the session; this is for output the controller could not read).
        if self.fail_on_cycle and self.missing and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from .record._witness import printable

        super().pytest_terminal_summary(terminalreporter)
        if self.missing:
            terminalreporter.write_line("")
        for line in self.missing:
            terminalreporter.write_line(
                f"lockwatch: worker {printable(line)}: the lock orders its tests took are not "
                "in this report",
                yellow=True,
            )
