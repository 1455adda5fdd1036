"""Watched ``multiprocessing`` locks: the locks and semaphores that cross processes.

``multiprocessing.Lock``, ``RLock``, ``Semaphore`` and ``BoundedSemaphore`` created by watched code
while instrumented are named by their creation site (or ``name_lock``). ``SemLock`` binds
``acquire`` / ``release`` as *instance* attributes (``_make_methods``, from ``__init__`` and
``__setstate__``), so a watched one gets the methods of a small tracker instead, and the class's
``__enter__`` / ``__exit__`` (patched) defer to them. Locks are timed like ``threading`` locks,
through the same bookkeeping (try first, the clock only on contention, per-thread statistics, the
held stack and the lock order); semaphores have no owner, so only their waits and counts are
recorded. A fork child inherits the tracker.

A spawn or forkserver child unpickles the lock: ``__getstate__`` wraps the state in an object
whose unpickling (a function of this module) hands the plain state to ``SemLock.__setstate__``
and remembers the lock's class under the semaphore's name, so the instrumented child names it as
the parent did, and an uninstrumented child still unpickles a plain lock.

The ``*_factory`` functions build what the patch table (``_patches``) installs on ``SemLock``:
wrapt wrappers for ``__init__``, ``__getstate__`` and ``__setstate__`` (a lock's creation and
pickling: a system call or a process away), plain functions for ``__enter__`` and ``__exit__``
(the lock path). :func:`watch` turns the tagging on and off (off also gives every watched lock
its plain methods back).
"""

from __future__ import annotations

import contextlib
import multiprocessing.synchronize as _sync
import sys
import weakref
from time import perf_counter_ns as _pc
from typing import Any

from .._session import OUTBOX, RECORDER, current
from ..record._recorder import WorkerState
from ..record._stats import Stats
from ._bookkeeping import (
    HOLD_FIELDS,
    acquire_tracked,
    caller_frame,
    lock_wait,
    record_try,
    stats_of,
    untrack,
)
from ._naming import LockClass, lock_class, watched_site

__all__ = [
    "RECEIVED",
    "TaggedState",
    "creation_site",
    "rename_factory",
    "semlock_enter_factory",
    "semlock_exit_factory",
    "semlock_getstate_factory",
    "semlock_init_factory",
    "semlock_setstate_factory",
    "untag_all",
]

_KINDS = {
    _sync.Lock: "multiprocessing.Lock",
    _sync.RLock: "multiprocessing.RLock",
    _sync.Semaphore: "multiprocessing.Semaphore",
    _sync.BoundedSemaphore: "multiprocessing.BoundedSemaphore",
}
_CONTEXT_FACTORIES = frozenset({"Lock", "RLock", "Semaphore", "BoundedSemaphore", "Pool"})
_NO_TIMEOUT_TYPES = (int, float)
_WRAPT = "wrapt."  # the modules of wrapt's pure-Python wrappers (the C ones make no frame)
_getframe = sys._getframe
_tls = RECORDER.tls


_TAGGED: weakref.WeakSet[Any] = weakref.WeakSet()
# Semaphore name -> (lock class name, site), learnt while unpickling a watched lock in a child.
RECEIVED: dict[str, tuple[str, str]] = {}


def _recording_state(timeout: Any) -> Any:
    """The calling thread's state, or None when this call is not recorded (lockwatch itself is
    running, or a timeout the tracked path cannot reproduce)."""
    state = RECORDER.thread_state()
    if state.in_lockwatch or (timeout is not None and type(timeout) not in _NO_TIMEOUT_TYPES):
        return None
    return state


