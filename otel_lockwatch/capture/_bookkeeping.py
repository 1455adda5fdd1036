"""The bookkeeping every watched lock shares: one routine per step of a lock's life.

Every wrapper (the ``threading`` proxies, the section paths, ``asyncio``, ``multiprocessing``)
runs the same steps around the real acquire and release and calls the same function for each;
the C fast path (``_fast_path``) runs the uncontended steps in C and calls these for the rest.

- :func:`check_order` (``_order_check``): before a blocking acquire made while other locks are
  held, the new lock-order edges go to the graph.
- The non-blocking acquire is tried first; :func:`record_try` counts a try-acquire.
- :func:`timed_wait` (:func:`lock_wait` for a lock's own ``acquire``): only when the try failed
  is the clock read (lock_stat and Abseil record contention only on the slow path), the lock
  class is noted as the worker's ``waiting`` while it blocks (the live gauges read it), and
  :func:`record_wait` counts the wait and leaves its sites and its record for OpenTelemetry to
  be filed off the lock path (``record._waits``).
- :func:`track_hold`: the lock is held; its entry goes on the worker's held stack, and the object
  that keeps the hold notes what the release will need.
- :func:`untrack`: the release; the entry comes off the stack and the hold is recorded (and
  queued, from the metric floor on: :func:`record_hold`).
- :func:`acquire_tracked`: the whole acquire of a lock whose ``acquire(blocking, timeout)`` is
  the stdlib's (``threading``, ``multiprocessing``): the steps above, in order.

Counters and histograms go to the calling worker's :class:`~..record._recorder.Stats`: no
process-wide lock. OpenTelemetry is reached only through the outbox, on the slow path.

A held-stack entry is a ``HeldEntry`` (``_fast_path``: ``lock_class``, ``frame``, ``lasti``,
``lock``, ``canonical``), pushed once the lock is taken: the frame's code and the instruction
offset at the acquisition give its site later, when a lock-order edge needs it, without reading
``f_lineno`` now (which costs more than the rest of the entry).

An object that keeps a hold (a lock proxy, a section's :class:`Hold`, a ``multiprocessing``
lock's tracker, an ``asyncio.Lock``) has the attributes :data:`HOLD_FIELDS`. A release reads them
*before* the lock is free: from then on another thread may take it and overwrite them.

Nothing here raises into the host program, except, under the ``raise`` policy,
:class:`~..exceptions.PotentialDeadlockError` before a blocking acquire that would close a cycle.
"""

from __future__ import annotations

import logging
import sys
import sysconfig
import threading
from _thread import get_ident as _get_ident
from collections.abc import Callable
from time import perf_counter_ns as _pc
from typing import Any

from opentelemetry import context as otel_context

from .._session import OUTBOX, RECORDER, THRESHOLDS, Thresholds
from ..record import _recorder
from ..record._histogram import bucket_of
from ..record._peak import PEAK_FIELDS
from ..record._recorder import THREAD_FIELDS, WORKER_FIELDS, WorkerState
from ..record._sites import UNKNOWN
from ..record._stats import STATS_FIELDS, Stats
from ..record._threads import current_thread_name
from ._collection import defer_collection, resume_collection
from ._fast_path import HeldEntry, new_stats, speedups
from ._naming import LockClass
from ._order_check import check_order, discard, entry_site

__all__ = [
    "HOLD_FIELDS",
    "Hold",
    "acquire_tracked",
    "caller_frame",
    "check_order",
    "current_context",
    "discard",
    "entry_site",
    "holder_entry",
    "lock_wait",
    "new_entry",
    "record_try",
    "record_wait",
    "stats_of",
    "timed_wait",
    "track_hold",
    "untrack",
]

logger = logging.getLogger("otel_lockwatch")

_tls = RECORDER.tls  # never replaced: Recorder.reset() keeps it
_getframe = sys._getframe

