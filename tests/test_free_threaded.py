"""The free-threaded build (PEP 703): instrumenting keeps the GIL off, and counts stay exact when
threads really run at once.

Without the GIL, threads run in parallel and wait on each other's locks for real, so a watched
lock must still exclude (no lost update), and the recorder's per-thread counts must add up to
every acquisition made. The count test runs on every build (more threads than cores, each
incrementing under one watched lock); the GIL test only where the GIL can be off.
scripts/build-python-ft.sh builds such an interpreter (CPython 3.13.5, ``--disable-gil``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

THREADS = 2 * (os.cpu_count() or 1) + 1  # more threads than cores
ITERATIONS = 20_000

PARALLEL = f"""
import json, sys, threading
from otel_lockwatch import LockwatchInstrumentor
from otel_lockwatch._session import RECORDER

LockwatchInstrumentor().instrument(manifest=False)
lock = threading.Lock()
n = 0
start = threading.Barrier({THREADS})

def work():
    global n
    start.wait()
    for _ in range({ITERATIONS}):
        with lock:
            n += 1

threads = [threading.Thread(target=work) for _ in range({THREADS})]
for t in threads:
    t.start()
for t in threads:
    t.join()
stats = [v for k, v in RECORDER.snapshot()["locks"].items() if k.startswith("__main__:")][0]
gil = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
print(json.dumps({{"n": n, "acquisitions": stats["acquisitions"],
                  "contentions": stats["contentions"], "gil": gil}}))
"""


def _run(code: str, pure: bool) -> dict:
    env = dict(os.environ)
    env.pop("LOCKWATCH_DISABLE_EXTENSIONS", None)
    if pure:
        env["LOCKWATCH_DISABLE_EXTENSIONS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for var in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER"):
        env[var] = "none"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("pure", [False, True], ids=["default path", "pure path"])
def test_counts_are_exact_with_more_threads_than_cores(pure):
    """Every increment made under the watched lock is kept (it still excludes), and every
    acquisition is counted once, however many threads ran at once."""
    got = _run(PARALLEL, pure)
    assert got["n"] == THREADS * ITERATIONS
    assert got["acquisitions"] == THREADS * ITERATIONS
    assert 0 <= got["contentions"] <= got["acquisitions"]
    assert got["gil"] is not FREE_THREADED  # the GIL stayed off where the build has none


@pytest.mark.skipif(not FREE_THREADED, reason="the GIL build: the GIL is always on")
def test_importing_and_instrumenting_keep_the_gil_off():
    """Importing the package and instrumenting (which imports every module it patches and, where
    built, the C extension) never turns the GIL back on."""
    code = (
        "import json, sys\n"
        "import otel_lockwatch\n"
        "after_import = sys._is_gil_enabled()\n"
        "from otel_lockwatch import LockwatchInstrumentor\n"
        "LockwatchInstrumentor().instrument(manifest=False)\n"
        "print(json.dumps({'import': after_import, 'instrument': sys._is_gil_enabled()}))\n"
    )
    assert _run(code, pure=False) == {"import": False, "instrument": False}
