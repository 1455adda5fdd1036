"""The bookkeeping every signal path shares: one routine per step (a wait, a take, a give).

A signal wait (``Condition.wait``, a blocking queue ``get`` / ``put``, a semaphore's blocking
``acquire``, an ``Event.wait`` or a future's result that blocked) ends only when another worker
signals, so it is recorded apart from mutex waits, in the worker's ``signals``
(``record._signals``). The condition, queue and semaphore paths (``_conditions``, ``_queues``,
``_semaphores``, ``_events``, ``_futures``) call these after the operation ran, never around it, so
the host's object behaves as it always did. Like ``_bookkeeping``'s, they write only to the calling
worker's state (no process-wide lock), and a wait that blocked also goes to the outbox, for its
``lock.wait`` span (above the wait threshold, with ``lockwatch.wait.kind = "signal"``) and its
value of the wait histogram, exactly as a mutex wait does. The clock is read for a take or a give
(their hold time needs it) and around a wait that blocked; never for a call that only passes
through.

A worker that touches a class here is a worker of that class in the recorder too (an empty
``Stats`` entry, written once): it then has an observed time, and the class a lock entry, even
when it never takes the class's mutex (a queue's mutex is not watched).

Nothing here raises into the host program.
"""

from __future__ import annotations

import asyncio
import asyncio.locks
import queue
import sys
import threading
from time import perf_counter_ns as _pc
from typing import Any

from .._session import OUTBOX, RECORDER
from ..record._recorder import WorkerState
from ..record._signals import SIGNAL_FIELDS, SignalStats
from . import _bookkeeping
from ._fast_path import new_stats, speedups
from ._naming import LockClass, excluded_caller, site_of

__all__ = [
    "SIGNAL_EXTRA",
    "excluded_wait",
    "gave",
    "handed",
    "signal_stats",
    "signalled",
    "skip_frames_of",
    "running_task_state",
    "task_state",
    "thread_state",
    "took",
    "waited",
]

#: The span attribute of a signal wait.
SIGNAL_EXTRA = {"lockwatch.wait.kind": "signal"}

_tls = RECORDER.tls  # never replaced: Recorder.reset() keeps it
_current_task = asyncio.current_task
# Frames that are not the site of a wait: the signal paths' own, and the primitives' internals.
_SKIPPED: set[int] = set()


def skip_frames_of(*module_globals: dict) -> None:
    """Frames running in these modules are never a wait's site (their callers are)."""
    _SKIPPED.update(id(g) for g in module_globals)


def thread_state() -> WorkerState:
    """The calling thread's ``WorkerState``."""
    try:
        return _tls.st
    except AttributeError:
        return RECORDER.thread_state()


def task_state() -> WorkerState:
    """The ``WorkerState`` of the running asyncio task (of the thread when there is none)."""
    try:
        task = _current_task()
    except RuntimeError:  # no running loop: a thread calling in
        task = None
    return thread_state() if task is None else RECORDER.task_state(task)


def running_task_state() -> WorkerState | None:
    """The ``WorkerState`` of the running asyncio task; None in a loop's callback (no task is
    running: the signal it makes is no worker's) or outside a loop."""
    try:
        task = _current_task()
    except RuntimeError:
        return None
    return None if task is None else RECORDER.task_state(task)


def signal_stats(st: WorkerState, cls: LockClass) -> SignalStats:
    """The worker's statistics for the class (made on first use, with its empty ``Stats``)."""
    s = st.signals.get(cls)
    if s is None:
        s = st.signals[cls] = SignalStats()
        if cls not in st.stats:
            st.stats[cls] = new_stats()
    return s


def waited(
    st: WorkerState, cls: LockClass, t0: int, t1: int, ok: bool, ctx: Any, give: bool
) -> None:
    """A signal wait from ``t0`` to ``t1`` that blocked; ``ok`` False when it gave up; ``give``
    True for a wait to give (a ``put`` on a full queue)."""
    try:
        s = signal_stats(st, cls)
        w = t1 - t0
        if give:
            s.give_waits += 1
            s.give_wait_ns += w
        else:
            s.waits += 1
            s.wait_ns += w
        if not ok:
            s.timeouts += 1
        b = w.bit_length()
        b = ((b - 5) << 4) + (w >> (b - 5)) if b > 5 else w
        hist = s.wait_histogram
        hist[b] = hist.get(b, 0) + 1
        if w > s.wait_max_ns:
            s.wait_max_ns = w
        if w < s.wait_min_ns:
            s.wait_min_ns = w
        st.last = t1
        span_ns = _bookkeeping.WAIT_SPAN_NS
        st.in_lockwatch = True
        OUTBOX.wait(
            cls,
            t0,
            t1,
            ctx,
            "acquired" if ok else "timed_out",
            span_ns,
            SIGNAL_EXTRA,
            _site() if w >= span_ns else None,
        )
    except Exception as exc:  # never into the host
        OUTBOX.failed(exc)
    finally:
        st.in_lockwatch = False


