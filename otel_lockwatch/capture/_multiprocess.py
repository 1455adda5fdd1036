"""Multi-process pools: every process reports, cross-process locks are watched.

A ``ProcessPoolExecutor``, a ``multiprocessing.Pool`` or a pre-fork server spreads one pool's
contention over many processes. Each process records its own locks and writes its own manifest;
``otel-lockwatch merge`` (``merge_manifests``) adds them up exactly. This module makes that happen
for the three start methods, and watches the locks that cross processes.

**File naming.** The parent writes the configured path. A child
(``multiprocessing.parent_process()`` is not None, or a plain ``os.fork()`` child) writing a path
without ``{pid}`` inserts ``.{pid}`` before the suffix: ``lockwatch-manifest.json`` becomes
``lockwatch-manifest.12345.json``. A child that recorded no lock activity at all (the forkserver
process, an idle pool worker) writes no manifest.

**fork.** The child inherits the instrumentation. At the fork (``os.register_at_fork``) the child
marks itself a child and resets the exporter's per-process state (its write lock, the
manifest-span flag, the checkpoint thread, restarted when an interval is set). A multiprocessing
child ends through ``os._exit`` after ``multiprocessing.util._exit_function()``, which runs the
``multiprocessing.util.Finalize`` callbacks; ``Process._bootstrap`` clears the finalizers it
inherited and then runs the ``util.register_after_fork`` callbacks, so the manifest's finalizer
is registered by such a callback (with ``exitpriority=100``: before the queues and semaphores are
torn down). A plain ``os.fork()`` child that exits normally runs the inherited ``atexit`` hook and
writes its own pid-suffixed file.

**spawn and forkserver.** Their children are new interpreters, instrumented at startup as
``opentelemetry-instrument`` does it: ``instrument()`` prepends ``otel_lockwatch/_bootstrap`` (a
``sitecustomize``) to ``PYTHONPATH`` and puts its options in
``OTEL_PYTHON_LOCKWATCH_CHILD_OPTIONS`` (JSON). The bootstrap instruments only multiprocessing's
own interpreters (``python -c "from multiprocessing.spawn import ..."`` and the forkserver), never
a ``python script.py`` subprocess, then chains to any other ``sitecustomize``. Under
``opentelemetry-instrument`` nothing is added: its own ``sitecustomize`` instruments every child.

**Cross-process locks.** ``multiprocessing.Lock``, ``RLock``, ``Semaphore`` and
``BoundedSemaphore`` created by watched code while instrumented are named by their creation site
(or ``name_lock``). ``SemLock`` binds ``acquire`` / ``release`` as *instance* attributes
(``_make_methods``, from ``__init__`` and ``__setstate__``), so a watched one gets instance
methods of a small tracker instead, and the class's ``__enter__`` / ``__exit__`` defer to them.
Locks are timed like ``threading`` locks (try first, the clock only on contention, per-thread
statistics, the held stack and the lock order); semaphores have no owner, so only their waits
and counts are recorded. A fork child inherits the tracker. A spawn or forkserver child unpickles
the lock: ``__getstate__`` wraps the state in an object whose unpickling (a function of this
module) hands the plain state to ``SemLock.__setstate__`` and remembers the lock's class under the
semaphore's name, so the instrumented child names it as the parent did, and an uninstrumented
child still unpickles a plain lock.

**Pool size.** ``ProcessPoolExecutor``'s ``max_workers`` and ``multiprocessing.Pool``'s
``processes`` are the nominal pool size (``"executor"``), which a merged manifest keeps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import multiprocessing
import multiprocessing.context
import multiprocessing.pool
import multiprocessing.synchronize as _sync
import multiprocessing.util as _mp_util
import os
import sys
import weakref
from concurrent.futures import ProcessPoolExecutor
from time import perf_counter_ns as _pc
from typing import Any

from ..record._outbox import OUTBOX
from ..record._recorder import RECORDER, Stats
from ._naming import LockClass, lock_class, watched_site
from ._wrappers import _check_order, _ctx_get, _record_wait, _untrack

__all__ = [
    "BOOTSTRAP_DIR",
    "CHILD_OPTIONS_ENV",
    "EXIT_PRIORITY",
    "child_options",
    "instrument",
    "is_child",
    "manifest_path",
    "mark_child",
    "skip_write",
    "uninstrument",
    "write_at_process_end",
]

logger = logging.getLogger("otel_lockwatch")

#: The options a bootstrapped child instruments itself with (JSON: ``instrument()`` kwargs).
CHILD_OPTIONS_ENV = "OTEL_PYTHON_LOCKWATCH_CHILD_OPTIONS"
#: The directory holding the bootstrap ``sitecustomize`` prepended to ``PYTHONPATH``.
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")
#: ``opentelemetry-instrument``'s own sitecustomize directory, when it runs the program.
_OTEL_AUTO_DIR = os.path.join("opentelemetry", "instrumentation", "auto_instrumentation")
#: multiprocessing's finalizers run in decreasing priority: the manifest goes first.
EXIT_PRIORITY = 100

_KINDS = {
    _sync.Lock: "multiprocessing.Lock",
    _sync.RLock: "multiprocessing.RLock",
    _sync.Semaphore: "multiprocessing.Semaphore",
    _sync.BoundedSemaphore: "multiprocessing.BoundedSemaphore",
}
_CONTEXT_FACTORIES = frozenset({"Lock", "RLock", "Semaphore", "BoundedSemaphore", "Pool"})

_getframe = sys._getframe
_NO_TIMEOUT_TYPES = (int, float)


class _State:
    """This module's per-process state (one object, so the at-fork hook and tests see one truth)."""

    active = False  # instrumented now
    child = False  # a forked or bootstrapped child (parent_process() covers the rest)
    at_fork_registered = False
    after_fork_pid = 0  # the pid whose multiprocessing after-fork registry holds our callback
    added_path = False  # we prepended BOOTSTRAP_DIR to PYTHONPATH
    created_pythonpath = False  # PYTHONPATH did not exist before
    set_options = False  # we set CHILD_OPTIONS_ENV
    exporter: Any = None  # what writes this process's manifest (given by instrument())


