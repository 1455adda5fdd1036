"""Watched section arrays: the instrumented ``StripedSections._acquire`` / ``_release``.

Every entry point of an array (``acquire``, ``lock``, ``try_lock``, ``lock_many``) goes through
``_acquire`` and ``_release``, which the patch table replaces on the class: arrays created before
and after ``instrument()`` are covered alike. An array is one lock class (its name); what lockwatch
keeps about it lives in the array's ``_lw`` slot (an :class:`ArrayTrack`): the hold of each
section (a :class:`~._bookkeeping.Hold`, created on first use), and how many sections are held at
once. A section's waiter tells a *collision* (the holder has another key that hashes to the same
section) from contention on its own entity.

The instrumented sync ``_acquire`` mirrors the array's uncontended path (the raw lock, ``_owners``,
``_keys``) to save a call, and calls the original for everything else; ``_release`` mirrors the
array's release the same way. The C path (``_speedups.SectionAcquire`` / ``SectionRelease``) runs
the same steps, reading the fields in :data:`TRACK_FIELDS` and :data:`ARRAY_FIELDS`, and hands
every unusual call back to the Python functions here. The async array (``_asyncio``) shares the
hold tracking and the release.
"""

from __future__ import annotations

import sys
import threading
from _thread import allocate_lock
from time import perf_counter_ns as _pc
from typing import Any

from .._session import RECORDER
from ..record._stats import Stats
from ..sections import _threaded as _array
from ..sections._threaded import StripedSections
from ._bookkeeping import (
    Hold,
    check_order,
    current_context,
    new_entry,
    record_try,
    timed_wait,
    track_hold,
    untrack,
)
from ._fast_path import new_stats, speedups
from ._naming import LockClass, lock_class

__all__ = [
    "ARRAY_FIELDS",
    "TRACK_FIELDS",
    "ArrayTrack",
    "hold_section",
    "section_acquire_factory",
    "section_release_factory",
    "track_of",
]

_getframe = sys._getframe
_get_ident = threading.get_ident
_tls = RECORDER.tls  # never replaced: Recorder.reset() keeps it
# Frames of the array's own entry points (lock(), __enter__, ...): not the acquisition site.
_ARRAY_GLOBALS = vars(_array)

#: The fields of :class:`ArrayTrack`. The C fast path receives the class with this table at setup,
#: names the fields it reads and checks that the table has them (``capture._fast_path``).
TRACK_FIELDS = (
    "slots",  # per section: its Hold, or None before its first use
    "held_sections",  # one item per section held now (append, pop and len are atomic)
    "max_held",  # the most sections held at once
    "lock_class",  # the array's LockClass
    "name",  # the array's name when this was made (a rename makes a new ArrayTrack)
    "count",  # the number of sections
)
#: What the mirrored fast path reads of a ``StripedSections`` (C: ``ARRAY_NAMES``), by name.
ARRAY_FIELDS = ("_lw", "_name", "_locks", "_owners", "_keys")


class ArrayTrack:
    """What lockwatch keeps about one section array, in the array's ``_lw`` slot
    (fields: :data:`TRACK_FIELDS`)."""

    __slots__ = (*TRACK_FIELDS, "__weakref__")

    def __init__(self, array: Any) -> None:
        self.name = array._name
        self.count = array._count
        self.lock_class = lock_class(self.name, "section")
        self.slots: list[Hold | None] = [None] * self.count
        self.held_sections: list[int] = []
        self.max_held = 0
        RECORDER.note_array(self)


# Threads that use an array first at once make one track (without the GIL they run at once; a
# track made twice loses the holds noted in the one replaced). A raw lock: never watched.
_TRACK_MADE = allocate_lock()


def track_of(array: Any) -> ArrayTrack:
    """The array's :class:`ArrayTrack`, made on first use and after a rename."""
    track = array._lw
    if track is None or track.name != array._name:
        with _TRACK_MADE:
            track = array._lw
            if track is None or track.name != array._name:
                track = array._lw = ArrayTrack(array)
    return track


def hold_section(track: ArrayTrack, index: int, state: Any, stats: Stats, entry: tuple) -> None:
    """Section ``index`` is held: count it among the array's held sections and track its hold."""
    slot = track.slots[index]
    if slot is None:
        slot = track.slots[index] = Hold()
    held = track.held_sections
    held.append(1)
    if len(held) > track.max_held:
        track.max_held = len(held)
    track_hold(slot, state, stats, entry)


def section_wait(
    original: Any,
    self: Any,
    index: int,
    key: Any,
    timeout: float,
    canonical: bool,
    state: Any,
    stats: Stats,
    lock_class: LockClass,
    frame: Any,
) -> bool:
    """The slow path of a blocking section acquire whose try failed: wait through the array's
    own ``_acquire``, timed, and record the wait (and whether it was a key collision)."""
    owner = self._owners[index]
    if owner is not None and owner == _get_ident():
        return original(self, index, key, True, timeout, canonical)  # raises the reentry error
    holder_key = self._keys[index]
    collision = holder_key is not None and holder_key != key
    if collision:
        stats.collisions += 1
    extra = {"lockwatch.section.index": index, "lockwatch.section.collision": collision}
    args = (self, index, key, True, timeout, canonical)
    return timed_wait(original, args, state, stats, lock_class, frame, extra, self._lw.slots[index])


