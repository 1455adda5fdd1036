"""The timeline: how much each lock class was waited for and held, per slice of wall-clock time.

Nothing on the lock path writes it. The recorder's totals per class (the exact wait and hold
sums every worker's ``Stats`` keeps) are *sampled*: by the emitter thread at its ticks (every
50 ms while anything reaches the outbox; no sooner than a bucket's width after the last sample,
nor than 20 times its cost) and by every snapshot. What a class's totals
grew by since the previous sample goes to the bucket of the sample's time. So a wait or a hold
counts in the bucket where it ended (a hold of 3 s shows at its release), and a run without
an emitter (no lock ever waited, no hold reached the metric floor) has its whole timeline in
the bucket of its snapshot.

**Buckets.** A bucket is ``width_ms`` wide, starting at a multiple of its width counted from the
Unix epoch; the width is 100 ms times a power of two. When a run would need more than
:data:`MAX_BUCKETS` buckets, the width doubles and each even bucket takes in the odd one after
it (both lie in one bucket of the doubled width, because the boundaries are the epoch's). So a
run of any length has at most :data:`MAX_BUCKETS` buckets, and a bucket is at most twice as wide
as that length requires.

**Merging** (:func:`merge_timelines`): the widest width of the parts, doubled while the union of
their spans needs more than :data:`MAX_BUCKETS`; every part's bucket lies inside one merged
bucket (widths divide each other, boundaries are the epoch's), so the sums are exact.

**In the manifest** (``timeline``: ``{width_ms, start_ms, buckets, locks: {name: {wait_ns:
[...], hold_ns: [...]}}}``, every list ``buckets`` long) the :data:`MAX_LOCKS` classes with the
most wait (then hold; then by name) are kept; a merge keeps the same number of the merged ones.
"""

from __future__ import annotations

import _thread
import time
from array import array
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["BASE_MS", "MAX_BUCKETS", "MAX_LOCKS", "SERIES", "Timeline", "merge_timelines"]

#: The narrowest bucket; every width is this times a power of two.
BASE_MS = 100
#: The most buckets a timeline has.
MAX_BUCKETS = 256
#: The lock classes a manifest's timeline keeps.
MAX_LOCKS = 8
#: A class's series, in the order of a row.
SERIES = ("wait_ns", "hold_ns")
_INT64_MAX = 2**63 - 1
_EMPTY_ROW = bytes(8 * MAX_BUCKETS)


def _rows() -> list[Any]:
    """A class's rows of the process's timeline: :data:`MAX_BUCKETS` signed 64-bit sums each,
    made whole when the class is first sampled, so a long run holds no more than a short one."""
    return [array("q", _EMPTY_ROW) for _ in SERIES]


