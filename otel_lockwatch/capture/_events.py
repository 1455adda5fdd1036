"""Watched events: a blocked ``Event.wait`` is a hand-off wait, the ``set`` that ends it a give.

A pool that hands a connection to a waiter by setting that waiter's own ``threading.Event``
(httpcore's ``ConnectionPool``, under httpx: one event per queued request, set by the peer that
gives a connection back) checks out in ``Event.wait()``: the worker waits for a peer, not for a
mutex, exactly as in a condition's ``wait``. So an event created by watched code while
instrumented (a ``threading.Event`` or an ``asyncio.Event``: kind ``threading.Event`` /
``asyncio.Event``) belongs to a lock class, named by its creation site as a condition is (one
class for the events made at one site, however many: one per request), and

- a ``wait()`` that finds the event not set is a hand-off wait on that class, to its return (a
  ``threading.Event.wait`` that timed out, or an ``asyncio.Event.wait`` cancelled, counted as
  given up); a ``wait()`` on a set event only passes through;
- a ``set()`` that ends a blocked wait (the event was clear and had waiters) is a give of the
  calling worker. A ``set()`` nobody waited for is not counted: the evaluation's rule (a waiter
  that also gives to the class waits for its peers: contention, ``manifest._pools``) reads only
  the gives that ended waits.

**Named at the first blocked wait.** Most events a pool makes are set before anyone waits (a
request that found a connection free), so an event pays almost nothing until a wait on it
blocks: its creation notes the creating call (``_naming.creation_note``: the code object and
offset, one lookup of the file; the standard library's creations on a caller's behalf, and a
library of primitives' such as anyio's, name the caller then, since that frame is gone by the
wait), and its ``set`` is the class's own. The first ``wait()`` that blocks finds the class of
that call (``_naming.class_of_note``, remembered per call) and gives that one event a ``set`` of
its own (an instance attribute holding the event weakly), which stamps the hand-over.

**Where it hooks.** ``__init__`` and ``wait`` of the two classes, patched on the class
(``_patches``); the class gets ``_lockwatch_class = None``, so an event that is not watched (the
standard library's own: a thread's ``_started``, a ``Barrier``'s, an executor's; the events made
before instrumenting or by OpenTelemetry, ``logging`` and lockwatch) has no note and runs the
original. On the C path, the machinery's creations go straight to the original ``__init__``
(``CreationGate``), as for a condition. An event whose wait blocked keeps its own ``set`` after
``uninstrument()`` (a condition keeps its hooks too); its waits stop recording.
"""

from __future__ import annotations

import inspect
import operator
import sys
import threading
from time import perf_counter_ns as _pc
from typing import Any

from .._session import OUTBOX
from ._fast_path import speedups
from ._handoffs import (
    add_give,
    blocked_wait,
    blocked_wait_async,
    excluded_wait,
    give_hook,
    record_wait,
    running_task_state,
    skip_frames_of,
    task_state,
    thread_state,
)
from ._naming import MACHINERY, WATCHED_FILES, LockClass, class_of_note, creation_note

__all__ = [
    "async_wait_factory",
    "creation_hook",
    "creation_note_of",
    "ended_when",
    "hand_off_ended",
    "named",
    "no_class",
    "note_creation",
    "set_hook",
    "tag_init_factory",
    "threading_wait_factory",
]


_getframe = sys._getframe
_watched_file = WATCHED_FILES.get


def no_class(original: Any) -> None:
    """The class attribute ``_lockwatch_class`` of a watched kind: None (not watched) until an
    instance's first blocked wait gives it its own."""
    return None


def creation_note_of(frame: Any, kind: str) -> Any:
    """How an object is created by the call ``frame`` is making (``_naming.creation_note``;
    None: not watched): one lookup when the creating code's file is known to be watched code."""
    try:
        code = frame.f_code
        module = _watched_file(code.co_filename)
        if module is not None:
            return code, frame.f_lasti, module
        return creation_note(frame, kind)
    except Exception as exc:  # never into the host: it works unwatched
        OUTBOX.failed(exc)
        return None


def note_creation(obj: Any, frame: Any, kind: str) -> bool:
    """Note on ``obj`` (``_lw_made``) how the call ``frame`` is making created it; returns
    whether it is watched."""
    note = creation_note_of(frame, kind)
    if note is None:
        return False
    try:
        obj._lw_made = note
        return True
    except Exception as exc:  # a subclass with no room for it: it works unwatched
        OUTBOX.failed(exc)
        return False


def tag_init_factory(original: Any, kind: str) -> Any:
    """The patched ``__init__`` of an event: one made by watched code notes its creating call
    (the machinery's go straight to ``original`` on the C path)."""
    return creation_hook(original, kind, None)