def section_acquire_factory(original: Any) -> Any:
    """The instrumented ``StripedSections._acquire``; ``original`` is the uninstrumented one."""

    def _acquire(
        self: Any,
        index: int,
        key: Any,
        blocking: bool = True,
        timeout: float = -1,
        canonical: bool = False,
    ) -> bool:
        try:
            state = _tls.st
        except AttributeError:
            state = RECORDER.thread_state()
        if state.in_lockwatch:
            return original(self, index, key, blocking, timeout, canonical)
        track = self._lw
        if track is None or track.name != self._name:
            track = track_of(self)
        lock_class = track.lock_class
        stats = state.stats.get(lock_class)
        if stats is None:
            stats = state.stats[lock_class] = new_stats()
        try:
            frame: Any = _getframe(1)
        except ValueError:  # called straight from C: no Python caller
            frame = _getframe(0)
        while frame.f_globals is _ARRAY_GLOBALS and frame.f_back is not None:
            frame = frame.f_back
        # As acquire_tracked: what does not need the section held is done before the acquire
        # (the stack entry made, the context, the order check, the holder's ident), and between
        # the raw acquire and the return there is the entry's push, one clock read and no call
        # that would let the interpreter switch threads but the held-sections count.
        entry = new_entry((lock_class, frame, frame.f_lasti, self, canonical))
        context = current_context()
        held = state.held
        if blocking:
            if held:
                check_order(state, lock_class, frame, self, canonical)
            ident = _get_ident()
            # The array's own uncontended path, mirrored (StripedSections._acquire's first lines):
            # one Python call less on every acquisition. Everything else goes through `original`.
            # The entry is pushed once the section is taken (_fast_path: the push point).
            if self._locks[index].acquire(False):
                held.append(entry)
                t0 = _pc()
                self._owners[index] = ident
                self._keys[index] = key
                stats.acquisitions += 1
            else:
                if not section_wait(
                    original, self, index, key, timeout, canonical, state, stats, lock_class, frame
                ):
                    return False
                held.append(entry)
                t0 = _pc()
        else:
            if not record_try(stats, original(self, index, key, False, -1, canonical)):
                return False
            held.append(entry)
            t0 = _pc()
        sections = track.held_sections
        sections.append(1)
        if len(sections) > track.max_held:
            track.max_held = len(sections)
        # The section's Hold, made by its first holder (with the section held, as the C path
        # makes it: two threads that both found none would each make one).
        slot = track.slots[index]
        if slot is None:
            slot = track.slots[index] = Hold()
        slot._lw_entry = entry
        slot._lw_stats = stats
        slot._lw_context = context
        slot._lw_start_ns = t0
        slot._lw_holder = state
        return True

    if speedups is not None:  # the same steps in C; unusual calls come back to _acquire
        return speedups.SectionAcquire(original, _acquire, _ARRAY_GLOBALS)
    return _acquire


def section_release_factory(original: Any, mirror: bool = True) -> Any:
    """The instrumented ``_release`` of a section array (``mirror``: do the sync array's release
    inline; the async array's own release hands the section on, so it is always called)."""

    def _release(self: Any, index: int) -> None:
        track = self._lw
        slot = track.slots[index] if track is not None else None
        if slot is None or slot._lw_holder is None:
            original(self, index)
            return
        # What untrack() needs is read before the section is free.
        holder = slot._lw_holder
        entry = slot._lw_entry
        stats = slot._lw_stats
        t0 = slot._lw_start_ns
        context = slot._lw_context
        if mirror:
            # Tracked, so held: the array's release, mirrored (StripedSections._release).
            slot._lw_holder = None
            self._owners[index] = None
            self._keys[index] = None
            self._locks[index].release()
        else:
            original(self, index)  # raises if not held: then nothing changed
            slot._lw_holder = None
        slot._lw_entry = None  # nothing of the holder (its frame) outlives the hold
        held = track.held_sections
        if held:
            held.pop()
        untrack(holder, entry, stats, t0, context, index)

    if speedups is not None:  # the same steps in C; unusual calls come back to _release
        return speedups.SectionRelease(original, _release, None, mirror)
    return _release


def section_wait_event(event: Any) -> bool:
    """:func:`section_wait` for the C path (an ``Acquisition``: ``_fast_path``'s contract)."""
    return section_wait(
        event.original,
        event.hold,
        event.index,
        event.key,
        event.timeout,
        event.canonical,
        event.worker,
        event.stats,
        event.lock_class,
        event.frame,
    )


if speedups is not None:
    speedups.setup_sections(
        section_wait=section_wait_event,
        track=(ArrayTrack, TRACK_FIELDS),
        array=(StripedSections, ARRAY_FIELDS),
    )