_STATE = _State()
_ORIGINALS: list[tuple[Any, str, Any]] = []
_TAGGED: weakref.WeakSet[Any] = weakref.WeakSet()
# Semaphore name -> (lock class name, site), learnt while unpickling a watched lock in a child.
_RECEIVED: dict[str, tuple[str, str]] = {}


class _Anchor:
    """A long-lived object for ``multiprocessing.util.register_after_fork`` (weak values)."""


_ANCHOR = _Anchor()


# -- which process is this, and where does it write -----------------------------------------------
def is_child() -> bool:
    """True in a multiprocessing child, a bootstrapped interpreter, an ``os.fork()`` child."""
    return _STATE.child or multiprocessing.parent_process() is not None


def mark_child() -> None:
    """Mark this process a child (called by the bootstrap ``sitecustomize``)."""
    _STATE.child = True


def manifest_path(path: str | os.PathLike[str]) -> str:
    """The path this process writes: a child inserts ``.{pid}`` before the suffix, unless the path
    already holds ``{pid}`` (``m.json`` -> ``m.{pid}.json``; ``dump_manifest`` fills it in)."""
    text = os.fspath(path)
    if "{pid}" in text or not is_child():
        return text
    head, name = os.path.split(text)
    stem, dot, suffix = name.rpartition(".")
    # No suffix (or a dot file): append.
    name = name + ".{pid}" if not dot or not stem else f"{stem}.{{pid}}.{suffix}"
    return os.path.join(head, name)


def skip_write() -> bool:
    """True for a child that recorded no lock activity at all: it writes no manifest."""
    if not is_child():
        return False
    return not any(state.stats for state in list(RECORDER._states))


# -- trackers: the instance methods of a watched SemLock ------------------------------------------
def _caller_frame() -> Any:
    """The frame that called the instrumented method (its own, when C called it directly)."""
    try:
        return _getframe(2)
    except ValueError:
        return _getframe(1)


