"""Watched redis-py locks: ``redis.lock.Lock`` (what ``Redis.lock()`` returns) and
``redis.asyncio.lock.Lock``.

redis-py is optional: :func:`targets` imports it, and the patch table (``_patches``) asks for the
targets only when ``redis`` is importable. What is patched, on both classes, by the patch table
(``__init__``, ``extend`` and ``reacquire`` wrapped through wrapt: a wrapper ``(wrapped,
instance, args, kwargs)``; the methods of every acquisition replaced by plain functions, as
redis-py's own methods are reached, since wrapt's ~0.8 us a call there took the watched pair to
the 5 % budget of a local server's two round trips: docs/ARCHITECTURE.md):

- ``__init__``: a lock created while instrumented gets its class (``_distributed.classify``: its
  creation site and key template);
- ``do_acquire``: one attempt (``SET NX PX``); a failed one marks the acquisition contended, and
  the time it was sent is when a lease starts;
- ``acquire``: the acquisition, recorded by ``_distributed`` (``blocking=False``: a try;
  ``blocking_timeout`` running out: a timeout);
- ``release``: the hold ends, also when the release raised (the failure is counted, by
  ``_failure``, and re-raised unchanged: ``LockNotOwnedError``, the key expired or was taken
  over; anything else, ``LockError``, a lost connection, a cancelled ``await``);
- ``extend`` / ``reacquire``: the lease moves.

A worker is the calling thread, or the asyncio task for ``redis.asyncio``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from time import perf_counter_ns as _pc
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
    lease_moved,
    release_begin,
    release_failed,
    released,
)

__all__ = ["KIND", "ASYNC_KIND", "targets"]

KIND = "redis.Lock"
ASYNC_KIND = "redis.asyncio.Lock"


def _blocking_index(original: Callable[..., Any]) -> int:
    """The position of ``blocking`` among ``acquire``'s arguments after ``self``."""
    return list(inspect.signature(original).parameters).index("blocking") - 1


def _failure(exc: BaseException, not_owned: type[BaseException]) -> str:
    """How a release failed: ``not_owned`` (the key expired or was taken over), else
    ``lock_error`` (nothing to release, a lost connection, a cancelled ``await``)."""
    return "not_owned" if isinstance(exc, not_owned) else "lock_error"


# -- both ------------------------------------------------------------------------------------
def _name_index(original: Callable[..., Any]) -> int:
    """The position of ``name`` among ``__init__``'s arguments after ``self``."""
    return list(inspect.signature(original).parameters).index("name") - 1


