"""Distributed locks: what a Redis lock and a file lock share, recorded as a local lock is.

A distributed lock is a local lock whose holder may be another process or host. Its wrappers
(``_redis``, ``_filelock``) run the same steps as every other lock, through the same routines
(``_bookkeeping``): the order check before a blocking acquire made while locks are held, the
wait recorded only when the acquisition was contended, the hold tracked on the worker's held
stack (so a local lock taken under a Redis lock, or the reverse, is a lock-order edge as any
other), the hold recorded at the release. What differs:

- **Contention** is decided by the library's own retry loop: an acquisition is contended when
  its *first attempt* failed (redis-py's ``do_acquire`` returned False, filelock's ``_acquire``
  left the file unlocked). The wrappers of those attempt methods mark the acquisition in progress
  (a context variable, so threads and asyncio tasks each see their own). The clock is read once
  at the start of every acquire: one ``perf_counter_ns`` is a few hundredths of a percent of a
  Redis round trip or a ``flock`` call, and it makes the wait exact from the caller's first
  attempt.
- **Names** have bounded cardinality (:func:`~._key_template.key_template`): what reads as an id
  in the key (numbers, hex ids, UUIDs, emails, random tokens) becomes ``*``, and a distributed
  lock's class is its key template (``lock:order:*``; for a file lock, the template of its file
  name, never the directory). The creation site (the first frame outside redis-py, filelock, the
  standard library and lockwatch) is the class's site. Why not the site, as for a local lock: a
  local lock is one object, made at one site and shared by every path that takes it, so its site
  names it. A Redis lock object is a throwaway handle made where it is taken; what two paths, two
  processes or two hosts share is the *key*. Named by site, ``with r.lock(f"lock:order:{id}")`` in
  ``checkout()`` and in ``restock()`` would be two unrelated locks, and an ABBA between them
  (within a process, or across hosts in merged manifests) could never close a cycle. ``name_lock``
  gives a chosen name. At most :data:`MAX_TEMPLATES_PER_KIND` templates per kind; later ones share
  ``(other)``, which orders nothing (the lock-order graph has no node for it: its locks are
  unrelated). The raw key or path is never a name, an attribute or a manifest field.
- **Leases** (Redis only): a lock taken with ``timeout`` holds a lease that Redis ends by
  expiring the key. The lease starts when the successful attempt was sent (never later than
  Redis set the key), is moved by ``extend()`` (added to, or replaced) and ``reacquire()``, and a
  hold that outlives it, or an ``extend`` / ``reacquire`` that came after it, is a **lease
  overrun** (counted once per hold, on the client's clock: within a round trip of the server's).
- **Release failures**: a release that raised (the lock refused it: ``LockNotOwnedError``,
  ``LockError``; or it failed: a lost connection, a cancelled ``await``, an ``OSError``) is
  counted, and its hold ends in lockwatch's books, whatever the lock kept; the exception still
  reaches the application.

Overruns and failures also become span events on the span current at the time
(``lockwatch.lease_overrun``, ``lockwatch.release_failed``); they are rare, slow-path events.
Nothing here raises into the host program.
"""

from __future__ import annotations

import asyncio
import contextvars
import sys
import sysconfig
from time import perf_counter_ns as _pc
from typing import Any

from opentelemetry import trace

from .._session import DISTRIBUTED, OUTBOX, RECORDER
from ..exceptions import PotentialDeadlockError
from ..record._order import OVERFLOW
from ..record._recorder import WorkerState
from ._bookkeeping import (
    HOLD_FIELDS,
    check_order,
    current_context,
    discard,
    new_entry,
    record_try,
    record_wait,
    stats_of,
    untrack,
)
from ._key_template import key_template
from ._naming import LockClass, lock_class

__all__ = [
    "MAX_TEMPLATES_PER_KIND",
    "DistHold",
    "abandon",
    "begin",
    "classify",
    "contended",
    "creation_site",
    "current_acquisition",
    "finish",
    "key_template",
    "lease_moved",
    "release_begin",
    "release_failed",
    "released",
    "TEMPLATES",
]