class _LockTrack:
    """The instrumented ``acquire`` / ``release`` of one ``multiprocessing.Lock`` (in one process).

    Same results and exceptions as the ``_multiprocessing.SemLock`` methods it calls; the hold is
    tracked like ``_wrappers.LockProxy`` tracks it.
    """

    __slots__ = ("sl", "cls", "st", "entry", "s", "t0", "ctx", "depth", "__weakref__")

    def __init__(self, semlock: Any, cls: LockClass) -> None:
        self.sl = semlock
        self.cls = cls
        self.st: Any = None
        self.depth = 0

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return self._acquire(block, timeout, _caller_frame())

    def _recording(self, timeout: Any) -> tuple[Any, Stats] | None:
        """The calling thread's state and this lock's Stats in it; None when this call is not
        recorded (lockwatch itself is running, or a timeout the fast path cannot reproduce)."""
        try:
            st = RECORDER.tls.st
        except AttributeError:
            st = RECORDER.thread_state()
        if st.busy or (timeout is not None and type(timeout) not in _NO_TIMEOUT_TYPES):
            return None
        s = st.stats.get(self.cls)
        if s is None:
            s = st.stats[self.cls] = Stats()
        return st, s

    def _acquire(self, block: Any, timeout: Any, f: Any) -> bool:
        sl = self.sl
        ready = self._recording(timeout)
        if ready is None:
            return sl.acquire(block, timeout)
        st, s = ready
        cls = self.cls
        if block:
            if st.held:
                _check_order(st, cls, f, self, False)
            if sl.acquire(False):
                s.acq += 1
            else:
                ctx = _ctx_get()
                t0 = _pc()
                ok = sl.acquire(True, timeout)
                _record_wait(st, s, cls, t0, _pc(), ok, ctx, f, None)
                if not ok:
                    return False
        elif sl.acquire(False):
            s.acq += 1
            s.tryok += 1
        else:
            s.skip += 1
            return False
        entry = (cls, f, f.f_lasti, self, False)
        st.held.append(entry)
        self.entry = entry
        self.s = s
        self.ctx = _ctx_get()
        self.st = st
        self.t0 = _pc()
        return True

    def release(self) -> None:
        st = self.st
        if st is None:
            self.sl.release()
            return
        self.sl.release()  # raises if released too many times: then nothing changed
        self.st = None
        _untrack(st, self.entry, self.s, self.t0, self.ctx, None)


class _RLockTrack(_LockTrack):
    """A ``multiprocessing.RLock``: re-entry by the owning thread is neither a wait nor an edge."""

    __slots__ = ()

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return self._acquire(block, timeout, _caller_frame())

    def _acquire(self, block: Any, timeout: Any, f: Any) -> bool:
        st = self.st
        if st is not None and st is getattr(RECORDER.tls, "st", None):
            ok = self.sl.acquire(block, timeout)
            if ok:
                self.depth += 1
            return ok
        return _LockTrack._acquire(self, block, timeout, f)

    def release(self) -> None:
        st = self.st
        if st is None or st is not getattr(RECORDER.tls, "st", None):
            self.sl.release()  # not tracked, or not the owner: the lock decides (and raises)
            return
        if self.depth:
            self.sl.release()
            self.depth -= 1
            return
        _LockTrack.release(self)


class _SemaphoreTrack(_LockTrack):
    """A ``multiprocessing.Semaphore`` / ``BoundedSemaphore``: waits and counts; no owner, so no
    hold time and no part in the lock order."""

    __slots__ = ()

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return self._acquire(block, timeout, _caller_frame())

    def _acquire(self, block: Any, timeout: Any, f: Any) -> bool:
        sl = self.sl
        ready = self._recording(timeout)
        if ready is None:
            return sl.acquire(block, timeout)
        st, s = ready
        cls = self.cls
        if sl.acquire(False):
            s.acq += 1
            if not block:
                s.tryok += 1
            return True
        if not block:
            s.skip += 1
            return False
        ctx = _ctx_get()
        t0 = _pc()
        ok = sl.acquire(True, timeout)
        _record_wait(st, s, cls, t0, _pc(), ok, ctx, f, None)
        return ok

    def release(self) -> None:
        self.sl.release()
        st = getattr(RECORDER.tls, "st", None)
        if st is not None:
            st.last = _pc()


_TRACKS = {
    _sync.Lock: _LockTrack,
    _sync.RLock: _RLockTrack,
    _sync.Semaphore: _SemaphoreTrack,
    _sync.BoundedSemaphore: _SemaphoreTrack,
}


def _tag(lock: Any, cls: LockClass) -> None:
    track = _TRACKS[type(lock)](lock._semlock, cls)
    d = lock.__dict__
    d["_lw_track"] = track
    d["_lockwatch_class"] = cls
    d["acquire"] = track.acquire
    d["release"] = track.release
    _TAGGED.add(lock)


def _untag(lock: Any) -> None:
    d = lock.__dict__
    d.pop("_lw_track", None)
    d.pop("_lockwatch_class", None)
    lock._make_methods()


def _rename(lock: Any, name: str) -> None:
    # name_lock() on a SemLock (found as the class's _lockwatch_rename while instrumented).
    track = lock.__dict__.get("_lw_track")
    if track is None:
        return
    cls = lock_class(name, track.cls.kind, track.cls.site)
    track.cls = cls
    lock.__dict__["_lockwatch_class"] = cls


