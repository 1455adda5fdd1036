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
from ..record._stats import Stats
from ..sections import _asyncio as _array
from ._bookkeeping import (
    check_order,
    current_context,
    holder_entry,
    new_entry,
    record_try,
    record_wait,
    stats_of,
    track_hold,
    untrack,
)
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
        frame: Any = _getframe(2)
    except ValueError:  # called straight from C: no Python caller
        return _getframe(1)
    while frame is not None and frame.f_globals is skip_globals:
        frame = frame.f_back
    return frame if frame is not None else _getframe(1)


async def _timed_wait(
    acquiring: Awaitable[Any],
    state: Any,
    stats: Stats,
    lock_class: LockClass,
    frame: Any,
    extra: dict[str, Any] | None = None,
    hold: Any = None,
) -> Any:
    """``_bookkeeping.timed_wait`` for an awaitable: a cancelled wait is recorded as one that
    did not get the lock."""
    context = current_context()
    held_by = None if hold is None else holder_entry(hold)
    # For the live gauges, as _bookkeeping.timed_wait.
    before, state.waiting = state.waiting, lock_class
    t0 = _pc()
    try:
        ok = await acquiring
    except BaseException:
        record_wait(state, stats, lock_class, t0, _pc(), False, context, frame, extra, held_by)
        raise
    finally:
        state.waiting = before
    record_wait(state, stats, lock_class, t0, _pc(), ok, context, frame, extra, held_by)
    return ok


def lock_acquire_factory(original: Any) -> Any:
    """The patched ``asyncio.Lock.acquire``."""

    async def acquire(self: Any) -> bool:
        lock_class = self.__dict__.get("_lockwatch_class")
        if lock_class is None:
            return await original(self)
        state = _state()
        if state.in_lockwatch:
            return await original(self)
        stats = stats_of(state, lock_class)
        frame = _caller(_LOCKS_GLOBALS)
        if state.held:
            check_order(state, lock_class, frame, self, False)
        waiters = self._waiters
        if not self._locked and not (waiters and any(not waiter.cancelled() for waiter in waiters)):
            await original(self)
            stats.acquisitions += 1
        else:
            await _timed_wait(original(self), state, stats, lock_class, frame, None, self)
        track_hold(self, state, stats, new_entry((lock_class, frame, frame.f_lasti, self, False)))
        return True

    return acquire


def lock_release_factory(original: Any) -> Any:
    """The patched ``asyncio.Lock.release`` (any task may release it)."""

    def release(self: Any) -> None:
        original(self)  # raises RuntimeError when not locked: then nothing changed
        # No other task runs before this one awaits: the hold is still this release's.
        attributes = self.__dict__
        holder = attributes.get("_lw_holder")
        if holder is not None:
            entry = attributes["_lw_entry"]
            self._lw_holder = self._lw_entry = None  # nothing of the holder outlives the hold
            untrack(
                holder,
                entry,
                attributes["_lw_stats"],
                attributes["_lw_start_ns"],
                attributes["_lw_context"],
                None,
            )

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
        state = _state()
        if state.in_lockwatch:
            return await original(self, index, key, blocking, timeout, canonical)
        track = track_of(self)
        lock_class = track.lock_class
        stats = stats_of(state, lock_class)
        frame = _caller(_ARRAY_GLOBALS)
        if blocking:
            if state.held:
                check_order(state, lock_class, frame, self, canonical)
            if await original(self, index, key, False, None, canonical):
                stats.acquisitions += 1
            else:
                owner = self._owners[index]
                if owner is not None and owner is _current_task():
                    # the reentry error
                    return await original(self, index, key, True, timeout, canonical)
                holder_key = self._keys[index]
                collision = holder_key is not None and holder_key != key
                if collision:
                    stats.collisions += 1
                extra = {"lockwatch.section.index": index, "lockwatch.section.collision": collision}
                acquiring = original(self, index, key, True, timeout, canonical)
                if not await _timed_wait(
                    acquiring, state, stats, lock_class, frame, extra, track.slots[index]
                ):
                    return False
        elif not record_try(stats, await original(self, index, key, False, None, canonical)):
            return False
        hold_section(
            track,
            index,
            state,
            stats,
            new_entry((lock_class, frame, frame.f_lasti, self, canonical)),
        )
        return True

    return _acquire


def async_section_release_factory(original: Any) -> Any:
    """The instrumented ``AsyncStripedSections._release`` (the array's own release hands the
    section to the next waiter, so it is always called)."""
    return section_release_factory(original, mirror=False)
