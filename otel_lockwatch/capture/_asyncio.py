"""The hot path under asyncio: ``asyncio.Lock``, ``asyncio.Semaphore`` and ``AsyncStripedSections``.

The same rules as ``_wrappers``, with one difference: the worker is the *task*, so the held-lock
stack and the statistics belong to ``asyncio.current_task()``. A lock is contended when its
``acquire`` cannot complete at once (it is locked, or others queue); only then is the clock read.
"""

from __future__ import annotations

import asyncio
import asyncio.locks
import sys
from time import perf_counter_ns as _pc
from typing import Any

from ..record._recorder import RECORDER, Stats
from ._wrappers import (
    _check_order,
    _ctx_get,
    _hold_section,
    _record_wait,
    _untrack,
    section_release_factory,
    track_of,
)

__all__ = [
    "async_section_acquire_factory",
    "async_section_release_factory",
    "lock_acquire_factory",
    "lock_release_factory",
    "semaphore_acquire_factory",
]

_getframe = sys._getframe
_LOCKS_GLOBALS = vars(asyncio.locks)
_current_task = asyncio.current_task
_tls = RECORDER.tls


def _state() -> Any:
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
    try:
        f: Any = _getframe(2)
    except ValueError:  # called straight from C: no Python caller
        return _getframe(1)
    while f is not None and f.f_globals is skip_globals:
        f = f.f_back
    return f if f is not None else _getframe(1)


def _stats(st: Any, cls: Any) -> Stats:
    s = st.stats.get(cls)
    if s is None:
        s = st.stats[cls] = Stats()
    return s


def lock_acquire_factory(original: Any) -> Any:
    """The instrumented ``asyncio.Lock.acquire``."""

    async def acquire(self: Any) -> bool:
        cls = self.__dict__.get("_lockwatch_class")
        if cls is None:
            return await original(self)
        st = _state()
        if st.busy:
            return await original(self)
        s = _stats(st, cls)
        f = _caller(_LOCKS_GLOBALS)
        if st.held:
            _check_order(st, cls, f, self, False)
        waiters = self._waiters
        if not self._locked and not (waiters and any(not w.cancelled() for w in waiters)):
            await original(self)
            s.acq += 1
        else:
            ctx = _ctx_get()
            t0 = _pc()
            try:
                await original(self)
            except BaseException:
                _record_wait(st, s, cls, t0, _pc(), False, ctx, f, None)  # cancelled while waiting
                raise
            _record_wait(st, s, cls, t0, _pc(), True, ctx, f, None)
        entry = (cls, f, f.f_lasti, self, False)
        st.held.append(entry)
        self._lw_track = (st, entry, s, _pc(), _ctx_get())
        return True

    acquire.__wrapped__ = original  # type: ignore[attr-defined]
    acquire.__doc__ = original.__doc__
    return acquire


def lock_release_factory(original: Any) -> Any:
    """The instrumented ``asyncio.Lock.release`` (any task may release it)."""

    def release(self: Any) -> None:
        original(self)  # raises RuntimeError when not locked: then nothing changed
        track = self.__dict__.get("_lw_track")
        if track is not None:
            self._lw_track = None
            st, entry, s, t0, ctx = track
            _untrack(st, entry, s, t0, ctx, None)

    release.__wrapped__ = original  # type: ignore[attr-defined]
    release.__doc__ = original.__doc__
    return release


def semaphore_acquire_factory(original: Any) -> Any:
    """The instrumented ``asyncio.Semaphore.acquire``: waits and counts (no owner)."""

    async def acquire(self: Any) -> bool:
        cls = self.__dict__.get("_lockwatch_class")
        if cls is None:
            return await original(self)
        st = _state()
        if st.busy:
            return await original(self)
        s = _stats(st, cls)
        if not self.locked():
            result = await original(self)
            s.acq += 1
            return result
        ctx = _ctx_get()
        t0 = _pc()
        try:
            result = await original(self)
        except BaseException:
            _record_wait(st, s, cls, t0, _pc(), False, ctx, _caller(_LOCKS_GLOBALS), None)
            raise
        _record_wait(st, s, cls, t0, _pc(), True, ctx, _caller(_LOCKS_GLOBALS), None)
        return result

    acquire.__wrapped__ = original  # type: ignore[attr-defined]
    acquire.__doc__ = original.__doc__
    return acquire


def async_section_acquire_factory(original: Any, sections_module_globals: dict) -> Any:
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
        if st.busy:
            return await original(self, index, key, blocking, timeout, canonical)
        track = track_of(self)
        cls = track.cls
        s = _stats(st, cls)
        f = _caller(sections_module_globals)
        if blocking:
            if st.held:
                _check_order(st, cls, f, self, canonical)
            if await original(self, index, key, False, None, canonical):
                s.acq += 1
            else:
                owner = self._owners[index]
                if owner is not None and owner is _current_task():
                    return await original(
                        self, index, key, True, timeout, canonical
                    )  # the reentry error
                holder_key = self._keys[index]
                collision = holder_key is not None and holder_key != key
                if collision:
                    s.coll += 1
                ctx = _ctx_get()
                t0 = _pc()
                extra = {"lockwatch.section.index": index, "lockwatch.section.collision": collision}
                try:
                    ok = await original(self, index, key, True, timeout, canonical)
                except BaseException:
                    _record_wait(st, s, cls, t0, _pc(), False, ctx, f, extra)
                    raise
                _record_wait(st, s, cls, t0, _pc(), ok, ctx, f, extra)
                if not ok:
                    return False
        elif await original(self, index, key, False, None, canonical):
            s.acq += 1
            s.tryok += 1
        else:
            s.skip += 1
            return False
        _hold_section(track, index, st, s, (cls, f, f.f_lasti, self, canonical))
        return True

    _acquire.__wrapped__ = original  # type: ignore[attr-defined]
    return _acquire


def async_section_release_factory(original: Any) -> Any:
    """The instrumented ``AsyncStripedSections._release`` (the array's own release hands the
    section to the next waiter, so it is always called)."""
    return section_release_factory(original, mirror=False)