# -- trackers: the instance methods of a watched SemLock ------------------------------------------
class _LockTrack:
    """The instrumented ``acquire`` / ``release`` of one ``multiprocessing.Lock`` (in one process).

    Same results and exceptions as the ``_multiprocessing.SemLock`` methods it calls; it keeps
    the hold like a ``threading`` lock proxy (:data:`~._bookkeeping.HOLD_FIELDS`).
    """

    __slots__ = ("semlock", "lock_class", "depth", *HOLD_FIELDS, "__weakref__")
    _lw_holder: WorkerState | None
    _lw_entry: Any
    _lw_stats: Stats
    _lw_start_ns: int
    _lw_context: Any

    def __init__(self, semlock: Any, lock_class: LockClass) -> None:
        self.semlock = semlock
        self.lock_class = lock_class
        self._lw_holder = None
        self.depth = 0

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return self._acquire(block, timeout, caller_frame())

    def _acquire(self, block: Any, timeout: Any, frame: Any) -> bool:
        state = _recording_state(timeout)
        if state is None:
            return self.semlock.acquire(block, timeout)
        return acquire_tracked(self.semlock, self, state, self.lock_class, frame, block, timeout)

    def release(self) -> None:
        holder = self._lw_holder
        if holder is None:
            self.semlock.release()
            return
        self._lw_holder = None
        entry, stats = self._lw_entry, self._lw_stats
        t0, context = self._lw_start_ns, self._lw_context
        self._lw_entry = None  # nothing of the holder (its frame) outlives the hold
        try:
            self.semlock.release()
        except BaseException:  # released too many times: nothing changed
            self._lw_holder, self._lw_entry = holder, entry
            raise
        untrack(holder, entry, stats, t0, context, None)


class _RLockTrack(_LockTrack):
    """A ``multiprocessing.RLock``: re-entry by the owning thread is neither a wait nor an edge."""

    __slots__ = ()

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return self._acquire(block, timeout, caller_frame())

    def _acquire(self, block: Any, timeout: Any, frame: Any) -> bool:
        holder = self._lw_holder
        if holder is not None and holder is getattr(_tls, "st", None):
            ok = self.semlock.acquire(block, timeout)
            if ok:
                self.depth += 1
            return ok
        return _LockTrack._acquire(self, block, timeout, frame)

    def release(self) -> None:
        holder = self._lw_holder
        if holder is None or holder is not getattr(_tls, "st", None):
            self.semlock.release()  # not tracked, or not the owner: the lock decides (and raises)
            return
        if self.depth:
            self.semlock.release()
            self.depth -= 1
            return
        _LockTrack.release(self)


class _SemaphoreTrack(_LockTrack):
    """A ``multiprocessing.Semaphore`` / ``BoundedSemaphore``: waits and counts; no owner, so no
    hold time and no part in the lock order."""

    __slots__ = ()

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return self._acquire(block, timeout, caller_frame())

    def _acquire(self, block: Any, timeout: Any, frame: Any) -> bool:
        semlock = self.semlock
        state = _recording_state(timeout)
        if state is None:
            return semlock.acquire(block, timeout)
        stats = stats_of(state, self.lock_class)
        if not block:
            return record_try(stats, semlock.acquire(False))
        if semlock.acquire(False):
            stats.acquisitions += 1
            return True
        return lock_wait(semlock, state, stats, self.lock_class, frame, timeout)

    def release(self) -> None:
        self.semlock.release()
        state = getattr(_tls, "st", None)
        if state is not None:
            state.last = _pc()


_TRACKS = {
    _sync.Lock: _LockTrack,
    _sync.RLock: _RLockTrack,
    _sync.Semaphore: _SemaphoreTrack,
    _sync.BoundedSemaphore: _SemaphoreTrack,
}


def _tag(lock: Any, lock_class: LockClass) -> None:
    track = _TRACKS[type(lock)](lock._semlock, lock_class)
    attributes = lock.__dict__
    attributes["_lw_track"] = track
    attributes["_lockwatch_class"] = lock_class
    attributes["acquire"] = track.acquire
    attributes["release"] = track.release
    _TAGGED.add(lock)


def _untag(lock: Any) -> None:
    attributes = lock.__dict__
    attributes.pop("_lw_track", None)
    attributes.pop("_lockwatch_class", None)
    lock._make_methods()


def untag_all() -> None:
    """Give every watched lock its plain methods back (``uninstrument()``: new and unpickled
    locks are tagged only while a session is current)."""
    for lock in list(_TAGGED):
        with contextlib.suppress(Exception):  # a lock whose semaphore is gone
            _untag(lock)
    _TAGGED.clear()


