"""The bookkeeping every watched lock shares: one routine per step of a lock's life.

Every wrapper (the ``threading`` proxies, the section paths, ``asyncio``, ``multiprocessing``)
runs the same steps around the real acquire and release and calls the same function for each;
the C fast path (``_fast_path``) runs the uncontended steps in C and calls these for the rest.

- :func:`check_order`: before a blocking acquire made while other locks are held, the new
  lock-order edges go to the graph (the per-worker chain cache makes a repeated nesting cost one
  set lookup).
- The non-blocking acquire is tried first; :func:`record_try` counts a try-acquire.
- :func:`timed_wait` (:func:`lock_wait` for a lock's own ``acquire``): only when the try failed
  is the clock read (lock_stat and Abseil record contention only on the slow path), the lock
  class is noted as the worker's ``waiting`` while it blocks (the live gauges read it), and
  :func:`record_wait` counts the wait and queues it for OpenTelemetry.
- :func:`track_hold`: the lock is held; its entry goes on the worker's held stack, and the object
  that keeps the hold notes what the release will need.
- :func:`untrack`: the release; the entry comes off the stack and the hold is recorded (and
  queued, from the metric floor on: :func:`record_hold`).
- :func:`acquire_tracked`: the whole acquire of a lock whose ``acquire(blocking, timeout)`` is
  the stdlib's (``threading``, ``multiprocessing``): the steps above, in order.

Counters and histograms go to the calling worker's :class:`~..record._recorder.Stats`: no
process-wide lock. OpenTelemetry is reached only through the outbox, on the slow path.

A held-stack entry is a tuple ``(lock class, frame, lasti, lock object, canonical)``: the frame's
code and the instruction offset at the acquisition give its site later, when a lock-order edge
needs it, without reading ``f_lineno`` now (which costs more than the rest of the entry).

An object that keeps a hold (a lock proxy, a section's :class:`Hold`, a ``multiprocessing``
lock's tracker, an ``asyncio.Lock``) has the attributes :data:`HOLD_FIELDS`. A release reads them
*before* the lock is free: from then on another thread may take it and overwrite them.

Nothing here raises into the host program, except, under the ``raise`` policy,
:class:`~..exceptions.PotentialDeadlockError` before a blocking acquire that would close a cycle.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from time import perf_counter_ns as _pc
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from .._settings import SETTINGS
from ..exceptions import PotentialDeadlockError
from ..record._histogram import bucket_of
from ..record._outbox import OUTBOX
from ..record._recorder import RECORDER, STATS_FIELDS, WORKER_FIELDS, Stats, WorkerState
from ..record._sites import UNKNOWN, SiteTable, code_attributes, code_site
from ..record._witness import EdgeWitness, utc_timestamp
from ._dropped import collected_gone, dropped
from ._fast_path import new_stats, speedups
from ._naming import LockClass, site_of

__all__ = [
    "HOLD_FIELDS",
    "Hold",
    "acquire_tracked",
    "caller_frame",
    "check_order",
    "configure",
    "current_context",
    "discard",
    "entry_site",
    "holder_entry",
    "lock_wait",
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

# Thresholds in nanoseconds and the cycle policy; set by configure() at instrument().
WAIT_SPAN_NS = round(SETTINGS["wait_span_threshold_ms"].default * 1_000_000)
HOLD_SPAN_NS = round(SETTINGS["hold_span_threshold_ms"].default * 1_000_000)
HOLD_METRIC_NS = round(SETTINGS["hold_metric_floor_ms"].default * 1_000_000)
ON_CYCLE = SETTINGS["on_cycle"].default


def configure(*, wait_span_ns: int, hold_span_ns: int, hold_metric_ns: int, on_cycle: str) -> None:
    """Set the thresholds the wrappers read (called by the instrumentor)."""
    global WAIT_SPAN_NS, HOLD_SPAN_NS, HOLD_METRIC_NS, ON_CYCLE
    WAIT_SPAN_NS = wait_span_ns
    HOLD_SPAN_NS = hold_span_ns
    HOLD_METRIC_NS = min(hold_metric_ns, hold_span_ns)
    ON_CYCLE = on_cycle
    if speedups is not None:
        speedups.set_hold_metric_ns(HOLD_METRIC_NS)


def caller_frame() -> Any:
    """The frame that called the function calling this one: the acquisition site (that function's
    own frame when C called it, with no Python caller)."""
    try:
        return _getframe(2)
    except ValueError:
        return _getframe(1)


def stats_of(st: WorkerState, cls: LockClass) -> Stats:
    """The worker's :class:`Stats` for a lock class, created on first use."""
    s = st.stats.get(cls)
    if s is None:
        s = st.stats[cls] = new_stats()
    return s


