"""Watched semaphores: pools of permits. A blocking ``acquire`` that waits is a signal wait,
``release`` its signal.

A ``BoundedSemaphore(2)`` guarding two connections is a pool of capacity 2: a worker blocked in
``acquire`` waits for a peer's ``release``, not for a mutex. A ``threading`` or ``asyncio``
``Semaphore`` / ``BoundedSemaphore`` created by watched code while instrumented gets its lock
class (named by its creation site) and its capacity (its initial value) from the patched
``__init__``; the patched methods record tagged instances only, after one dictionary lookup:

- every successful ``acquire`` is counted (``acquisitions``; a try that found no permit is
  ``skipped``) and is a checkout, with the permits left after it;
- a blocking ``acquire`` that had to wait is a signal wait (to take), the ones that gave up
  counted: the try-acquire comes first, and the clock is read only when it failed. It is not a
  mutex wait: it appears in no ``wait_ns`` of the lock's;
- every ``release`` is a checkin and a signal (the hold runs from the worker's acquire to its
  next release).

A semaphore has no owner (any worker may release it), so it has no hold of its own and takes no
part in the lock order. The ``*_factory`` functions build what the patch table (``_patches``)
installs.
"""

from __future__ import annotations

import functools
from time import perf_counter_ns as _pc
from typing import Any

from .._session import OUTBOX, RECORDER
from ..record._recorder import WorkerState
from ._bookkeeping import current_context, record_try, stats_of
from ._fast_path import speedups
from ._naming import LockClass, lock_class, watched_site
from ._signal_waits import (
    gave,
    signal_stats,
    skip_frames_of,
    task_state,
    took,
    waited,
)

__all__ = [
    "async_acquire_factory",
    "async_release_factory",
    "semaphore_init_factory",
    "threading_acquire_factory",
    "threading_release_factory",
]

_tls = RECORDER.tls  # never replaced: Recorder.reset() keeps it


def semaphore_init_factory(original: Any, kind: str) -> Any:
    """The patched ``__init__``: a semaphore created by watched code gets its class and
    capacity."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            site = watched_site(1)
            if site is not None:
                self._lockwatch_class = lock_class(site, kind, site)
                self._lw_capacity = self._value
        except Exception as exc:  # never into the host: the plain semaphore still works
            OUTBOX.failed(exc)

    return __init__


def _took_permit(sem: Any, st: WorkerState, cls: LockClass) -> None:
    """A checkout of a permit of ``sem`` (the permits left read after it)."""
    try:
        left, capacity = sem._value, getattr(sem, "_lw_capacity", -1)
    except Exception as exc:  # a subclass without the stdlib's fields
        OUTBOX.failed(exc)
        return
    took(st, cls, left, capacity)


def _waited_for_permit(
    sem: Any, st: WorkerState, cls: LockClass, t0: int, t1: int, ok: bool, ctx: Any
) -> None:
    """A blocking acquire that waited from ``t0`` to ``t1`` (``ok``: it got a permit)."""
    waited(st, cls, t0, t1, ok, ctx, False)
    if ok:
        _took_permit(sem, st, cls)
        return
    try:  # it gave up: the capacity is known all the same
        s = signal_stats(st, cls)
        s.most = max(s.most, getattr(sem, "_lw_capacity", -1))
    except Exception as exc:
        OUTBOX.failed(exc)


# -- threading ------------------------------------------------------------------------------
def threading_acquire_factory(original: Any) -> Any:
    """The patched ``threading.Semaphore.acquire`` (and ``__enter__``)."""

    def acquire(self: Any, blocking: bool = True, timeout: float | None = None) -> bool:
        cls = getattr(self, "_lockwatch_class", None)
        if cls is None or (timeout is not None and not blocking):
            return original(self, blocking, timeout)
        try:
            st = _tls.st
        except AttributeError:
            st = RECORDER.thread_state()
        if st.in_lockwatch:
            return original(self, blocking, timeout)
        s = st.stats.get(cls)
        if s is None:
            s = stats_of(st, cls)
        if not blocking:
            ok = record_try(s, original(self, False))
            if ok:
                _took_permit(self, st, cls)
            return ok
        if original(self, False):
            s.acquisitions += 1
            _took_permit(self, st, cls)
            return True
        ctx = current_context()
        before, st.waiting = st.waiting, cls  # for the live gauges, as _bookkeeping.timed_wait
        t0 = _pc()
        try:
            ok = original(self, True, timeout)
        finally:
            st.waiting = before
        if ok:
            s.acquisitions += 1
        _waited_for_permit(self, st, cls, t0, _pc(), ok, ctx)
        return ok

    functools.update_wrapper(acquire, original)  # its errors name the original, as in C
    # The C path takes `with sem:` / `acquire()` with a free permit; everything else runs here.
    return acquire if speedups is None else speedups.SemaphoreAcquire(original, acquire)


def threading_release_factory(original: Any) -> Any:
    """The patched ``Semaphore.release`` / ``BoundedSemaphore.release``: a checkin."""

    def release(self: Any, n: int = 1) -> None:
        original(self, n)  # raises when a bounded semaphore is released too often: no checkin
        cls = getattr(self, "_lockwatch_class", None)
        if cls is None:
            return
        try:
            st = _tls.st
        except AttributeError:
            st = RECORDER.thread_state()
        if st.in_lockwatch:
            return
        gave(st, cls, -1)  # a checkin

    functools.update_wrapper(release, original)
    return release if speedups is None else speedups.SemaphoreRelease(original, release)


# -- asyncio --------------------------------------------------------------------------------
def async_acquire_factory(original: Any) -> Any:
    """The patched ``asyncio.Semaphore.acquire`` (the worker is the task)."""

    async def acquire(self: Any) -> bool:
        cls = getattr(self, "_lockwatch_class", None)
        if cls is None:
            return await original(self)
        st = task_state()
        if st.in_lockwatch:
            return await original(self)
        s = stats_of(st, cls)
        if not self.locked():
            result = await original(self)
            s.acquisitions += 1
            _took_permit(self, st, cls)
            return result
        ctx = current_context()
        before, st.waiting = st.waiting, cls  # for the live gauges
        t0 = _pc()
        try:
            result = await original(self)
        except BaseException:  # cancelled (a timeout around it): it gave up
            _waited_for_permit(self, st, cls, t0, _pc(), False, ctx)
            raise
        finally:
            st.waiting = before
        s.acquisitions += 1
        _waited_for_permit(self, st, cls, t0, _pc(), True, ctx)
        return result

    return acquire


def async_release_factory(original: Any) -> Any:
    """The patched ``asyncio.Semaphore.release`` (``BoundedSemaphore``'s calls it)."""

    def release(self: Any) -> None:
        original(self)
        cls = getattr(self, "_lockwatch_class", None)
        if cls is not None:
            st = task_state()
            if not st.in_lockwatch:
                gave(st, cls, -1)

    return release


skip_frames_of(globals())
