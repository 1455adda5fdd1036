"""Watched futures: a blocked wait for a future's result is a hand-off wait, setting it the give.

A pool may park each waiter on a future of its own and resolve it when a peer gives a connection
back: aiohttp's ``TCPConnector`` (``limit=2``) awaits ``loop.create_future()`` in
``_wait_for_available_connection`` and its release sets the first waiter's result. The waiter
waits for a peer, as in a condition's ``wait``. So

- a ``concurrent.futures.Future`` created by watched code while instrumented (not an executor's:
  ``submit`` is the standard library's machinery, whose futures stay plain) gets a lock class
  (kind ``concurrent.futures.Future``), named by its creation site; a ``result()`` or
  ``exception()`` on it that finds it not finished is a hand-off wait, to its return (given up
  when it timed out), and so is ``concurrent.futures.wait()`` over futures of which a watched one
  is pending (on the class of the first such);
- a future that watched code makes with ``loop.create_future()`` (not asyncio's own: a sleep's,
  an ``asyncio.Event``'s, a queue's) is a :class:`Future`, the C future's subclass with one
  ``__await__`` of its own (kind ``asyncio.Future``): a task's ``await`` on it that finds it not
  done is a hand-off wait of the task, ended when the future is resolved (the time is stamped by
  ``set_result`` / ``set_exception``; a cancelled wait is given up). A future made directly
  (``asyncio.Future()``, ``asyncio.get_running_loop()`` of an event loop that is not
  ``asyncio``'s, uvloop's) is not watched;
- ``set_result`` / ``set_exception`` of a watched future that ends a blocked wait is a give of
  the calling worker (the task, or the thread; none when a loop callback resolves it, with no
  task running). A future resolved with nobody waiting runs the plain method.

As an event is (``_events``), a future is named at its first wait that blocks: its creation
notes the creating call, and that wait finds the class and gives the one future its own
``set_result`` and ``set_exception`` (instance attributes holding it weakly).

The evaluation's rule then reads who resolved the futures: the waiters of a pool also resolve
their peers' (they give connections back): contention; a consumer waiting for a producer that
never waits is idle (``manifest._pools``; the hand-off between peers: ``_events``).

**Where it hooks.** ``concurrent.futures.Future.__init__``: a watched future becomes a
:class:`ThreadFuture` (its ``__class__`` set: the subclass's ``result`` and ``exception`` are the
hooks), so an executor's futures keep the plain class and pay nothing past their creation
(none at all on the C path, whose ``CreationGate`` sends the machinery's creations straight to
the original); the module's ``wait``; and
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
import operator
import sys
import weakref
from time import perf_counter_ns as _pc
from typing import Any

from ._events import creation_hook, creation_note_of, ended_when, hand_off_ended, named
from ._fast_path import speedups
from ._handoffs import (
    blocked_wait,
    blocked_wait_async,
    excluded_wait,
    give_hook,
    running_task_state,
    skip_frames_of,
    stamp,
    task_state,
    thread_state,
)
from ._naming import MACHINERY, WATCHED_FILES

__all__ = [
    "Future",
    "ThreadFuture",
    "create_future_factory",
    "executor_wait_factory",
    "future_init_factory",
]

_getframe = sys._getframe
_watched_file = WATCHED_FILES.get
_FINISHED = (_base.FINISHED, _base.CANCELLED, _base.CANCELLED_AND_NOTIFIED)


# -- concurrent.futures ---------------------------------------------------------------------
# The plain future's methods, called directly (a super() call costs more, per future).
_cf_result, _cf_exception = _base.Future.result, _base.Future.exception
_cf_set_result, _cf_set_exception = _base.Future.set_result, _base.Future.set_exception
_thread_calls: dict = {}


class ThreadFuture(_base.Future):
    """A watched ``concurrent.futures.Future``: the class a future made by watched code takes
    at its creation (``__class__`` set by :func:`future_init_factory`), so an executor's futures,
    of the plain class, pay nothing on their ``result``. Named ``Future``, with the same
    ``repr``."""

    _lockwatch_class: Any = None

    def result(self, timeout: float | None = None) -> Any:
        if self._state in _FINISHED:
            return _cf_result(self, timeout)
        return _blocked(self, _cf_result, self, timeout)

    def exception(self, timeout: float | None = None) -> Any:
        if self._state in _FINISHED:
            return _cf_exception(self, timeout)
        return _blocked(self, _cf_exception, self, timeout)


ThreadFuture.__name__ = ThreadFuture.__qualname__ = "Future"  # <Future at 0x... state=pending>


def _blocked(future: Any, wait: Any, *args: Any) -> Any:
    """``wait(*args)`` on a watched future not finished yet: a hand-off wait when its class is
    known (named at this first blocked wait)."""
    state = thread_state()
    if state.in_lockwatch or excluded_wait():
        return wait(*args)
    lock_class = named(future, "concurrent.futures.Future", _thread_calls, _thread_hooks)
    if lock_class is None:
        return wait(*args)
    return blocked_wait(future, state, lock_class, _thread_ended, wait, *args)


_thread_ended = ended_when(operator.methodcaller("done"))


def _waking(future: Any) -> bool:
    """Whether a set now ends a blocked wait (a ``result()`` or a ``wait()`` on it)."""
    try:
        condition: Any = future._condition
        return future._state not in _FINISHED and bool(condition._waiters or future._waiters)
    except Exception:  # a subclass without the stdlib's fields
        return False


def _thread_hooks(future: Any) -> None:
    """Give ``future`` its own ``set_result`` and ``set_exception``: a give when they end a
    blocked wait."""
    give_hook(future, "set_result", _cf_set_result, _waking, thread_state)
    give_hook(future, "set_exception", _cf_set_exception, _waking, thread_state)


def future_init_factory(original: Any) -> Any:
    """The patched ``concurrent.futures.Future.__init__``: a future made by watched code (of
    the class itself, not a subclass's) becomes a :class:`ThreadFuture` that notes its creating
    call."""
    return creation_hook(original, "concurrent.futures.Future", _watch_future)


def _watch_future(future: Any) -> None:
    if type(future) is _base.Future:  # a subclass keeps its own methods: not watched
        future.__class__ = ThreadFuture


def _executor_ended(
    futures: Any, state: Any, lock_class: Any, t0: int, context: Any, result: Any, raised: bool
) -> None:
    t1 = _pc()
    pending, test = futures
    try:
        ok = test(future.done() for future in pending)
    except Exception:
        ok = False
    hand_off_ended(pending[0], state, lock_class, t0, t1, ok, context)


def executor_wait_factory(original: Any) -> Any:
    """The patched ``concurrent.futures.wait``: a hand-off wait on the class of the first
    watched future that is pending (the call runs unchanged)."""

    def wait(fs: Any, timeout: float | None = None, return_when: str = _base.ALL_COMPLETED) -> Any:
        fs = list(fs)  # read once: the original reads it again (a generator would be spent)
        pending = [
            future
            for future in fs
            if type(future) is ThreadFuture and future._state not in _FINISHED
        ]
        state = thread_state() if pending else None
        if state is None or state.in_lockwatch or excluded_wait():
            return original(fs, timeout, return_when)
        pending = [
            future
            for future in pending
            if named(future, "concurrent.futures.Future", _thread_calls, _thread_hooks) is not None
        ]
        if not pending:
            return original(fs, timeout, return_when)
        test = all if return_when == _base.ALL_COMPLETED else any
        lock_class = pending[0]._lockwatch_class
        return blocked_wait(
            (pending, test), state, lock_class, _executor_ended, original, fs, timeout, return_when
        )

    return wait


# -- asyncio --------------------------------------------------------------------------------
_set_result = asyncio.Future.set_result
_set_exception = asyncio.Future.set_exception
_async_calls: dict = {}


class Future(asyncio.Future):
    """A watched asyncio future: ``loop.create_future()`` made by watched code (which notes
    its creating call: this class is never made otherwise)."""

    __slots__ = ("_lockwatch_class", "_lw_made", "_lw_waiting", "_lw_resolved", "_lw_peer")
    _lockwatch_class: Any  # set at the first blocked wait
    _lw_made: Any  # the creation note (_naming.creation_note)
    _lw_waiting: int  # tasks blocked on it now
    _lw_resolved: int  # when a blocked wait's future was resolved (0: not yet)
    _lw_peer: bool  # resolved by a worker that waits on the class too

    def __await__(self) -> Any:
        if not self.done():
            state = task_state()
            lock_class = None
            if not (state.in_lockwatch or excluded_wait()):
                lock_class = named(self, "asyncio.Future", _async_calls, _async_hooks)
            if lock_class is None:
                self._asyncio_future_blocking = True
                yield self  # the task waits for it to be done
            else:
                self._lw_waiting = getattr(self, "_lw_waiting", 0) + 1
                self._lw_resolved = 0
                try:
                    waiting = blocked_wait_async(
                        self, state, lock_class, _async_ended, _Parked(self)
                    )
                    yield from waiting.__await__()
                finally:
                    self._lw_waiting -= 1
            if not self.done():
                raise RuntimeError("await wasn't used with future")
        return self.result()

    __iter__ = __await__


Future.__name__ = Future.__qualname__ = "Future"  # its repr is a plain future's: <Future pending>


class _Parked:
    """What a blocked wait on a watched asyncio future awaits: the future itself, yielded to the
    task as the plain future's ``__await__`` yields it."""

    __slots__ = ("future",)

    def __init__(self, future: Any) -> None:
        self.future = future

    def __await__(self) -> Any:
        self.future._asyncio_future_blocking = True
        yield self.future


def _async_ended(
    future: Any, state: Any, lock_class: Any, t0: int, context: Any, result: Any, raised: bool
) -> None:
    t1 = getattr(future, "_lw_resolved", 0) or _pc()
    ok = future.done() and not future.cancelled()
    hand_off_ended(future, state, lock_class, t0, t1, ok, context)


def _async_hooks(future: Any) -> None:
    """Give ``future`` its own ``set_result`` and ``set_exception``: the time a blocked wait
    ends, and the resolving worker's give."""
    future._lw_waiting = 0
    ref = weakref.ref(future)
    future.set_result = _resolving(ref, _set_result)
    future.set_exception = _resolving(ref, _set_exception)


def _resolving(ref: Any, plain: Any) -> Any:
    def resolve(value: Any) -> None:
        future = ref()
        if future is not None:
            plain(future, value)
            if future._lw_waiting:
                _resolved(future)

    resolve.__name__, resolve.__doc__ = plain.__name__, plain.__doc__
    return resolve


def _resolved(future: Any) -> None:
    """A blocked wait ends here: the time, and the resolving worker's give."""
    future._lw_resolved = _pc()
    stamp(future, running_task_state, future._lockwatch_class)


def create_future_factory(original: Any) -> Any:
    """The patched ``BaseEventLoop.create_future``: a future made by watched code is a
    :class:`Future` that notes its creating call."""

    def create_future(self: Any) -> Any:
        frame = _getframe(1)
        code = frame.f_code
        module = _watched_file(code.co_filename)
        if module is None:  # not known to be watched code: the whole rule
            note = creation_note_of(frame, "asyncio.Future")
            if note is None:
                return original(self)
        else:
            note = code, frame.f_lasti, module
        future = Future(loop=self)
        future._lw_made = note
        return future

    if speedups is None:
        return create_future
    return speedups.CreationGate(original, create_future, MACHINERY)


skip_frames_of(globals(), vars(_base), vars(asyncio.futures), vars(asyncio.base_events))
