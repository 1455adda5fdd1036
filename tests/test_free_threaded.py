"""The free-threaded build (PEP 703): instrumenting keeps the GIL off, and counts stay exact when
threads really run at once, on the C path as on the pure-Python one.

Without the GIL, threads run in parallel and wait on each other's locks for real, so a watched
lock must still exclude (no lost update), and the recorder's per-thread counts must add up to
every acquisition made. The count tests run on every build (more threads than cores, each
incrementing under one watched lock, on the sections of one array, or handing a lock to another
thread to release); the GIL test only where the GIL can be off. Where setup.py builds the C
extension (CPython 3.11+ on Linux: the free-threaded build included), the default path must be
the C path. scripts/build-python-ft.sh builds such an interpreter (CPython 3.13.15,
``--disable-gil``); scripts/test-pythons.sh's 3.13t leg runs these there.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

THREADS = 2 * (os.cpu_count() or 1) + 1  # more threads than cores
ITERATIONS = 20_000
# Where setup.py builds the C extension (its _wanted()): there the default path is the C path.
C_BUILT = (
    platform.python_implementation() == "CPython"
    and sys.version_info >= (3, 11)
    and sys.platform.startswith("linux")
)


def parallel(threads: int, iterations: int) -> str:
    """A program: ``threads`` threads, each ``iterations`` times ``with lock: n += 1`` on one
    watched lock, starting together; it prints what was kept and recorded, the internal errors
    included (its waits filed first, as the emitter files them: each one's holder read)."""
    return f"""
import json, sys, threading
from otel_lockwatch import LockwatchInstrumentor
from otel_lockwatch._session import OUTBOX, RECORDER
from otel_lockwatch.capture import _fast_path

LockwatchInstrumentor().instrument(manifest=False)
lock = threading.Lock()
n = 0
start = threading.Barrier({threads})

def work():
    global n
    start.wait()
    for _ in range({iterations}):
        with lock:
            n += 1

threads = [threading.Thread(target=work) for _ in range({threads})]
for t in threads:
    t.start()
for t in threads:
    t.join()
RECORDER.waits.file()
stats = [v for k, v in RECORDER.snapshot()["locks"].items() if k.startswith("__main__:")][0]
gil = sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True
print(json.dumps({{"n": n, "acquisitions": stats["acquisitions"], "holds": stats["hold_ns"].count,
                  "contentions": stats["contentions"], "errors": OUTBOX.errors, "gil": gil,
                  "c": _fast_path.SPEEDUPS}}))
"""


PARALLEL = parallel(THREADS, ITERATIONS)

# The sections of one array, taken by more threads than cores (more threads than sections).
SECTIONS = f"""
import json, sys, threading
from otel_lockwatch import LockwatchInstrumentor, StripedSections
from otel_lockwatch._session import RECORDER
from otel_lockwatch.capture import _fast_path

LockwatchInstrumentor().instrument(manifest=False)
sections = StripedSections(4, name="ft-sections")
counts = [0] * 4
start = threading.Barrier({THREADS})

def work(me):
    start.wait()
    for i in range({ITERATIONS // 4}):
        k = (me + i) % 4
        with sections.lock(k):
            counts[sections.index(k)] += 1

threads = [threading.Thread(target=work, args=(me,)) for me in range({THREADS})]
for t in threads:
    t.start()
for t in threads:
    t.join()
data = RECORDER.snapshot()
stats = data["locks"]["ft-sections"]
print(json.dumps({{"n": sum(counts), "acquisitions": stats["acquisitions"],
                  "holds": stats["hold_ns"].count,
                  "max_held": data["sections"]["ft-sections"]["max_held"],
                  "held_now": len(sections._lw.held_sections),
                  "gil": sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True,
                  "c": _fast_path.SPEEDUPS}}))
"""

# A Lock taken by one thread and released by another (a hand-over, which threading.Lock allows):
# the releasing thread ends the holder's hold, on the holder's held stack and Stats, while the
# holder takes and releases a lock of its own. Pairs: more threads than cores.
HANDOVER = f"""
import json, queue, sys, threading
from otel_lockwatch import LockwatchInstrumentor
from otel_lockwatch._session import RECORDER
from otel_lockwatch.capture import _fast_path

LockwatchInstrumentor().instrument(manifest=False)

def make_gate():
    return threading.Lock()

def make_own():
    return threading.Lock()

PAIRS = {THREADS // 2 + 1}
left = []
start = threading.Barrier(2 * PAIRS)

def pair():
    gate, own, tokens, done = make_gate(), make_own(), queue.SimpleQueue(), threading.Event()

    def taker():
        start.wait()
        for _ in range({ITERATIONS // 4}):
            gate.acquire()  # released by the giver
            tokens.put(1)
            for _ in range(2):
                with own:
                    pass
        tokens.put(None)
        done.wait()
        left.append(len(RECORDER.thread_state().held))

    def giver():
        start.wait()
        while tokens.get() is not None:
            gate.release()
        done.set()

    return [threading.Thread(target=taker), threading.Thread(target=giver)]

threads = [t for _ in range(PAIRS) for t in pair()]
for t in threads:
    t.start()
for t in threads:
    t.join()
locks = RECORDER.snapshot()["locks"]
gate = [v for k, v in locks.items() if k.startswith("__main__:make_gate:")][0]
own = [v for k, v in locks.items() if k.startswith("__main__:make_own:")][0]
print(json.dumps({{"pairs": PAIRS, "left": left,
                  "gate": gate["acquisitions"], "gate_holds": gate["hold_ns"].count,
                  "own": own["acquisitions"], "own_holds": own["hold_ns"].count,
                  "gil": sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True,
                  "c": _fast_path.SPEEDUPS}}))
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
    assert got["c"] is (C_BUILT and not pure)  # the path the test names
    assert got["n"] == THREADS * ITERATIONS
    assert got["acquisitions"] == THREADS * ITERATIONS
    assert got["holds"] == THREADS * ITERATIONS  # every release recorded too
    assert 0 <= got["contentions"] <= got["acquisitions"]
    assert got["errors"] == 0
    assert got["gil"] is not FREE_THREADED  # the GIL stayed off where the build has none


@pytest.mark.parametrize("pure", [False, True], ids=["default path", "pure path"])
def test_section_counts_are_exact_with_more_threads_than_sections(pure):
    """The sections of one array exclude per section, every acquisition and hold is counted once,
    and the count of sections held (one list for the array, which every thread that takes or
    leaves a section changes) is back to none at the end. (Its peak may pass the array's size by
    a few: a section's count is dropped just after its release, when the next holder may have
    counted it already; at most one per thread.)"""
    got = _run(SECTIONS, pure)
    total = THREADS * (ITERATIONS // 4)
    assert got["c"] is (C_BUILT and not pure)
    assert got["n"] == total
    assert got["acquisitions"] == total
    assert got["holds"] == total
    assert got["held_now"] == 0
    assert 1 <= got["max_held"] <= THREADS
    assert got["gil"] is not FREE_THREADED


@pytest.mark.parametrize("pure", [False, True], ids=["default path", "pure path"])
def test_a_lock_released_by_another_thread_is_counted_once(pure):
    """A hand-over: the giver's release ends the taker's hold (its held stack and Stats) while the
    taker takes its own lock. Every acquisition and every hold of both locks is counted once, and
    each taker's held stack is empty at the end (nothing lost, nothing left behind). Regression
    (the pure-Python path without the GIL): the giver looked at the top of the taker's stack,
    then popped, and the taker's push in between had it pop the taker's own entry, or its pop
    left the stack empty for the giver's look (IndexError raised into the giver's release)."""
    got = _run(HANDOVER, pure)
    each = ITERATIONS // 4
    assert got["c"] is (C_BUILT and not pure)
    assert got["gate"] == got["gate_holds"] == got["pairs"] * each
    assert got["own"] == got["own_holds"] == got["pairs"] * each * 2
    assert got["left"] == [0] * got["pairs"]
    assert got["gil"] is not FREE_THREADED


@pytest.mark.skipif(not FREE_THREADED, reason="the GIL build: the GIL is always on")
def test_importing_and_instrumenting_keep_the_gil_off():
    """Importing the package and instrumenting (which imports every module it patches and, where
    built, the C extension) never turns the GIL back on."""
    code = (
        "import json, sys\n"
        "import otel_lockwatch\n"
        "after_import = sys._is_gil_enabled()\n"
        "from otel_lockwatch import LockwatchInstrumentor\n"
        "from otel_lockwatch.capture import _fast_path\n"
        "LockwatchInstrumentor().instrument(manifest=False)\n"
        "print(json.dumps({'import': after_import, 'instrument': sys._is_gil_enabled(),\n"
        "                  'c': _fast_path.SPEEDUPS}))\n"
    )
    # The C path is loaded (it declares Py_MOD_GIL_NOT_USED), and the GIL stays off.
    assert _run(code, pure=False) == {"import": False, "instrument": False, "c": C_BUILT}


# A waiter's look at a holder that has noted its hold: every thread's frames are counted reads of
# sys._current_frames (replaced before lockwatch is imported), the holder parked in the program's
# code, inside its hold.
LOOK = """
import json, sys, threading
reads = []
_frames = sys._current_frames
def counted():
    reads.append(1)
    return _frames()
