"""A held lock that only cyclic garbage keeps (``capture/_dropped.py``'s ``collected_gone``),
decided under the thread's held locks without running a finalizer there.

Before an edge that would close a cycle is reported, the order check asks whether the held lock
is gone, kept only by a reference cycle. That question used to be answered by ``gc.collect()``,
on the thread that holds watched locks: a finalizer of unrelated garbage that takes one of them
waited for that thread forever. Each script runs in a subprocess with a timeout, so that a hang
fails the test rather than the suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_PRELUDE = """
import gc, threading
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider
from otel_lockwatch import LockwatchInstrumentor
from otel_lockwatch._session import RECORDER
LockwatchInstrumentor().instrument(
    tracer_provider=TracerProvider(), meter_provider=MeterProvider(), manifest=False
)

class SelfReferring:
    def __init__(self):
        self.me = self  # a reference cycle: only the collector frees it
        self.lock = threading.Lock()

def take(lock):
    lock.acquire()  # returns holding it: its frame and the garbage cycle refer to it
"""


def _run(body: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    script = _PRELUDE + textwrap.dedent(body)
    try:
        return subprocess.run(
            [sys.executable, "-W", "ignore", "-c", script],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the program hung: a finalizer ran under the held locks and waited for them")


@pytest.mark.skipif(
    sys.version_info >= (3, 13),
    reason="3.13 and later: the referrer walk does not find a lock kept only by a reference cycle "
    "gone, so the cycle check still runs the collector there (capture/_dropped.collected_gone)",
)
def test_a_finalizer_taking_a_held_lock_does_not_hang_the_cycle_check():
    """A thread holds ``outer`` and a lock that only a garbage cycle keeps, then takes a second
    lock of that class (an edge that would close a cycle). Unrelated garbage has a ``__del__``
    that takes ``outer``: a collection there ran it on this thread, which waited for itself."""
    done = _run(
        """
        outer = threading.Lock()

        class Finalized:
            def __init__(self):
                self.me = self
            def __del__(self):
                with outer:  # the program's own finalizer: harmless when it runs elsewhere
                    pass

        def worker():
            gc.disable()  # the collector must not run on its own here
            with outer:
                first = SelfReferring()
                take(first.lock)
                del first
                Finalized()
                second = SelfReferring()
                with second.lock:  # would close a cycle: the check asks whether `first` is gone
                    pass
            gc.enable()
            gc.collect()  # the finalizer runs now, with `outer` free

        t = threading.Thread(target=worker, name="w1")
        t.start()
        t.join()
        print(sum(RECORDER.held_locks_freed.values()), len(RECORDER.graph.to_json()["cycles"]))
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "0"]  # the garbage-kept lock is gone: no false cycle


def test_a_lock_a_live_object_keeps_still_orders():
    """The same shape, with the object that keeps the lock still referred to (a running frame's
    local): the lock can still be released, so the nesting is the class's first address order
    (asked whether `first` is gone: it is not), and the nesting the other way closes a cycle,
    reported."""
    done = _run(
        """
        def worker():
            gc.disable()
            first = SelfReferring()
            take(first.lock)
            second = SelfReferring()
            with second.lock:
                pass
            first.lock.release()
            with second.lock:
                with first.lock:  # the other address order
                    pass
            gc.enable()

        t = threading.Thread(target=worker, name="w1")
        t.start()
        t.join()
        print(RECORDER.held_locks_freed, len(RECORDER.graph.to_json()["cycles"]))
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["{}", "1"]


def test_a_lock_an_exceptions_traceback_keeps_is_gone():
    """A frame kept by its own exception's traceback (a cycle: the frame's local is the
    exception, whose traceback holds the frame) keeps the lock it acquired: gone."""
    done = _run(
        """
        def keep_in_traceback(lock):
            lock.acquire()
            try:
                raise ValueError("kept")
            except ValueError as exc:
                saved = exc  # noqa: F841  the frame -> saved -> traceback -> the frame

        def worker():
            gc.disable()
            keep_in_traceback(SelfReferring().lock)
            second = SelfReferring()
            with second.lock:
                pass
            gc.enable()

        t = threading.Thread(target=worker, name="w1")
        t.start()
        t.join()
        print(sum(RECORDER.held_locks_freed.values()), len(RECORDER.graph.to_json()["cycles"]))
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["1", "0"]
