"""Striped sections: serialize the work on each entity with a fixed array of locks.

Two paths that each load an entity's state, decide, send and record can interleave so that a
subscriber sees the new state and then the old one. A lock per entity fixes the race but gives
locks a lifecycle that follows an unbounded, externally chosen set of ids (create on first use,
evict on delete, and the eviction race that splits a lock's identity). A *section array* does
not: it is a fixed array of ``count`` locks, and an entity's section is
``fnv1a_32(key) & (count - 1)`` (see :mod:`._fnv`). An unseen entity already has
a section, a deleted one has nothing to drop, and memory is O(count) whatever the number of keys.
Two keys may *collide* into one section: that serializes more than required, never less.

Both paths of the pattern are first-class:

* the event path, whose message must go out, queues: ``with sections.lock(key):`` (bounded by
  ``timeout=``, raising :class:`~otel_lockwatch.exceptions.SectionTimeout`);
* the periodic sweep, which runs again soon anyway, yields: ``with sections.try_lock(key) as
  held:`` never blocks, and a later sweep re-reads state at least as new.

A section is never reentrant: a blocking acquire of a section the caller already holds (the same
key, or a key that collides into it) raises
:class:`~otel_lockwatch.exceptions.SectionReentryError` at once instead of hanging forever.
``lock_many`` takes several sections in ascending index order (the canonical order, like Guava's
``Striped.bulkGet``), so two ``lock_many`` calls never deadlock each other.

Contract with the instrumentation (``docs/ARCHITECTURE.md``): every public entry point goes
through ``_acquire(index, key, blocking, timeout, canonical)`` and ``_release(index)``, which the
instrumentor replaces on the class; ``canonical=True`` marks ``lock_many``'s acquisitions. Per
section, ``_owners[index]`` is the holder (a thread ident, or an ``asyncio.Task``; ``None`` when
free) and ``_keys[index]`` the key it was taken with, so a waiter can tell a collision from
contention on its own entity; ``_lw`` is a slot the instrumentation keeps its per-array state
in (``None`` until then). The raw locks come from ``_thread.allocate_lock`` so that the
instrumentation, which patches ``threading.Lock``, never instruments them.
"""

from __future__ import annotations

import asyncio
from _thread import allocate_lock, get_ident
from collections import deque
from contextlib import suppress
from dataclasses import dataclass
from time import monotonic
from typing import TYPE_CHECKING, Any

from ..exceptions import SectionReentryError, SectionTimeout
from ._fnv import hash_key, str_hashes

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["AsyncStripedSections", "SectionKey", "SectionStatistics", "StripedSections"]

#: The types a section key may have (``bool`` excluded).
SectionKey = str | bytes | bytearray | int

# The hot path: a str key seen before costs one dict lookup instead of a call to hash_key.
_str_hash = str_hashes.get

# Per array, how many shared lock() managers (exact str key, no timeout) are kept.
_LOCKERS_SIZE = 1024

# 2**32: the hash has 32 bits, so a larger array would have sections no key reaches.
_MAX_COUNT = 1 << 32


@dataclass(frozen=True)
class SectionStatistics:
    """A snapshot of a section array, returned by ``statistics()``.

    Attributes:
        name: the array's name.
        count: the number of sections.
        held: the indices of the sections held when the snapshot was taken, ascending
            (``len(held)`` is the number held).
        waiters: how many threads (or tasks) were blocked waiting for a section.
    """

    name: str
    count: int
    held: tuple[int, ...]
    waiters: int


def _check_count(count: object) -> None:
    if type(count) is not int:  # bool is an int subclass, and a flag is not a size
        raise TypeError(f"count must be an int, got {type(count).__name__}")
    if count < 1 or count & (count - 1):
        raise ValueError(f"count must be a power of two, got {count}")
    if count > _MAX_COUNT:
        raise ValueError(f"count must be at most 2**32, got {count}")


def _check_name(name: object) -> None:
    if not isinstance(name, str):
        raise TypeError(f"name must be a non-empty str, got {type(name).__name__}")
    if not name:
        raise ValueError(f"name must be a non-empty str, got {name!r}")


