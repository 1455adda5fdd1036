"""The pytest plugin, end to end: real pytest sessions in subprocesses (pytester).

The plugin is a ``pytest11`` entry point once installed; until then (or with plugin autoload
disabled) it is loaded with ``-p``. Passing ``-p`` for a plugin already loaded from its entry
point is an error, so the arguments depend on which case holds.
"""

from __future__ import annotations

import os
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
