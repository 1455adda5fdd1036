"""Watched ``threading`` locks: the ``Lock`` / ``RLock`` proxies.

A ``threading.Lock`` or ``RLock`` created by watched code while instrumented is a ``__slots__``
proxy around the real lock (not a ``wrapt.ObjectProxy``: a method on one costs about 0.6 us
more), with the lock's own methods, results, exceptions and ``repr``. Its hot path is the C
``_speedups.LockBase`` / ``RLockBase`` when the extension is built (``_fast_path``), else
:class:`PyLockBase` / :class:`_PyRLockBase` here, the reference, which also serves every call the
C path hands back. Either way the bookkeeping is ``_bookkeeping``'s.

Conditions (``_conditions``) and semaphores (``_semaphores``) have modules of their own.

The ``*_factory`` functions build what the patch table (``_patches``) installs.
"""

from __future__ import annotations

import _thread
import sys
import threading
from typing import TYPE_CHECKING, Any

from .._session import OUTBOX, RECORDER
from ..record._recorder import WorkerState
from ..record._stats import Stats
from . import _ordered
from ._bookkeeping import (
    HOLD_FIELDS,
    acquire_tracked,
    discard,
    untrack,
)
from ._collection import defer_collection, resume_collection
from ._fast_path import speedups
from ._naming import MACHINERY, LockClass, lock_class, watched_site
from ._switched_out import window_code, window_event, window_wait

__all__ = [
    "CREATION_WRAPPERS",
    "LockProxy",
    "PyLockBase",
    "RLockProxy",
    "executor_init_factory",
    "proxy_factory",
]

_getframe = sys._getframe
_tls = RECORDER.tls  # never replaced: Recorder.reset() keeps it
_TIMEOUT_MAX = threading.TIMEOUT_MAX

# Frames that are not the acquisition site: RLockProxy.acquire / _acquire_restore calling
# LockProxy.acquire, threading.Condition's __enter__ / wait() calling its lock's methods, and
# ordered() taking its locks.
_OWN_GLOBALS = globals()
_THREADING_GLOBALS = vars(threading)
_ORDERED_GLOBALS = vars(_ordered)


def _caller(frame: Any) -> Any:
    """The first frame at or above ``frame`` outside this module, ``threading`` and ``ordered``
    (``frame`` itself when there is none: C called in)."""
    first = frame
    while frame is not None and (
        frame.f_globals is _OWN_GLOBALS
        or frame.f_globals is _THREADING_GLOBALS
        or frame.f_globals is _ORDERED_GLOBALS
    ):
        frame = frame.f_back
    return frame if frame is not None else first


def _valid(blocking: Any, timeout: Any) -> bool:
    """True when (blocking, timeout) is a call the tracked path reproduces exactly."""
    if timeout == -1:
        return True
    return bool(blocking) and type(timeout) in (int, float) and 0 <= timeout <= _TIMEOUT_MAX


# -- threading.Lock ------------------------------------------------------------------------
class PyLockBase:
    """The pure-Python hot path of :class:`LockProxy`: the reference implementation.

    With the C extension built, ``LockProxy`` derives from ``_speedups.LockBase`` instead, whose
    methods run the same steps in C and hand every unusual call (a timeout, a new thread, no
    Python caller) to :meth:`acquire` here.
    """

    __slots__ = ("_lw_lock", "_lockwatch_class", *HOLD_FIELDS, "__weakref__")
    _lw_lock: Any
    _lockwatch_class: LockClass
    _lw_holder: WorkerState | None
    _lw_entry: Any
    _lw_stats: Stats
    _lw_start_ns: int
    _lw_context: Any

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        lock = self._lw_lock
        try:
            state = _tls.st
        except AttributeError:
            state = RECORDER.new_thread_state()
        if state.in_lockwatch or (timeout != -1 and not _valid(blocking, timeout)):
            return lock.acquire(blocking, timeout)
        # Under a held lock, the frame object made on first use allocates: the collector is
        # off from here until acquire_tracked closes the deferral (_collection).
        deferred = bool(state.held)
        if deferred:
            defer_collection()
        try:
            frame = _getframe(1)
        except ValueError:  # called straight from C (an atexit or C callback): no Python caller
            frame = _getframe(0)
        except BaseException:
            if deferred:
                resume_collection()
            raise
        module = frame.f_globals
        if module is _OWN_GLOBALS or module is _THREADING_GLOBALS or module is _ORDERED_GLOBALS:
            frame = _caller(frame)  # an RLock, a Condition or ordered(): the site is their caller's
        lock_class = self._lockwatch_class
        return acquire_tracked(
            lock, self, state, lock_class, frame, blocking, timeout, _wait, deferred
        )

    __enter__ = acquire
    acquire_lock = acquire

    def release(self) -> None:
        holder = self._lw_holder
        if holder is None:
            self._lw_lock.release()
            return
        # What untrack() needs is read before the lock is free (then another thread may take it).
        self._lw_holder = None
        entry = self._lw_entry
        self._lw_entry = None  # nothing of the holder (its frame) outlives the hold
        stats = self._lw_stats
        start_ns = self._lw_start_ns
        context = self._lw_context
        self._lw_lock.release()
        untrack(holder, entry, stats, start_ns, context, None)

    release_lock = release

    def __exit__(self, *args: Any) -> None:
        # release(), inlined: `with` is the common case, and calling release() from here costs
        # 7 % of a with block on this path (measured 2000 -> 2150 ns on CPython 3.11). Any
        # arguments, as the lock's own __exit__ takes.
        holder = self._lw_holder
        if holder is None:
            self._lw_lock.release()
            return
        self._lw_holder = None
        entry = self._lw_entry
        self._lw_entry = None  # nothing of the holder (its frame) outlives the hold
        stats = self._lw_stats
        start_ns = self._lw_start_ns
        context = self._lw_context
        self._lw_lock.release()
        untrack(holder, entry, stats, start_ns, context, None)


