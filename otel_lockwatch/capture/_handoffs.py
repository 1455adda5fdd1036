"""The bookkeeping every hand-off path shares: one routine per step (a wait, a take, a give).

A *hand-off wait* (``Condition.wait``, a blocking queue ``get`` / ``put``, a semaphore's blocking
``acquire``, an ``Event.wait`` or a future's result that blocked) ends only when another worker
hands something over: a ``notify``, a ``put``, a ``release``, a ``set``, a ``set_result``. It is
recorded apart from mutex waits, in the worker's ``handoffs`` (``record._handoff_stats``; the
manifest calls these waits ``signal_waits``, a published name). The condition, queue, semaphore,
event and future paths (``_conditions``, ``_queues``, ``_semaphores``, ``_events``, ``_futures``)
call these after the operation ran, never around it, so the host's object behaves as it always did.
Like ``_bookkeeping``'s, they write only to the calling worker's state (no process-wide lock), and a
wait that blocked also goes to the outbox, for its ``lock.wait`` span (above the wait threshold,
with ``lockwatch.wait.kind = "signal"``, a published value) and its value of the wait histogram,
exactly as a mutex wait does. The clock is read for a take or a give (their hold time needs it) and
around a wait that blocked; never for a call that only passes through.

One routine times a blocked wait on a thread (:func:`blocked_wait`) and one on a task
(:func:`blocked_wait_async`); each path passes what differs: the ``ended`` callback that records
the wait's end (its outcome, and whatever the path adds: a permit taken, a hand-off seen).

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
import weakref
from collections.abc import Awaitable, Callable
from time import perf_counter_ns as _pc
from typing import Any

from .._session import OUTBOX, RECORDER, THRESHOLDS
from ..record._handoff_stats import HANDOFF_FIELDS, HandoffStats
from ..record._recorder import WorkerState
from ._bookkeeping import current_context
from ._fast_path import new_stats, speedups
from ._naming import LockClass, excluded_caller, site_of

__all__ = [
    "HANDOFF_EXTRA",
    "Ended",
    "add_give",
    "blocked_wait",
    "blocked_wait_async",
    "excluded_wait",
    "gave",
    "give_hook",
    "handoff_stats",
    "record_wait",
    "running_task_state",
    "skip_frames_of",
    "stamp",
    "task_state",
    "thread_state",
    "took",
    "woke",
]

#: The span attribute of a hand-off wait (its value is a published name).
HANDOFF_EXTRA = {"lockwatch.wait.kind": "signal"}

#: ``ended(obj, state, lock_class, t0, context, result, raised)``: what a path records when a
#: blocked wait ends (``result`` the wait's, None when it ``raised``).
Ended = Callable[[Any, WorkerState, LockClass, int, Any, Any, bool], None]

_tls = RECORDER.tls  # never replaced: Recorder.reset() keeps it
_current_task = asyncio.current_task
# Frames that are not the site of a wait: the hand-off paths' own, and the primitives' internals.
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
    running: the hand-over it makes is no worker's) or outside a loop."""
    try:
        task = _current_task()
    except RuntimeError:
        return None
    return None if task is None else RECORDER.task_state(task)


def handoff_stats(state: WorkerState, lock_class: LockClass) -> HandoffStats:
    """The worker's statistics for the class (made on first use, with its empty ``Stats``)."""
    stats = state.handoffs.get(lock_class)
    if stats is None:
        stats = state.handoffs[lock_class] = HandoffStats()
        if lock_class not in state.stats:
            state.stats[lock_class] = new_stats()
    return stats


def blocked_wait(
    obj: Any,
    state: WorkerState,
    lock_class: LockClass,
    ended: Ended,
    wait: Any,
    *args: Any,
    enrol: bool = True,
) -> Any:
    """``wait(*args)``, a call that blocks until a peer hands something over, timed as a
    hand-off wait of the thread's ``state`` on ``lock_class``; ``ended(obj, ...)`` records its
    end. ``enrol``: the worker is one of the class's from the start (it counts as alive while it
    waits), unless the call may raise before it waits (a condition's lock not held), when it is
    from the wait's end. Its result or exception is the caller's."""
    started = _started(state, lock_class, enrol)
    try:
        result = wait(*args)
    except BaseException:  # interrupted while waiting (a timeout, a KeyboardInterrupt)
        _ended(started, ended, obj, state, lock_class, None, True)
        raise
    _ended(started, ended, obj, state, lock_class, result, False)
    return result