try:  # the ContextVar behind opentelemetry.context.get_current(): one C call on the hot path
    from opentelemetry.context import _RUNTIME_CONTEXT

    current_context = _RUNTIME_CONTEXT._current_context.get  # type: ignore[attr-defined]
except Exception:  # another runtime context: the public (slower) call
    current_context = otel_context.get_current


#: How many held entries' worth of ballast a thread keeps on the free-threaded build (none on
#: the others). Its collector counts each thread's allocations of tracked objects (less its
#: frees) and may set a collection off at every 512th, on that thread: the program's short-lived
#: objects come from free lists and are not counted, but a held entry is, and, alive for the
#: hold, made the thread's critical sections the highs of its count, where the 512th falls: a
#: collection set off there ran the finalizers under the program's lock, and one that takes it
#: waited for itself forever (tests/test_finalizers.py; plain, never). So each new entry first
#: frees one object of the thread's ballast, made while it held nothing: the count stays where
#: the program left it; the ballast is made again after a release that leaves the thread
#: holding nothing (:func:`untrack`), where a collection runs with no lock held. The C path
#: fills in spare entries made there instead (``_speedups.c``'s ``spare_entry``): this path's
#: entries are tuples, which cannot be filled in.
BALLAST = 8 if sysconfig.get_config_var("Py_GIL_DISABLED") else 0


def _ballasted_entry(fields: tuple) -> Any:
    ballast = getattr(_tls, "ballast", None)  # (none made yet on this thread)
    if ballast:
        ballast.pop()
    return HeldEntry(fields)


def _fill_ballast() -> None:
    ballast = getattr(_tls, "ballast", None)
    if ballast is None:
        ballast = _tls.ballast = []
    while len(ballast) < BALLAST:
        ballast.append(HeldEntry((None, None, 0, None, False)))


#: ``HeldEntry((lock_class, frame, lasti, lock, canonical))``, the ballast dropped first where
#: the build keeps one (:data:`BALLAST`): how every path in Python makes a held entry.
new_entry = _ballasted_entry if BALLAST else HeldEntry


def caller_frame() -> Any:
    """The frame that called the function calling this one: the acquisition site (that function's
    own frame when C called it, with no Python caller)."""
    try:
        return _getframe(2)
    except ValueError:
        return _getframe(1)


def stats_of(state: WorkerState, lock_class: LockClass) -> Stats:
    """The worker's :class:`Stats` for a lock class, created on first use (other locks may be
    held: with the collector off, ``_collection``)."""
    stats = state.stats.get(lock_class)
    if stats is None:
        defer_collection()
        try:
            stats = state.stats[lock_class] = new_stats()
        finally:
            resume_collection()
    return stats


def holder_entry(hold: Any) -> Any:
    """The held-stack entry of the last hold that ``hold`` (the object that keeps a lock's hold)
    tracked: the holder a waiter arrived during, or the one that released (or handed over) in
    the moment between the waiter's failed try and this look; None if none was ever watched, or
    once a release let go of it (its ``frame`` None once released: nothing of a holder outlives
    its hold but what a waiter that arrived during it keeps)."""
    try:
        return hold._lw_entry
    except AttributeError:  # never held yet
        return None


# -- the acquire -----------------------------------------------------------------------------
def record_try(stats: Stats, ok: bool) -> bool:
    """Count a non-blocking attempt; returns ``ok``."""
    if ok:
        stats.acquisitions += 1
        stats.try_acquisitions += 1
    else:
        stats.skipped += 1
    return ok


