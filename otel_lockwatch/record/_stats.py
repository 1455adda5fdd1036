"""A worker's statistics for one lock class: :class:`Stats` and the table that declares its fields.

Each worker state keeps one per lock class it touched (``_recorder.WorkerState.stats``); the
fields are declared once, in :data:`STATS_TABLE`, which also tells the C fast path their names
and how two workers' values merge (``Stats.merge``, an ended worker's fold, the snapshot).
"""

from __future__ import annotations

from ._sites import SiteTable, merge_tables

__all__ = ["NO_SAMPLE", "STATS_FIELDS", "STATS_TABLE", "Stats"]


#: The fields of :class:`Stats`, each with how two workers' values merge. The C fast path is given
#: the class with this table; it names the fields it reads and checks that this table has them.
STATS_TABLE: tuple[tuple[str, str], ...] = (
    ("acquisitions", "sum"),  # successful acquisitions (blocking and try)
    ("try_acquisitions", "sum"),  # successful try-acquires
    ("skipped", "sum"),  # try-acquires that found the lock taken
    ("hold_total_ns", "sum"),  # every hold, added up
    ("hold_histogram", "buckets"),  # holds: bucket_of(ns) -> count
    ("hold_min_ns", "min"),  # NO_SAMPLE until the first hold
    ("hold_max_ns", "max"),
    ("contentions", "sum"),  # blocking attempts that had to wait (including timed-out ones)
    ("timeouts", "sum"),  # blocking attempts that gave up
    ("wait_total_ns", "sum"),  # contended waits, added up
    ("wait_min_ns", "min"),  # NO_SAMPLE until the first contended wait
    ("wait_max_ns", "max"),
    ("last_release_ns", "max"),  # the end of its last hold (the worker's last_event_ns reads it)
    ("wait_histogram", "buckets"),  # contended waits: bucket_of(ns) -> count
    ("collisions", "sum"),  # contended waits caused by a colliding key (sections only)
    ("sites", "sites"),  # None until the first contended wait, then its SiteTable (_sites)
)
STATS_FIELDS = tuple(name for name, _ in STATS_TABLE)
NO_SAMPLE = 1 << 62  # the minimum of no sample (more than any duration a process measures)


class Stats:
    """One worker's counters and histograms for one lock class (fields: :data:`STATS_TABLE`)."""

    __slots__ = STATS_FIELDS

    def __init__(self) -> None:
        self.acquisitions = 0
        self.try_acquisitions = 0
        self.skipped = 0
        self.hold_total_ns = 0
        self.hold_histogram: dict[int, int] = {}
        self.hold_min_ns = NO_SAMPLE
        self.hold_max_ns = 0
        self.contentions = 0
        self.timeouts = 0
        self.wait_total_ns = 0
        self.wait_histogram: dict[int, int] = {}
        self.wait_min_ns = NO_SAMPLE
        self.wait_max_ns = 0
        self.last_release_ns = 0
        self.collisions = 0
        self.sites: SiteTable | None = None

    def merge(self, other: Stats, table: tuple[tuple[str, str], ...] = STATS_TABLE) -> None:
        """Add another worker's statistics of the same lock class to these (the fields of
        ``table``: the C path's Stats adds its hold histogram itself). A field ``other`` never
        wrote (zero, empty, no sample) is left alone: an ended thread that took one lock once is
        folded at the cost of the few it wrote (the recorder folds one per thread)."""
        for name, how in table:
            theirs = getattr(other, name)
            if theirs == NO_SAMPLE if how == "min" else not theirs:
                continue
            mine = getattr(self, name)
            if how == "sites":
                self.sites = merge_tables(mine, theirs)
            elif how == "buckets":  # a new dict, assigned (the C path's Stats reads a copy)
                merged = dict(mine)
                for b, n in theirs.items():
                    merged[b] = merged.get(b, 0) + n
                setattr(self, name, merged)
            elif how == "min":
                setattr(self, name, min(mine, theirs))
            elif how == "max":
                setattr(self, name, max(mine, theirs))
            else:
                setattr(self, name, mine + theirs)
