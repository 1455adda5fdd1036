"""Watched conditions: ``wait`` is a signal wait, ``notify`` its signal.

A pool built on a ``Condition`` (SQLAlchemy's ``QueuePool``, a list guarded by a condition)
checks a connection out in ``wait()``: the worker waits for a peer to give one back, not for the
mutex. So time in ``wait()`` / ``wait_for()`` on a watched condition (one created by watched code
while instrumented) is a signal wait on the condition's class (kind ``threading.Condition`` /
``asyncio.Condition``, named by its creation site), with the waits that timed out counted; every
``notify`` / ``notify_all`` call is a signal of the calling worker. A ``threading.Condition``
made without a lock gets a watched ``RLock`` of the condition's own class, so its mutex waits and
holds and its signal waits are reported together.

**Per condition, not per class.** The patched ``__init__`` gives a watched condition its own
``wait`` and ``notify`` (instance attributes wrapping what the instance had, so a subclass's
override is what runs), and ``notify_all`` when the class's does not call ``notify`` (decided
once per class from its code): ``wait_for`` calls ``self.wait`` and ``notify_all`` calls
``self.notify``, so they are covered. A condition that is not watched (the standard library's
own, in an ``Event``, a ``Barrier``, a semaphore or a queue) is never touched and costs nothing.
Like a lock proxy, a condition created while instrumented keeps recording after
``uninstrument()``.

**The re-acquire is not a signal wait.** ``wait()`` ends by re-acquiring the condition's lock
(``_acquire_restore``; for asyncio, the condition's ``acquire``). That re-acquire is a mutex
wait, recorded as one when the lock is watched, so the signal wait ends where the re-acquire
begins: the re-acquire of a watched condition stamps the wake-up time for the waiting worker.
The signal wait runs from the call to the wake-up; the re-acquire after it counts once, as the
mutex wait it is (or not at all when the lock is not watched).

The ``*_factory`` functions build what the patch table (``_patches``) installs.
"""

from __future__ import annotations

import threading
from time import perf_counter_ns as _pc
from typing import Any

from .._session import OUTBOX, RECORDER
from ._bookkeeping import current_context
from ._fast_path import speedups
from ._naming import MACHINERY, LockClass, lock_class, made_by_machinery, watched_site
from ._signal_waits import gave, signal_stats, skip_frames_of, task_state, thread_state, waited
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
    """Whether ``kind.notify_all`` signals through ``self.notify`` (which then counts it)."""
    known = _through_notify.get(kind)
    if known is None:
        code = getattr(getattr(kind, "notify_all", None), "__code__", None)
        known = _through_notify[kind] = code is not None and "notify" in code.co_names
    return known


def _is_stdlib_notify(notify: Any) -> bool:
    """Whether a bound ``notify`` is ``threading.Condition``'s own (not a subclass's override),
    whose call with no waiter only checks that the lock is held: the C path may do that itself."""
    return getattr(notify, "__func__", None) is _STDLIB_NOTIFY


def _signal_hooks(cond: Any, state: Any) -> None:
    """Give ``cond`` its own ``notify`` (and ``notify_all``, unless it calls ``notify``);
    ``state`` finds the calling worker's state (None: the calling thread's)."""
    notify = cond.notify

    def _notify(*args: Any, **kwargs: Any) -> None:
        notify(*args, **kwargs)  # raises when the lock is not held: then it signalled nothing
        # A signal (_signal_waits.gave, inlined: a condition never takes, so it has no hold to
        # pair; this runs on every notify).
        try:
            if state is None:
                try:
                    st = _tls.st
                except AttributeError:
                    st = RECORDER.thread_state()
            else:
                st = state()
            if st.in_lockwatch:
                return
            cls = cond._lockwatch_class
            s = st.signals.get(cls)
            if s is None:
                s = signal_stats(st, cls)
            s.gives += 1  # (no clock: a notify is made under the lock, whose release reads it)
        except Exception as exc:
            OUTBOX.failed(exc)

    _notify.__doc__ = notify.__doc__
    # A thread's notify runs in C when it can (the same count); a task's, here.
    cond.notify = (
        _notify
        if speedups is None or state is not None
        else speedups.ConditionNotify(notify, _notify, cond, _is_stdlib_notify(notify))
    )
    if not _calls_notify(type(cond)):
        notify_all = cond.notify_all

        def _notify_all() -> None:
            notify_all()
            try:
                st = thread_state() if state is None else state()
                if not st.in_lockwatch:
                    gave(st, cond._lockwatch_class, -1)
            except Exception as exc:
                OUTBOX.failed(exc)

        _notify_all.__doc__ = notify_all.__doc__
        cond.notify_all = _notify_all