def record_wait(
    state: WorkerState,
    stats: Stats,
    lock_class: LockClass,
    t0: int,
    t1: int,
    ok: bool,
    context: Any,
    frame: Any,
    extra: dict[str, Any] | None,
    held_by: Any = None,
) -> None:
    """Count a blocking attempt that had to wait from ``t0`` to ``t1`` (``ok``: it got the lock)
    at its site (``frame``) while the held-stack entry ``held_by`` held the lock (None:
    unknown); its sites and its record for OpenTelemetry (``extra``: more span attributes) are
    filed later, off the lock path (``record._waits``)."""
    waited_ns = t1 - t0
    stats.contentions += 1
    stats.wait_total_ns += waited_ns
    histogram = stats.wait_histogram
    bucket = bucket_of(waited_ns)
    histogram[bucket] = histogram.get(bucket, 0) + 1
    if waited_ns > stats.wait_max_ns:
        stats.wait_max_ns = waited_ns
    if waited_ns < stats.wait_min_ns:
        stats.wait_min_ns = waited_ns
    if ok:
        stats.acquisitions += 1
    else:
        stats.timeouts += 1
    # The rest is filed off the lock path (record._waits): what a later look could not have is
    # taken now. It allocates under the lock it took (or others held): _collection.
    state.in_lockwatch = True
    defer_collection()
    try:
        holder_frame = None if held_by is None else held_by.frame  # None: released before
        holder = None if holder_frame is None else (holder_frame.f_code, held_by.lasti)
        waiter = UNKNOWN if frame is None else (frame.f_code, frame.f_lasti)
        span_ns = THRESHOLDS.wait_span_ns
        site = thread = None
        if waited_ns >= span_ns:  # its span names both sites and the thread
            if frame is not None:
                site = (frame.f_globals.get("__name__", "?"), *waiter)
            ident = _get_ident()
            thread = (current_thread_name(ident), ident)
        if OUTBOX.accepting and not OUTBOX.started:  # the emitter files them: it must run
            OUTBOX.begin()
        RECORDER.waits.add(  # UNFILED_FIELDS
            (stats, lock_class, t0, t1, ok, context, extra, span_ns, waiter, holder, site, thread)
        )
    except Exception as exc:
        OUTBOX.failed(exc)
    finally:
        resume_collection()
        state.in_lockwatch = False


def timed_wait(
    acquire: Callable[..., Any],
    args: tuple,
    state: WorkerState,
    stats: Stats,
    lock_class: LockClass,
    frame: Any,
    extra: dict[str, Any] | None = None,
    hold: Any = None,
    started: int | None = None,
) -> Any:
    """The slow path of a blocking acquire whose try failed: ``acquire(*args)``, timed (from
    ``started``, if given), and the wait recorded, charged to the holder ``hold`` (the object
    that keeps the lock's hold) keeps at the arrival. Returns what ``acquire`` returned."""
    context = current_context()
    held_by = None if hold is None else holder_entry(hold)
    # Noted for the live gauges while the worker is blocked (restored: a wait may nest one).
    before, state.waiting = state.waiting, lock_class
    t0 = _pc() if started is None else started
    try:
        ok = acquire(*args)
    finally:
        state.waiting = before
    record_wait(state, stats, lock_class, t0, _pc(), ok, context, frame, extra, held_by)
    return ok


def lock_wait(
    lock: Any,
    state: WorkerState,
    stats: Stats,
    lock_class: LockClass,
    frame: Any,
    timeout: float = -1,
    hold: Any = None,
    started: int | None = None,
) -> bool:
    """:func:`timed_wait` in ``lock.acquire(True, timeout)`` (``hold``: the object that keeps
    the lock's hold, whose holder the wait is charged to)."""
    return timed_wait(
        lock.acquire, (True, timeout), state, stats, lock_class, frame, None, hold, started
    )


#: What an object that keeps a hold notes at the acquisition, for the release. The C fast path
#: reads and writes them on a :class:`Hold`, and its ``LockBase`` has members of these names
#: (named in C too: ``tests/test_fast_path_contract.py`` holds the two to one list).
#: (Prefixed: a lock proxy keeps them beside the names of the lock it wraps.)
HOLD_FIELDS = (
    "_lw_holder",  # the holder's WorkerState while the hold is tracked, else None
    "_lw_entry",  # the hold's held-stack entry
    "_lw_stats",  # the holder's Stats for the lock's class
    "_lw_start_ns",  # when the hold began (perf_counter_ns)
    "_lw_context",  # the OpenTelemetry context at the acquisition (the hold span's parent)
)