if TYPE_CHECKING:
    _LockBase = PyLockBase
else:
    _LockBase = PyLockBase if speedups is None else speedups.LockBase
# The base's allocator (LockProxy's own __new__ refuses): object.__new__, or the C type's.
_new = _LockBase.__new__


class LockProxy(_LockBase):
    """A watched ``threading.Lock``: the same methods, results, exceptions and ``repr``.

    ``acquire`` / ``__enter__`` / ``release`` / ``__exit__`` come from the base: the C
    ``_speedups.LockBase`` when it is built, else :class:`PyLockBase`.
    """

    __slots__ = ()

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # As the lock's own type (which CPython makes uninstantiable): the patched factories
        # create proxies through watch().
        raise TypeError(f"cannot create '{cls.__module__}.{cls.__name__}' instances")

    @classmethod
    def watch(cls, lock: Any, lock_class: LockClass) -> Any:
        """A proxy of this class around ``lock``, of lock class ``lock_class``: the internal
        constructor (calling the class itself raises, as for the lock's type)."""
        self = _new(cls)
        self._lw_lock = lock
        self._lockwatch_class = lock_class
        self._lw_holder = None
        return self

    def locked(self) -> bool:
        return self._lw_lock.locked()

    locked_lock = locked

    def _at_fork_reinit(self) -> None:
        self._lw_lock._at_fork_reinit()
        self._lw_forget_hold()

    def _lw_forget_hold(self) -> None:
        # Free again without a release (reinitialised): the held-stack entry goes too, or it
        # would order every later acquisition of its holder.
        holder = self._lw_holder
        if holder is not None:
            self._lw_holder = None
            discard(holder.held, self._lw_entry)

    def __repr__(self) -> str:
        return repr(self._lw_lock)

    def __reduce_ex__(self, protocol: Any) -> Any:
        # copy, deepcopy and pickle refuse a lock: the proxy refuses them the same way.
        return self._lw_lock.__reduce_ex__(protocol)

    # For Condition: whether the calling thread holds this lock, without a try-acquire.
    def _lw_is_owned(self) -> bool:
        holder = self._lw_holder
        if holder is not None:
            return holder is getattr(_tls, "st", None)
        if self._lw_lock.acquire(False):
            self._lw_lock.release()
            return False
        return True


# -- threading.RLock -----------------------------------------------------------------------
class _PyRLockBase(PyLockBase):
    """The pure-Python hot path of :class:`RLockProxy` (``_speedups.RLockBase`` in C)."""

    __slots__ = ("_lw_depth",)
    _lw_depth: int

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        try:
            state = _tls.st
        except AttributeError:
            state = RECORDER.new_thread_state()
        if self._lw_holder is state:  # re-entry by the owner: immediate
            ok = self._lw_lock.acquire(blocking, timeout)
            if ok:
                self._lw_depth += 1
            return ok
        return LockProxy.acquire(self, blocking, timeout)

    __enter__ = acquire

    def release(self) -> None:
        holder = self._lw_holder
        if holder is None or holder is not getattr(_tls, "st", None):
            self._lw_lock.release()  # not tracked, or not the owner: the lock decides (and raises)
            return
        if self._lw_depth:
            self._lw_lock.release()
            self._lw_depth -= 1
            return
        LockProxy.release(self)

    def __exit__(self, *args: Any) -> None:
        self.release()