def creation_hook(original: Any, kind: str, then: Any) -> Any:
    """The patched ``__init__`` of an event or a future: ``original``, then the instance notes
    its creating call (inlined: this runs for every event a pool makes), then ``then(self)``
    when the instance is watched. Of ``original``'s signature when it takes no argument (the
    standard library's ``__init__`` do: no argument tuple to build), else of any."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if note_creation(self, _getframe(1), kind) and then is not None:
            then(self)

    def __init_no_arguments__(self: Any) -> None:  # note_creation, inlined
        original(self)
        frame = _getframe(1)
        code = frame.f_code
        module = _watched_file(code.co_filename)
        if module is None:
            if note_creation(self, frame, kind) and then is not None:
                then(self)
            return
        try:
            self._lw_made = code, frame.f_lasti, module
        except Exception as exc:
            OUTBOX.failed(exc)
            return
        if then is not None:
            then(self)

    code: Any = getattr(original, "__code__", None)
    plain = code is not None and code.co_argcount == 1 and not code.co_kwonlyargcount
    plain = plain and not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
    hook = __init_no_arguments__ if plain else __init__
    hook.__name__, hook.__qualname__ = "__init__", getattr(original, "__qualname__", "__init__")
    return hook if speedups is None else speedups.CreationGate(original, hook, MACHINERY)


def named(obj: Any, kind: str, calls: dict, hooks: Any) -> LockClass | None:
    """The class of ``obj`` (an event or a future) at a wait that blocks: found from its
    creation note at the first such wait, which also gives ``obj`` the hooks ``hooks(obj)``
    installs (its own ``set``, ``set_result``); None when it is not watched."""
    lock_class = getattr(obj, "_lockwatch_class", None)  # (an asyncio future's slot: unset)
    if lock_class is not None:
        return lock_class
    try:
        lock_class = class_of_note(getattr(obj, "_lw_made", None), kind, calls)
        if lock_class is None:
            return None
        obj._lockwatch_class = lock_class  # first: a hook reads it
    except Exception as exc:  # never into the host: it works unwatched
        OUTBOX.failed(exc)
        return None
    try:
        hooks(obj)
    except Exception as exc:  # a subclass with no room for them: its sets are not seen
        OUTBOX.failed(exc)
    return lock_class


def _noted(event: Any) -> bool:
    """Whether ``event`` was made by watched code while instrumented (named, or with its
    creation noted): any other event's wait runs the original, and its worker is not looked up
    (a thread that only waits on the machinery's events is no worker)."""
    return event._lockwatch_class is not None or getattr(event, "_lw_made", None) is not None


def hand_off_ended(
    obj: Any, state: Any, lock_class: Any, t0: int, t1: int, ok: bool, context: Any
) -> None:
    """A blocked wait on ``obj`` from ``t0`` to ``t1`` (``ok``: it was set, not given up), and
    the hand-off when a peer set it (``obj._lw_peer``, stamped by the set)."""
    record_wait(state, lock_class, t0, t1, ok, context, False)
    try:
        peer = ok and getattr(obj, "_lw_peer", False) is True
    except Exception:  # a subclass's own __getattr__: no hand-off is seen
        peer = False
    if peer:
        add_give(state, lock_class)


# -- threading.Event ------------------------------------------------------------------------
_threading_calls: dict = {}


def _threading_waking(event: Any) -> bool:
    """Whether a ``set`` now ends a blocked wait."""
    try:
        return not event._flag and bool(event._cond._waiters)
    except Exception:  # a subclass without the stdlib's fields
        return False


def set_hook(waking: Any, find_state: Any) -> Any:
    """``hook(event)``: gives ``event`` its own ``set`` (``_handoffs.give_hook``), a give of
    the worker ``find_state()`` returns when ``waking(event)``."""

    def hook(event: Any) -> None:
        give_hook(event, "set", type(event).set, waking, find_state)

    return hook


def ended_when(done: Any) -> Any:
    """The ``ended`` of a thread's blocked wait on an event or a future: set (not given up) when
    ``done(obj)`` says so after it."""

    def ended(
        obj: Any, state: Any, lock_class: Any, t0: int, context: Any, result: Any, raised: bool
    ) -> None:
        t1 = _pc()
        try:
            ok = bool(done(obj))
        except Exception:  # a subclass's odd state: count the wait as given up
            ok = False
        hand_off_ended(obj, state, lock_class, t0, t1, ok, context)

    return ended


_threading_set_hook = set_hook(_threading_waking, thread_state)
_threading_ended = ended_when(operator.methodcaller("is_set"))


def threading_wait_factory(original: Any) -> Any:
    """The patched ``threading.Event.wait``."""

    def wait(self: Any, timeout: float | None = None) -> bool:
        # (_noted, inline: every Thread.start() waits on its thread's _started event, which is
        # not watched: a Python call fewer per thread started)
        if self._flag or (
            self._lockwatch_class is None and getattr(self, "_lw_made", None) is None
        ):
            return original(self, timeout)
        state = thread_state()
        if state.in_lockwatch or excluded_wait():
            return original(self, timeout)
        lock_class = named(self, "threading.Event", _threading_calls, _threading_set_hook)
        if lock_class is None:
            return original(self, timeout)
        return blocked_wait(self, state, lock_class, _threading_ended, original, self, timeout)

    return wait


# -- asyncio.Event --------------------------------------------------------------------------
_async_calls: dict = {}


def _async_waking(event: Any) -> bool:
    try:
        return not event._value and bool(event._waiters)
    except Exception:
        return False


_async_set_hook = set_hook(_async_waking, running_task_state)


def _async_ended(
    event: Any, state: Any, lock_class: Any, t0: int, context: Any, result: Any, raised: bool
) -> None:
    hand_off_ended(event, state, lock_class, t0, _pc(), not raised, context)  # raised: cancelled


def async_wait_factory(original: Any) -> Any:
    """The patched ``asyncio.Event.wait`` (the worker is the task)."""

    async def wait(self: Any) -> bool:
        if self._value or not _noted(self):
            return await original(self)
        state = task_state()
        if state.in_lockwatch or excluded_wait():
            return await original(self)
        lock_class = named(self, "asyncio.Event", _async_calls, _async_set_hook)
        if lock_class is None:
            return await original(self)
        return await blocked_wait_async(self, state, lock_class, _async_ended, original(self))

    return wait


skip_frames_of(globals(), vars(threading))
