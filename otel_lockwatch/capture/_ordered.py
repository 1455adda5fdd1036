"""Several locks taken in one canonical order: ``ordered(*locks, key=id)``.

Code that must hold two locks of one class at once orders them by a key every worker agrees on:
``transfer(a, b)`` takes the two account locks in ``id()`` order, so ``transfer(a, b)`` and
``transfer(b, a)`` never deadlock. The order check sees two locks of one creation site held at
once, which is recursive locking in general (two workers taking them in the other order
deadlock); it infers an ``id()`` order (every nesting of the class in one address order:
``_order_check.ADDRESS_ORDERED_KINDS``), but not another key's. lockdep has the annotation for it
(nesting subclasses, ``mutex_lock_nested``), Guava's cycle-detecting factory its explicit
orderings; the section arrays have ``lock_many``. For locks, :class:`ordered` is that annotation
and the ordering in one: it sorts the locks by ``key``, takes them in that order, and releases
them in reverse.

The locks of one ``ordered`` call add no edge between each other, as the sections of one
``lock_many`` call do not: while it takes each lock, the entries of the ones it took before are
off the worker's held stack, so the order check sees only what was held before the call. Locks
held before it still order each lock of the call, and every lock of the call orders what is
taken inside the block. Taking the same locks in another order outside ``ordered`` is still
reported. The acquisition site is the caller's line (the ``with ordered(...)``), as it is for a
``Condition``'s lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._session import RECORDER

__all__ = ["ordered"]

_tls = RECORDER.tls  # never replaced: Recorder.reset() keeps it


class ordered:  # lower case: used as a function, as contextlib's context managers are
    """Hold ``locks`` at once, taken in the order of ``key``; the order check knows them ordered.

    ``with ordered(a, b) as taken:`` takes the distinct locks among ``a`` and ``b`` (a lock given
    twice is taken once: ``transfer(a, a)`` takes one lock) in ascending ``key`` order, blocking
    on each, and releases them in reverse at the end of the block; ``taken`` is the tuple of
    locks in the order taken. Any object with ``acquire()`` and ``release()`` will do: the
    ``threading`` and ``multiprocessing`` locks, watched or not, with or without lockwatch.

    Args:
        *locks: the locks to hold.
        key: the canonical order (``id`` by default: one total order over the locks of a process,
            for as long as they live). Every worker that holds two of them at once must order
            them by the same key.

    Raises:
        TypeError: an argument has no ``acquire`` or ``release``.
        RuntimeError: the same ``ordered`` object entered again while it holds its locks.
    """

    __slots__ = ("_locks", "_taken")

    def __init__(self, *locks: Any, key: Callable[[Any], Any] = id) -> None:
        for lock in locks:
            if not callable(getattr(lock, "acquire", None)) or not callable(
                getattr(lock, "release", None)
            ):
                raise TypeError(f"ordered() takes locks, got {type(lock).__name__}")
        distinct = {id(lock): lock for lock in locks}
        self._locks = tuple(sorted(distinct.values(), key=key))
        self._taken = 0

    def __repr__(self) -> str:
        return f"<ordered {len(self._locks)} locks, {self._taken} held>"

    def __enter__(self) -> tuple[Any, ...]:
        if self._taken:
            raise RuntimeError("this ordered() already holds its locks")
        state: Any = getattr(_tls, "st", None)
        start = 0 if state is None else len(state.held)  # where this call's entries begin
        try:
            for lock in self._locks:
                if state is None:
                    state = getattr(_tls, "st", None)  # made by the first watched acquisition
                mine = None if state is None else state.held[start:]
                if mine:
                    del state.held[start:]  # out of the order check's sight while it takes this one
                try:
                    lock.acquire()
                finally:
                    if mine:
                        state.held[start:start] = mine  # back, under the new entry
                self._taken += 1
        except BaseException:
            self._release()
            raise
        return self._locks

    def __exit__(self, *exc_info: Any) -> None:
        self._release()

    def _release(self) -> None:
        locks = self._locks
        while self._taken:
            self._taken -= 1
            locks[self._taken].release()