#: Lock classes (key templates) per kind; later ones are named ``(other)`` (bounded cardinality).
MAX_TEMPLATES_PER_KIND = 256
#: The packages whose frames are never a creation or acquisition site.
_SKIPPED = ("redis", "filelock", "otel_lockwatch", "contextlib", "wrapt")  # wrapt: its Python path
_STDLIB = tuple({p for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib")) if p})
_getframe = sys._getframe
_running_loop = asyncio._get_running_loop  # None outside a loop, without raising
_current_task = asyncio.current_task
_tls = RECORDER.tls
leased_classes = DISTRIBUTED.leased_classes


def _state() -> WorkerState:
    """The calling worker's state: the asyncio task's in a running loop, else the thread's."""
    loop = _running_loop()
    task = _current_task(loop) if loop is not None else None
    if task is None:
        try:
            return _tls.st
        except AttributeError:
            return RECORDER.thread_state()
    return RECORDER.task_state(task)


_skipped_files: dict[str, bool] = {}  # a code object's file -> whether its frames are skipped


def _skipped(frame: Any) -> bool:
    code = frame.f_code
    skipped = _skipped_files.get(code.co_filename)
    if skipped is None:
        name = frame.f_globals.get("__name__", "")
        filename = code.co_filename
        skipped = _skipped_files[filename] = any(
            name == p or name.startswith(p + ".") for p in _SKIPPED
        ) or (
            filename.startswith(_STDLIB)
            and "site-packages" not in filename
            and "dist-packages" not in filename
        )
    return skipped


def _outside(depth: int) -> Any:
    """The first frame, from ``depth`` up, outside the lock's library, the standard library and
    lockwatch (the outermost frame when every frame is inside)."""
    try:
        frame: Any = _getframe(depth + 1)
    except ValueError:
        frame = _getframe(1)
    last = frame
    known = _skipped_files
    while frame is not None:
        skipped = known.get(frame.f_code.co_filename)
        if skipped is None:
            skipped = _skipped(frame)
        if not skipped:
            return frame
        last = frame
        frame = frame.f_back
    return last


def creation_site(depth: int = 1) -> str:
    """``module:function:line`` of the code creating a lock (``depth``: 1 from the patched
    ``__init__``)."""
    frame = _outside(depth + 1)
    return f"{frame.f_globals.get('__name__', '?')}:{frame.f_code.co_name}:{frame.f_lineno}"


TEMPLATES: dict[str, set[str]] = {}  # kind -> the templates that name a class


def classify(lock: Any, kind: str, key: Any, site: str) -> None:
    """Give a new lock its class (named by its key template; ``site``, where it was created,
    is the class's site) and template."""
    template = key_template(key)
    seen = TEMPLATES.setdefault(kind, set())
    if template not in seen:
        if len(seen) >= MAX_TEMPLATES_PER_KIND:
            template = OVERFLOW  # many unrelated locks: no node of the lock-order graph
        seen.add(template)
    template_class = lock_class(template, kind, site)
    attributes = lock.__dict__
    attributes["_lockwatch_class"] = template_class
    attributes["_lw_template"] = template


def _template_of(lock: Any, lock_class: LockClass) -> None:
    """A class's first acquisition: its key template becomes a metric attribute, and is noted
    for the manifest."""
    template = lock.__dict__.get("_lw_template", "")
    lock_class.attrs["lockwatch.lock.key_template"] = template
    DISTRIBUTED.template(lock_class, template)


# -- the acquire and the hold -----------------------------------------------------------------
class DistHold:
    """One acquire of a distributed lock and, once it got the lock, its hold: one object for both
    (the first :data:`HOLD_FIELDS`, then the acquisition's fields, then the hold's)."""

    __slots__ = (
        *HOLD_FIELDS,
        # the acquisition
        "lock",  # the lock being acquired (None once held: no cycle through the lock's holds)
        "lock_class",
        "state",  # the worker acquiring it (``_lw_holder`` once it holds it)
        "frame",  # the acquisition's frame (its site)
        "t0",  # when the acquire began
        "failed",  # an attempt failed: the acquisition is contended
        "before",  # the worker's waiting class before this one's (set when an attempt failed)
        "sent_ns",  # when the last attempt was sent (a lease starts no later); a file lock,
        # which has no lease, only notes that one was (1)
        "token",  # the context variable's token while the acquire runs
        # the hold
        "key",  # its key in the lock's holds: the worker (Redis), the thread (a file lock)
        "depth",  # a file lock's re-entry depth in the hold's context (1: the outermost)
        "deadline_ns",  # when the lease ends (None: no lease)
        "lease_ns",
        "overran",  # its overrun was counted (once per hold)
    )
    _lw_holder: WorkerState | None
    _lw_entry: Any
    _lw_stats: Any
    _lw_start_ns: int
    _lw_context: Any
    lock: Any
    lock_class: LockClass
    state: WorkerState
    frame: Any
    t0: int
    failed: bool
    before: LockClass | None
    sent_ns: int
    token: Any
    key: Any
    depth: int
    deadline_ns: int | None
    lease_ns: int
    overran: bool


_new_hold = DistHold.__new__  # fields are set where they are known: no __init__ call


_CURRENT: contextvars.ContextVar[DistHold | None] = contextvars.ContextVar(
    "lockwatch_distributed_acquisition", default=None
)


def contended(acquisition: DistHold) -> None:
    """An attempt of ``acquisition`` failed: it is contended, and its worker is noted as waiting
    on its class until it ends (the live gauges read it), as the local slow path does."""
    if not acquisition.failed:
        acquisition.failed = True
        state = acquisition.state
        acquisition.before, state.waiting = state.waiting, acquisition.lock_class


def begin(lock: Any, lock_class: LockClass, blocking: Any, key: Any = None) -> DistHold | None:
    """Start recording an acquire of ``lock``, of the class ``lock_class`` (None: lockwatch itself
    runs); ``key``: the hold's key in the lock's holds (None: the worker). Called by the
    wrapper of ``acquire``, whose caller is the acquisition site.

    Raises:
        PotentialDeadlockError: under the ``raise`` policy, the acquire would close a cycle.
    """
    try:
        state = _state()
        if state.in_lockwatch:
            return None
        frame = _outside(2)
        if blocking and state.held:
            check_order(state, lock_class, frame, lock, False)
        acquisition = _new_hold(DistHold)
        acquisition.lock = lock
        acquisition.lock_class = lock_class
        acquisition.state = state
        acquisition.frame = frame
        acquisition.key = state if key is None else key
        acquisition.failed = False
        acquisition.sent_ns = 0
        acquisition._lw_context = current_context()
        acquisition.token = _CURRENT.set(acquisition)
        acquisition.t0 = _pc()
        return acquisition
    except PotentialDeadlockError:  # the raise policy: refused on purpose
        raise
    except Exception as exc:  # never into the host: the lock is taken unrecorded
        OUTBOX.failed(exc)
        return None


#: The acquire in progress in this thread or task, or None. A wrapped attempt method (redis-py's
#: ``do_acquire``, filelock's ``_acquire``) notes on it, when its lock is the one being acquired,
#: when it sent the attempt (``sent_ns``) and whether it failed (``failed``).
current_acquisition = _CURRENT.get


def finish(acquisition: DistHold, ok: bool, blocking: Any, lease_s: Any = None) -> None:
    """End an acquire: ``ok``, it got the lock (False: refused, or timed out); ``lease_s``,
    the lease it was taken with (seconds; None or 0 for none). Held, ``acquisition`` is the hold."""
    _CURRENT.reset(acquisition.token)
    state, lock_class = acquisition.state, acquisition.lock_class
    if acquisition.failed:
        state.waiting = acquisition.before
    try:
        stats = state.stats.get(lock_class)
        if stats is None:
            stats = stats_of(state, lock_class)
        lock = acquisition.lock
        if "lockwatch.lock.key_template" not in lock_class.attrs:  # a new class: once
            _template_of(lock, lock_class)
        if ok and blocking and not acquisition.failed:  # the common case: uncontended
            stats.acquisitions += 1
        elif not blocking:
            record_try(stats, ok)
            if not ok:
                return
        else:  # a blocking acquire that failed an attempt waited (and may have timed out)
            extra = {"lockwatch.lock.key_template": lock_class.attrs["lockwatch.lock.key_template"]}
            record_wait(
                state,
                stats,
                lock_class,
                acquisition.t0,
                _pc(),
                ok,
                acquisition._lw_context,
                acquisition.frame,
                extra,
            )
            if not ok:
                return
        if lease_s:
            acquisition.lease_ns = lease_ns = int(lease_s * 1_000_000_000)
            acquisition.deadline_ns = (acquisition.sent_ns or acquisition.t0) + lease_ns
            acquisition.overran = False
            if lock_class not in leased_classes:
                DISTRIBUTED.leased(lock_class)
        else:
            acquisition.deadline_ns = None
        acquisition.lock = None
        acquisition.depth = 1
        attributes = lock.__dict__
        holds = attributes.get("_lw_holds")
        if holds is None:
            holds = attributes["_lw_holds"] = {}
        holds[acquisition.key] = acquisition
        # track_hold's steps, the context already read: the entry on the held stack, the fields
        # the release reads; the clock last.
        frame = acquisition.frame
        entry = new_entry((lock_class, frame, frame.f_lasti, acquisition, False))
        state.held.append(entry)
        acquisition._lw_entry = entry
        acquisition._lw_stats = stats
        acquisition._lw_holder = state
        acquisition._lw_start_ns = _pc()
    except Exception as exc:  # never into the host: the lock is held all the same
        OUTBOX.failed(exc)


def abandon(acquisition: DistHold) -> None:
    """An acquire that raised (cancelled, a connection error): nothing is recorded."""
    _CURRENT.reset(acquisition.token)
    if acquisition.failed:
        acquisition.state.waiting = acquisition.before


# -- the hold and the release ----------------------------------------------------------------
def _event(name: str, lock_class: LockClass, attrs: dict[str, Any]) -> None:
    span = trace.get_current_span()
    if span.is_recording():
        span.add_event(
            name,
            {
                "lockwatch.lock.name": lock_class.name,
                "lockwatch.lock.kind": lock_class.kind,
                "lockwatch.lock.key_template": lock_class.attrs.get(
                    "lockwatch.lock.key_template", ""
                ),
                **attrs,
            },
        )


def _overrun(hold: DistHold, now: int, late: str) -> None:
    """Count the hold's overrun once, if its lease ended before ``now``."""
    deadline = hold.deadline_ns
    if hold.overran or deadline is None or now <= deadline:
        return
    hold.overran = True
    holder = hold._lw_holder
    lock_class = hold._lw_entry.lock_class
    worker = holder.worker if holder is not None else "?"
    DISTRIBUTED.overrun(lock_class, worker, now - deadline)
    _event(
        "lockwatch.lease_overrun",
        lock_class,
        {
            "lockwatch.worker": worker,
            "lockwatch.lease_ms": hold.lease_ns / 1e6,
            "lockwatch.overrun_ms": (now - deadline) / 1e6,
            "lockwatch.detected_at": late,
        },
    )


def _hold_of(holds: dict) -> DistHold | None:
    """The calling worker's hold among a Redis lock's holds; the only hold when there is one
    (the caller knows the lock holds a token, and a token shared across workers is released by
    any of them)."""
    if len(holds) == 1:
        for hold in holds.values():
            return hold
    return holds.get(_state())


def release_begin(lock: Any) -> DistHold | None:
    """Before a release of a Redis lock that holds a token: the hold it ends; an ended lease is
    an overrun."""
    try:
        holds = lock.__dict__.get("_lw_holds")
        if not holds:
            return None
        hold = _hold_of(holds)
        if hold is not None:
            deadline = hold.deadline_ns
            if deadline is not None and not hold.overran:
                now = _pc()
                if now > deadline:
                    _overrun(hold, now, "release")
        return hold
    except Exception as exc:
        OUTBOX.failed(exc)
        return None


def released(lock: Any, hold: DistHold, record: bool = True, own: bool = True) -> None:
    """After a release that unlocked: the hold is over, and recorded.

    ``record=False``: the hold is *forgotten*, not recorded: its lock was found free in its
    context though no watched release ended it (a release made while not instrumented,
    filelock's ``force`` release of an exited thread's holds). ``own``: its holder runs on the
    calling thread, whose held stack loses the entry now; another thread's entry is found gone
    by its next order check (nothing refers to the hold any more: ``_dropped``)."""
    try:
        holder = hold._lw_holder
        if holder is None:
            return
        hold._lw_holder = None
        holds = lock.__dict__["_lw_holds"]
        if holds.get(hold.key) is hold:
            del holds[hold.key]
        entry = hold._lw_entry
        if record:
            hold._lw_entry = ()  # the entry holds the hold: no cycle left for the collector
            untrack(holder, entry, hold._lw_stats, hold._lw_start_ns, hold._lw_context, None)
        elif own:
            hold._lw_entry = ()
            discard(holder.held, entry)
    except Exception as exc:
        OUTBOX.failed(exc)


def release_failed(lock: Any, hold: DistHold | None, failure: str) -> None:
    """After a release that raised, whatever it raised: ``failure``, how (``not_owned``,
    ``lock_error``: see :data:`~..record._data.FAILURE_KINDS`). It is counted, and the hold ends
    in lockwatch's books whatever the lock kept (redis.asyncio keeps its token after a lost
    connection, filelock its descriptor after a failed unlock, both so that the release can be
    retried): a hold kept open would order every later acquisition of the worker, and make the
    next lock of its class "recursive locking". A retried release finds no hold, and records
    nothing."""
    try:
        lock_class = lock.__dict__.get("_lockwatch_class")
        if lock_class is not None:
            DISTRIBUTED.release_failed(lock_class, failure)
            _event("lockwatch.release_failed", lock_class, {"lockwatch.failure": failure})
    except Exception as exc:
        OUTBOX.failed(exc)
    if hold is not None:
        released(lock, hold)


def lease_moved(lock: Any, sent_ns: int, seconds: Any, replace: bool, ok: bool) -> None:
    """``extend`` / ``reacquire`` sent at ``sent_ns``: the lease becomes ``seconds`` from then
    (``replace``) or ``seconds`` longer. One sent after the lease ended is an overrun (and so is
    one the lock refused: the lease was gone)."""
    try:
        holds = lock.__dict__.get("_lw_holds")
        hold = _hold_of(holds) if holds else None
        if hold is None or hold.deadline_ns is None:
            return
        if not ok:
            _overrun(hold, max(_pc(), hold.deadline_ns + 1), "extend")
            return
        _overrun(hold, sent_ns, "extend")
        add = int(seconds * 1_000_000_000)
        hold.deadline_ns = sent_ns + add if replace else hold.deadline_ns + add
        hold.lease_ns = hold.deadline_ns - hold._lw_start_ns
    except Exception as exc:
        OUTBOX.failed(exc)
