"""Finalizers that take locks: instrumenting a program never makes one run under a held lock.

A collection runs finalizers on the thread whose allocation set it off. A program that allocates
nothing while it holds its locks never runs one there; lockwatch's bookkeeping allocates under a
held lock (a new lock-order edge, its witness, a wait queued for OpenTelemetry), and holds the
collector off while it does (``capture._collection``). The stress runs in a real subprocess with
a watchdog (``faulthandler``), so a hang fails the test instead of hanging the suite.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import sysconfig
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from otel_lockwatch.capture import _collection, _fast_path

ROOT = Path(__file__).resolve().parent.parent
TRIALS = 100

# The tests that make a collection due at (nearly) every allocation, by a threshold of one, need
# a collector that counts each allocation at once: the free-threaded build counts them per
# thread and adds them up 512 at a time (no collection at all in 200 allocations at threshold
# one, on 3.13.5t), so there they could not fail.
prompt_collections = pytest.mark.skipif(
    bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
    reason="the free-threaded build counts allocations 512 at a time: no collection is due",
)

# What every script here runs first: on the C or the Python path (``mode``), instrumented;
# "plain", not. (Each script's `mode` is its first argument.)
INSTRUMENT = textwrap.dedent(
    """
    if mode != "plain":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        from otel_lockwatch import LockwatchInstrumentor
        from otel_lockwatch.capture import _fast_path
        from otel_lockwatch._session import RECORDER
        assert _fast_path.SPEEDUPS == (mode == "C"), _fast_path.SPEEDUPS
        LockwatchInstrumentor().instrument(
            tracer_provider=TracerProvider(), meter_provider=MeterProvider(), manifest=False
        )
    """
).strip()


# 20 locks of 20 lock classes (one creation line each); objects in reference cycles whose
# __del__ takes two of them, nested; the main loop makes garbage with no lock held, then nests
# two locks (a new lock-order edge until every pair has been seen), allocating nothing under them:
# by calls, not `with`, whose binding of __enter__ and __exit__ allocates two objects the
# collector counts (3.11 collects inside an allocation). With `with`, the program itself could set
# a collection off under its first lock, when another thread's allocations (lockwatch's emitter:
# the program alone never did) had left the count one short there: 2 hangs in whole runs of
# 3.11's suite under load, December 2026, the Python path's trials.
STRESS = (
    textwrap.dedent(
        """
    import faulthandler, random, sys, threading
    mode, trials = sys.argv[1], int(sys.argv[2])
    INSTRUMENT

    def make():
        return [
    LOCK_LINES
        ]

    class Garbage:
        def __init__(self, locks, i, j):
            self.me = self  # a cycle: only the collector frees it
            self.locks, self.i, self.j = locks, i, j

        def __del__(self):
            with self.locks[self.i]:
                with self.locks[self.j]:
                    pass

    for trial in range(trials):
        if mode != "plain":
            RECORDER.reset()  # the graph and the chain caches: every edge is new again
        locks = make()
        rnd = random.Random(trial)
        faulthandler.dump_traceback_later(60, exit=True)  # a hang ends the process
        for _ in range(1500):
            for _ in range(5):
                i, j = sorted(rnd.sample(range(20), 2))
                Garbage(locks, i, j)
            a, b = sorted(rnd.sample(range(20), 2))
            first, second = locks[a], locks[b]
            first.acquire()
            second.acquire()
            second.release()
            first.release()
        faulthandler.cancel_dump_traceback_later()
    print("trials", trials, flush=True)
    """
    )
    .replace("LOCK_LINES", "\n".join(["        threading.Lock(),"] * 20))
    .replace("INSTRUMENT", INSTRUMENT)
)


def _paths() -> list[str]:
    return ["plain", *(["C"] if _fast_path.SPEEDUPS else []), "Python"]


def _run_script(script: str, mode: str, *args: str, timeout: float) -> Any:
    """Run a script of this file in a subprocess on ``mode``'s path (plain, C or Python)."""
    env = dict(os.environ)
    env.pop("LOCKWATCH_DISABLE_EXTENSIONS", None)
    if mode == "Python":
        env["LOCKWATCH_DISABLE_EXTENSIONS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, "-c", script, mode, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


# On CPython 3.12 and 3.13 the pure-Python path cannot hold off a collection that the `with`
# statement itself sets due: `with lock:` binds a Python class's __enter__ and __exit__ (two
# objects the collector counts), which may take the count past the threshold, and the Python
# __enter__'s first instruction is an interpreter check that runs the collection, under the
# locks the thread already holds. A C lock's __enter__ runs no check, and by the program's next
# one the bound methods are freed (nothing is due then). 3.14's `with` binds nothing
# (LOAD_SPECIAL), and the C path holds the collection off on every version: docs/performance.md.
_WITH_BINDS_ENTER = sys.version_info[:2] in ((3, 12), (3, 13))


@pytest.mark.parametrize(
    "mode",
    [
        pytest.param(
            mode,
            marks=pytest.mark.skipif(
                mode == "Python" and _WITH_BINDS_ENTER,
                reason="3.12/3.13: a pure-Python __enter__ runs a collection its `with` set due",
            ),
        )
        for mode in _paths()
    ],
)
def test_finalizers_taking_locks_never_hang_in_100_trials(mode):
    done = _run_script(STRESS, mode, str(TRIALS), timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["trials", str(TRIALS)]


# Garbage with finalizers made under a held lock, then a collection due at every allocation the
# collector tracks (threshold 1) while another lock's class is used for the first time (after
# each reset every class is new again: its first Stats is made there). A plain acquire and
# release allocate nothing, so plainly no finalizer runs under the outer lock; each notes whether
# it did (on the thread that holds it: a collection the emitter thread sets off meanwhile runs
# the finalizers there, which is harmless, and failed this test under load, 4 of 800).
DUE = textwrap.dedent(
    """
    import gc, sys, threading
    mode = sys.argv[1]
    INSTRUMENT
    outer, inner = threading.Lock(), threading.Lock()
    under = []
    MAIN = threading.get_ident()

    class Garbage:
        def __init__(self):
            self.me = self  # a cycle: only the collector frees it

        def __del__(self):
            # Under the outer lock: on the thread that holds it (the main thread, the only one
            # that takes it); the emitter thread may run a due collection meanwhile, harmlessly.
            under.append(outer.locked() and threading.get_ident() == MAIN)

    for trial in range(200):
        if mode != "plain":
            RECORDER.reset()
        gc.collect()
        with outer:
            for _ in range(4):
                Garbage()
            gc.set_threshold(1)
            inner.acquire()
            inner.release()
            gc.set_threshold(700)
    gc.collect()
    print(len(under), sum(under))
    """
).replace("INSTRUMENT", INSTRUMENT)


@prompt_collections
@pytest.mark.parametrize("mode", _paths())
def test_a_collection_due_under_a_held_lock_waits_until_it_is_released(mode):
    done = _run_script(DUE, mode, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    ran, under_the_lock = map(int, done.stdout.split())
    assert ran == 800  # every finalizer ran (none of them under the outer lock)
    assert under_the_lock == 0


# A nested acquisition's count of tracked objects, on the thread that makes it (gc.get_count()
# flushes the calling thread's count first, on the free-threaded build: exact there).
BALANCE = textwrap.dedent(
    """
    import gc, sys, threading
    mode = sys.argv[1]
    INSTRUMENT
    gc.disable()  # (counted, not collected)
    outer, inner = threading.Lock(), threading.Lock()
    rises = []
    for _ in range(200):
        with outer:
            before = gc.get_count()[0]
            inner.acquire()
            rises.append(gc.get_count()[0] - before)
            inner.release()
    print(max(rises[10:]))  # (after the first rounds: the edge, the classes' first Stats)
    """
).replace("INSTRUMENT", INSTRUMENT)


@pytest.mark.skipif(
    not sysconfig.get_config_var("Py_GIL_DISABLED"),
    reason="the free-threaded build's collector: the GIL build's counts every allocation at once",
)
@pytest.mark.parametrize("mode", _paths())
def test_a_nested_acquisition_leaves_the_threads_count_where_it_was(mode):
    """On the free-threaded build a collection is set off where the thread's count of tracked
    objects reaches a new high: an acquisition under a held lock leaves it where the program
    left it (its held entry frees one object of the ballast made while nothing was held)."""
    done = _run_script(BALANCE, mode, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert int(done.stdout) <= 0


def _implementations() -> list[tuple]:
    python = (_collection.py_defer_collection, _collection.py_resume_collection)
    if _fast_path.speedups is None:
        return [python]
    return [python, (_fast_path.speedups.defer_collection, _fast_path.speedups.resume_collection)]


@pytest.fixture
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


@pytest.mark.parametrize("defer, resume", _implementations())
def test_deferrals_nest_across_threads(defer, resume, collector_on):
    """The collector is off from the first deferral to the last, whichever thread closes it."""
    opened, close = threading.Event(), threading.Event()
    seen = []

    def other():
        defer()
        opened.set()
        close.wait()
        seen.append(gc.isenabled())
        resume()

    t = threading.Thread(target=other)
    t.start()
    opened.wait()
    assert not gc.isenabled()
    defer()
    defer()
    resume()
    assert not gc.isenabled()
    resume()  # this thread's last: the other's is still open
    assert not gc.isenabled()
    close.set()
    t.join()
    assert seen == [False]
    assert gc.isenabled()
    resume()  # one too many: nothing changes
    assert gc.isenabled()


# 50 tracked objects made with no interpreter check between them (one tuple display), then a
# deferral: the collection they set due (past a threshold 20 above the count) runs at the first
# check, right after the deferral's call on CPython 3.12 and later (3.11: inside the allocation).
_BURST = "def burst(defer, resume):\n    due = (" + "[], " * 50 + ")\n    defer()\n    resume()\n"


@pytest.mark.skipif(not _fast_path.SPEEDUPS, reason="the C deferral (no Python call)")
def test_a_collection_due_before_a_deferral_does_not_run_inside_it(collector_on):
    """CPython 3.12 runs a due collection even with the collector disabled; the C deferral raises
    the thresholds there, so that it collects nothing until the deferral ends. (The pure-Python
    deferral is a Python call, whose entry is itself a check: the collection runs before it.)"""
    namespace: dict = {}
    exec(_BURST, namespace)
    burst = namespace["burst"]
    started: list[bool] = []

    def note(phase, info):
        if phase == "start":
            started.append(gc.isenabled())

    thresholds = gc.get_threshold()
    gc.callbacks.append(note)
    try:
        for _ in range(50):
            gc.collect()
            gc.set_threshold(gc.get_count()[0] + 20, *thresholds[1:])
            burst(_fast_path.speedups.defer_collection, _fast_path.speedups.resume_collection)
    finally:
        gc.callbacks.remove(note)
        gc.set_threshold(*thresholds)
    assert started.count(False) == 0, started  # none while the collector was off
    assert started.count(True) >= 50  # (the premise: each burst set a collection off, after)


@pytest.mark.parametrize("defer, resume", _implementations())
def test_a_collector_off_before_stays_off(defer, resume, collector_on):
    gc.disable()
    defer()
    resume()
    assert not gc.isenabled()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("mode", ["C", "Python"] if _fast_path.SPEEDUPS else ["Python"])
def test_a_forked_child_closes_its_parents_deferrals(mode, tmp_path):
    """A deferral open in another thread when the process forks: the child's collector is on."""
    script = textwrap.dedent(
        """
        import gc, os, sys, threading
        from otel_lockwatch.capture import _collection
        opened, done = threading.Event(), threading.Event()
        def other():
            _collection.defer_collection()
            opened.set()
            done.wait()
            _collection.resume_collection()
        t = threading.Thread(target=other)
        t.start()
        opened.wait()
        pid = os.fork()
        if pid == 0:
            os._exit(0 if gc.isenabled() else 1)
        _, status = os.waitpid(pid, 0)
        done.set()
        t.join()
        print(os.waitstatus_to_exitcode(status), gc.isenabled())
        """
    )
    env = dict(os.environ)
    env.pop("LOCKWATCH_DISABLE_EXTENSIONS", None)
    if mode == "Python":
        env["LOCKWATCH_DISABLE_EXTENSIONS"] = "1"
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.stdout.split() == ["0", "True"], done.stderr


@prompt_collections
def test_a_python_deferral_sets_no_collection_off_before_it_holds_the_collector_off(
    collector_on,
):
    """The pure path's deferral allocates nothing the collector tracks while the collector is
    still on (a ``with _lock:`` did: its bound ``__exit__``), so it never sets off the very
    collection, and the finalizer under a held lock, it is there to hold off. At a threshold of
    one, every second tracked allocation collects: 200 deferrals would set several off."""

    class Cell:
        pass

    inside = []

    def note(phase, info):
        if phase == "start":
            frame = sys._getframe()
            while (
                frame is not None and frame.f_code is not _collection.py_defer_collection.__code__
            ):
                frame = frame.f_back
            inside.append(frame is not None)

    threshold = gc.get_threshold()
    gc.callbacks.append(note)
    try:
        gc.set_threshold(1)
        for _ in range(200):
            _collection.py_defer_collection()
            _collection.py_resume_collection()
            garbage = Cell()  # a tracked allocation between the deferrals (no free list)
            del garbage
    finally:
        gc.set_threshold(*threshold)
        gc.callbacks.remove(note)
    assert inside and not any(inside)  # collections ran, none inside a deferral's start
