"""The pure-Python path's wait behind a holder switched out inside lockwatch's own bookkeeping.

A raw lock's ``acquire`` and ``release`` are C calls: between them the interpreter switches
threads only where the program's own code lets it. The pure-Python wrappers add two such places
while the lock is held: the check after the call to the raw ``acquire`` (before the hold is
noted), and the first instruction of ``__exit__`` / ``release`` (before the raw ``release``).
With CPU-bound threads the interpreter's switch request (every ``sys.getswitchinterval()``)
lands there now and then, and the next thread to try the lock finds it held by a thread that
cannot run until the interpreter comes back to it. Blocking then hands the lock, at its release,
to a thread that does not have the interpreter, and the others queue behind that one: a convoy
the program does not have (8 threads x 50,000 ``with L: n += 1`` on CPython 3.11: 15 % of the
acquisitions contended, ``HOT_LOCK_DETECTED`` and 38x the wall time, where the raw lock has
none).

So on this path a failed try looks at the holder first (:func:`in_window`). While the holder is
inside that window (its hold not noted yet, or its innermost frame one of the wrappers' own on
this very lock: Python 3.10 also switches on the way back from the acquire), the waiter gives
the interpreter up for a moment and tries again, without blocking; an acquisition made that way
is not a wait of the program's (the raw lock would not have made it wait) and is counted in
``RECORDER.window_yields`` only. Once the holder is seen in the program's own code, or after
:data:`WINDOW_POLLS` tries, the wait is the program's: it blocks, and is timed from then and
recorded as every other wait. Not from the first failed try: the yields wait for the
interpreter, not the lock, and a loaded machine can keep it from a waiter for hundreds of ms
(8 threads x 25,000 uncontended ``with L: n += 1`` on the pure path, beside 30 busy processes:
waits of 80-336 ms recorded, 63-320 ms of them one yield's sleep; a CI run's 3.15 leg read such
a program as ``STARVATION_OBSERVED``, most likely so). Without the GIL, and for a timed acquire
(whose timeout runs from its call), the wait is timed from the failed try.

The C fast path's wrappers are C calls, with no switch point inside, but the call that ran one
is followed by the interpreter's check, still inside the window: after ``lock.acquire()`` on
every version, and after ``with lock:``'s ``__enter__`` since 3.14 (a call there, where 3.13's
``BEFORE_WITH`` had no check). A switch request that comes during the C bookkeeping lands there,
with the lock held (3.14: 0 to 9 contentions per 200,000 uncontended ``with`` blocks on the C
path). So the C path's failed try comes here too, and a holder whose innermost frame is its
acquisition's site, still at the call that acquired (the entry's frame and offset), is inside
the window.

Without the GIL (the free-threaded build, unless an extension turned it back on) the window is
only a holder that has taken the lock and not noted its hold yet: lockwatch's own code, which
holds the lock where the program's would not, on both paths alike. A holder that has noted its
hold runs on a core of its own whatever its code, so no convoy forms behind it, and a failed try
then is the program's wait; its frame is not looked at there, since reading another thread's
frame stops every thread of the process (``sys._current_frames()``), on each contended
acquisition. (The look gone, 8 threads x 50,000 ``with L: n += 1`` on 3.13t, the C path:
10-18 contentions and 5-6 acquisitions taken by yielding, against 22-189 and 8-545 with it;
docs/performance.md.)
"""

from __future__ import annotations

import sys
import sysconfig
from collections.abc import Callable
from time import perf_counter_ns as _pc
from time import sleep as _sleep
from typing import Any

from .._session import RECORDER
from ..record._recorder import WorkerState
from ..record._stats import Stats
from ._bookkeeping import lock_wait
from ._collection import defer_collection, resume_collection
from ._fast_path import speedups
from ._naming import LockClass

__all__ = [
    "WINDOW_POLLS",
    "in_window",
    "window_code",
    "window_event",
    "window_wait",
    "window_yields",
    "wrapping",
]

#: How many times a waiter yields to one hold inside the window before it blocks.
WINDOW_POLLS = 64
#: How long the first yield sleeps (s), doubling with each yield to the same hold up to
#: :data:`_YIELD_MAX_S`: the interpreter must pass to the holder, which may take several threads'
#: turns (on 3.13 more than on 3.11), and a waiter that came back at once would take it again.
_YIELD_S = 1e-6
_YIELD_MAX_S = 1e-3

# The code of the wrappers' own acquire and release (``window_code`` adds them): a holder whose
# innermost frame runs one of them on the lock waited for is inside the window.
_WINDOW_CODES: set[Any] = set()
_current_frames = sys._current_frames
# The free-threaded build, where the GIL may be off (an extension that does not declare it
# unused turns it on at run time: _gil_enabled() says which, now); a GIL build has it on.
_FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
_gil_enabled: Callable[[], bool] = getattr(sys, "_is_gil_enabled", lambda: True)  # (3.13 on)


