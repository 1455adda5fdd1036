"""The pytest plugin, end to end: real pytest sessions in subprocesses (pytester).

The plugin is a ``pytest11`` entry point once installed; until then (or with plugin autoload
disabled) it is loaded with ``-p``. Passing ``-p`` for a plugin already loaded from its entry
point is an error, so the arguments depend on which case holds.
"""

from __future__ import annotations

import os
import re
from importlib.metadata import entry_points

import pytest

pytest_plugins = ["pytester"]

PLUGIN = "otel_lockwatch.pytest_plugin"

INVERTED = """
import functools
import threading

from otel_lockwatch import name_lock


@functools.cache
def locks():
    return name_lock(threading.Lock(), "A"), name_lock(threading.Lock(), "B")


def test_export():
    a, b = locks()
    with a:
        with b:
            pass


def test_import():
    a, b = locks()
    with b:
        with a:
            pass
"""

CONSISTENT = INVERTED.replace("with b:\n        with a:", "with a:\n        with b:")

PROBE = """
import _thread
import sys
import threading


def test_probe():
    print("LOCK TYPE", type(threading.Lock()).__name__)
    print("INSTRUMENTOR IMPORTED", "otel_lockwatch._instrumentor" in sys.modules)
"""


def line_in(source: str, text: str, nth: int) -> int:
    """The line number, in the file pytester writes (stripped), of the nth line equal to text."""
    found = [n for n, line in enumerate(source.strip().splitlines(), 1) if line == text]
    return found[nth - 1]


def plugin_args() -> list[str]:
    """``-p otel_lockwatch.pytest_plugin`` unless pytest will load it from its entry point."""
    registered = any(ep.value == PLUGIN for ep in entry_points(group="pytest11"))
    if registered and not os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD"):
        return []
    return ["-p", PLUGIN]


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*plugin_args(), "-p", "no:cacheprovider", *args)


def test_inversion_across_two_tests_fails_the_session(pytester):
    """A -> B in one test, B -> A in another: --lockwatch-fail-on-cycle fails the session although
    both tests pass, prints the cycle's witnesses and names both tests."""
    pytester.makepyfile(test_inverted=INVERTED)
    result = run(pytester, "--lockwatch-fail-on-cycle")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    a, b = line_in(INVERTED, "    with a:", 1), line_in(INVERTED, "    with b:", 1)
    result.stdout.fnmatch_lines(
        [
            "*lockwatch: lock-order witnesses*",
            "2 lock-order edges, 1 potential deadlock (lock-order cycle)",
            "possible circular locking dependency: A -> B -> A",
            f"  A -> B: worker 'MainThread' held A (acquired at test_inverted:test_export:{a}) and "
            f"acquired B (at test_inverted:test_export:{a + 1}), *",
            f"  B -> A: worker 'MainThread' held B (acquired at test_inverted:test_import:{b}) and "
            f"acquired A (at test_inverted:test_import:{b + 1}), *",
            "  first seen in:",
            "    A -> B: test_inverted.py::test_export",
            "    B -> A: test_inverted.py::test_import",
            "*",
            "edges (each lock order, and the test that first showed it):",
            "  A -> B: test_inverted.py::test_export",
            "  B -> A: test_inverted.py::test_import",
            "*",
            "lockwatch: FAILED (--lockwatch-fail-on-cycle): lock-order cycle A -> B -> A from "
            "test_inverted.py::test_export, test_inverted.py::test_import",
        ]
    )


def test_report_only_does_not_fail(pytester):
    """--lockwatch alone reports the cycle and keeps the tests' verdict."""
    pytester.makepyfile(test_inverted=INVERTED)
    result = run(pytester, "--lockwatch")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["possible circular locking dependency: A -> B -> A"])
    result.stdout.no_fnmatch_line("*FAILED (--lockwatch-fail-on-cycle)*")