def took(st: WorkerState, cls: LockClass, left: int, capacity: int) -> None:
    """A take (a checkout): ``left`` items or permits remain, of ``capacity`` (-1: unknown)."""
    try:
        now = _pc()
        s = signal_stats(st, cls)
        s.takes += 1
        s.pending.append(now)
        if left < s.fewest:
            s.fewest = left
        if capacity > s.most:
            s.most = capacity
        st.last = now
    except Exception as exc:
        OUTBOX.failed(exc)


def gave(st: WorkerState, cls: LockClass, held: int) -> None:
    """A give (a checkin, a signal): ``held`` items are in the queue now (-1: not a queue)."""
    try:
        now = _pc()
        s = st.signals.get(cls)
        if s is None:
            s = signal_stats(st, cls)
        s.gives += 1
        pending = s.pending
        if pending:
            h = now - pending.pop()
            s.hold_total_ns += h
            b = h.bit_length()
            b = ((b - 5) << 4) + (h >> (b - 5)) if b > 5 else h
            hist = s.hold_histogram
            hist[b] = hist.get(b, 0) + 1
            if h > s.hold_max_ns:
                s.hold_max_ns = h
            if h < s.hold_min_ns:
                s.hold_min_ns = h
        if held > s.most:
            s.most = held
        st.last = now
    except Exception as exc:
        OUTBOX.failed(exc)


def signalled(state: Any, cls: LockClass) -> bool:
    """A signal that ended another worker's wait and pairs with no checkout (an event's ``set``,
    a future's result): one give of the worker ``state()`` returns (None: no worker). Returns
    whether that worker waits on the class itself (a hand-off between peers: :func:`handed`)."""
    try:
        st = state()
        if st is None or st.in_lockwatch:
            return False
        s = st.signals.get(cls)
        if s is None:
            s = signal_stats(st, cls)
        s.gives += 1
        st.last = _pc()
        return s.waits > 0
    except Exception as exc:
        OUTBOX.failed(exc)
        return False


def handed(st: WorkerState, cls: LockClass) -> None:
    """A wait on an event or a future that a peer ended, one that waits on the class too: the
    waiter is in the pool's chain of hand-offs, and that counts as one signal of its own (it
    will hand on what it was handed, and a hand-on with nobody waiting sets nothing to see)."""
    try:
        s = st.signals.get(cls)
        if s is None:
            s = signal_stats(st, cls)
        s.gives += 1
    except Exception as exc:
        OUTBOX.failed(exc)


if speedups is not None:
    # A take and a give run on every checkout and checkin: the C path records them alike.
    speedups.setup_signals(signal_stats=signal_stats, fields=(SignalStats, SIGNAL_FIELDS))
    took = speedups.took  # noqa: F811
    gave = speedups.gave  # noqa: F811


def excluded_wait() -> bool:
    """Whether the waiting (or signalling) code, the first frame outside lockwatch's signal paths
    and the primitives' modules, is OpenTelemetry's, ``logging``'s or lockwatch's or called by
    them (checked when a wait on an object made per request blocks: ``_naming.class_of_call``
    leaves it to the wait)."""
    try:
        f: Any = sys._getframe(1)
        while f is not None and id(f.f_globals) in _SKIPPED:
            f = f.f_back
        return excluded_caller(f)
    except Exception as exc:  # an odd module (a __name__ that is no str): recorded as any wait
        OUTBOX.failed(exc)
        return False


def _site() -> str | None:
    """``module:function:line`` of the code that waited: the first frame outside lockwatch's
    signal paths and the primitives' own modules."""
    f: Any = sys._getframe(1)
    while f is not None and id(f.f_globals) in _SKIPPED:
        f = f.f_back
    return site_of(f) if f is not None else None


skip_frames_of(globals(), vars(threading), vars(queue), vars(asyncio.locks))