def creation_site(instance: Any) -> str | None:
    """The watched creation site of ``instance``, seen from a patched ``__init__`` (the caller of
    this function): the subclasses' ``__init__``, wrapt's frames (without its C extension) and one
    ``multiprocessing.context`` factory are skipped; a lock created inside multiprocessing itself
    (a ``Condition``'s, a queue's) is not watched."""
    depth = 2
    frame: Any = _getframe(depth)
    while frame is not None and (
        frame.f_globals.get("__name__", "").startswith(_WRAPT)  # wrapt without its C extension
        or (frame.f_code.co_name == "__init__" and frame.f_locals.get("self") is instance)
    ):
        depth += 1
        frame = frame.f_back
    if (
        frame is not None
        and frame.f_globals.get("__name__") == "multiprocessing.context"
        and frame.f_code.co_name in _CONTEXT_FACTORIES
    ):
        depth += 1
    return watched_site(depth)


# -- what the patch table installs on SemLock -----------------------------------------------------
def semlock_init_factory(original: Any) -> Any:
    """The wrapt wrapper of ``SemLock.__init__``: a lock created by watched code is tagged."""

    def __init__(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
        wrapped(*args, **kwargs)
        kind = _KINDS.get(type(instance))
        if kind is None or current() is None:
            return
        try:
            site = creation_site(instance)
            if site is not None:
                _tag(instance, lock_class(site, kind, site))
        except Exception as exc:  # never into the host: the plain lock still works
            OUTBOX.failed(exc)

    return __init__


class TaggedState:
    """A watched SemLock's pickled state: unpickles as the plain state, remembering the class."""

    __slots__ = ("state", "name", "site")

    def __init__(self, state: tuple, name: str, site: str) -> None:
        self.state = state
        self.name = name
        self.site = site

    def __reduce__(self) -> tuple:
        return (_received_state, (self.state, self.name, self.site))


def _received_state(state: Any, name: str, site: str) -> Any:
    """Unpickling a watched lock in another process: note its class, return the plain state."""
    try:
        if isinstance(state, tuple) and len(state) >= 4 and isinstance(state[3], str):
            RECEIVED[state[3]] = (name, site)
    except Exception:  # pragma: no cover - never into the host
        pass
    return state


def semlock_getstate_factory(original: Any) -> Any:
    """The wrapt wrapper of ``SemLock.__getstate__``: a watched lock's state names its class."""

    def __getstate__(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        state = wrapped(*args, **kwargs)
        track = instance.__dict__.get("_lw_track")
        if track is None:
            return state
        return TaggedState(state, track.lock_class.name, track.lock_class.site)

    return __getstate__


def semlock_setstate_factory(original: Any) -> Any:
    """The wrapt wrapper of ``SemLock.__setstate__``: a lock unpickled in a watched child takes
    the class its parent gave it."""

    def __setstate__(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
        wrapped(*args, **kwargs)
        if current() is None:
            return
        try:
            state = args[0] if args else kwargs.get("state")
            kind = _KINDS.get(type(instance))
            received = (
                RECEIVED.get(state[3]) if kind is not None and isinstance(state, tuple) else None
            )
            if received is not None:
                _tag(instance, lock_class(received[0], kind, received[1]))  # type: ignore[arg-type]
        except Exception as exc:
            OUTBOX.failed(exc)

    return __setstate__


def semlock_enter_factory(original: Any) -> Any:
    def __enter__(self: Any) -> Any:
        track = self.__dict__.get("_lw_track")
        if track is None:
            return original(self)
        return track._acquire(True, None, caller_frame())

    return __enter__


def semlock_exit_factory(original: Any) -> Any:
    def __exit__(self: Any, *args: Any) -> Any:
        track = self.__dict__.get("_lw_track")
        if track is None:
            return original(self, *args)
        track.release()
        return None

    return __exit__


def _rename(lock: Any, name: str) -> None:
    # name_lock() on a SemLock (found as the class's _lockwatch_rename while instrumented).
    track = lock.__dict__.get("_lw_track")
    if track is None:
        return
    named = lock_class(name, track.lock_class.kind, track.lock_class.site)
    track.lock_class = named
    lock.__dict__["_lockwatch_class"] = named


def rename_factory(original: Any) -> Any:
    """``SemLock._lockwatch_rename`` (absent before): how ``name_lock`` names a SemLock."""
    return staticmethod(_rename)
