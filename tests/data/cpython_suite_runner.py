"""Run CPython's own test modules, plain or instrumented, and print what failed as JSON.

    python cpython_suite_runner.py plain|instrumented MANIFEST test.test_threading ...

Instrumented, lockwatch is switched on before any test module is imported (the suites create
their locks at test time, so every lock they make is watched), with no exporter, and the
manifest is written at exit as a user's would be.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import sys
import unittest


def main(argv: list[str]) -> int:
    mode, manifest, *modules = argv
    # A run that hangs says where, on stderr, before the test's deadline ends it (900 s).
    faulthandler.dump_traceback_later(720)
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
