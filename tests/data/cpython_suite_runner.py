"""Run CPython's own test modules, plain or instrumented, and print what failed as JSON.

    python cpython_suite_runner.py plain|instrumented MANIFEST test.test_threading ...

Instrumented, lockwatch is switched on before any test module is imported (the suites create
their locks at test time, so every lock they make is watched), with no exporter, and the
manifest is written at exit as a user's would be.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import unittest

#: CPython's own deadlocks in these suites, fixed upstream after a release this project tests on:
#: (the test module, the method) -> (the releases it hangs on, the issue). Those tests are
#: skipped there, plain and instrumented alike, naming the issue. gh-125451: the executor's
#: manager thread joins the queue's feeder thread holding the executor's shutdown lock, which
#: the feeder takes when a task fails to pickle during a shutdown (seen here on 3.13.0,
#: instrumented, in test_shutdown_deadlock_pickle: a hang until the test's deadline).
GH_125451 = (
    ((3, 12, 0) <= sys.version_info[:3] < (3, 12, 8))
    or ((3, 13, 0) <= sys.version_info[:3] < (3, 13, 1)),
    "CPython's own deadlock on this release (gh-125451, fixed in 3.12.8 and 3.13.1)",
)
KNOWN_HANGS = {
    ("test.test_concurrent_futures.test_deadlock", "test_shutdown_deadlock_pickle"): GH_125451,
    ("test.test_concurrent_futures.test_shutdown", "test_processes_terminate"): GH_125451,
}


def skip_known_hangs(suite: unittest.TestSuite) -> None:
    """Mark each test of ``suite`` that :data:`KNOWN_HANGS` names for this release skipped."""
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            skip_known_hangs(test)
            continue
        name = getattr(test, "_testMethodName", "")
        hangs, why = KNOWN_HANGS.get((type(test).__module__, name), (False, ""))
        if hangs:
            setattr(test, name, unittest.skip(why)(getattr(test, name)))


def main(argv: list[str]) -> int:
    mode, manifest, *modules = argv
    if mode == "instrumented":
        from otel_lockwatch import LockwatchInstrumentor

        LockwatchInstrumentor().instrument(manifest_path=manifest, checkpoint_interval_s=0)
    suite = unittest.TestSuite()
    loader = unittest.TestLoader()
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError:  # a test's id (a rerun): module.Class.method
            suite.addTests(loader.loadTestsFromName(name))
            continue
        suite.addTests(loader.loadTestsFromModule(module))
    skip_known_hangs(suite)
    with open(os.devnull, "w") as sink:
        result = unittest.TextTestRunner(stream=sink, verbosity=0).run(suite)
    failed = sorted(
        {test.id() for test, _ in result.failures + result.errors + result.unexpectedSuccesses}
    )
    details = {test.id(): text[-1500:] for test, text in result.failures + result.errors}
    # On a line of its own: a suite may leave its stdout mid-line (3.13's concurrent.futures
    # prints its tests' durations).
    print("\n" + json.dumps({"run": result.testsRun, "failed": failed, "details": details}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
