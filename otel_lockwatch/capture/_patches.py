"""Every patch lockwatch makes, in one table that drives both directions.

An entry of :data:`PATCHES` names an owner (a module or a class), an attribute, how to build what
goes there from what was there (``build(original, *args)``), and how it goes there (``via``):

- :data:`WRAPT`: ``build`` returns a wrapt wrapper, ``wrapper(wrapped, instance, args, kwargs)``,
  and :func:`install` wraps the attribute with it as the OpenTelemetry instrumentors do
  (``wrapt.wrap_object`` with a ``FunctionWrapper``); :func:`uninstall` removes that very wrapper
  with ``wrapt.unwrap_object``, which puts the original back where it was defined (or removes the
  copy a wrap through a subclass made), and splices it out from under a wrapper another
  instrumentation put on top meanwhile. What costs a round trip, a system call or a process
  goes this way: the creation of a Redis, file or multiprocessing lock, a Redis lease's move,
  a multiprocessing lock's pickling, a process pool's creation; wrapt's ~0.5 us a call is lost
  in it.
- :data:`SETATTR`: ``build`` returns the replacement itself, a plain function (or one of the C
  path's callables, or a property), set on the owner; :func:`uninstall` puts exactly the object
  that was there back (or removes the attribute, where there was none). What runs at every
  acquisition goes this way (and ``threading``'s factories, ``Condition.__init__`` and the
  section arrays' methods are C callables on the C path): there wrapt's bound wrapper costs from
  half an in-process primitive's operation to several times it, and takes a Redis or file
  lock's pair to or past its 5 % budget (docs/ARCHITECTURE.md, "How the patches are
  installed", has the figures; ``benchmarks/bench_patching.py`` and
  ``benchmarks/bench_distributed.py`` measure them). Each replacement carries its original in
  ``__wrapped__``.

What is patched pickles by reference to where it is installed, as the original does
(``threading.Lock`` pickles as ``threading.Lock``, not as a function of lockwatch's; a wrapped
method as ``getattr(owner, name)``): ``multiprocessing``'s managers keep ``threading.Lock`` and
``RLock`` in a registry that the spawn and forkserver start methods pickle, and the unpickling
process takes its own ``threading.Lock``.

What is patched:

- ``StripedSections._acquire`` / ``_release`` and their async twins: every entry point of an
  array goes through them, so arrays created before and after ``instrument()`` are covered.
- ``threading.Lock`` and ``threading.RLock`` (the factories): a lock created afterwards by watched
  code is a proxy that records; locks created before, and by OpenTelemetry, ``logging``,
  otel-lockwatch and the stdlib's own machinery, are the plain locks they always were.
  (``from threading import Lock`` done before instrumenting keeps the plain factory.)
- ``threading.Condition.__init__`` and ``asyncio.Condition.__init__``: a condition created by
  watched code gets its own ``wait`` and ``notify`` (hand-off waits and gives); a threading one
  made without a lock gets a watched RLock.
- ``queue.Queue.__init__`` (``LifoQueue`` and ``PriorityQueue`` inherit it): a queue created by
  watched code gets its own storage hooks and condition waits; other queues are untouched.
- ``threading.Semaphore`` / ``BoundedSemaphore``, ``asyncio.Lock`` / ``asyncio.Semaphore`` /
  ``BoundedSemaphore``, and ``multiprocessing``'s ``SemLock``: ``__init__`` tags an instance
  created by watched code with its lock class, and the methods record tagged instances only.
- ``threading.Event`` and ``asyncio.Event`` (``__init__``, ``wait``; the class attribute
  ``_lockwatch_class``, None, is added while instrumented),
  ``concurrent.futures.Future.__init__`` and ``concurrent.futures.wait``, and
  ``BaseEventLoop.create_future``: an event or a future created by watched code notes its
  creating call (a future becomes of a watched subclass); a wait on it that blocks names its
  lock class and is a hand-off wait, the set that ends it a give.
- ``ThreadPoolExecutor``, ``ProcessPoolExecutor`` and ``multiprocessing.Pool``: their size is the
  pool's nominal size.
- Distributed locks, where their library is installed (:data:`OPTIONAL`: the library is imported
  at ``instrument()`` when it is importable, never required): redis-py's ``Lock`` and its asyncio
  twin (``_redis``), filelock's ``FileLock`` and ``SoftFileLock`` (``_filelock``).
"""