# The wait of a failed try (the C path's window: setup_locks below; its wait is C's).
_wait = window_wait
window_code(
    acquire_tracked,
    PyLockBase.acquire,
    PyLockBase.release,
    PyLockBase.__exit__,
    _PyRLockBase.acquire,
    _PyRLockBase.release,
    _PyRLockBase.__exit__,
)

if TYPE_CHECKING:
    _RLockBase = _PyRLockBase
else:
    _RLockBase = _PyRLockBase if speedups is None else speedups.RLockBase


class RLockProxy(_RLockBase, LockProxy):
    """A watched ``threading.RLock``. Re-entry by the owner is neither a wait nor an order edge.

    ``acquire`` / ``__enter__`` / ``release`` / ``__exit__`` come from the base: the C
    ``_speedups.RLockBase`` when it is built, else :class:`_PyRLockBase`.
    """

    __slots__ = ()

    # LockProxy's, again: the C RLockBase, before LockProxy in the MRO, has a __new__ of its own.
    __new__ = LockProxy.__new__

    @classmethod
    def watch(cls, lock: Any, lock_class: LockClass) -> Any:
        """A proxy of this class around ``lock`` (see :meth:`LockProxy.watch`)."""
        self = super().watch(lock, lock_class)
        self._lw_depth = 0
        return self

    def _is_owned(self) -> bool:
        return self._lw_lock._is_owned()

    def _recursion_count(self) -> int:
        return self._lw_lock._recursion_count()

    def _release_save(self) -> Any:
        # Condition.wait(): release completely; the depth travels in the lock's own state.
        holder = self._lw_holder
        current: WorkerState | None = getattr(_tls, "st", None)
        if holder is None or holder is not current:
            return self._lw_lock._release_save()  # not tracked, or not the owner (it raises)
        # Untracked before the lock is free (another thread may take it at once, and track it).
        entry, stats, start_ns = self._lw_entry, self._lw_stats, self._lw_start_ns
        context = self._lw_context
        depth = self._lw_depth
        self._lw_holder = None
        self._lw_entry = None
        self._lw_depth = 0
        try:
            saved = self._lw_lock._release_save()
        except BaseException:  # it raised: nothing changed
            self._lw_holder = holder
            self._lw_entry = entry
            self._lw_depth = depth
            raise
        untrack(holder, entry, stats, start_ns, context, None)
        return saved

    def _acquire_restore(self, state: Any) -> None:
        # The owner re-acquires after Condition.wait(): a blocking acquire (waits and order are
        # recorded), then the re-entries the state had.
        count = state[0] if isinstance(state, tuple) and state and isinstance(state[0], int) else 1
        self.acquire()
        for _ in range(count - 1):
            self.acquire()

    def _at_fork_reinit(self) -> None:
        self._lw_lock._at_fork_reinit()
        self._lw_forget_hold()
        self._lw_depth = 0


class _Absent:
    """A name the wrapped lock's type does not have: reading it raises ``AttributeError``, so
    ``hasattr`` and ``getattr`` answer for the proxy as for the lock."""

    def __init__(self, owner: str, name: str) -> None:
        self.message = f"{owner!r} object has no attribute {name!r}"

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        raise AttributeError(self.message)


# An RLock lacks some of Lock's names (``locked`` until Python 3.14, the ``*_lock`` aliases),
# and ``_recursion_count`` before 3.11: so does its proxy.
for _name, _present in (
    ("locked", LockProxy.locked),
    ("locked_lock", LockProxy.locked),
    ("acquire_lock", RLockProxy.acquire),
    ("release_lock", RLockProxy.release),
    ("_recursion_count", RLockProxy._recursion_count),
):
    if hasattr(_thread.RLock, _name):
        setattr(RLockProxy, _name, _present)
    else:
        setattr(RLockProxy, _name, _Absent("_thread.RLock", _name))
del _name, _present


def _forwarder(name: str) -> property:
    def get(self: Any) -> Any:
        return getattr(self._lw_lock, name)

    return property(get, doc=f"The wrapped lock's {name}.")