def _check_timeout(timeout: object, none_means: str) -> None:
    """A finite-or-infinite non-negative number; ``none_means`` names the no-timeout value."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number, got {type(timeout).__name__}")
    if not timeout >= 0:  # also refuses NaN
        raise ValueError(f"timeout must be a non-negative number or {none_means}, got {timeout!r}")


def _plan(sections: _SectionArray, keys: Iterable[SectionKey]):
    """Return the distinct ``(index, first key)`` pairs of ``keys``, ascending by index."""
    if isinstance(keys, (str, bytes, bytearray, int)):
        raise TypeError(f"lock_many takes an iterable of keys, got {type(keys).__name__}")
    try:
        it = iter(keys)
    except TypeError:
        raise TypeError(f"lock_many takes an iterable of keys, got {type(keys).__name__}") from None
    mask = sections._mask
    plan: dict[int, SectionKey] = {}
    for key in it:
        plan.setdefault(hash_key(key) & mask, key)
    return sorted(plan.items())


class _SectionArray:
    """What both arrays share: validation, the index, the owners and keys, the patch slot."""

    __slots__ = ("__weakref__", "_count", "_keys", "_lw", "_mask", "_name", "_owners")

    def __init__(self, count: int, name: str) -> None:
        _check_count(count)
        _check_name(name)
        self._name = name
        self._count = count
        self._mask = count - 1
        self._owners: list[Any] = [None] * count  # the holder: a thread ident, or a task
        self._keys: list[SectionKey | None] = [None] * count  # the holder's key
        self._lw = None  # the instrumentation's per-array state (see _wrappers.track_of)

    @property
    def name(self) -> str:
        """The array's name."""
        return self._name

    @property
    def count(self) -> int:
        """The number of sections."""
        return self._count

    def index(self, key: SectionKey) -> int:
        """Return the section index of ``key``: ``fnv1a_32(key bytes) & (count - 1)``.

        Args:
            key: a ``str`` (UTF-8), ``bytes``/``bytearray``, or ``int`` (decimal ASCII).

        Raises:
            TypeError: ``key`` is a ``bool`` or of another type.
        """
        return hash_key(key) & self._mask

    def _held(self) -> int:
        raise NotImplementedError

    def __repr__(self) -> str:
        noun = "section" if self._count == 1 else "sections"
        return f"<{type(self).__name__} {self._name!r} {self._count} {noun}, {self._held()} held>"


# --------------------------------------------------------------------------------------------
# threads


