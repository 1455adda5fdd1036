"""Watched semaphores: pools of permits. A blocking ``acquire`` that waits is a hand-off wait,
``release`` its give.

A ``BoundedSemaphore(2)`` guarding two connections is a pool of capacity 2: a worker blocked in
``acquire`` waits for a peer's ``release``, not for a mutex. A ``threading`` or ``asyncio``
``Semaphore`` / ``BoundedSemaphore`` created by watched code while instrumented gets its lock
class (named by its creation site) and its capacity (its initial value) from the patched
``__init__``; the patched methods record tagged instances only, after one dictionary lookup:

- every successful ``acquire`` is counted (``acquisitions``; a try that found no permit is
  ``skipped``) and is a checkout, with the permits left after it;
- a blocking ``acquire`` that had to wait is a hand-off wait (to take), the ones that gave up
  counted: the try-acquire comes first, and the clock is read only when it failed. It is not a
  mutex wait: it appears in no ``wait_ns`` of the lock's;
- every ``release`` is a checkin and a give (the hold runs from the worker's acquire to its
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
from ._bookkeeping import record_try, stats_of
from ._fast_path import speedups
from ._handoffs import (
    blocked_wait,
    blocked_wait_async,
    gave,
    handoff_stats,
    record_wait,
    skip_frames_of,
    task_state,
    took,
)
from ._naming import LockClass, lock_class, watched_site

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


def _took_permit(sem: Any, state: WorkerState, semaphore_class: LockClass) -> None:
    """A checkout of a permit of ``sem`` (the permits left read after it)."""
    try:
        left, capacity = sem._value, getattr(sem, "_lw_capacity", -1)
    except Exception as exc:  # a subclass without the stdlib's fields
        OUTBOX.failed(exc)
        return
    took(state, semaphore_class, left, capacity)


def _permit_wait_ended(
    sem: Any,
    state: WorkerState,
    semaphore_class: LockClass,
    t0: int,
    context: Any,
    result: Any,
    raised: bool,
) -> None:
    """A blocking acquire that waited from ``t0`` (``result``: whether it got a permit)."""
    t1 = _pc()
    ok = not raised and bool(result)
    if ok:
        stats_of(state, semaphore_class).acquisitions += 1
    record_wait(state, semaphore_class, t0, t1, ok, context, False)
    if ok:
        _took_permit(sem, state, semaphore_class)
        return
    try:  # it gave up: the capacity is known all the same
        stats = handoff_stats(state, semaphore_class)
        stats.most = max(stats.most, getattr(sem, "_lw_capacity", -1))
    except Exception as exc:
        OUTBOX.failed(exc)


# -- threading ------------------------------------------------------------------------------
def threading_acquire_factory(original: Any) -> Any:
    """The patched ``threading.Semaphore.acquire`` (and ``__enter__``)."""

    def acquire(self: Any, blocking: bool = True, timeout: float | None = None) -> bool:
        semaphore_class = getattr(self, "_lockwatch_class", None)
        if semaphore_class is None or (timeout is not None and not blocking):
            return original(self, blocking, timeout)
        try:
            state = _tls.st
        except AttributeError:
            state = RECORDER.thread_state()
        if state.in_lockwatch:
            return original(self, blocking, timeout)
        stats = state.stats.get(semaphore_class)
        if stats is None:
            stats = stats_of(state, semaphore_class)
        if not blocking:
            ok = record_try(stats, original(self, False))
            if ok:
                _took_permit(self, state, semaphore_class)
            return ok
        if original(self, False):
            stats.acquisitions += 1
            _took_permit(self, state, semaphore_class)
            return True
        return blocked_wait(
            self, state, semaphore_class, _permit_wait_ended, original, self, True, timeout
        )

    functools.update_wrapper(acquire, original)  # its errors name the original, as in C
    # The C path takes `with sem:` / `acquire()` with a free permit; everything else runs here.
    return acquire if speedups is None else speedups.SemaphoreAcquire(original, acquire)


def threading_release_factory(original: Any) -> Any:
    """The patched ``Semaphore.release`` / ``BoundedSemaphore.release``: a checkin."""

    def release(self: Any, n: int = 1) -> None:
        original(self, n)  # raises when a bounded semaphore is released too often: no checkin
        semaphore_class = getattr(self, "_lockwatch_class", None)
        if semaphore_class is None:
            return
        try:
            state = _tls.st
        except AttributeError:
            state = RECORDER.thread_state()
        if state.in_lockwatch:
            return
        gave(state, semaphore_class, -1)  # a checkin

    functools.update_wrapper(release, original)
    return release if speedups is None else speedups.SemaphoreRelease(original, release)


# -- asyncio --------------------------------------------------------------------------------
def async_acquire_factory(original: Any) -> Any:
    """The patched ``asyncio.Semaphore.acquire`` (the worker is the task)."""

    async def acquire(self: Any) -> bool:
        semaphore_class = getattr(self, "_lockwatch_class", None)
        if semaphore_class is None:
            return await original(self)
        state = task_state()
        if state.in_lockwatch:
            return await original(self)
        stats = stats_of(state, semaphore_class)
        if not self.locked():
            result = await original(self)
            stats.acquisitions += 1
            _took_permit(self, state, semaphore_class)
            return result
        return await blocked_wait_async(
            self, state, semaphore_class, _permit_wait_ended, original(self)
        )

    return acquire


def async_release_factory(original: Any) -> Any:
    """The patched ``asyncio.Semaphore.release`` (``BoundedSemaphore``'s calls it)."""

    def release(self: Any) -> None:
        original(self)
        semaphore_class = getattr(self, "_lockwatch_class", None)
        if semaphore_class is not None:
            state = task_state()
            if not state.in_lockwatch:
                gave(state, semaphore_class, -1)

    return release


skip_frames_of(globals())