sys._current_frames = counted
from otel_lockwatch import LockwatchInstrumentor
from otel_lockwatch.capture import _fast_path
from otel_lockwatch.capture._switched_out import in_window

LockwatchInstrumentor().instrument(manifest=False)
lock = threading.Lock()
held, done = threading.Event(), threading.Event()

def holder():
    with lock:
        held.set()
        done.wait(30)

t = threading.Thread(target=holder)
t.start()
held.wait(30)
seen = in_window(lock)
done.set()
t.join()
print(json.dumps({"in_window": seen, "reads": len(reads), "c": _fast_path.SPEEDUPS,
                  "gil": sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True}))
"""


@pytest.mark.skipif(not FREE_THREADED, reason="the GIL build: the window looks at the holder")
@pytest.mark.parametrize("pure", [False, True], ids=["default path", "pure path"])
def test_without_the_gil_a_noted_holder_is_not_looked_at(pure):
    """Without the GIL a holder that has noted its hold runs on its own core: out of the window,
    and its frame not read (that read stops every thread of the process there)."""
    got = _run(LOOK, pure)
    assert got == {"in_window": False, "reads": 0, "c": C_BUILT and not pure, "gil": False}


@pytest.mark.parametrize("pure", [False, True], ids=["default path", "pure path"])
def test_a_waiter_reads_its_holder_s_entry_whole(pure):
    """A waiter takes a reference to the holder's held-stack entry while the holder's release
    lets go of it. Regression (the C path without the GIL): a plain load and incref took a
    reference to an entry freed between the two and reused by another object (an internal
    error, "'builtin_function_or_method' object has no attribute 'frame'", in 3 of 5 runs of
    this program on 3.13t); the read is now made under the proxy's critical section, which the
    stores take too."""
    got = _run(parallel(8, 50_000), pure)  # waiters read the entries releases let go of
    assert (got["n"], got["errors"], got["c"]) == (400_000, 0, C_BUILT and not pure)