def test_consistent_suite_passes(pytester):
    """Both tests take A before B: one edge, no cycle, the session passes."""
    pytester.makepyfile(test_consistent=CONSISTENT)
    result = run(pytester, "--lockwatch-fail-on-cycle")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        [
            "1 lock-order edge, 0 potential deadlocks (lock-order cycles)",
            "  A -> B: test_consistent.py::test_export",
        ]
    )
    result.stdout.no_fnmatch_line("*possible circular*")


def test_failing_tests_keep_their_status(pytester):
    """A session that already failed stays failed (exit status 1), with the report."""
    pytester.makepyfile(test_inverted=INVERTED + "\n\ndef test_broken():\n    assert False\n")
    result = run(pytester, "--lockwatch-fail-on-cycle")
    result.assert_outcomes(passed=2, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["possible circular locking dependency: A -> B -> A"])


def test_without_the_flag_nothing_is_instrumented(pytester):
    """No flag: threading.Lock is the plain lock, the instrumentor is not even imported, and no
    report is printed. With the flag, the same probe sees the watched lock."""
    pytester.makepyfile(test_probe=PROBE)
    result = run(pytester, "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*LOCK TYPE lock", "INSTRUMENTOR IMPORTED False"])
    # The plugin's name in pytest's "plugins:" header is all that may mention it.
    mentions = [line for line in result.stdout.lines if "lockwatch" in line]
    assert [line for line in mentions if not line.startswith("plugins:")] == []

    result = run(pytester, "-s", "--lockwatch")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*LOCK TYPE LockProxy", "*lockwatch: lock-order witnesses*"])


def test_ini_option(pytester):
    """``lockwatch_fail_on_cycle = true`` in the configuration is the flag."""
    pytester.makeini("[pytest]\nlockwatch_fail_on_cycle = true\n")
    pytester.makepyfile(test_inverted=INVERTED)
    result = run(pytester)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        ["*FAILED (--lockwatch-fail-on-cycle): lock-order cycle A -> B -> A *"]
    )


def test_edge_in_a_fixture_is_credited_to_its_test(pytester):
    """An order shown in a fixture's setup is credited to the test that requested it."""
    pytester.makepyfile(
        test_fixture=INVERTED.replace(
            "def test_import():",
            """@pytest.fixture
def inverted():
    a, b = locks()
    with b:
        with a:
            pass


def test_import(inverted):""",
        ).replace("import threading", "import threading\n\nimport pytest")
    )
    result = run(pytester, "--lockwatch-fail-on-cycle")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(["    B -> A: test_fixture.py::test_import"])


def test_module_level_locks_are_watched(pytester):
    """Locks created at module level (the usual global lock) take part in the report."""
    pytester.makepyfile(
        test_module_level="""
import threading

from otel_lockwatch import name_lock

A = name_lock(threading.Lock(), "A")
B = name_lock(threading.Lock(), "B")


def test_export():
    with A, B:
        pass


def test_import():
    with B, A:
        pass
"""
    )
    result = run(pytester, "--lockwatch-fail-on-cycle")
    result.stdout.fnmatch_lines(["possible circular locking dependency: A -> B -> A"])


def test_names_reach_the_terminal_escaped(pytester):
    """A lock name (or a test id) holding control characters is printed escaped in every line of
    the summary: an ESC sequence in a name cannot repaint the reviewer's terminal."""
    source = INVERTED.replace('"A"', '"A\\x1b[2J"')
    pytester.makepyfile(test_inverted=source)
    result = run(pytester, "--lockwatch-fail-on-cycle")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert "\x1b[2J" not in result.stdout.str()
    result.stdout.fnmatch_lines(
        [
            "  A\\x1b[2J -> B: test_inverted.py::test_export",
            "lockwatch: FAILED (--lockwatch-fail-on-cycle): lock-order cycle "
            "A\\x1b[2J -> B -> A\\x1b[2J from *",
        ]
    )


# -- under pytest-xdist: the workers watch, the controller merges and reports ------------------

