"""Watched futures: a blocked wait for a future's result is a signal wait, setting it the signal.

A pool may park each waiter on a future of its own and resolve it when a peer gives a connection
back: aiohttp's ``TCPConnector`` (``limit=2``) awaits ``loop.create_future()`` in
``_wait_for_available_connection`` and its release sets the first waiter's result. The waiter
waits for a peer, as in a condition's ``wait``. So

- a ``concurrent.futures.Future`` created by watched code while instrumented (not an executor's:
  ``submit`` is the standard library's machinery, whose futures stay plain) gets a lock class
  (kind ``concurrent.futures.Future``), named by its creation site; a ``result()`` or
  ``exception()`` on it that finds it not finished is a signal wait, to its return (given up when
  it timed out), and so is ``concurrent.futures.wait()`` over futures of which a watched one is
  pending (on the class of the first such);
- a future that watched code makes with ``loop.create_future()`` (not asyncio's own: a sleep's,
  an ``asyncio.Event``'s, a queue's) is a :class:`Future`, the C future's subclass with one
  ``__await__`` of its own (kind ``asyncio.Future``): a task's ``await`` on it that finds it not
  done is a signal wait of the task, ended when the future is resolved (the time is stamped by
  ``set_result`` / ``set_exception``; a cancelled wait is given up). A future made directly
  (``asyncio.Future()``, ``asyncio.get_running_loop()`` of an event loop that is not
  ``asyncio``'s, uvloop's) is not watched;
- ``set_result`` / ``set_exception`` of a watched future that ends a blocked wait is a signal of
  the calling worker (the task, or the thread; none when a loop callback resolves it, with no
  task running). A future resolved with nobody waiting costs one attribute read.

The evaluation's rule then reads who resolved the futures: the waiters of a pool also resolve
their peers' (they give connections back): contention; a consumer waiting for a producer that
never waits is idle (``manifest._pools``; the hand-off between peers: ``_events``).

**Where it hooks.** ``concurrent.futures.Future.__init__``: a watched future becomes a
:class:`ThreadFuture` (its ``__class__`` set: the subclass's ``result``, ``exception``,
``set_result`` and ``set_exception`` are the hooks), so an executor's futures keep the plain
class and pay nothing past their creation (none at all on the C path, whose ``CreationGate``
sends the machinery's creations straight to the original); the module's ``wait``; and
``asyncio.BaseEventLoop.create_future``, gated alike. A watched future differs from the plain
one only in its type (a subclass named ``Future``, with the same ``repr``): ``isinstance``,
``asyncio.isfuture`` and the task's wake-up treat it as any future. Like a condition, a watched
future keeps recording after ``uninstrument()``.
"""

from __future__ import annotations

import asyncio
import asyncio.base_events
import asyncio.futures
import concurrent.futures._base as _base
import sys
from time import perf_counter_ns as _pc
from typing import Any

from .._session import OUTBOX
from ._bookkeeping import current_context
from ._events import MISS, blocked_wait, ended, stamp
from ._fast_path import speedups
from ._naming import MACHINERY, class_of_call
from ._signal_waits import (
    excluded_wait,
    running_task_state,
    signal_stats,
    skip_frames_of,
    task_state,
    thread_state,
)

__all__ = [
    "Future",
    "ThreadFuture",
    "create_future_factory",
    "executor_wait_factory",
    "future_init_factory",
]

_getframe = sys._getframe
_FINISHED = (_base.FINISHED, _base.CANCELLED, _base.CANCELLED_AND_NOTIFIED)


# -- concurrent.futures ---------------------------------------------------------------------
# The plain future's methods, called directly (a super() call costs more, per future).
_cf_result, _cf_exception = _base.Future.result, _base.Future.exception
_cf_set_result, _cf_set_exception = _base.Future.set_result, _base.Future.set_exception


class ThreadFuture(_base.Future):
    """A watched ``concurrent.futures.Future``: the class a future made by watched code takes
    at its creation (``__class__`` set by :func:`future_init_factory`), so an executor's futures,
    of the plain class, pay nothing on their ``set_result`` and ``result``. Named ``Future``,
    with the same ``repr``."""

    _lockwatch_class: Any = None

    def result(self, timeout: float | None = None) -> Any:
        if self._state in _FINISHED:
            return _cf_result(self, timeout)
        return blocked_wait(self, self._lockwatch_class, self.done, _cf_result, self, timeout)

    def exception(self, timeout: float | None = None) -> Any:
        if self._state in _FINISHED:
            return _cf_exception(self, timeout)
        return blocked_wait(self, self._lockwatch_class, self.done, _cf_exception, self, timeout)

    def set_result(self, result: Any) -> None:
        if self._waking():
            stamp(self, thread_state, self._lockwatch_class)
        _cf_set_result(self, result)

    def set_exception(self, exception: Any) -> None:
        if self._waking():
            stamp(self, thread_state, self._lockwatch_class)
        _cf_set_exception(self, exception)

    def _waking(self) -> bool:
        """Whether a set now ends a blocked wait (a ``result()`` or a ``wait()`` on it)."""
        try:
            cond: Any = self._condition
            return self._state not in _FINISHED and bool(cond._waiters or self._waiters)
        except Exception:  # a subclass without the stdlib's fields
            return False