# A name of the lock's type that the proxy does not define (one a later Python adds) is read
# from the wrapped lock. Not through a ``__getattr__``: a class that has one makes every
# attribute access of its instances go through it (a bound method made per call), which cost
# the instrumented pair about 100 ns on the C path.
for _proxy, _type in ((LockProxy, _thread.LockType), (RLockProxy, _thread.RLock)):
    for _name in dir(_type):
        if not _name.startswith("__") and not hasattr(_proxy, _name):
            setattr(_proxy, _name, _forwarder(_name))
del _proxy, _type


# -- what the patch table installs ---------------------------------------------------------
def _made(original: Any, kind: str, watch: Any, args: Any, kwargs: Any) -> Any:
    """A lock from ``original``; a proxy of class ``kind`` when the caller of the caller of
    this function is watched code."""
    lock = original(*args, **kwargs)
    try:
        site = watched_site(2)
        if site is None:
            return lock
        return watch(lock, lock_class(site, kind, site))
    except Exception as exc:  # never into the host: the plain lock still works
        OUTBOX.failed(exc)
        return lock


def proxy_factory(original: Any, kind: str, proxy: type[LockProxy]) -> Any:
    """The patched ``threading.Lock`` / ``RLock``: a proxy for a lock created by watched code.

    Where the original is a type (``threading.Lock`` is ``_thread.lock`` from Python 3.13), the
    replacement is a class too, so that what a program does with the type still works:
    ``threading.Lock | None`` is a union, ``isinstance(lock, threading.Lock)`` is true of a
    plain lock and of a proxy, it cannot be subclassed, and calling it makes a lock.
    """
    watch = proxy.watch
    if isinstance(original, type):

        class _LockType(type):
            def __instancecheck__(cls, obj: Any) -> bool:
                return isinstance(obj, (original, proxy))

            def __subclasscheck__(cls, sub: Any) -> bool:
                return issubclass(sub, (original, proxy))

            def __call__(cls, *args: Any, **kwargs: Any) -> Any:
                return _made(original, kind, watch, args, kwargs)

        def __init_subclass__(cls: type, **kwargs: Any) -> None:  # as the lock's type refuses
            raise TypeError(f"type {original.__qualname__!r} is not an acceptable base type")

        namespace: dict[str, Any] = {
            "__doc__": original.__doc__,
            "__module__": "threading",  # pickled by reference, as the type it replaced
            "__wrapped__": original,
            "__init_subclass__": classmethod(__init_subclass__),
        }
        return _LockType(kind.rpartition(".")[2], (), namespace)

    # Neither is a descriptor: a class attribute `make = threading.Lock` calls it unbound, as it
    # calls the builtin it replaces; both pickle by the name they are installed under.
    if speedups is None:
        return _Factory(original, kind, watch)

    def factory(*args: Any, **kwargs: Any) -> Any:  # every call the C gate does not answer
        return _made(original, kind, watch, args, kwargs)

    return speedups.CreationCall(original, factory, MACHINERY)


class _Factory:
    """The pure path's patched lock factory: a callable that is no descriptor, and that pickle
    saves as a reference to where it is installed (``_patches`` names it), as the builtin it
    replaced."""

    def __init__(self, original: Any, kind: str, watch: Any) -> None:
        self.__wrapped__ = original
        self._kind = kind
        self._watch = watch

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _made(self.__wrapped__, self._kind, self._watch, args, kwargs)

    def __reduce__(self) -> str:
        # named by _patches where it is installed; otherwise pickle's lookup fails, as it should
        name: str = vars(self).get("__qualname__", "<a lock factory not installed>")
        return name


#: The replacements of a lock factory or ``Condition.__init__`` that are not Python functions.
CREATION_WRAPPERS: tuple[type, ...] = (
    (_Factory,) if speedups is None else (_Factory, speedups.CreationCall, speedups.CreationGate)
)


def executor_init_factory(original: Any) -> Any:
    """The patched ``ThreadPoolExecutor.__init__``: its ``max_workers`` is the pool's nominal
    size."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            if watched_site(1) is not None:
                RECORDER.note_pool(self._max_workers, "executor")
        except Exception as exc:
            OUTBOX.failed(exc)

    return __init__


if speedups is not None:
    speedups.setup_locks(
        python_acquire=PyLockBase.acquire,
        python_rlock_acquire=_PyRLockBase.acquire,
        skip_frames=(_OWN_GLOBALS, _THREADING_GLOBALS, _ORDERED_GLOBALS),
        window=window_event,
    )
