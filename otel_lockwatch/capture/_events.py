"""Watched events: a blocked ``Event.wait`` is a signal wait, the ``set`` that ends it its signal.

A pool that hands a connection to a waiter by setting that waiter's own ``threading.Event``
(httpcore's ``ConnectionPool``, under httpx: one event per queued request, set by the peer that
gives a connection back) checks out in ``Event.wait()``: the worker waits for a peer, not for a
mutex, exactly as in a condition's ``wait``. So an event created by watched code while
instrumented (a ``threading.Event`` or an ``asyncio.Event``: kind ``threading.Event`` /
``asyncio.Event``) gets a lock class, named by its creation site as a condition is (one class for
the events made at one site, however many: one per request), and

- a ``wait()`` that finds the event not set is a signal wait on that class, to its return (a
  ``threading.Event.wait`` that timed out, or an ``asyncio.Event.wait`` cancelled, counted as
  given up); a ``wait()`` on a set event only passes through;
- a ``set()`` that ends a blocked wait (the event was clear and had waiters) is a signal of the
  calling worker. A ``set()`` nobody waited for is not counted: the evaluation's rule (a waiter
  that also signals the class waits for its peers: contention, ``manifest._pools``) reads only
  the signals that ended waits.

**Where it hooks.** ``__init__``, ``wait`` and ``set`` of the two classes, patched on the class
(``_patches``); the class gets ``_lockwatch_class = None``, so an event that is not watched (the
standard library's own: a thread's ``_started``, a ``Barrier``'s, an executor's; the events made
before instrumenting or by OpenTelemetry, ``logging`` and lockwatch) is told apart by one
attribute read and runs the original. The clock is read only for a wait that blocks, and a set
looks for waiters (the event's own ``_cond._waiters`` / ``_waiters``) only when its event is
watched. On the C path, the machinery's creations go straight to the original ``__init__``
(``CreationGate``), as for a condition.

Unlike a watched condition, whose hooks are its own, an event stops recording at
``uninstrument()`` (the methods are the class's).
"""

from __future__ import annotations

import sys
import threading
from time import perf_counter_ns as _pc
from typing import Any

from .._session import OUTBOX
from ._bookkeeping import current_context
from ._fast_path import speedups
from ._naming import MACHINERY, class_of_call
from ._signal_waits import (
    excluded_wait,
    handed,
    running_task_state,
    signal_stats,
    signalled,
    skip_frames_of,
    task_state,
    thread_state,
    waited,
)

__all__ = [
    "MISS",
    "async_set_factory",
    "async_wait_factory",
    "blocked_wait",
    "ended",
    "no_class",
    "stamp",
    "tag_init_factory",
    "threading_set_factory",
    "threading_wait_factory",
]


_getframe = sys._getframe
#: What a creating call not seen yet finds in its kind's cache.
MISS = object()


def no_class(original: Any) -> None:
    """The class attribute ``_lockwatch_class`` of a watched kind: None (not watched) until an
    instance's ``__init__`` gives it its own."""
    return None


def tag_init_factory(original: Any, kind: str) -> Any:
    """The patched ``__init__`` of an event or a future: an instance created by watched code gets
    its lock class, by creation site, remembered per creating call (``_naming.class_of_call``;
    the machinery's go straight to ``original`` on the C path)."""
    calls: dict = {}

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            f = _getframe(1)  # the creating call, looked up here: one call less per creation
            cls = calls.get((f.f_code, f.f_lasti), MISS)
            if cls is MISS:
                cls = class_of_call(1, kind, calls)
            if cls is not None:
                self._lockwatch_class = cls
        except Exception as exc:  # never into the host: it works unwatched
            OUTBOX.failed(exc)

    return __init__ if speedups is None else speedups.CreationGate(original, __init__, MACHINERY)