# -- sites -----------------------------------------------------------------------------------
def entry_site(entry: tuple) -> str:
    """``module:function:line`` where a held lock was acquired."""
    return code_site(entry[1].f_code, entry[2])


def holder_entry(hold: Any) -> tuple | None:
    """The held-stack entry of the last hold that ``hold`` (the object that keeps a lock's hold)
    tracked: the holder a waiter arrived during, or the one that released (or handed over) in
    the moment between the waiter's failed try and this look; None if none was ever watched."""
    try:
        return hold._lw_entry
    except AttributeError:  # never held yet
        return None


# -- the lock order --------------------------------------------------------------------------
def check_order(st: WorkerState, cls: LockClass, frame: Any, obj: Any, canonical: bool) -> None:
    """Called before a blocking acquire made while locks are held: add the new edges.

    A held entry whose pair is not in the chain cache adds no edge when its lock is the one being
    acquired (the holder waits for another thread's release: a hand-over, not an order), or when
    its lock is gone (``_dropped``: nobody can release it), which then leaves the stack and is
    reported (:func:`_held_lock_freed`). Both cost a cache miss only.
    """
    chain = st.chain
    gone = None
    for entry in st.held:
        hcls = entry[0]
        if (
            canonical
            and entry[4]
            and hcls is cls
            and entry[1] is frame
            and entry[2] == frame.f_lasti
        ):
            continue  # one lock_many call (same frame and position) is ascending: canonical
        pair = (hcls, cls)
        if pair in chain:
            continue
        if entry[3] is obj and cls.kind != "section":  # (an array's sections share the array)
            continue
        if dropped(entry, st.held) or not _new_edge(st, entry, cls, frame, pair):
            gone = [entry] if gone is None else [*gone, entry]
    if gone is not None:
        _held_lock_freed(st, gone)


def _held_lock_freed(st: WorkerState, entries: list) -> None:
    """Take the entries of gone locks off the worker's stack; count each by lock class in the
    recorder, and warn once per class (lockdep's "held lock freed")."""
    st.in_lockwatch = True
    try:
        for entry in entries:
            discard(st.held, entry)
            name = entry[0].name
            counts = RECORDER.held_locks_freed
            first = name not in counts
            counts[name] = counts.get(name, 0) + 1
            if first:
                logger.warning(
                    "otel-lockwatch: held lock freed: %s (acquired at %s by worker %r) is gone "
                    "while held; it orders no later acquisition",
                    name,
                    entry_site(entry),
                    st.worker,
                )
    except Exception as exc:  # never into the host
        OUTBOX.failed(exc)
    finally:
        st.in_lockwatch = False


def _new_edge(st: WorkerState, entry: tuple, cls: LockClass, frame: Any, pair: tuple) -> bool:
    """Add the edge from a held entry; False when, the edge closing a cycle, the collector found
    the held lock gone (kept only by a reference cycle: see ``collected_gone``)."""
    st.in_lockwatch = True
    try:
        span_ctx = trace.get_current_span().get_span_context()
        trace_id = f"{span_ctx.trace_id:032x}" if span_ctx.is_valid else None
        span_id = f"{span_ctx.span_id:016x}" if span_ctx.is_valid else None
        hcls = entry[0]
        witness = EdgeWitness(
            hcls.name,
            cls.name,
            st.worker,
            (entry_site(entry), site_of(frame)),
            utc_timestamp(),
            trace_id,
            span_id,
        )
        graph = RECORDER.graph
        cycle = graph.would_close_cycle(hcls.name, cls.name, witness)
        if cycle is not None:
            if graph.witness(hcls.name, cls.name) is None and collected_gone(entry, st.held):
                return False
            if ON_CYCLE == "raise":
                # Recorded for the manifest, refused now and on every later attempt (the pair
                # never enters the chain cache, and would_close_cycle answers every time).
                graph.add_edge(hcls.name, cls.name, witness)
                raise PotentialDeadlockError(cycle.format(), cycle.locks)
        cycle = graph.add_edge(hcls.name, cls.name, witness)
        st.chain.add(pair)
        if cycle is not None and ON_CYCLE == "warn":
            text = cycle.format()
            logger.warning("otel-lockwatch: %s", text)
            OUTBOX.cycle_event(text, cycle.locks)
    except PotentialDeadlockError:
        raise
    except Exception as exc:  # never into the host
        OUTBOX.failed(exc)
    finally:
        st.in_lockwatch = False
    return True