from __future__ import annotations

import asyncio.base_events
import asyncio.locks
import concurrent.futures
import concurrent.futures._base
import functools
import importlib.util
import multiprocessing.pool
import multiprocessing.synchronize as _sync
import queue
import threading
import types
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import wrapt

from .._session import OUTBOX
from ..sections._asyncio import AsyncStripedSections
from ..sections._threaded import StripedSections
from . import (
    _asyncio,
    _conditions,
    _events,
    _filelock,
    _futures,
    _mp_locks,
    _queues,
    _redis,
    _sections,
    _semaphores,
    _threading,
)
from ._multiprocess import pool_init_factory
from ._naming import lock_class, watched_site

__all__ = [
    "OPTIONAL",
    "PATCHES",
    "SETATTR",
    "WRAPT",
    "Installed",
    "Patch",
    "PatchWrapper",
    "install",
    "uninstall",
]

#: How a :class:`Patch` is installed: wrapped through wrapt, or replaced by ``setattr``.
WRAPT = "wrapt"
SETATTR = "setattr"


def tag_init_factory(original: Any, kind: str) -> Any:
    """The patched ``__init__`` of a semaphore or an asyncio lock: an instance created by watched
    code gets its lock class, by creation site."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            site = watched_site(1)
            if site is not None:
                self._lockwatch_class = lock_class(site, kind, site)
        except Exception as exc:  # never into the host: the plain primitive still works
            OUTBOX.failed(exc)

    return __init__


@dataclass(frozen=True)
class Patch:
    """One patched attribute: ``owner.name`` is wrapped by the wrapt wrapper
    ``build(original, *args)`` (``via=WRAPT``), or becomes it (``via=SETATTR``)."""

    owner: Any
    name: str
    build: Callable[..., Any]
    args: tuple = ()
    via: str = SETATTR

    def __post_init__(self) -> None:
        if self.via not in (WRAPT, SETATTR):
            raise ValueError(f"a patch is installed via {WRAPT!r} or {SETATTR!r}, not {self.via!r}")


class _BoundPatchWrapper(wrapt.BoundFunctionWrapper):
    """A :class:`PatchWrapper` bound (to an instance, or to the class it is read from)."""

    __slots__ = ()  # no dict to make at each binding

    def __reduce_ex__(self, protocol: Any) -> tuple:
        # As a bound method pickles: the attribute of its instance (or of its class).
        parent = self._self_parent
        instance = self._self_instance
        return getattr, (
            parent._self_patched_owner if instance is None else instance,
            parent._self_patched_name,
        )


class PatchWrapper(wrapt.FunctionWrapper):
    """wrapt's ``FunctionWrapper`` around ``owner.name``, pickled by reference to where it is
    installed (a plain proxy refuses to be pickled), as the function it wraps is."""

    __slots__ = ("_self_patched_owner", "_self_patched_name")
    __bound_function_wrapper__ = _BoundPatchWrapper

    def __init__(self, wrapped: Any, wrapper: Any, owner: Any, name: str) -> None:
        super().__init__(wrapped, wrapper)
        self._self_patched_owner = owner
        self._self_patched_name = name

    def __reduce_ex__(self, protocol: Any) -> tuple:
        return getattr, (self._self_patched_owner, self._self_patched_name)


_sem_init = _semaphores.semaphore_init_factory
_Future = concurrent.futures.Future

PATCHES: tuple[Patch, ...] = (
    # section arrays
    Patch(StripedSections, "_acquire", _sections.section_acquire_factory),
    Patch(StripedSections, "_release", _sections.section_release_factory),
    Patch(AsyncStripedSections, "_acquire", _asyncio.async_section_acquire_factory),
    Patch(AsyncStripedSections, "_release", _asyncio.async_section_release_factory),
    # threading
    Patch(threading, "Lock", _threading.proxy_factory, ("threading.Lock", _threading.LockProxy)),
    Patch(threading, "RLock", _threading.proxy_factory, ("threading.RLock", _threading.RLockProxy)),
    Patch(threading.Condition, "__init__", _conditions.condition_init_factory),
    Patch(threading.Semaphore, "__init__", _sem_init, ("threading.Semaphore",)),
    Patch(threading.BoundedSemaphore, "__init__", _sem_init, ("threading.BoundedSemaphore",)),
    Patch(threading.Semaphore, "acquire", _semaphores.threading_acquire_factory),
    # `with` calls __enter__, which the class binds to the original acquire
    Patch(threading.Semaphore, "__enter__", _semaphores.threading_acquire_factory),
    Patch(threading.Semaphore, "release", _semaphores.threading_release_factory),
    Patch(threading.BoundedSemaphore, "release", _semaphores.threading_release_factory),
    Patch(ThreadPoolExecutor, "__init__", _threading.executor_init_factory),
    # events and futures: the class knows no class (None) until a watched instance's __init__
    Patch(threading.Event, "_lockwatch_class", _events.no_class),
    Patch(threading.Event, "__init__", _events.tag_init_factory, ("threading.Event",)),
    Patch(threading.Event, "wait", _events.threading_wait_factory),
    Patch(_Future, "__init__", _futures.future_init_factory),
    Patch(concurrent.futures._base, "wait", _futures.executor_wait_factory),
    Patch(concurrent.futures, "wait", _futures.executor_wait_factory),
    # queue
    Patch(queue.Queue, "__init__", _queues.queue_init_factory),
    # asyncio
    Patch(asyncio.locks.Lock, "__init__", tag_init_factory, ("asyncio.Lock",)),
    Patch(asyncio.locks.Lock, "acquire", _asyncio.lock_acquire_factory),
    Patch(asyncio.locks.Lock, "release", _asyncio.lock_release_factory),
    Patch(asyncio.locks.Semaphore, "__init__", _sem_init, ("asyncio.Semaphore",)),
    Patch(asyncio.locks.BoundedSemaphore, "__init__", _sem_init, ("asyncio.BoundedSemaphore",)),
    Patch(asyncio.locks.Semaphore, "acquire", _semaphores.async_acquire_factory),
    Patch(asyncio.locks.Semaphore, "release", _semaphores.async_release_factory),
    Patch(asyncio.locks.Condition, "__init__", _conditions.async_condition_init_factory),
    Patch(asyncio.locks.Event, "_lockwatch_class", _events.no_class),
    Patch(asyncio.locks.Event, "__init__", _events.tag_init_factory, ("asyncio.Event",)),
    Patch(asyncio.locks.Event, "wait", _events.async_wait_factory),
    Patch(asyncio.base_events.BaseEventLoop, "create_future", _futures.create_future_factory),
    # multiprocessing
    Patch(_sync.SemLock, "__init__", _mp_locks.semlock_init_factory, (), WRAPT),
    Patch(_sync.SemLock, "__getstate__", _mp_locks.semlock_getstate_factory, (), WRAPT),
    Patch(_sync.SemLock, "__setstate__", _mp_locks.semlock_setstate_factory, (), WRAPT),
    # the lock path: `with lock` on every multiprocessing lock and semaphore (a queue's too)
    Patch(_sync.SemLock, "__enter__", _mp_locks.semlock_enter_factory),
    Patch(_sync.SemLock, "__exit__", _mp_locks.semlock_exit_factory),
    Patch(_sync.SemLock, "_lockwatch_rename", _mp_locks.rename_factory),  # added: nothing to wrap
    Patch(ProcessPoolExecutor, "__init__", pool_init_factory, ("_max_workers",), WRAPT),
    Patch(multiprocessing.pool.Pool, "__init__", pool_init_factory, ("_processes",), WRAPT),
)

#: Third-party locks: (the library's top-level module, a function returning its targets as
#: ``(owner, name, build, args, via)``), patched only when the module is importable.
OPTIONAL: tuple[tuple[str, Callable[[], tuple[tuple, ...]]], ...] = (
    ("redis", _redis.targets),
    ("filelock", _filelock.targets),
)


def _optional_targets() -> list[Patch]:
    """The targets of every importable library of :data:`OPTIONAL` (importing it)."""
    out: list[Patch] = []
    for module, targets in OPTIONAL:
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            continue
        try:
            optional = targets()
        except Exception as exc:  # a version that lacks what is patched: its locks go unwatched
            OUTBOX.failed(exc)
            continue
        out.extend(Patch(*target) for target in optional)
    return out


#: The replacements that pickle by reference, so are named where they are installed.
_NAMED = (types.FunctionType, *_threading.CREATION_WRAPPERS)
_ABSENT = object()  # what an attribute that did not exist is restored to: nothing
#: What :func:`install` made and :func:`uninstall` undoes (the session keeps it: ``patches``):
#: each patch, with the wrapper wrapt installed (WRAPT) or the object that was there (SETATTR).
Installed = list[tuple[Patch, Any]]


def _name_as_installed(replacement: Any, patch: Patch) -> None:
    # pickle saves a function as a reference, module and qualified name, and checks that the
    # name leads back to it: name it where it is installed (a factory that is no function,
    # _threading.proxy_factory's, pickles by the same name: its __reduce__ gives it).
    owner = patch.owner
    if isinstance(owner, types.ModuleType):
        replacement.__module__ = owner.__name__
        replacement.__name__ = replacement.__qualname__ = patch.name
    else:
        replacement.__module__ = owner.__module__
        replacement.__qualname__ = f"{owner.__qualname__}.{patch.name}"


def _apply(patch: Patch) -> Any:
    """Install one patch; returns what :func:`_remove` needs to undo it."""
    owner, name = patch.owner, patch.name
    original = vars(owner).get(name, _ABSENT)
    inherited = getattr(owner, name, None)
    built = patch.build(inherited if original is _ABSENT else original, *patch.args)
    if patch.via == WRAPT:
        # wrapt finds the attribute where it is defined (up the class's MRO, unbound) and notes
        # whether wrapping it here made a copy that unwrap_object() must remove.
        return wrapt.wrap_object(owner, name, PatchWrapper, (built, owner, name))
    if isinstance(built, types.FunctionType) and original is not _ABSENT:
        functools.update_wrapper(built, original)
    if isinstance(built, _NAMED):
        _name_as_installed(built, patch)
    setattr(owner, name, built)
    return original


def _remove(patch: Patch, kept: Any) -> None:
    owner, name = patch.owner, patch.name
    if patch.via == WRAPT:
        now = vars(owner).get(name)
        if isinstance(now, _BoundPatchWrapper) and now._self_parent is kept:
            # ``saved = Class.method; ...; Class.method = saved`` while instrumented put back
            # our wrapper bound to the class, which is no wrapper wrapt can find: ours again.
            setattr(owner, name, kept)
        try:
            # missing_ok: another party replaced the attribute wholesale; ours went with it.
            wrapt.unwrap_object(owner, name, kept, missing_ok=True)
        except wrapt.WrapperNotOutermostError as exc:  # a plain decorator on ours: left alone
            OUTBOX.failed(exc)
    elif kept is not _ABSENT:
        setattr(owner, name, kept)
    elif name in vars(owner):
        delattr(owner, name)


def install() -> Installed:
    """Patch every attribute of :data:`PATCHES` and of the importable :data:`OPTIONAL`
    libraries; returns what :func:`uninstall` undoes.

    Raises:
        Exception: whatever a patch's build raised; the patches made are undone first.
    """
    # The optional libraries are imported before anything is patched: the locks they make at
    # import are their own plumbing, and stay plain.
    targets = [*PATCHES, *_optional_targets()]
    made: Installed = []
    try:
        for patch in targets:
            made.append((patch, _apply(patch)))
    except BaseException:
        uninstall(made)
        raise
    return made


def uninstall(made: Installed) -> None:
    """Undo the patches :func:`install` made, in reverse order (emptying ``made``): a wrapper is
    removed by wrapt, a replaced attribute gets back the object that was there (or is removed,
    where there was none)."""
    while made:
        _remove(*made.pop())