def _creation_site(instance: Any) -> str | None:
    """The watched creation site of ``instance``, seen from the patched ``__init__`` (the caller
    of this function): the subclasses' ``__init__`` and one ``multiprocessing.context`` factory
    are skipped; a lock created inside multiprocessing itself (a ``Condition``'s, a queue's) is
    not watched."""
    depth = 2
    f: Any = _getframe(depth)
    while f is not None and f.f_code.co_name == "__init__" and f.f_locals.get("self") is instance:
        depth += 1
        f = f.f_back
    if (
        f is not None
        and f.f_globals.get("__name__") == "multiprocessing.context"
        and f.f_code.co_name in _CONTEXT_FACTORIES
    ):
        depth += 1
    return watched_site(depth)


# -- the patches ----------------------------------------------------------------------------------
def _semlock_init_factory(original: Any) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        kind = _KINDS.get(type(self))
        if kind is None or not _STATE.active:
            return
        try:
            site = _creation_site(self)
            if site is not None:
                _tag(self, lock_class(site, kind, site))
        except Exception as exc:  # never into the host: the plain lock still works
            OUTBOX.failed(exc)

    return __init__


class _TaggedState:
    """A watched SemLock's pickled state: unpickles as the plain state, remembering the class."""

    __slots__ = ("state", "name", "site")

    def __init__(self, state: tuple, name: str, site: str) -> None:
        self.state = state
        self.name = name
        self.site = site

    def __reduce__(self) -> tuple:
        return (_received_state, (self.state, self.name, self.site))


def _received_state(state: Any, name: str, site: str) -> Any:
    """Unpickling a watched lock in another process: note its class, return the plain state."""
    try:
        if isinstance(state, tuple) and len(state) >= 4 and isinstance(state[3], str):
            _RECEIVED[state[3]] = (name, site)
    except Exception:  # pragma: no cover - never into the host
        pass
    return state


def _semlock_getstate_factory(original: Any) -> Any:
    def __getstate__(self: Any) -> Any:
        state = original(self)
        track = self.__dict__.get("_lw_track")
        if track is None:
            return state
        return _TaggedState(state, track.cls.name, track.cls.site)

    return __getstate__


def _semlock_setstate_factory(original: Any) -> Any:
    def __setstate__(self: Any, state: Any) -> None:
        original(self, state)
        if not _STATE.active:
            return
        try:
            kind = _KINDS.get(type(self))
            received = (
                _RECEIVED.get(state[3]) if kind is not None and isinstance(state, tuple) else None
            )
            if received is not None:
                _tag(self, lock_class(received[0], kind, received[1]))  # type: ignore[arg-type]
        except Exception as exc:
            OUTBOX.failed(exc)

    return __setstate__


def _semlock_enter_factory(original: Any) -> Any:
    def __enter__(self: Any) -> Any:
        track = self.__dict__.get("_lw_track")
        if track is None:
            return original(self)
        return track._acquire(True, None, _caller_frame())

    return __enter__


def _semlock_exit_factory(original: Any) -> Any:
    def __exit__(self: Any, *args: Any) -> Any:
        track = self.__dict__.get("_lw_track")
        if track is None:
            return original(self, *args)
        track.release()
        return None

    return __exit__


def _pool_init_factory(original: Any, attribute: str) -> Any:
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not _STATE.active:
            return
        try:
            if _creation_site(self) is not None:
                RECORDER.note_pool(getattr(self, attribute), "executor")
        except Exception as exc:
            OUTBOX.failed(exc)

    return __init__


# Patch targets: (owner, attribute, factory).
_TARGETS = (
    (_sync.SemLock, "__init__", _semlock_init_factory),
    (_sync.SemLock, "__getstate__", _semlock_getstate_factory),
    (_sync.SemLock, "__setstate__", _semlock_setstate_factory),
    (_sync.SemLock, "__enter__", _semlock_enter_factory),
    (_sync.SemLock, "__exit__", _semlock_exit_factory),
    (ProcessPoolExecutor, "__init__", lambda o: _pool_init_factory(o, "_max_workers")),
    (multiprocessing.pool.Pool, "__init__", lambda o: _pool_init_factory(o, "_processes")),
)


def _patch() -> None:
    if _ORIGINALS:
        return
    for owner, name, factory in _TARGETS:
        original = vars(owner)[name]
        patched = factory(original)
        patched.__wrapped__ = original
        patched.__doc__ = original.__doc__
        patched.__name__ = original.__name__
        patched.__qualname__ = original.__qualname__
        _ORIGINALS.append((owner, name, original))
        setattr(owner, name, patched)
    _sync.SemLock._lockwatch_rename = staticmethod(_rename)  # type: ignore[attr-defined]


