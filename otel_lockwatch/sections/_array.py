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

There are two arrays, one per kind of worker: ``_threaded.StripedSections`` for threads and
``_asyncio.AsyncStripedSections`` for asyncio tasks. This module holds what they share: the
validation of their arguments, the key-to-index mapping, the per-section owner and key, and the
:class:`SectionStatistics` snapshot.

Contract with the instrumentation (``docs/ARCHITECTURE.md``): every public entry point goes
through ``_acquire(index, key, blocking, timeout, canonical)`` and ``_release(index)``, which the
instrumentor replaces on each array class; ``canonical=True`` marks ``lock_many``'s
acquisitions. Per section, ``_owners[index]`` is the holder (a thread ident, or an
``asyncio.Task``; ``None`` when free) and ``_keys[index]`` the key it was taken with, so a waiter
can tell a collision from contention on its own entity; ``_lw`` is a slot the instrumentation
keeps its per-array state in (``None`` until then). To find the caller's acquisition site the
instrumentation skips the frames of the module that defines the array class (by its globals),
so each class's public entry points and context managers live in that class's module.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._fnv import hash_key

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "SectionArray",
    "SectionKey",
    "SectionStatistics",
    "check_timeout",
    "plan_many",
]

#: The types a section key may have (``bool`` excluded).
SectionKey = str | bytes | bytearray | int

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


def check_timeout(timeout: object, none_means: str) -> None:
    """Refuse a timeout that is not a non-negative number (infinity is one).

    Args:
        timeout: the value to check.
        none_means: how the caller spells "no timeout" (``"-1"`` or ``"None"``), for the message.

    Raises:
        TypeError: ``timeout`` is not a number (a ``bool`` is not).
        ValueError: ``timeout`` is negative or NaN.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise TypeError(f"timeout must be a number, got {type(timeout).__name__}")
    if not timeout >= 0:  # also refuses NaN
        raise ValueError(f"timeout must be a non-negative number or {none_means}, got {timeout!r}")


def plan_many(sections: SectionArray, keys: Iterable[SectionKey]) -> list[tuple[int, SectionKey]]:
    """Return the distinct ``(index, first key)`` pairs of ``keys``, ascending by index: the
    sections ``lock_many`` takes, in its canonical order.

    Raises:
        TypeError: ``keys`` is a single key or not iterable.
    """
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


class SectionArray:
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
        self._lw = None  # the instrumentation's per-array state (see capture._sections.track_of)

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