class StripedSections(_SectionArray):
    """A fixed array of ``count`` locks; an entity's key picks its section with FNV-1a.

    ``acquire`` / ``release`` have ``threading.Lock`` semantics (including release from another
    thread); ``lock``, ``try_lock`` and ``lock_many`` are the context managers to use.

    Args:
        count: the number of sections, a power of two (a mask replaces the modulo). Size it
            comfortably above the number of concurrent holders so that collisions stay rare.
        name: names the array in messages, ``repr`` and telemetry.

    Raises:
        TypeError: ``count`` is not an int (a ``bool`` is not), or ``name`` is not a str.
        ValueError: ``count`` is not a power of two (or exceeds 2**32), or ``name`` is empty.
    """

    __slots__ = ("_guard", "_lockers", "_locks", "_waiting")

    def __init__(self, count: int = 256, *, name: str = "sections") -> None:
        super().__init__(count, name)
        self._locks = [allocate_lock() for _ in range(count)]
        self._waiting = [0] * count  # blocked threads per section, guarded by _guard
        self._guard = allocate_lock()  # taken only on the slow path, around a wait
        # str key -> its lock() manager: _Locked is immutable, so one serves every thread; the
        # dict is emptied when full, like the hash cache, so memory stays bounded.
        self._lockers: dict[str, _Locked] = {}

    # -- the two patch points ----------------------------------------------------------------

    def _acquire(
        self,
        index: int,
        key: SectionKey,
        blocking: bool = True,
        timeout: float = -1,
        canonical: bool = False,
    ) -> bool:
        """Take section ``index`` for ``key``; every public entry point comes through here.

        ``canonical`` is ``True`` for ``lock_many``'s ascending acquisitions; the array itself
        ignores it (it is for the instrumentation, which replaces this method on the class).
        """
        lock = self._locks[index]
        if lock.acquire(False):
            self._owners[index] = get_ident()
            self._keys[index] = key
            return True
        # Only this thread ever writes its ident here, and it clears the owner before
        # releasing, so equality means the caller holds the section right now.
        if self._owners[index] == get_ident():
            if blocking:
                raise SectionReentryError(self._name, index)
            return False
        if not blocking or timeout == 0:
            return False
        guard = self._guard
        with guard:
            self._waiting[index] += 1
        try:
            taken = lock.acquire(True, timeout)
        finally:
            with guard:
                self._waiting[index] -= 1
        if taken:
            self._owners[index] = get_ident()
            self._keys[index] = key
        return taken

    def _release(self, index: int) -> None:
        """Release section ``index``; every public release comes through here."""
        # Clear first: once the raw lock is released another thread may take it and write its
        # own owner, which must not be overwritten.
        self._owners[index] = None
        self._keys[index] = None
        try:
            self._locks[index].release()
        except RuntimeError:
            raise RuntimeError(
                f"release of section {index} of {self._name!r}, which is not held"
            ) from None

    # -- threading.Lock-style API --------------------------------------------------------------

    def acquire(self, key: SectionKey, blocking: bool = True, timeout: float = -1) -> bool:
        """Take ``key``'s section, as ``threading.Lock.acquire`` does; pair with ``release``.

        Args:
            key: the entity's key.
            blocking: wait for the section if it is held; ``False`` returns at once.
            timeout: seconds to wait at most when blocking; ``-1`` waits forever.

        Returns:
            ``True`` if the section was taken, ``False`` if it was held (non-blocking, or
            held by the caller itself) or the timeout expired.

        Raises:
            SectionReentryError: ``blocking`` and the caller already holds the section.
            ValueError: a timeout with ``blocking=False``, or a negative timeout other than -1.
            TypeError: a key or timeout of the wrong type.
        """
        if timeout != -1:
            if not blocking:
                raise ValueError(
                    f"can't specify a timeout for a non-blocking call, got timeout={timeout!r}"
                )
            _check_timeout(timeout, "-1")
        h = _str_hash(key) if type(key) is str else None
        if h is None:
            h = hash_key(key)
        return self._acquire(h & self._mask, key, blocking, timeout)

    def release(self, key: SectionKey) -> None:
        """Release ``key``'s section (any thread may, as with ``threading.Lock``).

        Raises:
            RuntimeError: the section is not held.
        """
        h = _str_hash(key) if type(key) is str else None
        if h is None:
            h = hash_key(key)
        self._release(h & self._mask)

    # -- context managers ---------------------------------------------------------------------

    def lock(self, key: SectionKey, *, timeout: float | None = None) -> _Locked:
        """Hold ``key``'s section for a ``with`` block, waiting for it: the event path.

        ``with sections.lock(key) as index:`` binds the section index.

        Args:
            key: the entity's key.
            timeout: seconds to wait at most; ``None`` waits forever.

        Raises:
            SectionTimeout: (on entering) the section was not taken within ``timeout``.
            SectionReentryError: (on entering) the caller already holds the section.
            ValueError: a negative timeout.
        """
        if timeout is None:
            if type(key) is str:
                # The event path's common case: an immutable manager, shared by every thread.
                cm = self._lockers.get(key)
                if cm is None:
                    cm = self._new_locker(key)
                return cm
            timeout = -1
        else:
            _check_timeout(timeout, "None")
        h = _str_hash(key) if type(key) is str else None
        if h is None:
            h = hash_key(key)
        return _Locked(self, h & self._mask, key, timeout)

    def _new_locker(self, key: str) -> _Locked:
        cm = _Locked(self, hash_key(key) & self._mask, key, -1)
        lockers = self._lockers
        if len(lockers) >= _LOCKERS_SIZE:
            lockers.clear()
        lockers[key] = cm
        return cm

    def try_lock(self, key: SectionKey) -> _TryLocked:
        """Hold ``key``'s section for a ``with`` block if it is free: the deferrable path.

        ``with sections.try_lock(key) as held:`` binds ``True`` if the section was taken (it is
        released on exit) or ``False`` if it was held, by another thread or the caller itself.
        Never blocks.
        """
        h = _str_hash(key) if type(key) is str else None
        if h is None:
            h = hash_key(key)
        return _TryLocked(self, h & self._mask, key)

    def lock_many(self, keys: Iterable[SectionKey], *, timeout: float | None = None) -> _LockedMany:
        """Hold the sections of all ``keys`` for a ``with`` block.

        The distinct sections are taken in ascending index order and released in reverse, so
        two ``lock_many`` calls never deadlock each other whatever the order of their keys.
        ``with sections.lock_many(keys) as indices:`` binds the ascending tuple of indices.

        Args:
            keys: an iterable of keys (not a single key).
            timeout: seconds to wait at most for all of them; ``None`` waits forever.

        Raises:
            SectionTimeout: (on entering) a section was not taken in time; those already
                taken are released.
            SectionReentryError: (on entering) the caller already holds one of the sections;
                those already taken are released.
            TypeError: ``keys`` is a single key or not iterable.
            ValueError: a negative timeout.
        """
        if timeout is not None:
            _check_timeout(timeout, "None")
        return _LockedMany(self, _plan(self, keys), timeout)

    # -- introspection -------------------------------------------------------------------------

    def statistics(self) -> SectionStatistics:
        """Return a :class:`SectionStatistics` snapshot (held sections, blocked threads)."""
        held = tuple(i for i, lock in enumerate(self._locks) if lock.locked())
        with self._guard:
            waiters = sum(self._waiting)
        return SectionStatistics(self._name, self._count, held, waiters)

    def _held(self) -> int:
        return sum(lock.locked() for lock in self._locks)


