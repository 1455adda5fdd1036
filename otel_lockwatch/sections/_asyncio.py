"""``AsyncStripedSections``: the section array for asyncio tasks.

The same keys give the same indices as ``_threaded.StripedSections``; a task is the unit of
ownership, and each section is a FIFO of waiting tasks with direct hand-off, so a release
never lets a newcomer barge in and a cancelled waiter never leaks a section (the class
docstring says how).

Every frame between a caller and ``_acquire`` is in this module (the instrumentation skips this
module's frames to find the acquisition site): the entry points and their context managers
stay here.
"""

from __future__ import annotations

import asyncio
from collections import deque
from contextlib import suppress
from time import monotonic
from typing import TYPE_CHECKING, Any

from ..exceptions import SectionReentryError, SectionTimeout
from ._array import SectionArray, SectionKey, SectionStatistics, check_timeout, plan_many
from ._fnv import hash_key, str_hashes

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["AsyncStripedSections"]

# The hot path: a str key seen before costs one dict lookup instead of a call to hash_key.
_str_hash = str_hashes.get


def _expire(fut: asyncio.Future[bool]) -> None:
    """A waiter's timeout: wake it with ``False`` unless it was handed the section first."""
    if not fut.done():
        fut.set_result(False)


class AsyncStripedSections(SectionArray):
    """The asyncio twin of ``StripedSections``: same keys, same indices, guard per task.

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
                _remove_waiter(waiters, entry)
            raise
        finally:
            if expiry is not None:
                expiry.cancel()
        if not granted:  # expired; a hand-off pops its entry, an expiry does not
            _remove_waiter(waiters, entry)
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
            check_timeout(timeout, "None")
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
            check_timeout(timeout, "None")
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
            check_timeout(timeout, "None")
        return _AsyncLockedMany(self, plan_many(self, keys), timeout)

    # -- introspection -------------------------------------------------------------------------

    def statistics(self) -> SectionStatistics:
        """Return a :class:`SectionStatistics` snapshot (held sections, waiting tasks)."""
        held = tuple(i for i, owner in enumerate(self._owners) if owner is not None)
        waiters = sum(not entry[0].done() for queue in self._waiters if queue for entry in queue)
        return SectionStatistics(self._name, self._count, held, waiters)

    def _held(self) -> int:
        return sum(owner is not None for owner in self._owners)


def _remove_waiter(waiters: deque[Any], entry: object) -> None:
    """Take a cancelled or expired waiter's entry out of its section's queue."""
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