def _unpatch() -> None:
    for owner, name, original in reversed(_ORIGINALS):
        setattr(owner, name, original)
    _ORIGINALS.clear()
    if "_lockwatch_rename" in vars(_sync.SemLock):
        del _sync.SemLock._lockwatch_rename  # type: ignore[attr-defined]
    for lock in list(_TAGGED):
        with contextlib.suppress(Exception):  # a lock whose semaphore is gone: nothing to restore
            _untag(lock)
    _TAGGED.clear()


# -- processes ------------------------------------------------------------------------------------
def _exporter() -> Any:
    return _STATE.exporter


def _after_fork_in_child() -> None:
    # os.register_at_fork: every fork child, multiprocessing's or a plain os.fork().
    _STATE.child = True
    if not _STATE.active:
        return
    exporter = _exporter()
    if exporter is not None:
        try:
            exporter._after_fork_in_child()
        except Exception as exc:
            OUTBOX.failed(exc)


def _on_process_start(anchor: Any) -> None:
    # multiprocessing.util.register_after_fork: run by Process._bootstrap in every child (fork,
    # spawn and forkserver), after it cleared the finalizers it inherited.
    if _STATE.active:
        _mp_util.Finalize(None, write_at_process_end, exitpriority=EXIT_PRIORITY)


def write_at_process_end() -> None:
    """The child's final write, run by multiprocessing before ``os._exit``."""
    exporter = _exporter()
    if exporter is not None and _STATE.active:
        exporter.close()


def _register_process_hooks() -> None:
    if not _STATE.at_fork_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(
            after_in_child=_after_fork_in_child
        )  # can't be unregistered: checks _STATE
        _STATE.at_fork_registered = True
    if _STATE.after_fork_pid != os.getpid():
        # Inherited across a fork (the registry is copied); registered afresh in a new interpreter.
        _mp_util.register_after_fork(_ANCHOR, _on_process_start)
        _STATE.after_fork_pid = os.getpid()


# -- spawn / forkserver: the bootstrap ------------------------------------------------------------
def _under_opentelemetry_instrument(pythonpath: str) -> bool:
    return any(
        os.path.normpath(p).endswith(_OTEL_AUTO_DIR) for p in pythonpath.split(os.pathsep) if p
    )


def child_options(options: Any) -> dict[str, Any]:
    """The ``instrument()`` keyword arguments a bootstrapped child uses: the parent's options,
    with the manifest path made absolute (a child may start in another directory)."""
    values = {k: v for k, v in dataclasses.asdict(options).items() if v is not None}
    if "manifest_path" in values:
        values["manifest_path"] = os.path.abspath(values["manifest_path"])
    return values


def _install_bootstrap(options: Any) -> None:
    pythonpath = os.environ.get("PYTHONPATH", "")
    if _under_opentelemetry_instrument(pythonpath):
        return  # its sitecustomize instruments every child, with the lockwatch entry point
    entries = [p for p in pythonpath.split(os.pathsep) if p]
    if BOOTSTRAP_DIR not in entries:
        _STATE.created_pythonpath = "PYTHONPATH" not in os.environ
        os.environ["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *entries])
        _STATE.added_path = True
    if options is not None:
        os.environ[CHILD_OPTIONS_ENV] = json.dumps(child_options(options), sort_keys=True)
        _STATE.set_options = True


def _remove_bootstrap() -> None:
    if _STATE.added_path:
        entries = [
            p
            for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and p != BOOTSTRAP_DIR
        ]
        if entries or not _STATE.created_pythonpath:
            os.environ["PYTHONPATH"] = os.pathsep.join(entries)
        else:
            os.environ.pop("PYTHONPATH", None)
        _STATE.added_path = False
    if _STATE.set_options:
        os.environ.pop(CHILD_OPTIONS_ENV, None)
        _STATE.set_options = False


# -- instrument / uninstrument --------------------------------------------------------------------
def instrument(options: Any = None, exporter: Any = None) -> None:
    """Watch multiprocessing locks and pools, and make every child process report.

    Args:
        options: the instrumentor's resolved ``Options`` (handed to spawned children).
        exporter: the ``ManifestExporter`` that writes this process's manifest, or None.
    """
    _STATE.active = True
    _STATE.exporter = exporter
    _patch()
    _register_process_hooks()
    _install_bootstrap(options)


def uninstrument() -> None:
    """Undo :func:`instrument` as far as possible: the patches, the watched locks' methods, the
    ``PYTHONPATH`` entry and the options variable. (The at-fork hooks stay, inert.)"""
    _STATE.active = False
    _STATE.exporter = None
    _unpatch()
    _remove_bootstrap()