# -- threading.Condition --------------------------------------------------------------------
def watch_condition(cond: Any, cls: LockClass) -> None:
    """Make ``cond`` a watched condition of class ``cls`` (called at its creation)."""
    cond._lockwatch_class = cls
    restore = cond._acquire_restore
    wait = cond.wait
    wakes: dict[int, int] = {}  # thread -> when its wait was woken

    def _acquire_restore(saved: Any) -> Any:
        wakes[_get_ident()] = _pc()  # woken: the wait ends here, the re-acquire is the lock's
        return restore(saved)

    def _wait(timeout: float | None = None) -> bool:
        st = thread_state()
        if st.in_lockwatch:
            return wait(timeout)
        ctx = current_context()
        me = _get_ident()
        wakes.pop(me, None)
        cls = cond._lockwatch_class
        before, st.waiting = st.waiting, cls  # for the live gauges, as _bookkeeping.timed_wait
        t0 = _pc()
        try:
            ok = wait(timeout)
        except BaseException:
            woken = wakes.pop(me, 0)
            if woken:  # it waited, then gave up (an exception while waiting)
                waited(st, cls, t0, woken, False, ctx, False)
            raise  # else it never waited (the lock was not held)
        finally:
            st.waiting = before
        waited(st, cls, t0, wakes.pop(me, 0) or _pc(), ok, ctx, False)
        return ok

    _wait.__doc__ = wait.__doc__
    cond._acquire_restore = _acquire_restore
    cond.wait = _wait
    _signal_hooks(cond, None)


def condition_init_factory(original: Any) -> Any:
    """The patched ``threading.Condition.__init__``: a condition created by watched code is
    watched; without a lock given, its lock is a watched ``RLock`` of its class."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        lock: Any = args[0] if args else kwargs.get("lock")
        cls = None
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
                cls = lock_class(site, "threading.Condition", site)
                if lock is None:
                    lock = RLockProxy.watch(_plain_rlock(), cls)
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
        if cls is not None:
            try:
                watch_condition(self, cls)
            except Exception as exc:
                OUTBOX.failed(exc)

    return __init__ if speedups is None else speedups.CreationGate(original, __init__, MACHINERY)


# -- asyncio.Condition ----------------------------------------------------------------------
def _watch_async(cond: Any, cls: LockClass) -> None:
    cond._lockwatch_class = cls
    acquire = cond.acquire  # the lock's, bound by the condition; wait() re-acquires with it
    wait = cond.wait
    wakes: dict[Any, int] = {}  # waiting worker's state -> when its wait was woken (0: not yet)

    async def _acquire() -> bool:
        st = task_state()
        if st in wakes:  # the re-acquire of a wait (else `async with`): the wait ends here
            wakes[st] = _pc()
        return await acquire()

    async def _wait() -> bool:
        st = task_state()
        if st.in_lockwatch:
            return await wait()
        ctx = current_context()
        wakes[st] = 0
        cls = cond._lockwatch_class
        before, st.waiting = st.waiting, cls  # for the live gauges
        t0 = _pc()
        try:
            result = await wait()
        except BaseException:  # cancelled (a timeout around it): it gave up
            woken = wakes.pop(st, 0)
            if woken:
                waited(st, cls, t0, woken, False, ctx, False)
            raise
        finally:
            st.waiting = before
        waited(st, cls, t0, wakes.pop(st, 0) or _pc(), True, ctx, False)
        return result

    _wait.__doc__ = wait.__doc__
    cond.acquire = _acquire
    cond.wait = _wait
    _signal_hooks(cond, task_state)


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
