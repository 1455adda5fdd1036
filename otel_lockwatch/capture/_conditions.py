"""Watched conditions: ``wait`` is a hand-off wait, ``notify`` its give.

A pool built on a ``Condition`` (SQLAlchemy's ``QueuePool``, a list guarded by a condition)
checks a connection out in ``wait()``: the worker waits for a peer to give one back, not for the
mutex. So time in ``wait()`` / ``wait_for()`` on a watched condition (one created by watched code
while instrumented) is a hand-off wait on the condition's class (kind ``threading.Condition`` /
``asyncio.Condition``, named by its creation site), with the waits that timed out counted; every
``notify`` / ``notify_all`` call is a give of the calling worker. A ``threading.Condition``
made without a lock gets a watched ``RLock`` of the condition's own class, so its mutex waits and
holds and its hand-off waits are reported together.

**Per condition, not per class.** The patched ``__init__`` gives a watched condition its own
``wait`` and ``notify`` (instance attributes wrapping what the instance had, so a subclass's
override is what runs), and ``notify_all`` when the class's does not call ``notify`` (decided
once per class from its code): ``wait_for`` calls ``self.wait`` and ``notify_all`` calls
``self.notify``, so they are covered. A condition that is not watched (the standard library's
own, in an ``Event``, a ``Barrier``, a semaphore or a queue) is never touched and costs nothing.
Like a lock proxy, a condition created while instrumented keeps recording after
``uninstrument()``.

**The re-acquire is not a hand-off wait.** ``wait()`` ends by re-acquiring the condition's lock
(``_acquire_restore``; for asyncio, the condition's ``acquire``). That re-acquire is a mutex
wait, recorded as one when the lock is watched, so the hand-off wait ends where the re-acquire
begins: the re-acquire of a watched condition stamps the wake-up time for the waiting worker.
The hand-off wait runs from the call to the wake-up; the re-acquire after it counts once, as the
mutex wait it is (or not at all when the lock is not watched).

The ``*_factory`` functions build what the patch table (``_patches``) installs.
"""

from __future__ import annotations

import threading
from time import perf_counter_ns as _pc
from typing import Any

from .._session import OUTBOX, RECORDER
from ..record._recorder import WorkerState
from ._fast_path import speedups
from ._handoffs import (
    add_give,
    blocked_wait,
    blocked_wait_async,
    gave,
    record_wait,
    skip_frames_of,
    task_state,
    thread_state,
)
from ._naming import MACHINERY, LockClass, lock_class, made_by_machinery, watched_site
from ._threading import LockProxy, RLockProxy

__all__ = ["async_condition_init_factory", "condition_init_factory", "watch_condition"]

_get_ident = threading.get_ident
_tls = RECORDER.tls  # never replaced: Recorder.reset() keeps it
# The plain RLock factory (this module is imported before anything is patched): a Condition's
# watched lock wraps one.
_plain_rlock = threading.RLock
_through_notify: dict[type, bool] = {}
_STDLIB_NOTIFY = threading.Condition.notify


def _calls_notify(kind: type) -> bool:
    """Whether ``kind.notify_all`` notifies through ``self.notify`` (which then counts it)."""
    known = _through_notify.get(kind)
    if known is None:
        code = getattr(getattr(kind, "notify_all", None), "__code__", None)
        known = _through_notify[kind] = code is not None and "notify" in code.co_names
    return known


def _is_stdlib_notify(notify: Any) -> bool:
    """Whether a bound ``notify`` is ``threading.Condition``'s own (not a subclass's override),
    whose call with no waiter only checks that the lock is held: the C path may do that itself."""
    return getattr(notify, "__func__", None) is _STDLIB_NOTIFY


def _notify_hooks(cond: Any, find_state: Any) -> None:
    """Give ``cond`` its own ``notify`` (and ``notify_all``, unless it calls ``notify``);
    ``find_state`` finds the calling worker's state (None: the calling thread's)."""
    notify = cond.notify

    def _notify(*args: Any, **kwargs: Any) -> None:
        notify(*args, **kwargs)  # raises when the lock is not held: then it notified nobody
        # A give with no take: a condition never takes, so it has no hold to pair.
        try:
            if find_state is None:
                try:
                    state = _tls.st
                except AttributeError:
                    state = RECORDER.thread_state()
            else:
                state = find_state()
            if not state.in_lockwatch:
                add_give(state, cond._lockwatch_class)
        except Exception as exc:
            OUTBOX.failed(exc)

    _notify.__doc__ = notify.__doc__
    # A thread's notify runs in C when it can (the same count); a task's, here.
    cond.notify = (
        _notify
        if speedups is None or find_state is not None
        else speedups.ConditionNotify(notify, _notify, cond, _is_stdlib_notify(notify))
    )
    if not _calls_notify(type(cond)):
        notify_all = cond.notify_all

        def _notify_all() -> None:
            notify_all()
            try:
                state = thread_state() if find_state is None else find_state()
                if not state.in_lockwatch:
                    gave(state, cond._lockwatch_class, -1)
            except Exception as exc:
                OUTBOX.failed(exc)

        _notify_all.__doc__ = notify_all.__doc__
        cond.notify_all = _notify_all


