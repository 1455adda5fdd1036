"""Watched file locks: ``filelock.FileLock`` (``flock``) and ``filelock.SoftFileLock``.

filelock is optional: :func:`targets` imports it, and the patch table (``_patches``) asks for the
targets only when ``filelock`` is importable. A file lock is recorded like a Redis lock
(``_distributed``), without a lease. What is patched (``__init__`` wrapped through wrapt, a
wrapper ``(wrapped, instance, args, kwargs)``; the methods of every acquisition replaced by plain
functions: wrapt's ~0.6 us a call there took a ``flock`` pair past its 5 % budget; the
properties replaced: a wrapt wrapper is no data descriptor, so an assignment would bypass it):

- ``BaseFileLock.__init__``: a lock created while instrumented gets its class (its creation site
  and the template of its file *name*: the directory is never part of it);
- the backends' ``_acquire`` (one attempt): a second attempt marks the acquisition contended
  (the first failed);
- ``BaseFileLock.acquire``: the acquisition. A file lock is re-entrant per object (per thread,
  by default; shared by every thread with ``thread_local=False``): only the outermost acquire is
  recorded, and the release that unlocks the file ends the hold. The hold counts its own depth,
  so neither the acquire nor the release asks the lock whether it is held (``is_locked``, 0.7 us
  a call on filelock 4.3) unless the calling thread's context already holds it (a re-entry).
  ``blocking=False`` or ``timeout=0`` is a try; ``Timeout`` after a wait is a timeout
  (re-raised unchanged);
- ``BaseFileLock.release``: a release that raised is counted as a release failure
  (``lock_error``) and re-raised unchanged; its hold ends in lockwatch's books even when filelock
  still says it is locked (its descriptor could not be unlocked: the release can be retried,
  and a hold kept open would order every later acquisition of the thread);
- the ``timeout`` and ``blocking`` properties' setters: a default set after the lock was made
  drops the note of its defaults (see :func:`default_setter_factory`).

A hold that no watched release ended (the lock released while not instrumented, or by
filelock's ``force`` release of an exited thread's holds) is found at the next acquire of its
context, which finds the file unlocked: it is forgotten (:func:`~._distributed.released`).
"""

from __future__ import annotations

import os
from _thread import get_ident as _ident
from collections.abc import Callable
from typing import Any

from .._session import OUTBOX
from ._distributed import (
    abandon,
    begin,
    classify,
    contended,
    creation_site,
    current_acquisition,
    finish,
    release_failed,
    released,
)

__all__ = ["KIND", "SOFT_KIND", "targets"]

KIND = "filelock.FileLock"
SOFT_KIND = "filelock.SoftFileLock"