def blocked_wait(obj: Any, cls: Any, done: Any, wait: Any, *args: Any) -> Any:
    """``wait(*args)`` on ``obj``, a watched event or future of class ``cls`` that has not
    happened yet, timed as a signal wait of the calling thread; ``done()`` tells, after it,
    whether the wait ended by the signal (else it gave up). Its result or exception is the
    caller's."""
    st = thread_state()
    if st.in_lockwatch or excluded_wait():
        return wait(*args)
    try:  # a worker of the class from now: it counts as alive while it waits
        signal_stats(st, cls)
    except Exception as exc:
        OUTBOX.failed(exc)
    ctx = current_context()
    before, st.waiting = st.waiting, cls  # for the live gauges, as _bookkeeping.timed_wait
    t0 = _pc()
    try:
        result = wait(*args)
    except BaseException:
        ended(obj, st, cls, t0, _pc(), _done(done), ctx)
        raise
    finally:
        st.waiting = before
    ended(obj, st, cls, t0, _pc(), _done(done), ctx)
    return result


def ended(obj: Any, st: Any, cls: Any, t0: int, t1: int, ok: bool, ctx: Any) -> None:
    """A blocked wait on ``obj`` from ``t0`` to ``t1`` (``ok``: it was set, not given up), and
    the hand-off when a peer set it (``obj._lw_peer``, stamped by the set)."""
    waited(st, cls, t0, t1, ok, ctx, False)
    try:
        peer = ok and getattr(obj, "_lw_peer", False) is True
    except Exception:  # a subclass's own __getattr__: no hand-off is seen
        peer = False
    if peer:
        handed(st, cls)


def _done(done: Any) -> bool:
    try:
        return bool(done())
    except Exception:  # a subclass's odd state: count the wait as given up
        return False


def stamp(obj: Any, state: Any, cls: Any) -> None:
    """A set that ends a blocked wait on ``obj``: the setter's signal, and whether it was a
    peer's (read by the waiter when it wakes: so stamped before the set wakes it)."""
    try:
        obj._lw_peer = not excluded_wait() and signalled(state, cls)
    except Exception as exc:  # a subclass with no room for it: no hand-off is seen
        OUTBOX.failed(exc)


# -- threading.Event ------------------------------------------------------------------------
def threading_wait_factory(original: Any) -> Any:
    """The patched ``threading.Event.wait``."""

    def wait(self: Any, timeout: float | None = None) -> bool:
        cls = self._lockwatch_class
        if cls is None or self._flag:
            return original(self, timeout)
        return blocked_wait(self, cls, self.is_set, original, self, timeout)

    return wait


def threading_set_factory(original: Any) -> Any:
    """The patched ``threading.Event.set``: a signal when it ends a blocked wait."""

    def set(self: Any) -> None:  # noqa: A001 (the method's own name)
        cls = self._lockwatch_class
        if cls is None:
            return original(self)
        try:
            waking = not self._flag and bool(self._cond._waiters)
        except Exception:  # a subclass without the stdlib's fields
            waking = False
        if waking:
            stamp(self, thread_state, cls)
        original(self)

    return set


# -- asyncio.Event --------------------------------------------------------------------------
def async_wait_factory(original: Any) -> Any:
    """The patched ``asyncio.Event.wait`` (the worker is the task)."""

    async def wait(self: Any) -> bool:
        cls = self._lockwatch_class
        if cls is None or self._value:
            return await original(self)
        st = task_state()
        if st.in_lockwatch or excluded_wait():
            return await original(self)
        try:
            signal_stats(st, cls)
        except Exception as exc:
            OUTBOX.failed(exc)
        ctx = current_context()
        before, st.waiting = st.waiting, cls  # for the live gauges
        t0 = _pc()
        try:
            result = await original(self)
        except BaseException:  # cancelled (a timeout around it): it gave up
            waited(st, cls, t0, _pc(), False, ctx, False)
            raise
        finally:
            st.waiting = before
        ended(self, st, cls, t0, _pc(), True, ctx)
        return result

    return wait


def async_set_factory(original: Any) -> Any:
    """The patched ``asyncio.Event.set``: a signal when it ends a blocked wait."""

    def set(self: Any) -> None:  # noqa: A001
        cls = self._lockwatch_class
        if cls is None:
            return original(self)
        try:
            waking = not self._value and bool(self._waiters)
        except Exception:
            waking = False
        if waking:
            stamp(self, running_task_state, cls)
        original(self)

    return set


skip_frames_of(globals(), vars(threading))
