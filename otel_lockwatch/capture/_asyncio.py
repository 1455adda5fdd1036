"""Watched asyncio locks: ``asyncio.Lock`` and ``AsyncStripedSections``.

The same bookkeeping as every other lock (``_bookkeeping``), with one difference: the worker is
the *task*, so the held-lock stack and the statistics belong to ``asyncio.current_task()``. A lock
is contended when its ``acquire`` cannot complete at once (it is locked, or others queue); only
then is the clock read. A watched ``asyncio.Lock`` keeps its hold in its own ``__dict__``.
"""

from __future__ import annotations

import asyncio
import asyncio.locks
import sys
from collections.abc import Awaitable
from time import perf_counter_ns as _pc
from typing import Any

from .._session import RECORDER
from ..record._recorder import Stats
from ..sections import _asyncio as _array
from ._bookkeeping import (
    check_order,
    current_context,
    holder_entry,
    record_try,
    record_wait,
    stats_of,
    track_hold,
    untrack,
)
from ._fast_path import HeldEntry
from ._naming import LockClass
from ._sections import hold_section, section_release_factory, track_of

__all__ = [
    "async_section_acquire_factory",
    "async_section_release_factory",
    "lock_acquire_factory",
    "lock_release_factory",
]

_getframe = sys._getframe
_LOCKS_GLOBALS = vars(asyncio.locks)
_ARRAY_GLOBALS = vars(_array)
_current_task = asyncio.current_task
_tls = RECORDER.tls


def _state() -> Any:
    """The calling task's state (a thread's, when no loop runs)."""
    try:
        task = _current_task()
    except RuntimeError:  # no running loop: a thread calling in
        task = None
    if task is None:
        try:
            return _tls.st
        except AttributeError:
            return RECORDER.thread_state()
    return RECORDER.task_state(task)


def _caller(skip_globals: dict) -> Any:
    """The acquisition site: the first frame above the instrumented method outside
    ``skip_globals`` (the primitive's own module)."""
    try:
        f: Any = _getframe(2)
    except ValueError:  # called straight from C: no Python caller
        return _getframe(1)
    while f is not None and f.f_globals is skip_globals:
        f = f.f_back
    return f if f is not None else _getframe(1)


async def _timed_wait(
    acquiring: Awaitable[Any],
    st: Any,
    s: Stats,
    cls: LockClass,
    f: Any,
    extra: dict[str, Any] | None = None,
    hold: Any = None,
) -> Any:
    """``_bookkeeping.timed_wait`` for an awaitable: a cancelled wait is recorded as one that
    did not get the lock."""
    ctx = current_context()
    held_by = None if hold is None else holder_entry(hold)
    before, st.waiting = st.waiting, cls  # for the live gauges, as _bookkeeping.timed_wait
    t0 = _pc()
    try:
        ok = await acquiring
    except BaseException:
        record_wait(st, s, cls, t0, _pc(), False, ctx, f, extra, held_by)
        raise
    finally:
        st.waiting = before
    record_wait(st, s, cls, t0, _pc(), ok, ctx, f, extra, held_by)
    return ok


def lock_acquire_factory(original: Any) -> Any:
    """The patched ``asyncio.Lock.acquire``."""

    async def acquire(self: Any) -> bool:
        cls = self.__dict__.get("_lockwatch_class")
        if cls is None:
            return await original(self)
        st = _state()
        if st.in_lockwatch:
            return await original(self)
        s = stats_of(st, cls)
        f = _caller(_LOCKS_GLOBALS)
        if st.held:
            check_order(st, cls, f, self, False)
        waiters = self._waiters
        if not self._locked and not (waiters and any(not w.cancelled() for w in waiters)):
            await original(self)
            s.acquisitions += 1
        else:
            await _timed_wait(original(self), st, s, cls, f, None, self)
        track_hold(self, st, s, HeldEntry((cls, f, f.f_lasti, self, False)))
        return True

    return acquire


def lock_release_factory(original: Any) -> Any:
    """The patched ``asyncio.Lock.release`` (any task may release it)."""

    def release(self: Any) -> None:
        original(self)  # raises RuntimeError when not locked: then nothing changed
        # No other task runs before this one awaits: the hold is still this release's.
        d = self.__dict__
        st = d.get("_lw_holder")
        if st is not None:
            entry = d["_lw_entry"]
            self._lw_holder = self._lw_entry = None  # nothing of the holder outlives the hold
            untrack(st, entry, d["_lw_stats"], d["_lw_start_ns"], d["_lw_context"], None)

    return release


def async_section_acquire_factory(original: Any) -> Any:
    """The instrumented ``AsyncStripedSections._acquire``."""

    async def _acquire(
        self: Any,
        index: int,
        key: Any,
        blocking: bool = True,
        timeout: float | None = None,
        canonical: bool = False,
    ) -> bool:
        st = _state()
        if st.in_lockwatch:
            return await original(self, index, key, blocking, timeout, canonical)
        track = track_of(self)
        cls = track.lock_class
        s = stats_of(st, cls)
        f = _caller(_ARRAY_GLOBALS)
        if blocking:
            if st.held:
                check_order(st, cls, f, self, canonical)
            if await original(self, index, key, False, None, canonical):
                s.acquisitions += 1
            else:
                owner = self._owners[index]
                if owner is not None and owner is _current_task():
                    # the reentry error
                    return await original(self, index, key, True, timeout, canonical)
                holder_key = self._keys[index]
                collision = holder_key is not None and holder_key != key
                if collision:
                    s.collisions += 1
                extra = {"lockwatch.section.index": index, "lockwatch.section.collision": collision}
                acquiring = original(self, index, key, True, timeout, canonical)
                if not await _timed_wait(acquiring, st, s, cls, f, extra, track.slots[index]):
                    return False
        elif not record_try(s, await original(self, index, key, False, None, canonical)):
            return False
        hold_section(track, index, st, s, HeldEntry((cls, f, f.f_lasti, self, canonical)))
        return True

    return _acquire


def async_section_release_factory(original: Any) -> Any:
    """The instrumented ``AsyncStripedSections._release`` (the array's own release hands the
    section to the next waiter, so it is always called)."""
    return section_release_factory(original, mirror=False)
