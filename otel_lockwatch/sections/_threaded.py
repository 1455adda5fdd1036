"""``StripedSections``: the section array for threads.

``acquire`` / ``release`` have ``threading.Lock`` semantics (including release from another
thread); ``lock``, ``try_lock`` and ``lock_many`` are the context managers to use. Each section
is a raw lock from ``_thread.allocate_lock``, so that the instrumentation, which patches
``threading.Lock``, never instruments them; ``_waiting`` counts the threads blocked on each
section (for :meth:`StripedSections.statistics`) and is touched only on the slow path.

The event path's common case, ``with sections.lock(key):`` with a ``str`` key and no timeout,
costs one dict lookup for the hash and one for a shared, immutable context manager.

Every frame between a caller and ``_acquire`` is in this module (the instrumentation skips this
module's frames to find the acquisition site): the entry points and their context managers
stay here. The instrumentation's C fast path reads ``StripedSections``'s slots.
"""

from __future__ import annotations

from _thread import allocate_lock, get_ident
from time import monotonic
from typing import TYPE_CHECKING

from ..exceptions import SectionReentryError, SectionTimeout
from ._array import SectionArray, SectionKey, SectionStatistics, check_timeout, plan_many
from ._fnv import hash_key, str_hashes

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["StripedSections"]

# The hot path: a str key seen before costs one dict lookup instead of a call to hash_key.
_str_hash = str_hashes.get

#: Per array, how many shared lock() managers (exact str key, no timeout) are kept.
LOCKERS_SIZE = 1024


class StripedSections(SectionArray):
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
            check_timeout(timeout, "-1")
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
            check_timeout(timeout, "None")
        h = _str_hash(key) if type(key) is str else None
        if h is None:
            h = hash_key(key)
        return _Locked(self, h & self._mask, key, timeout)

    def _new_locker(self, key: str) -> _Locked:
        cm = _Locked(self, hash_key(key) & self._mask, key, -1)
        lockers = self._lockers
        if len(lockers) >= LOCKERS_SIZE:
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
            check_timeout(timeout, "None")
        return _LockedMany(self, plan_many(self, keys), timeout)

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
