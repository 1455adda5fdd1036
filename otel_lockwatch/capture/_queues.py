"""Watched queues: a ``queue.Queue`` is one lock class, its blocking ``get`` / ``put`` hand-off
waits.

A connection pool built on a queue (urllib3's ``HTTPConnectionPool``, redis-py's
``BlockingConnectionPool``: a ``LifoQueue`` of connections) checks out with ``get`` and checks in
with ``put``. A ``queue.Queue``, ``LifoQueue`` or ``PriorityQueue`` created by watched code while
instrumented is one lock class, named by where it was created (kind ``queue.Queue``,
``queue.LifoQueue``, ``queue.PriorityQueue``); its mutex and conditions are the queue's
internals, not classes of their own (the ``queue`` module's locks are never watched, like
``threading``'s). The C ``queue.SimpleQueue`` is not patched.

- A ``get`` that finds the queue empty waits on the queue's ``not_empty`` condition: a hand-off
  wait (to *take*), ended by a ``put``; a ``put`` that finds a bounded queue full waits on
  ``not_full``: a hand-off wait (to *give*), ended by a ``get``. A wait that times out is
  counted.
- Every item taken is a take (a checkout): the items left after it, and the hold until the
  same worker's next ``put``; every item put is a give (a checkin, and the hand-over to the
  get-waiters): the items held after it (the capacity is the most the queue held).

**Where it hooks: per queue, not per class.** Only ``Queue.__init__`` is patched. A watched
queue gets, as attributes of its own, a wrapper around its ``_get`` and ``_put`` (the storage
hooks that ``get`` and ``put`` call under the queue's mutex once an item moves, so the sizes
read there are exact) and around its two conditions' ``wait`` (called only when ``get`` or
``put`` must block: the clock is read for a wait only then). ``get`` and ``put`` themselves run
unchanged, with the caller's arguments, and a subclass's overrides run as they always did. A
queue that is not watched (OpenTelemetry's, ``logging``'s, lockwatch's own, every queue created
before instrumenting) is not touched at all and pays nothing. The wait includes re-taking the
queue's mutex, which is not watched: nothing is counted twice. Like a lock proxy, a queue
created while instrumented keeps recording after ``uninstrument()``.
"""

from __future__ import annotations

import queue
from time import perf_counter_ns as _pc
from typing import Any

from .._session import OUTBOX, RECORDER
from ..record._recorder import WorkerState
from ._handoffs import blocked_wait, gave, record_wait, skip_frames_of, thread_state, took
from ._naming import LockClass, lock_class, watched_site

__all__ = ["queue_init_factory", "watch_queue"]

_tls = RECORDER.tls  # never replaced: Recorder.reset() keeps it
_KINDS = ((queue.PriorityQueue, "queue.PriorityQueue"), (queue.LifoQueue, "queue.LifoQueue"))
# The stdlib's own _qsize: len(self.queue). A queue with one of them is measured with len(), a
# call less; any other (a subclass's) is called.
_LEN_OF_QUEUE = {
    vars(kind)["_qsize"]
    for kind in (queue.Queue, queue.LifoQueue, queue.PriorityQueue)
    if "_qsize" in vars(kind)
}


def _kind(q: Any) -> str:
    for base, kind in _KINDS:
        if isinstance(q, base):
            return kind
    return "queue.Queue"


def queue_init_factory(original: Any) -> Any:
    """The patched ``queue.Queue.__init__`` (``LifoQueue`` and ``PriorityQueue`` inherit it): a
    queue created by watched code is one watched class."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            site = watched_site(1)
            if site is not None:
                watch_queue(self, lock_class(site, _kind(self), site))
        except Exception as exc:  # never into the host: the queue works unwatched
            OUTBOX.failed(exc)

    return __init__


def watch_queue(q: Any, queue_class: LockClass) -> None:
    """Make ``q`` a watched queue of class ``queue_class`` (called at its creation)."""
    q._lockwatch_class = queue_class
    get, put, size = q._get, q._put, q._qsize
    sized = type(q)._qsize in _LEN_OF_QUEUE

    def _get() -> Any:
        item = get()
        try:  # a checkout; this runs on every get
            try:
                state = _tls.st
            except AttributeError:
                state = RECORDER.thread_state()
            if not state.in_lockwatch:
                took(state, q._lockwatch_class, len(q.queue) if sized else size(), -1)
        except Exception as exc:
            OUTBOX.failed(exc)
        return item

    def _put(item: Any) -> None:
        put(item)
        try:  # a checkin and a hand-over; this runs on every put. Every item came in through
            # a watched put: the most it held is the capacity seen.
            try:
                state = _tls.st
            except AttributeError:
                state = RECORDER.thread_state()
            if not state.in_lockwatch:
                gave(state, q._lockwatch_class, len(q.queue) if sized else size())
        except Exception as exc:
            OUTBOX.failed(exc)

    q._get = _get
    q._put = _put
    _time_waits(q.not_empty, q, _take_wait_ended)
    _time_waits(q.not_full, q, _give_wait_ended)


def _time_waits(condition: Any, q: Any, ended: Any) -> None:
    """Time every ``wait`` on one of the queue's conditions as a hand-off wait of the queue."""
    wait = condition.wait

    def _wait(timeout: float | None = None) -> bool:
        state = thread_state()
        if state.in_lockwatch:
            return wait(timeout)
        return blocked_wait(q, state, q._lockwatch_class, ended, wait, timeout)

    _wait.__doc__ = wait.__doc__
    condition.wait = _wait


def _take_wait_ended(
    q: Any, state: WorkerState, queue_class: LockClass, t0: int, context: Any, ok: Any, raised: bool
) -> None:
    """A ``get`` waited on an empty queue (``ok``: the condition's answer; raised: it gave up)."""
    record_wait(state, queue_class, t0, _pc(), not raised and bool(ok), context, False)


def _give_wait_ended(
    q: Any, state: WorkerState, queue_class: LockClass, t0: int, context: Any, ok: Any, raised: bool
) -> None:
    """A ``put`` waited on a full queue."""
    record_wait(state, queue_class, t0, _pc(), not raised and bool(ok), context, True)


skip_frames_of(globals())