class _Locked:
    """``StripedSections.lock()``: a single-section, blocking context manager."""

    __slots__ = ("_index", "_key", "_sections", "_timeout")

    def __init__(
        self, sections: StripedSections, index: int, key: SectionKey, timeout: float
    ) -> None:
        self._sections = sections
        self._index = index
        self._key = key
        self._timeout = timeout  # -1: forever

    def __enter__(self) -> int:
        sections = self._sections
        if sections._acquire(self._index, self._key, True, self._timeout):
            return self._index
        raise SectionTimeout(sections._name, self._index, self._timeout)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._sections._release(self._index)


class _TryLocked:
    """``StripedSections.try_lock()``: binds whether the section was taken."""

    __slots__ = ("_held", "_index", "_key", "_sections")

    def __init__(self, sections: StripedSections, index: int, key: SectionKey) -> None:
        self._sections = sections
        self._index = index
        self._key = key
        self._held = False

    def __enter__(self) -> bool:
        self._held = held = self._sections._acquire(self._index, self._key, False)
        return held

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._held:
            self._held = False
            self._sections._release(self._index)


class _LockedMany:
    """``StripedSections.lock_many()``: ascending acquisition, reverse release."""

    __slots__ = ("_plan", "_sections", "_taken", "_timeout")

    def __init__(
        self, sections: StripedSections, plan: list[tuple[int, SectionKey]], timeout: float | None
    ) -> None:
        self._sections = sections
        self._plan = plan
        self._timeout = timeout
        self._taken: list[int] = []

    def __enter__(self) -> tuple[int, ...]:
        sections = self._sections
        timeout = self._timeout
        deadline = None if timeout is None else monotonic() + timeout
        taken: list[int] = []
        try:
            for index, key in self._plan:
                wait = -1 if deadline is None else max(0.0, deadline - monotonic())
                if not sections._acquire(index, key, True, wait, True):
                    raise SectionTimeout(sections._name, index, timeout)  # type: ignore[arg-type]
                taken.append(index)
        except BaseException:
            for index in reversed(taken):
                sections._release(index)
            raise
        self._taken = taken
        return tuple(taken)

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        taken, self._taken = self._taken, []
        for index in reversed(taken):
            self._sections._release(index)


# --------------------------------------------------------------------------------------------
# asyncio


def _expire(fut: asyncio.Future[bool]) -> None:
    if not fut.done():
        fut.set_result(False)