class Hold:
    """Keeps the hold of one section of an array (fields: :data:`HOLD_FIELDS`)."""

    __slots__ = HOLD_FIELDS

    def __init__(self) -> None:
        self._lw_holder: WorkerState | None = None


def track_hold(hold: Any, state: WorkerState, stats: Stats, entry: Any) -> None:
    """The lock is held: push its entry on the worker's held stack, and note on ``hold`` (the
    object that keeps the hold) what the release needs. The clock is read last.
    (:func:`acquire_tracked` does the same around the acquire, keeping the held window short.)"""
    state.held.append(entry)
    hold._lw_entry = entry
    hold._lw_stats = stats
    hold._lw_context = current_context()
    hold._lw_holder = state
    hold._lw_start_ns = _pc()


def acquire_tracked(
    lock: Any,
    hold: Any,
    state: WorkerState,
    lock_class: LockClass,
    frame: Any,
    blocking: Any,
    timeout: Any,
    wait: Callable[..., bool] = lock_wait,
    deferred: bool = False,
) -> bool:
    """Acquire ``lock`` (whose ``acquire(blocking, timeout)`` is the stdlib's) from ``frame``,
    counted, ordered, timed when it waits (``wait``: :func:`lock_wait` or one with its
    signature), and tracked on ``hold`` (which is also the entry's lock object). Under a held
    lock, what comes before the acquire allocates with the collector off (``_collection``; the
    caller's deferral, ``deferred``, also covers its frame object), closed before the acquire.

    The held window (from the raw acquire to the raw release) holds only the entry's push, one
    clock read and attribute stores: the entry, the context and the order check are made before
    the acquire, the histogram after the release (:func:`untrack`). A call in the window is a
    place where the interpreter may switch threads while the lock is held (docs/performance.md);
    ``held.append`` is none once specialized (the interpreter's ``list.append`` instruction does
    not check for a switch).
    """
    held = state.held
    if held and not deferred:
        defer_collection()
        deferred = True
    try:
        stats = state.stats.get(lock_class)
        if stats is None:
            stats = state.stats[lock_class] = new_stats()
        entry = new_entry((lock_class, frame, frame.f_lasti, hold, False))
        context = current_context()
        if blocking and held:
            check_order(state, lock_class, frame, hold, False)
    finally:
        if deferred:
            resume_collection()
    # The entry is pushed once the lock is taken (_fast_path: the push point).
    if blocking:
        if lock.acquire(False):
            held.append(entry)
            start_ns = _pc()
            stats.acquisitions += 1
        else:
            if not wait(lock, state, stats, lock_class, frame, timeout, hold):
                return False
            held.append(entry)
            start_ns = _pc()
    else:
        if not record_try(stats, lock.acquire(False)):
            return False
        held.append(entry)
        start_ns = _pc()
    # Attribute stores only: a call here would be a point where the interpreter switches threads.
    hold._lw_entry = entry
    hold._lw_stats = stats
    hold._lw_context = context
    hold._lw_start_ns = start_ns
    hold._lw_holder = state
    return True