# -- threading.Condition --------------------------------------------------------------------
def watch_condition(cond: Any, condition_class: LockClass) -> None:
    """Make ``cond`` a watched condition of class ``condition_class`` (called at its creation)."""
    cond._lockwatch_class = condition_class
    restore = cond._acquire_restore
    wait = cond.wait
    wakes: dict[int, int] = {}  # thread -> when its wait was woken

    def _acquire_restore(saved: Any) -> Any:
        wakes[_get_ident()] = _pc()  # woken: the wait ends here, the re-acquire is the lock's
        return restore(saved)

    def _wait(timeout: float | None = None) -> bool:
        state = thread_state()
        if state.in_lockwatch:
            return wait(timeout)
        wakes.pop(_get_ident(), None)
        return blocked_wait(
            wakes, state, cond._lockwatch_class, _wait_ended, wait, timeout, enrol=False
        )

    _wait.__doc__ = wait.__doc__
    cond._acquire_restore = _acquire_restore
    cond.wait = _wait
    _notify_hooks(cond, None)


def _wait_ended(
    wakes: dict,
    state: WorkerState,
    condition_class: LockClass,
    t0: int,
    context: Any,
    ok: Any,
    raised: bool,
) -> None:
    """A thread's ``wait`` ended: at its wake-up (stamped by the re-acquire) when it was woken."""
    now = _pc()
    woken = wakes.pop(_get_ident(), 0)
    if raised:
        if woken:  # it waited, then gave up (an exception while waiting)
            record_wait(state, condition_class, t0, woken, False, context, False)
        return  # else it never waited (the lock was not held)
    record_wait(state, condition_class, t0, woken or now, bool(ok), context, False)


def condition_init_factory(original: Any) -> Any:
    """The patched ``threading.Condition.__init__``: a condition created by watched code is
    watched; without a lock given, its lock is a watched ``RLock`` of its class."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        lock: Any = args[0] if args else kwargs.get("lock")
        condition_class = None
        if lock is None and len(args) + len(kwargs) <= 1:
            try:
                machinery = made_by_machinery(1)
            except Exception as exc:  # never into the host
                OUTBOX.failed(exc)
                machinery = False
            if machinery:  # a Future's condition (one per task): its RLock made here, unasked
                original(self, _plain_rlock())
                return
        try:
            site = watched_site(1)
            if site is not None:
                condition_class = lock_class(site, "threading.Condition", site)
                if lock is None:
                    lock = RLockProxy.watch(_plain_rlock(), condition_class)
                    args, kwargs = (lock,), {}
        except Exception as exc:  # never into the host: the condition works unwatched
            OUTBOX.failed(exc)
        original(self, *args, **kwargs)
        if type(lock) is LockProxy:
            # Condition's own _is_owned() would try-acquire the lock: ask the proxy instead.
            self._is_owned = lock._lw_is_owned
        elif type(lock) is RLockProxy:
            # The real RLock's own answer, without the proxy's Python frame (notify asks it).
            self._is_owned = lock._lw_lock._is_owned
        if condition_class is not None:
            try:
                watch_condition(self, condition_class)
            except Exception as exc:
                OUTBOX.failed(exc)

    return __init__ if speedups is None else speedups.CreationGate(original, __init__, MACHINERY)


# -- asyncio.Condition ----------------------------------------------------------------------
def _watch_async(cond: Any, condition_class: LockClass) -> None:
    cond._lockwatch_class = condition_class
    acquire = cond.acquire  # the lock's, bound by the condition; wait() re-acquires with it
    wait = cond.wait
    wakes: dict[Any, int] = {}  # waiting worker's state -> when its wait was woken (0: not yet)

    async def _acquire() -> bool:
        state = task_state()
        if state in wakes:  # the re-acquire of a wait (else `async with`): the wait ends here
            wakes[state] = _pc()
        return await acquire()

    async def _wait() -> bool:
        state = task_state()
        if state.in_lockwatch:
            return await wait()
        wakes[state] = 0
        return await blocked_wait_async(
            wakes, state, cond._lockwatch_class, _async_wait_ended, wait(), enrol=False
        )

    _wait.__doc__ = wait.__doc__
    cond.acquire = _acquire
    cond.wait = _wait
    _notify_hooks(cond, task_state)


def _async_wait_ended(
    wakes: dict,
    state: WorkerState,
    condition_class: LockClass,
    t0: int,
    context: Any,
    result: Any,
    raised: bool,
) -> None:
    """A task's ``wait`` ended: at its wake-up (stamped by the re-acquire) when it was woken;
    raised (cancelled, a timeout around it): it gave up."""
    now = _pc()
    woken = wakes.pop(state, 0)
    if raised:
        if woken:
            record_wait(state, condition_class, t0, woken, False, context, False)
        return
    record_wait(state, condition_class, t0, woken or now, True, context, False)


def async_condition_init_factory(original: Any) -> Any:
    """The patched ``asyncio.Condition.__init__``: a condition created by watched code is
    watched (the worker is the task)."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            site = watched_site(1)
            if site is not None:
                _watch_async(self, lock_class(site, "asyncio.Condition", site))
        except Exception as exc:  # never into the host: the condition works unwatched
            OUTBOX.failed(exc)

    return __init__


skip_frames_of(globals())