class AsyncStripedSections(_SectionArray):
    """The asyncio twin of :class:`StripedSections`: same keys, same indices, guard per task.

    Each section is a FIFO of waiting tasks with direct hand-off: ``release`` makes the first
    live waiter the owner before waking it, so nobody can barge in between. A waiter that is
    cancelled (or times out) leaves the queue; one cancelled after being handed the section
    passes it on, so cancellation never leaks a held section. Nothing binds the array to an
    event loop, but it is not thread-safe: use it from one loop at a time.

    Args:
        count: the number of sections, a power of two.
        name: names the array in messages, ``repr`` and telemetry.

    Raises:
        TypeError: ``count`` is not an int (a ``bool`` is not), or ``name`` is not a str.
        ValueError: ``count`` is not a power of two (or exceeds 2**32), or ``name`` is empty.
    """

    __slots__ = ("_waiters",)

    def __init__(self, count: int = 256, *, name: str = "sections") -> None:
        super().__init__(count, name)
        # per section, None until first contended: (future, task, key) of each waiter
        self._waiters: list[
            deque[tuple[asyncio.Future[bool], asyncio.Task[Any], SectionKey]] | None
        ] = [None] * count

    # -- the two patch points ----------------------------------------------------------------

    async def _acquire(
        self,
        index: int,
        key: SectionKey,
        blocking: bool = True,
        timeout: float | None = None,
        canonical: bool = False,
    ) -> bool:
        """Take section ``index`` for ``key``; every public entry point comes through here."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError(f"{type(self).__name__} must be used from an asyncio task")
        owner = self._owners[index]
        if owner is None:
            self._owners[index] = task
            self._keys[index] = key
            return True
        if owner is task:
            if blocking:
                raise SectionReentryError(self._name, index)
            return False
        if not blocking or (timeout is not None and timeout <= 0):
            return False
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        entry = (fut, task, key)
        waiters = self._waiters[index]
        if waiters is None:
            waiters = self._waiters[index] = deque()
        waiters.append(entry)
        expiry = None if timeout is None else loop.call_later(timeout, _expire, fut)
        try:
            granted = await fut
        except BaseException:
            if fut.done() and not fut.cancelled() and fut.result():
                # Handed the section, then cancelled before resuming: pass it on.
                self._hand_off(index)
            else:
                _discard(waiters, entry)
            raise
        finally:
            if expiry is not None:
                expiry.cancel()
        if not granted:  # expired; a hand-off pops its entry, an expiry does not
            _discard(waiters, entry)
        return granted

    def _release(self, index: int) -> None:
        """Release section ``index``; every public release comes through here."""
        if self._owners[index] is None:
            raise RuntimeError(f"release of section {index} of {self._name!r}, which is not held")
        self._hand_off(index)

    def _hand_off(self, index: int) -> None:
        # Not a patch point: also used when a waiter handed the section is cancelled, which the
        # instrumentation must not see as a release.
        waiters = self._waiters[index]
        while waiters:
            fut, task, key = waiters.popleft()
            if not fut.done():
                self._owners[index] = task
                self._keys[index] = key
                fut.set_result(True)
                return
        self._owners[index] = None
        self._keys[index] = None

    # -- asyncio.Lock-style API ----------------------------------------------------------------

    async def acquire(
        self, key: SectionKey, blocking: bool = True, timeout: float | None = None
    ) -> bool:
        """Take ``key``'s section; pair with ``release``.

        Args:
            key: the entity's key.
            blocking: wait for the section if it is held; ``False`` returns at once.
            timeout: seconds to wait at most when blocking; ``None`` waits forever.

        Returns:
            ``True`` if the section was taken, ``False`` if it was held (non-blocking, or held
            by the calling task itself) or the timeout expired.

        Raises:
            SectionReentryError: ``blocking`` and the calling task already holds the section.
            ValueError: a timeout with ``blocking=False``, or a negative timeout.
            TypeError: a key or timeout of the wrong type.
        """
        if timeout is not None:
            if not blocking:
                raise ValueError(
                    f"can't specify a timeout for a non-blocking call, got timeout={timeout!r}"
                )
            _check_timeout(timeout, "None")
        h = _str_hash(key) if type(key) is str else None
        if h is None:
            h = hash_key(key)
        return await self._acquire(h & self._mask, key, blocking, timeout)

    def release(self, key: SectionKey) -> None:
        """Release ``key``'s section (any task may), waking its first waiter.

        Raises:
            RuntimeError: the section is not held.
        """
        h = _str_hash(key) if type(key) is str else None
        if h is None:
            h = hash_key(key)
        self._release(h & self._mask)

    # -- context managers ---------------------------------------------------------------------

    def lock(self, key: SectionKey, *, timeout: float | None = None) -> _AsyncLocked:
        """Hold ``key``'s section for an ``async with`` block, waiting for it.

        ``async with sections.lock(key) as index:`` binds the section index.

        Args:
            key: the entity's key.
            timeout: seconds to wait at most; ``None`` waits forever.

        Raises:
            SectionTimeout: (on entering) the section was not taken within ``timeout``.
            SectionReentryError: (on entering) the calling task already holds the section.
            ValueError: a negative timeout.
        """
        if timeout is not None:
            _check_timeout(timeout, "None")
        h = _str_hash(key) if type(key) is str else None
        if h is None:
            h = hash_key(key)
        return _AsyncLocked(self, h & self._mask, key, timeout)

    def try_lock(self, key: SectionKey) -> _AsyncTryLocked:
        """Hold ``key``'s section for an ``async with`` block if it is free; never waits.

        ``async with sections.try_lock(key) as held:`` binds whether it was taken.
        """
        h = _str_hash(key) if type(key) is str else None
        if h is None:
            h = hash_key(key)
        return _AsyncTryLocked(self, h & self._mask, key)

    def lock_many(
        self, keys: Iterable[SectionKey], *, timeout: float | None = None
    ) -> _AsyncLockedMany:
        """Hold the sections of all ``keys`` for an ``async with`` block, ascending.

        Args:
            keys: an iterable of keys (not a single key).
            timeout: seconds to wait at most for all of them; ``None`` waits forever.

        Raises:
            SectionTimeout: (on entering) a section was not taken in time; those already
                taken are released.
            SectionReentryError: (on entering) the calling task already holds one of them.
            TypeError: ``keys`` is a single key or not iterable.
            ValueError: a negative timeout.
        """
        if timeout is not None:
            _check_timeout(timeout, "None")
        return _AsyncLockedMany(self, _plan(self, keys), timeout)

    # -- introspection -------------------------------------------------------------------------

    def statistics(self) -> SectionStatistics:
        """Return a :class:`SectionStatistics` snapshot (held sections, waiting tasks)."""
        held = tuple(i for i, owner in enumerate(self._owners) if owner is not None)
        waiters = sum(not entry[0].done() for queue in self._waiters if queue for entry in queue)
        return SectionStatistics(self._name, self._count, held, waiters)

    def _held(self) -> int:
        return sum(owner is not None for owner in self._owners)


def _discard(waiters: deque[Any], entry: object) -> None:
    with suppress(ValueError):  # already popped by a hand-off that found it done
        waiters.remove(entry)


class _AsyncLocked:
    """``AsyncStripedSections.lock()``."""

    __slots__ = ("_index", "_key", "_sections", "_timeout")

    def __init__(
        self, sections: AsyncStripedSections, index: int, key: SectionKey, timeout: float | None
    ) -> None:
        self._sections = sections
        self._index = index
        self._key = key
        self._timeout = timeout

    async def __aenter__(self) -> int:
        sections = self._sections
        if await sections._acquire(self._index, self._key, True, self._timeout):
            return self._index
        raise SectionTimeout(sections._name, self._index, self._timeout)  # type: ignore[arg-type]

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        self._sections._release(self._index)


class _AsyncTryLocked:
    """``AsyncStripedSections.try_lock()``."""

    __slots__ = ("_held", "_index", "_key", "_sections")

    def __init__(self, sections: AsyncStripedSections, index: int, key: SectionKey) -> None:
        self._sections = sections
        self._index = index
        self._key = key
        self._held = False

    async def __aenter__(self) -> bool:
        self._held = held = await self._sections._acquire(self._index, self._key, False)
        return held

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._held:
            self._held = False
            self._sections._release(self._index)


class _AsyncLockedMany:
    """``AsyncStripedSections.lock_many()``."""

    __slots__ = ("_plan", "_sections", "_taken", "_timeout")

    def __init__(
        self,
        sections: AsyncStripedSections,
        plan: list[tuple[int, SectionKey]],
        timeout: float | None,
    ) -> None:
        self._sections = sections
        self._plan = plan
        self._timeout = timeout
        self._taken: list[int] = []

    async def __aenter__(self) -> tuple[int, ...]:
        sections = self._sections
        timeout = self._timeout
        deadline = None if timeout is None else monotonic() + timeout
        taken: list[int] = []
        try:
            for index, key in self._plan:
                wait = None if deadline is None else max(0.0, deadline - monotonic())
                if not await sections._acquire(index, key, True, wait, True):
                    raise SectionTimeout(sections._name, index, timeout)  # type: ignore[arg-type]
                taken.append(index)
        except BaseException:
            for index in reversed(taken):
                sections._release(index)
            raise
        self._taken = taken
        return tuple(taken)

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        taken, self._taken = self._taken, []
        for index in reversed(taken):
            self._sections._release(index)