SHARED_LOCKS = """
import threading

A = threading.Lock()
B = threading.Lock()
"""


def locking_test(name: str, orders: list[tuple[str, str]], record: str) -> str:
    """A test module whose test ``name`` takes the shared locks in each ``(first, second)`` order,
    after writing the xdist worker that runs it to ``record``/``name``.worker.

    The locks are not named: their class is their creation site in ``shared_locks``, the same in
    every worker that imports the module, which is what the controller's union is keyed by."""
    body = "".join(
        f"    with shared_locks.{first}:\n        with shared_locks.{second}:\n            pass\n"
        for first, second in orders
    )
    return f"""
import os
import re
import pathlib

import shared_locks


def {name}():
    worker = os.environ.get("PYTEST_XDIST_WORKER", "no worker")
    (pathlib.Path({record!r}) / "{name}.worker").write_text(worker)
{body}"""


def xdist_args(dist: str) -> list[str]:
    """``-n 2 --dist dist``, loading pytest-xdist explicitly when plugins are not autoloaded."""
    pytest.importorskip("xdist")
    load = ["-p", "xdist.plugin"] if os.environ.get("PYTEST_DISABLE_PLUGIN_AUTOLOAD") else []
    return [*load, "-n", "2", "--dist", dist]


def lockwatch_section(result: pytest.RunResult) -> list[str]:
    """The plugin's summary up to pytest's closing line, its witnesses' times masked, without
    blank lines (pytest opens the section with one after a verbose progress line)."""
    lines = result.stdout.lines
    start = next(n for n, line in enumerate(lines) if "lockwatch: lock-order witnesses" in line)
    end = next(n for n in range(start, len(lines)) if " passed" in lines[n] and " in " in lines[n])
    return [
        re.sub(r", \d{4}-\d\d-\d\dT[\d:.]+Z$", ", <time>", line)
        for line in lines[start:end]
        if line
    ]


def worker_of(pytester: pytest.Pytester, test: str) -> str:
    return (pytester.path / f"{test}.worker").read_text()


@pytest.mark.parametrize("dist", ["load", "loadfile"])
def test_xdist_inversion_across_workers_is_reported_as_without_xdist(pytester, dist):
    """A -> B in test_export on one worker, B -> A in test_import on the other: the controller
    merges the workers' edges (keyed by lock class, the creation site, the same in both workers)
    and prints the same report and exit status as a run without xdist. Before the workers' edges
    reached the controller, the session passed with "0 lock-order edges"."""
    record = str(pytester.path)
    pytester.makepyfile(
        shared_locks=SHARED_LOCKS,
        test_export=locking_test("test_export", [("A", "B")], record),
        test_import=locking_test("test_import", [("B", "A")], record),
    )
    alone = run(pytester, "--lockwatch-fail-on-cycle")
    alone.assert_outcomes(passed=2)
    assert alone.ret == pytest.ExitCode.TESTS_FAILED

    result = run(pytester, *xdist_args(dist), "--lockwatch-fail-on-cycle")
    result.assert_outcomes(passed=2)
    # Two tests (two files) on two workers: xdist sends one to each (round robin for `load`, a
    # file per worker for `loadfile`), so the cycle is split across the workers.
    assert worker_of(pytester, "test_export") != worker_of(pytester, "test_import")
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    assert lockwatch_section(result) == lockwatch_section(alone)
    result.stdout.fnmatch_lines(
        [
            "2 lock-order edges, 1 potential deadlock (lock-order cycle)",
            "possible circular locking dependency: shared_locks:<module>:* -> "
            "shared_locks:<module>:* -> shared_locks:<module>:*",
            "lockwatch: FAILED (--lockwatch-fail-on-cycle): lock-order cycle * from "
            "test_export.py::test_export, test_import.py::test_import",
        ]
    )