def init_factory(original: Any, soft: type) -> Any:
    """``BaseFileLock.__init__``: a lock created now is classified by its creation site and
    file name."""

    def __init__(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
        wrapped(*args, **kwargs)
        try:
            attributes = instance.__dict__
            if "_lockwatch_class" not in attributes:  # a singleton made again keeps its class
                kind = SOFT_KIND if isinstance(instance, soft) else KIND
                name = os.path.basename(os.fspath(instance.lock_file))
                classify(instance, kind, name, creation_site(1))
                attributes["_lw_blocking"] = _blocking(instance, None, None)
        except Exception as exc:  # never into the host: the plain lock still works
            OUTBOX.failed(exc)

    return __init__


def _blocking(lock: Any, timeout: Any, blocking: Any) -> bool:
    """Whether an acquire with these arguments (None: the lock's default) may wait: not a try
    (``blocking=False``, ``timeout=0``)."""
    if blocking is None:
        blocking = getattr(lock, "blocking", True)  # an instance default since filelock 3.14
    if timeout is None:
        timeout = getattr(lock, "timeout", -1)
    return bool(blocking) and timeout != 0


def default_setter_factory(original: property) -> property:
    """The ``timeout`` / ``blocking`` property: set, the lock's defaults are read again at each
    acquire. Until then ``with lock:`` is told from a try by the defaults the lock was made with
    (noted by ``__init__``): reading them costs ~0.5 us, more than the rest of the acquire's
    bookkeeping. (With a thread-local lock, a default set in one thread applies to it alone;
    every thread then reads them. A default set while lockwatch was not instrumented is not
    seen: the lock keeps the note it was made with.)"""
    fset = original.fset

    def set_default(self: Any, value: Any) -> None:
        fset(self, value)  # type: ignore[misc]
        self.__dict__.pop("_lw_blocking", None)

    return property(original.fget, set_default, original.fdel, original.__doc__)


def attempt_factory(original: Any) -> Any:
    """A backend's ``_acquire``: one attempt."""

    def _acquire(self: Any) -> None:
        # An attempt after the first means the first failed (so does a wait that timed out:
        # see _distributed.finish); asking the lock whether it is held costs more than this.
        acquisition = current_acquisition()
        if acquisition is not None and acquisition.lock is self:
            if acquisition.sent_ns:
                contended(acquisition)
            else:
                acquisition.sent_ns = 1
        original(self)

    return _acquire


def _shared_hold(lock: Any, holds: dict) -> Any:
    """When the calling thread keeps no hold of ``lock``: the hold every thread shares, if the
    lock was made with ``thread_local=False`` (a thread-local lock, the default, has one context
    per thread)."""
    if len(holds) == 1:
        is_thread_local = getattr(lock, "is_thread_local", None)  # filelock 3.12 and later
        if is_thread_local is not None and not is_thread_local():
            for hold in holds.values():
                return hold
    return None


def acquire_factory(original: Any, timeout_error: type[BaseException]) -> Any:
    def acquire(self: Any, *args: Any, **kwargs: Any) -> Any:
        attributes = self.__dict__
        lock_class = attributes.get("_lockwatch_class")
        if lock_class is None:
            return original(self, *args, **kwargs)
        key = _ident()
        holds = attributes.get("_lw_holds")
        if holds:  # held through this object: a re-entry when held in this thread's context
            hold = holds.get(key) or _shared_hold(self, holds)
            if hold is not None:
                if self.is_locked:  # inner: not recorded, one level deeper
                    proxy = original(self, *args, **kwargs)
                    hold.depth += 1
                    return proxy
                released(self, hold, record=False, own=hold.key == key)  # forgotten
        if args or kwargs:
            blocking = _blocking(
                self, args[0] if args else kwargs.get("timeout"), kwargs.get("blocking")
            )
        else:  # ``with lock:``: the defaults (see default_setter_factory)
            blocking = attributes.get("_lw_blocking")
            if blocking is None:
                blocking = _blocking(self, None, None)
        acquisition = begin(self, lock_class, blocking, key)
        if acquisition is None:
            return original(self, *args, **kwargs)
        try:
            proxy = original(self, *args, **kwargs)
        except timeout_error:
            finish(acquisition, False, blocking)
            raise
        except BaseException:
            abandon(acquisition)
            raise
        finish(acquisition, True, blocking)
        return proxy

    return acquire


def release_factory(original: Any) -> Any:
    def release(self: Any, *args: Any, **kwargs: Any) -> None:
        holds = self.__dict__.get("_lw_holds")
        if holds is None:  # never held while watched
            return original(self, *args, **kwargs)
        # The hold's own depth says whether this release unlocks the file (``force``: at any
        # depth); asking the lock (``is_locked``) would cost more than the rest of the release.
        hold = (holds.get(_ident()) or _shared_hold(self, holds)) if holds else None
        try:
            original(self, *args, **kwargs)
        except BaseException:  # the hold ends in lockwatch's books, even if the file stays locked
            release_failed(self, hold, "lock_error")
            raise
        if hold is not None:
            if hold.depth > 1 and not (args[0] if args else kwargs.get("force")):
                hold.depth -= 1  # an inner release: the file stays locked
            else:
                released(self, hold)
        return None

    return release


def targets() -> tuple[tuple[Any, str, Callable[..., Any], tuple, str], ...]:
    """The patch targets ``(owner, name, build, args, via)`` of filelock's locks (imports it)."""
    import filelock

    base, soft = filelock.BaseFileLock, filelock.SoftFileLock
    out: list[tuple[Any, str, Callable[..., Any], tuple, str]] = [
        (base, "__init__", init_factory, (soft,), "wrapt"),
        (base, "acquire", acquire_factory, (filelock.Timeout,), "setattr"),
        (base, "release", release_factory, (), "setattr"),
    ]
    for backend in dict.fromkeys((filelock.FileLock, soft)):  # the same class without flock
        out.append((backend, "_acquire", attempt_factory, (), "setattr"))
    for name in ("timeout", "blocking"):  # the defaults that can be set (blocking: from 3.14)
        default = getattr(base, name, None)
        if isinstance(default, property) and default.fset is not None:
            out.append((base, name, default_setter_factory, (), "setattr"))
    return tuple(out)