async def blocked_wait_async(
    obj: Any,
    state: WorkerState,
    lock_class: LockClass,
    ended: Ended,
    waiting: Awaitable[Any],
    enrol: bool = True,
) -> Any:
    """``await waiting``: :func:`blocked_wait` for a task (``state`` the task's)."""
    started = _started(state, lock_class, enrol)
    try:
        return_value = await waiting
    except BaseException:  # cancelled (a timeout around it): it gave up
        _ended(started, ended, obj, state, lock_class, None, True)
        raise
    _ended(started, ended, obj, state, lock_class, return_value, False)
    return return_value


def _started(state: WorkerState, lock_class: LockClass, enrol: bool) -> tuple[Any, Any, int]:
    """A blocked wait begins: the worker's ``waiting`` before it, the context, the clock."""
    if enrol:  # a worker of the class from now: it counts as alive while it waits
        try:
            handoff_stats(state, lock_class)
        except Exception as exc:
            OUTBOX.failed(exc)
    context = current_context()
    before, state.waiting = state.waiting, lock_class  # for the live gauges
    return before, context, _pc()


def _ended(
    started: tuple[Any, Any, int],
    ended: Ended,
    obj: Any,
    state: WorkerState,
    lock_class: LockClass,
    result: Any,
    raised: bool,
) -> None:
    """A blocked wait ended: the worker waits no more, and the path records it."""
    before, context, t0 = started
    state.waiting = before
    try:
        ended(obj, state, lock_class, t0, context, result, raised)
    except Exception as exc:  # never into the host
        OUTBOX.failed(exc)


def record_wait(
    state: WorkerState, lock_class: LockClass, t0: int, t1: int, ok: bool, context: Any, give: bool
) -> None:
    """A hand-off wait from ``t0`` to ``t1`` that blocked; ``ok`` False when it gave up;
    ``give`` True for a wait to give (a ``put`` on a full queue)."""
    try:
        stats = handoff_stats(state, lock_class)
        waited_ns = t1 - t0
        if give:
            stats.give_waits += 1
            stats.give_wait_ns += waited_ns
        else:
            stats.waits += 1
            stats.wait_ns += waited_ns
        if not ok:
            stats.timeouts += 1
        _count(stats.wait_histogram, waited_ns)
        if waited_ns > stats.wait_max_ns:
            stats.wait_max_ns = waited_ns
        if waited_ns < stats.wait_min_ns:
            stats.wait_min_ns = waited_ns
        state.last = t1
        span_ns = THRESHOLDS.wait_span_ns
        state.in_lockwatch = True
        OUTBOX.wait(
            lock_class,
            t0,
            t1,
            context,
            "acquired" if ok else "timed_out",
            span_ns,
            HANDOFF_EXTRA,
            _site() if waited_ns >= span_ns else None,
        )
    except Exception as exc:  # never into the host
        OUTBOX.failed(exc)
    finally:
        state.in_lockwatch = False


def _count(histogram: dict[int, int], ns: int) -> None:
    """One sample of ``ns`` in a log-linear histogram's buckets (``record._histogram``'s)."""
    bits = ns.bit_length()
    bucket = ((bits - 5) << 4) + (ns >> (bits - 5)) if bits > 5 else ns
    histogram[bucket] = histogram.get(bucket, 0) + 1


def took(state: WorkerState, lock_class: LockClass, left: int, capacity: int) -> None:
    """A take (a checkout): ``left`` items or permits remain, of ``capacity`` (-1: unknown)."""
    try:
        now = _pc()
        stats = handoff_stats(state, lock_class)
        stats.takes += 1
        stats.pending.append(now)
        stats.fewest = min(stats.fewest, left)
        stats.most = max(stats.most, capacity)
        state.last = now
    except Exception as exc:
        OUTBOX.failed(exc)


def gave(state: WorkerState, lock_class: LockClass, held: int) -> None:
    """A give (a checkin, a notify): ``held`` items are in the queue now (-1: not a queue)."""
    try:
        now = _pc()
        stats = state.handoffs.get(lock_class)
        if stats is None:
            stats = handoff_stats(state, lock_class)
        stats.gives += 1
        pending = stats.pending
        if pending:
            held_ns = now - pending.pop()
            stats.hold_total_ns += held_ns
            _count(stats.hold_histogram, held_ns)
            if held_ns > stats.hold_max_ns:
                stats.hold_max_ns = held_ns
            if held_ns < stats.hold_min_ns:
                stats.hold_min_ns = held_ns
        if held > stats.most:
            stats.most = held
        state.last = now
    except Exception as exc:
        OUTBOX.failed(exc)