@pytest.mark.parametrize("dist", ["load", "loadfile"])
def test_xdist_inversion_inside_one_test_fails_the_session(pytester, dist):
    """One test takes A then B, then B then A, wherever xdist runs it: the session fails."""
    record = str(pytester.path)
    pytester.makepyfile(
        shared_locks=SHARED_LOCKS,
        test_both=locking_test("test_both", [("A", "B"), ("B", "A")], record),
        test_other=locking_test("test_other", [], record),
    )
    result = run(pytester, *xdist_args(dist), "--lockwatch-fail-on-cycle")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "2 lock-order edges, 1 potential deadlock (lock-order cycle)",
            "lockwatch: FAILED (--lockwatch-fail-on-cycle): lock-order cycle * from "
            "test_both.py::test_both",
        ]
    )


@pytest.mark.parametrize("dist", ["load", "loadfile"])
def test_xdist_consistent_suite_passes(pytester, dist):
    """Both workers take A before B: one edge (seen by two workers, listed once), no cycle, exit
    status 0. The controller runs no test and leaves its own locks alone."""
    record = str(pytester.path)
    pytester.makepyfile(
        shared_locks=SHARED_LOCKS,
        test_export=locking_test("test_export", [("A", "B")], record),
        test_import=locking_test("test_import", [("A", "B")], record),
    )
    pytester.makeconftest(
        """
import threading


def pytest_terminal_summary(terminalreporter, config):
    if not hasattr(config, "workerinput"):
        terminalreporter.write_line(f"CONTROLLER LOCK {type(threading.Lock()).__name__}")
"""
    )
    result = run(pytester, *xdist_args(dist), "--lockwatch-fail-on-cycle")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(
        ["1 lock-order edge, 0 potential deadlocks (lock-order cycles)", "CONTROLLER LOCK lock"]
    )
    result.stdout.no_fnmatch_line("*possible circular*")


def test_xdist_crashed_worker_does_not_break_the_report(pytester):
    """A worker that dies mid-session sends no edges: the controller still reports what the
    other workers sent, says which worker's edges are missing, and the session fails (the crash
    is a failed test)."""
    record = str(pytester.path)
    pytester.makepyfile(
        shared_locks=SHARED_LOCKS,
        test_export=locking_test("test_export", [("A", "B")], record),
        test_crash=locking_test("test_crash", [("B", "A")], record) + "    os._exit(3)\n",
    )
    result = run(
        pytester, *xdist_args("loadfile"), "--max-worker-restart", "0", "--lockwatch-fail-on-cycle"
    )
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "1 lock-order edge, 0 potential deadlocks (lock-order cycles)",
            "lockwatch: worker gw? went down before sending its lock-order edges*",
        ]
    )
    result.stdout.no_fnmatch_line("*INTERNALERROR*")


def test_xdist_unreadable_worker_output_does_not_break_the_report(pytester):
    """A worker's output that is not the plugin's shape (another version's, say) is named in the
    summary, not raised into xdist's controller loop (no INTERNALERROR); the other worker's edges
    are reported, and --lockwatch-fail-on-cycle fails the session: its check saw only part of
    the suite."""
    record = str(pytester.path)
    pytester.makepyfile(
        shared_locks=SHARED_LOCKS,
        test_export=locking_test("test_export", [("A", "B")], record),
        test_import=locking_test("test_import", [("B", "A")], record),
    )
    pytester.makeconftest(
        """
import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_testnodedown(node, error):
    if node.gateway.id == "gw1":
        node.workeroutput["lockwatch"] = {"edges": [{"witness": {"holding": "A"}, "test": "t"}]}
"""
    )
    result = run(pytester, *xdist_args("loadfile"), "--lockwatch-fail-on-cycle")
    result.assert_outcomes(passed=2)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines(
        [
            "1 lock-order edge, 0 potential deadlocks (lock-order cycles)",
            "lockwatch: worker gw1 sent unreadable lock-order edges (edge witness must have the "
            "keys *): the lock orders its tests took are not in this report",
        ]
    )
    result.stdout.no_fnmatch_line("*INTERNALERROR*")