# -- the release -----------------------------------------------------------------------------
def untrack(
    holder: WorkerState, entry: Any, stats: Stats, start_ns: int, context: Any, index: int | None
) -> None:
    """The bookkeeping of a release, after it (with what the hold noted, read before): pop the
    held entry, record the hold. ``index``: the section's, for a section."""
    end_ns = _pc()
    held_ns = end_ns - start_ns
    held = holder.held
    try:
        # The holder's own release, in order: its entry is on top, where no other thread
        # pushes or pops. Another thread's release of the holder's Lock (or out of order) goes
        # to discard(), which the holder's own pushes and pops meanwhile do not confuse.
        if held[-1] is entry and _tls.st is holder:
            held.pop()
            if BALLAST and not held:
                _fill_ballast()  # (the lock is free: a collection it sets off runs outside)
        else:
            discard(held, entry)
    except (IndexError, AttributeError):  # an empty stack; a thread lockwatch has not seen
        discard(held, entry)
    stats.hold_total_ns += held_ns
    # bucket_of(held_ns), inlined: the one copy on the hot path (a call would cost every release).
    bits = held_ns.bit_length()
    bucket = ((bits - 5) << 4) + (held_ns >> (bits - 5)) if bits > 5 else held_ns
    histogram = stats.hold_histogram  # the C path's Stats gives a copy: assigned back
    histogram[bucket] = histogram.get(bucket, 0) + 1
    stats.hold_histogram = histogram
    if held_ns > stats.hold_max_ns:
        stats.hold_max_ns = held_ns
    if held_ns < stats.hold_min_ns:
        stats.hold_min_ns = held_ns
    stats.last_release_ns = end_ns  # (the holder's last event: WorkerState.last_event_ns)
    # The session's floor (one attribute read more than a global).
    if held_ns >= THRESHOLDS.hold_metric_ns:
        record_hold(holder, entry, start_ns, end_ns, context, index)


def record_hold(
    holder: WorkerState, entry: Any, start_ns: int, end_ns: int, context: Any, index: int | None
) -> None:
    """The slow path of a release: a hold at or above the metric floor goes to the outbox.
    ``holder`` is the holder's state; lockwatch runs on the releasing thread's (``releasing``),
    which is another when a thread releases a Lock another took (marking the holder's would make
    the holder's own acquisitions meanwhile go unrecorded)."""
    try:
        releasing = _tls.st
    except AttributeError:
        releasing = RECORDER.thread_state()
    releasing.in_lockwatch = True
    defer_collection()  # other locks may be held: _collection
    try:
        extra = None if index is None else {"lockwatch.section.index": index}
        span_ns = THRESHOLDS.hold_span_ns
        site = entry_site(entry) if end_ns - start_ns >= span_ns else None
        OUTBOX.put(
            "lock.hold", entry.lock_class, start_ns, end_ns, context, None, span_ns, extra, site
        )
    except Exception as exc:
        OUTBOX.failed(exc)
    finally:
        resume_collection()
        releasing.in_lockwatch = False


# -- the C path's slow paths: one event each (``_fast_path``'s contract) ----------------------
def check_order_event(event: Any) -> None:
    """:func:`check_order` for the C path (an ``Acquisition``)."""
    check_order(event.worker, event.lock_class, event.frame, event.hold, event.canonical)


def record_hold_event(event: Any) -> None:
    """:func:`record_hold` for the C path (a ``Release``)."""
    record_hold(event.worker, event.entry, event.start_ns, event.end_ns, event.context, event.index)


if speedups is not None:
    speedups.setup(
        tls=_tls,
        context=current_context,
        failed=OUTBOX.failed,
        check_order=check_order_event,
        record_hold=record_hold_event,
        worker_state=(WorkerState, WORKER_FIELDS),
        stats=(Stats, STATS_FIELDS),
        hold=(Hold, HOLD_FIELDS),
        outbox=OUTBOX,
        waits=RECORDER.waits,
        threads=threading._active,  # type: ignore[attr-defined]
        new_state=RECORDER.new_thread_state,
        new_stats=new_stats,
    )
    # A thread's registration and end, in C on the recorder's own tables (a thread per request
    # pays both once: docs/performance.md, thread churn).
    speedups.setup_threads(
        recorder=RECORDER, fields=THREAD_FIELDS, peak_fields=PEAK_FIELDS, limits=vars(_recorder)
    )

    def _fast_path_floor(thresholds: Thresholds) -> None:
        speedups.set_thresholds(
            thresholds.hold_metric_ns, thresholds.hold_span_ns, thresholds.wait_span_ns
        )

    # The C path keeps its copies of the hold metric floor and span threshold: the session's, at
    # every begin().
    THRESHOLDS.follow(_fast_path_floor)
