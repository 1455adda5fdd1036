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

Caveats: an edge made by a background thread is credited to the test phase during which it was
noticed. Under pytest-xdist each worker process sees only its own tests, so an inversion split
across workers is not found (merge the workers' manifests instead). If the process is already
instrumented (``opentelemetry-instrument pytest ...``), the plugin reports on that
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
    session = LockwatchSession(fail_on_cycle=fail)
    session.start()
    config.pluginmanager.register(session, _PLUGIN_NAME)


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.pluginmanager.get_plugin(_PLUGIN_NAME)
    if session is not None:
        config.pluginmanager.unregister(session, _PLUGIN_NAME)
        session.stop()


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
        self.harvest("(before the tests)")

    def stop(self) -> None:
        """Undo :meth:`start`'s instrumentation (not someone else's)."""
        if self._instrumentor is not None:
            self._instrumentor.uninstrument()
            self._instrumentor = None

    # -- bookkeeping -----------------------------------------------------------------------
    def harvest(self, who: str) -> None:
        """Note the edges the lock-order graph gained since the last call, crediting ``who``."""
        from .record._recorder import RECORDER

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
        self.harvest("(session teardown)")
        if self.fail_on_cycle and self.cycles() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        from .record._witness import printable  # names and test ids reach a terminal: escaped

        self.harvest("(session teardown)")
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