def _regrid(
    into: dict[str, list[list[int]]],
    first: int,
    width: int,
    start_ms: int,
    part_width: int,
    locks: Mapping[str, Any],
    n: int,
) -> None:
    """Add a timeline's series (buckets of ``part_width`` from ``start_ms``) into rows of ``n``
    buckets of ``width`` from bucket ``first``."""
    for name, series in locks.items():
        rows = into.setdefault(name, [[0] * n for _ in SERIES])
        for row, key in zip(rows, SERIES, strict=True):
            for i, v in enumerate(series[key]):
                if v:
                    row[(start_ms + i * part_width) // width - first] += v


def _top(locks: Mapping[str, Any], keep: int | None) -> list[str]:
    return sorted(locks, key=lambda name: (-sum(locks[name][0]), -sum(locks[name][1]), name))[:keep]


def _document(
    width: int,
    first: int,
    n: int,
    locks: Mapping[str, list[list[int]]],
    keep: int | None = MAX_LOCKS,
) -> dict[str, Any]:
    return {
        "width_ms": width,
        "start_ms": first * width,
        "buckets": n,
        "locks": {
            name: {key: list(row[:n]) for key, row in zip(SERIES, locks[name], strict=True)}
            for name in _top(locks, keep)
        },
    }


class Timeline:
    """The process's timeline (see the module docstring), fed by :meth:`sample`."""

    def __init__(self) -> None:
        self._lock = _thread.RLock()  # the emitter and a snapshot may sample at once
        self.reset()

    def reset(self) -> None:
        """Forget every bucket, and start the next sample's deltas from zero."""
        with self._lock:
            self.width_ms = BASE_MS
            self.first: int | None = None  # the first bucket's index (epoch ms // width)
            self.n = 0
            self.locks: dict[str, list[Any]] = {}  # name -> [wait row, hold row] (_rows)
            self._seen: dict[str, tuple[int, int]] = {}
            self._next = 0.0  # when a periodic sample is due (perf_counter)
            self._busy = False  # a sample is under way (on the thread holding the lock)

    def exclusive(self) -> Any:
        """The timeline, held for a ``with`` block (re-entrant): no sample runs meanwhile. The
        recorder holds it across a reset, so that a sample is wholly before the reset (and
        forgotten by it) or wholly after (reading the states the reset left)."""
        return self._lock

    def after_fork(self) -> None:
        """In a child: a fresh timeline (the child's totals start again from its own work)."""
        self._lock = _thread.RLock()
        self.reset()

    def _double(self) -> None:
        assert self.first is not None
        first = self.first // 2
        n = (self.first + self.n - 1) // 2 - first + 1
        for rows in self.locks.values():
            for row in rows:  # in place: bucket i goes to (first + i) // 2 - first, never above i
                for i in range(self.n):
                    v, row[i] = row[i], 0
                    row[(self.first + i) // 2 - first] += v
        self.first, self.n, self.width_ms = first, n, self.width_ms * 2

    def sample(self, totals: Mapping[str, tuple[int, int]], now_ms: int) -> None:
        """Add what each class's ``(wait, hold)`` totals grew by since the last sample to the
        bucket of ``now_ms`` (epoch milliseconds)."""
        with self._lock:
            if self.first is None:
                self.first, self.n = now_ms // self.width_ms, 1
            index = max(now_ms // self.width_ms, self.first)  # a clock set back: the first
            while index - self.first >= MAX_BUCKETS:
                self._double()
                index = now_ms // self.width_ms
            at = index - self.first
            self.n = max(self.n, at + 1)  # the rows are whole: (_rows)
            seen = self._seen
            for name, (wait, hold) in totals.items():
                was = seen.get(name, (0, 0))
                seen[name] = (wait, hold)
                grown = (max(0, wait - was[0]), max(0, hold - was[1]))
                if grown[0] or grown[1]:
                    series = self.locks.get(name)
                    if series is None:
                        series = self.locks[name] = _rows()
                    for row, v in zip(series, grown, strict=True):
                        row[at] = min(row[at] + v, _INT64_MAX)

    def sample_states(self, states: Iterable[Any], periodic: bool = False) -> dict[str, Any]:
        """:meth:`sample` the wait and hold totals of every worker state's ``Stats``, now, and
        return the data part's ``{"timeline": ...}`` as of this sample: totals read after it
        (a snapshot's) are never behind it, whoever samples next (the emitter, a signal
        handler's snapshot). A ``periodic`` sample (the emitter's) is skipped until the last
        one's cost has been paid back 20 times, and at least one bucket's width: walking
        every worker's statistics takes at most ~5 % of the emitter's thread; it returns ``{}``
        (nobody reads it: no document is made)."""
        totals: dict[str, tuple[int, int]] = {}
        with self._lock:  # totals read in turn: each sample's are at least the last one's
            began = time.perf_counter()
            if self._busy or (periodic and began < self._next):
                # busy: a signal handler's snapshot on the thread that is sampling, whose rows
                # are half grown; that snapshot goes without a timeline
                return {}
            self._busy = True
            try:
                for state in states:
                    for cls, s in list(state.stats.items()):
                        wait, hold = totals.get(cls.name, (0, 0))
                        totals[cls.name] = (wait + s.wait_total_ns, hold + s.hold_total_ns)
                self.sample(totals, time.time_ns() // 1_000_000)
                done = time.perf_counter()
                self._next = done + max(self.width_ms / 1000, 20 * (done - began))
                doc = None if periodic else self.to_json()
            finally:
                self._busy = False
        return {} if doc is None else {"timeline": doc}

    def to_json(self) -> dict[str, Any] | None:
        """The manifest's ``timeline``; None before the first sample."""
        with self._lock:
            if self.first is None:
                return None
            return _document(self.width_ms, self.first, self.n, self.locks)


def merge_timelines(
    parts: Iterable[Mapping[str, Any]], keep: int | None = MAX_LOCKS
) -> dict[str, Any] | None:
    """One timeline of several (checked ones, see the module docstring); None for none.

    ``keep``: the classes kept, those with the most wait (None: all, for a fold that merges
    one part at a time and keeps the top classes only at its end)."""
    parts = list(parts)
    if not parts:
        return None
    width = max(p["width_ms"] for p in parts)
    start = min(p["start_ms"] for p in parts)
    end = max(p["start_ms"] + p["width_ms"] * p["buckets"] for p in parts)
    while (end - 1) // width - start // width + 1 > MAX_BUCKETS:
        width *= 2
    first = start // width
    n = (end - 1) // width - first + 1
    locks: dict[str, list[list[int]]] = {}
    for p in parts:
        _regrid(locks, first, width, p["start_ms"], p["width_ms"], p["locks"], n)
    return _document(width, first, n, locks, keep)