def give_hook(obj: Any, name: str, plain: Any, waking: Any, find_state: Any) -> None:
    """Give ``obj`` a method ``name`` of its own (an instance attribute holding ``obj`` weakly):
    ``plain(obj, ...)``, after the give of the worker ``find_state()`` returns when
    ``waking(obj)`` says the call ends a blocked wait (stamped first: the waiter reads it when it
    wakes). An event's ``set``, a thread's future's ``set_result``."""
    ref = weakref.ref(obj)

    def hook(*args: Any) -> Any:
        current = ref()
        if current is None:  # nobody can be waiting on it
            return None
        if waking(current):
            stamp(current, find_state, current._lockwatch_class)
        return plain(current, *args)

    hook.__name__, hook.__doc__ = name, plain.__doc__
    setattr(obj, name, hook)


def stamp(obj: Any, find_state: Any, lock_class: LockClass) -> None:
    """A set that ends a blocked wait on ``obj``: the setter's give, and whether it was a
    peer's (``obj._lw_peer``, read by the waiter when it wakes)."""
    try:
        obj._lw_peer = not excluded_wait() and woke(find_state, lock_class)
    except Exception as exc:  # a subclass with no room for it: no hand-off is seen
        OUTBOX.failed(exc)


def woke(find_state: Any, lock_class: LockClass) -> bool:
    """A give that ended another worker's wait and pairs with no checkout (an event's ``set``,
    a future's result): one give of the worker ``find_state()`` returns (None: no worker).
    Returns whether that worker waits on the class itself (a hand-off between peers:
    :func:`add_give`)."""
    try:
        state = find_state()
        if state is None or state.in_lockwatch:
            return False
        stats = state.handoffs.get(lock_class)
        if stats is None:
            stats = handoff_stats(state, lock_class)
        stats.gives += 1
        state.last = _pc()
        return stats.waits > 0
    except Exception as exc:
        OUTBOX.failed(exc)
        return False


def add_give(state: WorkerState, lock_class: LockClass) -> None:
    """One give that pairs with no take and needs no clock: a condition's ``notify`` (made under
    the lock, whose release reads the clock), or a wait on an event or a future that a peer
    ended, one that waits on the class too (the waiter is in the pool's chain of hand-offs: it
    will hand on what it was handed, and a hand-on with nobody waiting sets nothing to see)."""
    try:
        stats = state.handoffs.get(lock_class)
        if stats is None:
            stats = handoff_stats(state, lock_class)
        stats.gives += 1
    except Exception as exc:
        OUTBOX.failed(exc)


if speedups is not None:
    # A take and a give run on every checkout and checkin: the C path records them alike.
    speedups.setup_handoffs(handoff_stats=handoff_stats, fields=(HandoffStats, HANDOFF_FIELDS))
    took = speedups.took  # noqa: F811
    gave = speedups.gave  # noqa: F811


def excluded_wait() -> bool:
    """Whether the waiting (or handing-over) code, the first frame outside lockwatch's hand-off
    paths and the primitives' modules, is OpenTelemetry's, ``logging``'s or lockwatch's or
    called by them (checked when a wait on an object made per request blocks: the naming leaves
    it to the wait)."""
    try:
        frame: Any = sys._getframe(1)
        while frame is not None and id(frame.f_globals) in _SKIPPED:
            frame = frame.f_back
        return excluded_caller(frame)
    except Exception as exc:  # an odd module (a __name__ that is no str): recorded as any wait
        OUTBOX.failed(exc)
        return False


def _site() -> str | None:
    """``module:function:line`` of the code that waited: the first frame outside lockwatch's
    hand-off paths and the primitives' own modules."""
    frame: Any = sys._getframe(1)
    while frame is not None and id(frame.f_globals) in _SKIPPED:
        frame = frame.f_back
    return site_of(frame) if frame is not None else None


skip_frames_of(globals(), vars(threading), vars(queue), vars(asyncio.locks))