ThreadFuture.__name__ = ThreadFuture.__qualname__ = "Future"  # <Future at 0x... state=pending>


def future_init_factory(original: Any) -> Any:
    """The patched ``concurrent.futures.Future.__init__``: a future made by watched code (of
    the class itself, not a subclass's) becomes a :class:`ThreadFuture` of its lock class."""
    calls: dict = {}

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if type(self) is not _base.Future:  # a subclass keeps its own methods: not watched
            return
        try:
            f = _getframe(1)  # the creating call, looked up here: one call less per future
            cls = calls.get((f.f_code, f.f_lasti), MISS)
            if cls is MISS:
                cls = class_of_call(1, "concurrent.futures.Future", calls)
            if cls is not None:
                future: Any = self
                future._lockwatch_class = cls
                future.__class__ = ThreadFuture
        except Exception as exc:  # never into the host: a plain future
            OUTBOX.failed(exc)

    if speedups is None:
        return __init__
    return speedups.CreationGate(original, __init__, MACHINERY)


def executor_wait_factory(original: Any) -> Any:
    """The patched ``concurrent.futures.wait``: a signal wait on the class of the first watched
    future that is pending (the call runs unchanged)."""

    def wait(fs: Any, timeout: float | None = None, return_when: str = _base.ALL_COMPLETED) -> Any:
        fs = list(fs)  # read once: the original reads it again (a generator would be spent)
        pending = [
            f
            for f in fs
            if getattr(f, "_lockwatch_class", None) is not None and f._state not in _FINISHED
        ]
        if not pending:
            return original(fs, timeout, return_when)
        test = all if return_when == _base.ALL_COMPLETED else any

        def done() -> bool:
            return test(f.done() for f in pending)

        first = pending[0]
        return blocked_wait(first, first._lockwatch_class, done, original, fs, timeout, return_when)

    return wait


# -- asyncio --------------------------------------------------------------------------------
_set_result = asyncio.Future.set_result
_set_exception = asyncio.Future.set_exception


class Future(asyncio.Future):
    """A watched asyncio future: ``loop.create_future()`` made by watched code (which sets its
    fields: this class is never made otherwise)."""

    __slots__ = ("_lockwatch_class", "_lw_waiting", "_lw_resolved", "_lw_peer")
    _lockwatch_class: Any
    _lw_waiting: int  # tasks blocked on it now
    _lw_resolved: int  # when a blocked wait's future was resolved (0: not yet)
    _lw_peer: bool  # resolved by a worker that waits on the class too

    def __await__(self) -> Any:
        if self.done():
            return self.result()
        cls = self._lockwatch_class
        st = task_state()
        if st.in_lockwatch or excluded_wait():
            self._asyncio_future_blocking = True
            yield self  # the task waits for it to be done
        else:
            try:
                signal_stats(st, cls)
            except Exception as exc:
                OUTBOX.failed(exc)
            ctx = current_context()
            before, st.waiting = st.waiting, cls  # for the live gauges
            self._lw_waiting += 1
            self._lw_resolved = 0
            t0 = _pc()
            try:
                self._asyncio_future_blocking = True
                yield self
            finally:
                st.waiting = before
                self._lw_waiting -= 1
                ok = self.done() and not self.cancelled()
                ended(self, st, cls, t0, getattr(self, "_lw_resolved", 0) or _pc(), ok, ctx)
        if not self.done():
            raise RuntimeError("await wasn't used with future")
        return self.result()

    __iter__ = __await__

    def set_result(self, result: Any) -> None:
        _set_result(self, result)
        if self._lw_waiting:
            self._resolved()

    def set_exception(self, exception: Any) -> None:
        _set_exception(self, exception)
        if self._lw_waiting:
            self._resolved()

    def _resolved(self) -> None:
        """A blocked wait ends here: the time, and the resolving worker's signal."""
        self._lw_resolved = _pc()
        stamp(self, running_task_state, self._lockwatch_class)


Future.__name__ = Future.__qualname__ = "Future"  # its repr is a plain future's: <Future pending>


def create_future_factory(original: Any) -> Any:
    """The patched ``BaseEventLoop.create_future``: a future made by watched code is a
    :class:`Future` of its class, by creation site (remembered per creating call:
    ``_naming.class_of_call``)."""
    calls: dict = {}

    def create_future(self: Any) -> Any:
        try:
            f = _getframe(1)  # the creating call, looked up here: one call less per future
            cls = calls.get((f.f_code, f.f_lasti), MISS)
            if cls is MISS:
                cls = class_of_call(1, "asyncio.Future", calls)
            if cls is None:
                return original(self)
            future = Future(loop=self)
            future._lockwatch_class = cls
            future._lw_waiting = 0  # (the other fields are written by a wait that blocks)
            return future
        except Exception as exc:  # never into the host: a plain future
            OUTBOX.failed(exc)
            return original(self)

    if speedups is None:
        return create_future
    return speedups.CreationGate(original, create_future, MACHINERY)


skip_frames_of(globals(), vars(_base), vars(asyncio.futures), vars(asyncio.base_events))