def _frame_through_all(ident: int) -> Any:
    # With the cyclic collector held off: up to CPython 3.11, sys._current_frames() makes the
    # threads' frame objects while it holds the runtime's lock of thread states, and a collection
    # set off by one of those allocations that frees a threading.local takes that lock again:
    # the thread waits for itself, holding the interpreter, and the process stops for good
    # (python/cpython#106883; later versions hold the collector off there themselves).
    defer_collection()
    try:
        return _current_frames().get(ident)
    finally:
        resume_collection()


#: The innermost frame of one thread (by ident), or None. ``sys._current_frames()`` makes a frame
#: object for every thread's innermost frame (about 19,000 instructions per look with 18
#: threads, on 3.11); the C path's ``thread_frame`` finds the one thread's. Not on the
#: free-threaded build, where only the interpreter's stop of the world reads another thread's
#: frames safely.
thread_frame = (
    speedups.thread_frame if speedups is not None and not _FREE_THREADED else _frame_through_all
)


def window_code(*functions: Any) -> None:
    """Note functions that acquire or release the lock their ``self`` (or ``hold``) keeps: a
    place where the interpreter switched threads inside one of them, while that lock is held, is
    lockwatch's, not the program's."""
    _WINDOW_CODES.update(function.__code__ for function in functions)


def in_window(hold: Any) -> bool:
    """Whether the thread holding ``hold``'s lock was switched out inside lockwatch's own code:
    between the raw acquire and the notes of the hold (no holder noted yet), in a wrapper's
    acquire or release of that lock, or on the way back from the call that acquired it."""
    holder: WorkerState | None = hold._lw_holder
    if holder is None:
        return True
    if _FREE_THREADED and not _gil_enabled():  # without the GIL, no look at another thread's
        return False  # frame (module docstring)
    owner = holder.thread() if holder.thread is not None else None
    ident = getattr(owner, "ident", None)
    if ident is None:
        return False
    return wrapping(thread_frame(ident), hold)


def wrapping(frame: Any, hold: Any) -> bool:
    """Whether ``frame`` (a thread's innermost) runs a wrapper's acquire or release of ``hold``'s
    lock, or is the site of the hold's acquisition still at the call that acquired it (its
    held-stack entry's frame and offset: the C path's acquire returned, the check after it not
    passed yet)."""
    if frame is None:
        return False
    if frame.f_code in _WINDOW_CODES:
        local = frame.f_locals
        return local.get("self", local.get("hold")) is hold
    entry = getattr(hold, "_lw_entry", None)
    return entry is not None and entry.frame is frame and entry.lasti == frame.f_lasti


def window_yields(lock: Any, stats: Stats, hold: Any, deadline: float | None = None) -> bool:
    """Yield to a holder of ``hold``'s lock inside the window, trying ``lock`` again after each
    yield, until the holder is seen in the program's own code, :data:`WINDOW_POLLS` yields to
    one hold, or ``deadline`` (perf_counter ns). True: taken that way (counted: an acquisition,
    and ``RECORDER.window_yields``); False: the caller waits, as the program would have."""
    polls = 0
    seen = None
    while in_window(hold):
        entry = getattr(hold, "_lw_entry", None)
        if entry is not seen:  # another hold (the last one ended): its holder gets its polls
            seen, polls = entry, 0
        elif polls == WINDOW_POLLS:
            return False
        _sleep(min(_YIELD_S * (1 << polls), _YIELD_MAX_S))
        polls += 1
        if lock.acquire(False):
            stats.acquisitions += 1
            RECORDER.window_yields += 1
            return True
        if deadline is not None and _pc() >= deadline:
            return False
    return False


def window_event(event: Any) -> bool:
    """:func:`window_yields` for the C path (an ``Acquisition``), before its own wait."""
    return window_yields(event.lock, event.stats, event.hold)


def window_wait(
    lock: Any,
    state: WorkerState,
    stats: Stats,
    lock_class: LockClass,
    frame: Any,
    timeout: float = -1,
    hold: Any = None,
) -> bool:
    """:func:`~._bookkeeping.lock_wait` for the pure-Python lock wrappers: first yield to a
    holder inside the window (:func:`window_yields`), then wait (and record the wait) as
    usual. (The C path does the same steps: ``_speedups.c``'s ``lock_wait_here``.)"""
    if timeout == 0 or hold is None:
        return lock_wait(lock, state, stats, lock_class, frame, timeout, hold)
    t0 = _pc()
    deadline = None if timeout < 0 else t0 + timeout * 1e9
    if window_yields(lock, stats, hold, deadline):
        return True
    if deadline is not None:
        timeout = max(0.0, (deadline - _pc()) / 1e9)
    # The yields were the window's (the waiter waited for the interpreter, which a loaded machine
    # can keep from it for hundreds of ms, not for the lock): the program's wait begins now.
    # Without the GIL the holder holds the lock on a core of its own meanwhile, and a timed
    # acquire's timeout runs from its call: those are timed from the failed try.
    started = t0 if _FREE_THREADED or deadline is not None else None
    return lock_wait(lock, state, stats, lock_class, frame, timeout, hold, started)
