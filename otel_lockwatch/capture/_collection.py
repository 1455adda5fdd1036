"""The cyclic collector held off while lockwatch allocates under a held lock.

A collection runs the finalizers (``__del__``, weakref callbacks) of what it frees on the thread
whose allocation set it off, wherever that thread is. A program that allocates nothing while it
holds its locks never runs one under a lock; lockwatch's bookkeeping allocates there (the frame
object of an acquisition site, a held-stack entry, a new lock-order edge and its witness, a wait
or a long hold queued for OpenTelemetry), and a finalizer that takes a lock its thread holds
would wait for itself forever.

So those allocations run with the collector off: :func:`defer_collection` before,
:func:`resume_collection` after, nested on one thread or across threads. The first deferral
notes whether the collector was on and turns it off; the last turns it back on if it was. What
the deferred allocations counted is collected at the program's next allocation, where its own
would have set a collection off; nothing is collected here (``gc.collect()`` would run the
finalizers at once). A deferral never spans a blocking wait: the collector is off for
microseconds, for every thread.

The C path (``_speedups``) has the same two functions over one count (atomic under the GIL);
this is the reference (:func:`py_defer_collection`, :func:`py_resume_collection`: the tests
hold both to one behaviour), and serves the pure-Python path. A deferral open in another
thread when the process forks is closed in the child. A ``gc.disable()`` made by another
thread while a deferral is open is undone when it closes (the collector's switch is the
process's), and so, on CPython 3.12, is a ``gc.set_threshold()`` (a deferral raises the
thresholds there: below).
"""

from __future__ import annotations

import _thread
import gc
import sys

from .._session import at_fork
from ._fast_path import speedups

__all__ = ["defer_collection", "py_defer_collection", "py_resume_collection", "resume_collection"]

# Re-entrant: a signal handler may take a lock (and defer) inside a deferral of its thread.
_lock = _thread.RLock()
_deferrals = 0
_was_enabled = False

# CPython 3.12 runs a collection that an allocation scheduled at the interpreter's next check
# (a Python call, a loop's jump) even while the collector is disabled (3.11 collects inside the
# allocation; 3.13 and later skip a scheduled collection while disabled), and lockwatch's own
# Python code under a held lock is such a check. There a deferral also raises the thresholds, so
# that a scheduled collection finds no generation due; the last resume puts them back.
_RAISE_THRESHOLDS = sys.version_info[:2] == (3, 12)
_RAISED = (2**31 - 1,) * 3
_saved_thresholds: tuple[int, ...] | None = None


def py_defer_collection() -> None:
    """Hold the cyclic collector off until the matching :func:`resume_collection`.

    Nothing here allocates an object the collector tracks before ``gc.disable()``: not even a
    ``with _lock:``, whose bound ``__exit__`` is one, and which could set off the collection
    (and a finalizer taking a lock the caller holds) this is here to hold off.
    """
    global _deferrals, _was_enabled, _saved_thresholds
    _lock.acquire()
    try:
        if _deferrals == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
            if _RAISE_THRESHOLDS and _saved_thresholds is None:  # (inline: no Python call)
                _saved_thresholds = gc.get_threshold()
                gc.set_threshold(*_RAISED)
        _deferrals += 1
    finally:
        _lock.release()


def py_resume_collection() -> None:
    """End a deferral: the collector is on again after the last, if it was before the first."""
    global _deferrals
    _lock.acquire()
    try:
        if _deferrals <= 0:  # a forked child closed the deferrals of its parent's threads
            return
        _deferrals -= 1
        if _deferrals == 0:
            _restore_thresholds()
            if _was_enabled:
                gc.enable()
    finally:
        _lock.release()


def _restore_thresholds() -> None:
    global _saved_thresholds
    if _saved_thresholds is not None:
        gc.set_threshold(*_saved_thresholds)
        _saved_thresholds = None


def _after_fork_in_child() -> None:
    global _lock, _deferrals
    _lock = _thread.RLock()
    if _deferrals > 0:
        _deferrals = 0
        _restore_thresholds()
        if _was_enabled:
            gc.enable()


if speedups is not None:
    defer_collection = speedups.defer_collection
    resume_collection = speedups.resume_collection
else:
    defer_collection = py_defer_collection
    resume_collection = py_resume_collection
    at_fork("collection", after_in_child=_after_fork_in_child)