def init_factory(original: Any, kind: str) -> Any:
    """``Lock.__init__``: a lock created now is classified by its creation site and key."""
    index = _name_index(original)

    def __init__(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
        wrapped(*args, **kwargs)
        try:
            name = args[index] if len(args) > index else kwargs["name"]
            classify(instance, kind, name, creation_site(1))
        except Exception as exc:  # never into the host: the plain lock still works
            OUTBOX.failed(exc)

    return __init__


# -- redis.lock.Lock -------------------------------------------------------------------------
def do_acquire_factory(original: Any) -> Any:
    def do_acquire(self: Any, token: Any) -> bool:
        acquisition = current_acquisition()
        if acquisition is None or acquisition.lock is not self:
            return original(self, token)
        acquisition.sent_ns = _pc()
        ok = original(self, token)
        if not ok:
            contended(acquisition)
        return ok

    return do_acquire


def acquire_factory(original: Any) -> Any:
    index = _blocking_index(original)

    def acquire(self: Any, *args: Any, **kwargs: Any) -> bool:
        lock_class = self.__dict__.get("_lockwatch_class")
        if lock_class is None:
            return original(self, *args, **kwargs)
        blocking = args[index] if len(args) > index else kwargs.get("blocking")
        if blocking is None:
            blocking = self.blocking
        acquisition = begin(self, lock_class, blocking)
        if acquisition is None:
            return original(self, *args, **kwargs)
        try:
            ok = original(self, *args, **kwargs)
        except BaseException:
            abandon(acquisition)
            raise
        finish(acquisition, bool(ok), blocking, self.timeout)
        return ok

    return acquire


def release_factory(original: Any, not_owned: type[BaseException]) -> Any:
    def release(self: Any) -> None:
        if "_lockwatch_class" not in self.__dict__:
            return original(self)
        hold = release_begin(self) if self.local.token is not None else None
        try:
            original(self)
        except BaseException as exc:  # the hold ends in lockwatch's books, whatever the lock kept
            release_failed(self, hold, _failure(exc, not_owned))
            raise
        if hold is not None:
            released(self, hold)
        return None

    return release


def _extension(args: tuple, kwargs: dict) -> tuple[Any, bool]:
    """``extend``'s ``additional_time`` and ``replace_ttl``, however they were passed."""
    additional_time = args[0] if args else kwargs["additional_time"]
    replace_ttl = args[1] if len(args) > 1 else kwargs.get("replace_ttl", False)
    return additional_time, replace_ttl


def extend_factory(original: Any, not_owned: type[BaseException]) -> Any:
    def extend(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if "_lw_holds" not in instance.__dict__:
            return wrapped(*args, **kwargs)
        additional_time, replace_ttl = _extension(args, kwargs)
        sent = _pc()
        try:
            result = wrapped(*args, **kwargs)
        except not_owned:
            lease_moved(instance, sent, additional_time, replace_ttl, False)
            raise
        lease_moved(instance, sent, additional_time, replace_ttl, True)
        return result

    return extend


def reacquire_factory(original: Any, not_owned: type[BaseException]) -> Any:
    def reacquire(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        if "_lw_holds" not in instance.__dict__:
            return wrapped(*args, **kwargs)
        sent = _pc()
        try:
            result = wrapped(*args, **kwargs)
        except not_owned:
            lease_moved(instance, sent, instance.timeout, True, False)
            raise
        lease_moved(instance, sent, instance.timeout, True, True)
        return result

    return reacquire


# -- redis.asyncio.lock.Lock -----------------------------------------------------------------
def async_do_acquire_factory(original: Any) -> Any:
    async def do_acquire(self: Any, token: Any) -> bool:
        acquisition = current_acquisition()
        if acquisition is None or acquisition.lock is not self:
            return await original(self, token)
        acquisition.sent_ns = _pc()
        ok = await original(self, token)
        if not ok:
            contended(acquisition)
        return ok

    return do_acquire


def async_acquire_factory(original: Any) -> Any:
    index = _blocking_index(original)

    async def acquire(self: Any, *args: Any, **kwargs: Any) -> bool:
        lock_class = self.__dict__.get("_lockwatch_class")
        if lock_class is None:
            return await original(self, *args, **kwargs)
        blocking = args[index] if len(args) > index else kwargs.get("blocking")
        if blocking is None:
            blocking = self.blocking
        acquisition = begin(self, lock_class, blocking)
        if acquisition is None:
            return await original(self, *args, **kwargs)
        try:
            ok = await original(self, *args, **kwargs)
        except BaseException:
            abandon(acquisition)
            raise
        finish(acquisition, bool(ok), blocking, self.timeout)
        return ok

    return acquire


def async_release_factory(original: Any, not_owned: type[BaseException]) -> Any:
    async def release(self: Any) -> None:
        if "_lockwatch_class" not in self.__dict__:
            return await original(self)
        hold = release_begin(self) if self.local.token is not None else None
        try:
            await original(self)
        except BaseException as exc:  # the hold ends in lockwatch's books, whatever the lock kept
            release_failed(self, hold, _failure(exc, not_owned))
            raise
        if hold is not None:
            released(self, hold)
        return None

    return release


def _moving(
    awaitable: Any,
    lock: Any,
    sent: int,
    seconds: Any,
    replace: bool,
    not_owned: type[BaseException],
):
    async def moved() -> Any:
        try:
            result = await awaitable
        except not_owned:
            lease_moved(lock, sent, seconds, replace, False)
            raise
        lease_moved(lock, sent, seconds, replace, True)
        return result

    return moved()


def async_extend_factory(original: Any, not_owned: type[BaseException]) -> Any:
    """``extend`` returns an awaitable (and raises at once when there is nothing to extend)."""

    def extend(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        awaitable = wrapped(*args, **kwargs)
        if "_lw_holds" not in instance.__dict__:
            return awaitable
        additional_time, replace_ttl = _extension(args, kwargs)
        return _moving(awaitable, instance, _pc(), additional_time, replace_ttl, not_owned)

    return extend


def async_reacquire_factory(original: Any, not_owned: type[BaseException]) -> Any:
    def reacquire(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        awaitable = wrapped(*args, **kwargs)
        if "_lw_holds" not in instance.__dict__:
            return awaitable
        return _moving(awaitable, instance, _pc(), instance.timeout, True, not_owned)

    return reacquire


def targets() -> tuple[tuple[Any, str, Callable[..., Any], tuple, str], ...]:
    """The patch targets ``(owner, name, build, args, via)`` of redis-py's locks (imports
    redis)."""
    import redis.asyncio.lock
    import redis.lock
    from redis.exceptions import LockNotOwnedError

    sync, asy = redis.lock.Lock, redis.asyncio.lock.Lock
    return (
        (sync, "__init__", init_factory, (KIND,), "wrapt"),
        (sync, "do_acquire", do_acquire_factory, (), "setattr"),
        (sync, "acquire", acquire_factory, (), "setattr"),
        (sync, "release", release_factory, (LockNotOwnedError,), "setattr"),
        (sync, "extend", extend_factory, (LockNotOwnedError,), "wrapt"),
        (sync, "reacquire", reacquire_factory, (LockNotOwnedError,), "wrapt"),
        (asy, "__init__", init_factory, (ASYNC_KIND,), "wrapt"),
        (asy, "do_acquire", async_do_acquire_factory, (), "setattr"),
        (asy, "acquire", async_acquire_factory, (), "setattr"),
        (asy, "release", async_release_factory, (LockNotOwnedError,), "setattr"),
        (asy, "extend", async_extend_factory, (LockNotOwnedError,), "wrapt"),
        (asy, "reacquire", async_reacquire_factory, (LockNotOwnedError,), "wrapt"),
    )