# -- the acquire -----------------------------------------------------------------------------
def record_try(s: Stats, ok: bool) -> bool:
    """Count a non-blocking attempt; returns ``ok``."""
    if ok:
        s.acquisitions += 1
        s.try_acquisitions += 1
    else:
        s.skipped += 1
    return ok


def record_wait(
    st: WorkerState,
    s: Stats,
    cls: LockClass,
    t0: int,
    t1: int,
    ok: bool,
    ctx: Any,
    f: Any,
    extra: dict[str, Any] | None,
    held_by: tuple | None = None,
) -> None:
    """Count a blocking attempt that had to wait from ``t0`` to ``t1`` (``ok``: it got the lock)
    at its site (the frame ``f``) while the held-stack entry ``held_by`` held the lock (None:
    unknown), and queue it for OpenTelemetry (``extra``: more span attributes)."""
    w = t1 - t0
    s.contentions += 1
    s.wait_total_ns += w
    hist = s.wait_histogram
    b = bucket_of(w)
    hist[b] = hist.get(b, 0) + 1
    if w > s.wait_max_ns:
        s.wait_max_ns = w
    if w < s.wait_min_ns:
        s.wait_min_ns = w
    if ok:
        s.acquisitions += 1
    else:
        s.timeouts += 1
    st.in_lockwatch = True
    try:
        sites = s.sites
        if sites is None:
            sites = s.sites = SiteTable()
        holder = UNKNOWN if held_by is None else (held_by[1].f_code, held_by[2])
        sites.add(UNKNOWN if f is None else (f.f_code, f.f_lasti), holder, w)
        if w >= WAIT_SPAN_NS and held_by is not None:  # the span names who held the lock
            extra = {**(extra or {}), **code_attributes(entry_site(held_by), "lockwatch.holder.")}
        OUTBOX.wait(
            cls,
            t0,
            t1,
            ctx,
            "acquired" if ok else "timed_out",
            WAIT_SPAN_NS,
            extra,
            site_of(f) if w >= WAIT_SPAN_NS else None,
        )
    except Exception as exc:
        OUTBOX.failed(exc)
    finally:
        st.in_lockwatch = False


def timed_wait(
    acquire: Callable[..., Any],
    args: tuple,
    st: WorkerState,
    s: Stats,
    cls: LockClass,
    f: Any,
    extra: dict[str, Any] | None = None,
    hold: Any = None,
    started: int | None = None,
) -> Any:
    """The slow path of a blocking acquire whose try failed: ``acquire(*args)``, timed (from
    ``started``, if given), and the wait recorded, charged to the holder ``hold`` (the object
    that keeps the lock's hold) keeps at the arrival. Returns what ``acquire`` returned."""
    ctx = current_context()
    held_by = None if hold is None else holder_entry(hold)
    # Noted for the live gauges while the worker is blocked (restored: a wait may nest one).
    before, st.waiting = st.waiting, cls
    t0 = _pc() if started is None else started
    try:
        ok = acquire(*args)
    finally:
        st.waiting = before
    record_wait(st, s, cls, t0, _pc(), ok, ctx, f, extra, held_by)
    return ok


def lock_wait(
    lock: Any,
    st: WorkerState,
    s: Stats,
    cls: LockClass,
    f: Any,
    timeout: float = -1,
    hold: Any = None,
    started: int | None = None,
) -> bool:
    """:func:`timed_wait` in ``lock.acquire(True, timeout)`` (``hold``: the object that keeps
    the lock's hold, whose holder the wait is charged to)."""
    return timed_wait(lock.acquire, (True, timeout), st, s, cls, f, None, hold, started)


#: What an object that keeps a hold notes at the acquisition, for the release. The C fast path
#: reads and writes them on a :class:`Hold`, and gives its ``LockBase`` members of these names,
#: addressing both by position (``HOLD_*`` in ``_speedups.c``): rename freely, add at the end.
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


def track_hold(hold: Any, st: WorkerState, s: Stats, entry: tuple) -> None:
    """The lock is held: push its entry on the worker's held stack, and note on ``hold`` (the
    object that keeps the hold) what the release needs. The clock is read last.
    (:func:`acquire_tracked` does the same around the acquire, keeping the held window short.)"""
    st.held.append(entry)
    hold._lw_entry = entry
    hold._lw_stats = s
    hold._lw_context = current_context()
    hold._lw_holder = st
    hold._lw_start_ns = _pc()


def acquire_tracked(
    lock: Any,
    hold: Any,
    st: WorkerState,
    cls: LockClass,
    f: Any,
    blocking: Any,
    timeout: Any,
    wait: Callable[..., bool] = lock_wait,
) -> bool:
    """Acquire ``lock`` (whose ``acquire(blocking, timeout)`` is the stdlib's) from the frame
    ``f``, counted, ordered, timed when it waits (``wait``: :func:`lock_wait` or one with its
    signature), and tracked on ``hold`` (which is also the entry's lock object).

    The held window (from the raw acquire to the raw release) holds only one clock read and
    attribute stores: the stack entry, the context and the order check come before the acquire,
    the histogram after the release (:func:`untrack`). A call in the window is a place where the
    interpreter may switch threads while the lock is held (docs/performance.md).
    """
    s = st.stats.get(cls)
    if s is None:
        s = st.stats[cls] = new_stats()
    held = st.held
    entry = (cls, f, f.f_lasti, hold, False)
    ctx = current_context()
    if blocking:
        if held:
            check_order(st, cls, f, hold, False)
        # Pushed before the acquire, so that nothing but the clock read runs in the held window
        # (the live gauges may see the entry a few instructions early; a failed try removes it).
        held.append(entry)
        if lock.acquire(False):
            t0 = _pc()
            s.acquisitions += 1
        else:
            held.pop()  # not held while it waits (the live gauges read the stack)
            if not wait(lock, st, s, cls, f, timeout, hold):
                return False
            t0 = _pc()
            held.append(entry)
    else:
        held.append(entry)
        if not record_try(s, lock.acquire(False)):
            held.pop()
            return False
        t0 = _pc()
    # Attribute stores only: a call here would be a point where the interpreter switches threads.
    hold._lw_entry = entry
    hold._lw_stats = s
    hold._lw_context = ctx
    hold._lw_start_ns = t0
    hold._lw_holder = st
    return True


# -- the release -----------------------------------------------------------------------------
def untrack(st: WorkerState, entry: tuple, s: Stats, t0: int, ctx: Any, index: int | None) -> None:
    """The bookkeeping of a release, after it (with what the hold noted, read before): pop the
    held entry, record the hold. ``index``: the section's, for a section."""
    t1 = _pc()
    h = t1 - t0
    held = st.held
    if held and held[-1] is entry:
        held.pop()
    else:
        discard(held, entry)
    s.hold_total_ns += h
    # bucket_of(h), inlined: the one copy on the hot path (a call would cost every release).
    b = h.bit_length()
    b = ((b - 5) << 4) + (h >> (b - 5)) if b > 5 else h
    hist = s.hold_histogram  # the C path's Stats gives a copy: assigned back
    hist[b] = hist.get(b, 0) + 1
    s.hold_histogram = hist
    if h > s.hold_max_ns:
        s.hold_max_ns = h
    if h < s.hold_min_ns:
        s.hold_min_ns = h
    st.last = t1
    if h >= HOLD_METRIC_NS:
        record_hold(st, entry, t0, t1, ctx, index)


def record_hold(
    st: WorkerState, entry: tuple, t0: int, t1: int, ctx: Any, index: int | None
) -> None:
    """The slow path of a release: a hold at or above the metric floor goes to the outbox."""
    st.in_lockwatch = True
    try:
        extra = None if index is None else {"lockwatch.section.index": index}
        site = entry_site(entry) if t1 - t0 >= HOLD_SPAN_NS else None
        OUTBOX.put("lock.hold", entry[0], t0, t1, ctx, None, HOLD_SPAN_NS, extra, site)
    except Exception as exc:
        OUTBOX.failed(exc)
    finally:
        st.in_lockwatch = False


def discard(held: list, entry: tuple) -> None:
    """Remove ``entry`` from a held stack where it is not on top (an out-of-order release)."""
    for i in range(len(held) - 1, -1, -1):
        if held[i] is entry:
            del held[i]
            return


if speedups is not None:
    speedups.setup(
        tls=_tls,
        context=current_context,
        failed=OUTBOX.failed,
        check_order=check_order,
        lock_wait=lock_wait,
        record_hold=record_hold,
        worker_state=(WorkerState, WORKER_FIELDS),
        stats=(Stats, STATS_FIELDS),
        hold=(Hold, HOLD_FIELDS),
    )
    speedups.set_hold_metric_ns(HOLD_METRIC_NS)
