"""Contention points and contending points: which code waits for a lock class, and which code
held it when a waiter arrived (Linux ``lock_stat``'s two tables).

Only a wait that blocked pays for them, on the slow path that already read the clock: the
waiter's frame and the held-stack entry of the lock's holder at the waiter's arrival give two
keys, ``(code object, instruction offset)``, cheap to take (no line lookup, no string). They
become ``module:function:line`` sites only when the snapshot asks (:func:`site_points`).

A worker keeps, per lock class it waited on, one :class:`SiteTable` (on its ``Stats``):

- ``waits``: waiter key -> ``[count, total, min, max, {bucket: count}]`` of its waits (a
  ``LogHistogram`` in the snapshot: count, total, p95);
- ``holders``: holder key -> ``[count, total wait caused]``.

**The bound.** Each table keeps at most its ``keep`` keys (4 x the ``contention_points``
setting: the session's ``THRESHOLDS.sites_kept``, which the lock paths hand to each table they
make; :data:`KEEP`, 32, by default); a key that arrives when the table is full is counted under
``(other)``. A lock held by nobody this process knows (another process's, or released between
the failed try and the look at its holder) is charged to ``(unknown)``. So the counts and totals
of a class's points always add up to its contentions and its wait, exactly.

**In the manifest** (``contention_points`` and ``contending_points`` of a lock entry) the sites
merge by adding (:func:`merge_points`), then :func:`trim_points` keeps the ``keep`` sites
with the most wait (ties: the most waits, then the site's name) and folds the rest into
``(other)``. The report shows the top ``contention_points`` of them. A merge of parts that each
have at most ``keep`` sites per class is exact: it equals the points of one process that
did all their work. Past that, a site folded into ``(other)`` in one part stays there.

A short call chain (the waiter's caller's caller) is not kept: the holder's frame has usually
returned by the time a waiter looks (a finished frame has no ``f_back``), so only the waiter's
half could be had, and its key would multiply the rows the bound folds into ``(other)``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from ._histogram import LogHistogram, bucket_of, from_buckets

__all__ = [
    "KEEP",
    "OTHER",
    "POINT_FIELDS",
    "UNKNOWN",
    "SiteTable",
    "code_attributes",
    "code_site",
    "merge_points",
    "merge_tables",
    "ranked",
    "read_points",
    "site_points",
    "trim_points",
    "with_unfiled",
]

#: Where a key that arrives in a full table is counted.
OTHER = "(other)"
#: The holder of a lock nobody in this process was seen holding.
UNKNOWN = "(unknown)"
#: A contending point's fields: waits that found it holding, and their total wait (ns).
POINT_FIELDS = ("count", "wait_ns")
NO_SAMPLE = 1 << 62  # the minimum of no sample
#: The sites kept per lock class by default, in memory and in a manifest: 4 x the
#: ``contention_points`` setting's default (a session's is its ``THRESHOLDS.sites_kept``).
KEEP = 32


# -- sites of code ---------------------------------------------------------------------------
_code_modules: dict[str, str] = {}


def _module_of_code(code: Any) -> str:
    # The code object does not know its module; the file does. Map the file to a module name once.
    name = _code_modules.get(code.co_filename)
    if name is None:
        name = code.co_filename
        for mod_name, module in list(sys.modules.items()):
            if getattr(module, "__file__", None) == code.co_filename:
                name = mod_name
                break
        _code_modules[code.co_filename] = name
    return name


def _line_of(code: Any, lasti: int) -> int:
    for start, end, line in code.co_lines():
        if start <= lasti < end and line is not None:
            return line
    return code.co_firstlineno


_sites: dict[tuple[Any, int], str] = {}  # (code, offset) -> site; emptied past 4096


def code_site(code: Any, lasti: int) -> str:
    """``module:function:line`` of the instruction at offset ``lasti`` of ``code``."""
    key = (code, lasti)
    site = _sites.get(key)
    if site is None:
        if len(_sites) >= 4096:
            _sites.clear()
        site = _sites[key] = f"{_module_of_code(code)}:{code.co_name}:{_line_of(code, lasti)}"
    return site


def code_attributes(site: str, prefix: str = "") -> dict[str, Any]:
    """A site's span attributes: ``code.namespace``, ``code.function``, ``code.lineno`` (the
    line only when it is one), each name after ``prefix`` (``lockwatch.holder.``)."""
    module, _, rest = site.partition(":")
    function, _, line = rest.rpartition(":")
    attrs: dict[str, Any] = {
        f"{prefix}code.namespace": module,
        f"{prefix}code.function": function,
    }
    if line.isdigit():
        attrs[f"{prefix}code.lineno"] = int(line)
    return attrs


# -- the worker's tables ---------------------------------------------------------------------
def _new_wait_row() -> list[Any]:
    return [0, 0, NO_SAMPLE, 0, {}]  # count, total, min, max, {bucket: count}


def _new_pair() -> list[int]:
    return [0, 0]  # count, total


def _row(table: dict[Any, Any], key: Any, new: Any, keep: int) -> Any:
    """``table[key]``, made by ``new()`` when missing; ``table[OTHER]`` for a new key of a
    table that has ``keep`` keys."""
    row = table.get(key)
    if row is None:
        if len(table) >= keep:
            key = OTHER
            row = table.get(OTHER)
        if row is None:
            row = table[key] = new()
    return row


class SiteTable:
    """One worker's contention and contending points for one lock class (see the module
    docstring): ``waits`` key -> ``[count, total, min, max, buckets]``; ``holders`` key ->
    ``[count, wait_ns]``; at most ``keep`` keys each, the rest in ``(other)``."""

    __slots__ = ("holders", "keep", "waits")

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self.waits: dict[Any, list[Any]] = {}
        self.holders: dict[Any, list[int]] = {}

    def add(self, waiter: Any, holder: Any, w: int) -> None:
        """A wait of ``w`` ns at the key ``waiter`` while the key ``holder`` held the lock."""
        row = _row(self.waits, waiter, _new_wait_row, self.keep)
        row[0] += 1
        row[1] += w
        if w < row[2]:
            row[2] = w
        if w > row[3]:
            row[3] = w
        buckets = row[4]
        b = bucket_of(w)
        buckets[b] = buckets.get(b, 0) + 1
        pair = _row(self.holders, holder, _new_pair, self.keep)
        pair[0] += 1
        pair[1] += w

    def merge(self, other: SiteTable) -> None:
        """Add an ended worker's table to this one (keys kept: they are the same code)."""
        for key, row in list(other.waits.items()):
            mine = self.waits.setdefault(key, _new_wait_row())
            mine[0] += row[0]
            mine[1] += row[1]
            mine[2] = min(mine[2], row[2])
            mine[3] = max(mine[3], row[3])
            for b, n in list(row[4].items()):
                mine[4][b] = mine[4].get(b, 0) + n
        for key, pair in list(other.holders.items()):
            mine_pair = self.holders.setdefault(key, _new_pair())
            mine_pair[0] += pair[0]
            mine_pair[1] += pair[1]


def _site(key: Any) -> str:
    return key if isinstance(key, str) else code_site(*key)


def merge_tables(mine: SiteTable | None, theirs: SiteTable | None) -> SiteTable | None:
    """Two workers' tables of one class as one (``mine``, made when None, takes ``theirs``)."""
    if theirs is None:
        return mine
    if mine is None:
        mine = SiteTable(theirs.keep)
    mine.merge(theirs)
    return mine


def site_points(table: SiteTable | None) -> dict[str, Any]:
    """A table's ``contention_points`` and ``contending_points``, keyed by site (keys of one
    site, at two instructions of one line, add up); nothing without a table."""
    if table is None:
        return {}
    waits: dict[str, LogHistogram] = {}
    for key, (_, total, lo, hi, buckets) in list(table.waits.items()):
        site = _site(key)
        hist = from_buckets(buckets, total, lo, hi)
        mine = waits.get(site)
        waits[site] = hist if mine is None else mine.merge(hist)
    holders: dict[str, dict[str, int]] = {}
    for key, (count, wait) in list(table.holders.items()):
        row = holders.setdefault(_site(key), {"count": 0, "wait_ns": 0})
        row["count"] += count
        row["wait_ns"] += wait
    return {"contention_points": waits, "contending_points": holders}


#: How many times :func:`read_points` reads a table that a filer was writing before it gives up
#: on its sites.
READS = 3


def read_points(s: Any) -> tuple[dict[str, Any], int, int]:
    """``(points, contentions, wait_total)`` of a ``Stats``, the points read first.

    A filer (the emitter, every 50 ms) may be adding a wait to the table while it is read: a
    row's total read before the add and its buckets after it, or the waits' row after it and the
    holders' before, is a torn read, whose points do not fit under the counters however the
    unfiled waits are charged. Such a read is made again (a filer's add takes microseconds);
    after :data:`READS` torn reads, the points are the counters' alone, charged to ``(unknown)``
    (what a snapshot gives up then is where those waits were, never their count or time).
    """
    for _ in range(READS):
        points = site_points(s.sites)
        contentions, wait_total = s.contentions, s.wait_total_ns
        if _fits(points, contentions, wait_total):
            return points, contentions, wait_total
    return with_unfiled(site_points(SiteTable()), contentions, wait_total), contentions, wait_total


def _fits(points: dict[str, Any], contentions: int, wait_total: int) -> bool:
    # Whether the points are a whole read: the holders add up to the waits, and what the
    # counters have beyond them is nothing, or waits with their time (a wait counted, and its
    # time not added yet, is a count with a time of 0).
    if not points:
        return True
    holders = points["contending_points"].values()
    count, total = _filed(points)
    if (sum(r["count"] for r in holders), sum(r["wait_ns"] for r in holders)) != (count, total):
        return False
    count, total = contentions - count, wait_total - total
    return (count, total) == (0, 0) or (count > 0 and total >= 0)


def _filed(points: dict[str, Any]) -> tuple[int, int]:
    # The count and the time of the waits the points hold.
    waits = points["contention_points"].values()
    return sum(h.count for h in waits), sum(h.sum for h in waits)


def with_unfiled(points: dict[str, Any], contentions: int, wait_total: int) -> dict[str, Any]:
    """``points`` (:func:`site_points` of a ``Stats``' table, read before its counters) with the
    waits its counters have and its table not yet (counted by the lock path, not filed yet:
    ``record._waits``; a snapshot files first, but a wait may end while it reads) charged to
    ``(unknown)`` at both ends, so that the points add up to ``contentions`` and ``wait_total``
    (their count and sum exact; their histogram the mean's bucket). No table and no waits, no
    points; no table but waits counted is a first wait not filed yet, charged so too: the lock's
    entry merges with other workers' that have points (without, the merged points fell short of
    the lock's counters and the evaluation refused the snapshot: 2 to 7 runs in 30 of the
    finalizer stress on 3.11's pure path)."""
    if not points:
        if contentions <= 0:
            return points
        points = {"contention_points": {}, "contending_points": {}}
    waits = points["contention_points"]
    count, total = _filed(points)
    count, total = contentions - count, wait_total - total
    if count <= 0 or total < 0:  # nothing unfiled (or a counter read mid-update: as read)
        return points
    mean = total // count
    unfiled = from_buckets({bucket_of(mean): count}, total, mean, mean)
    mine = waits.get(UNKNOWN)
    waits[UNKNOWN] = unfiled if mine is None else mine.merge(unfiled)
    holders = points["contending_points"]
    row = holders.setdefault(UNKNOWN, {"count": 0, "wait_ns": 0})
    row["count"] += count
    row["wait_ns"] += total
    return {"contention_points": waits, "contending_points": holders}


# -- merging ---------------------------------------------------------------------------------
def merge_points(acc: dict[str, Any], lock: Mapping[str, Any]) -> None:
    """Add a lock entry's points (those it has) to the accumulator ``acc`` (sites unite, their
    histograms merge and counts add; :func:`trim_points` bounds the result)."""
    waits = lock.get("contention_points")
    if waits is not None:
        into = acc.setdefault("contention_points", {})
        for site, hist in waits.items():
            mine = into.get(site)
            into[site] = hist.copy() if mine is None else mine.merge(hist)
    holders = lock.get("contending_points")
    if holders is not None:
        into_rows = acc.setdefault("contending_points", {})
        for site, row in holders.items():
            mine_row = into_rows.setdefault(site, dict.fromkeys(POINT_FIELDS, 0))
            for key in POINT_FIELDS:
                mine_row[key] += row[key]


def _rank(item: tuple[str, Any]) -> tuple[int, int, str]:
    site, value = item
    if isinstance(value, LogHistogram):
        return (-value.sum, -value.count, site)
    return (-value["wait_ns"], -value["count"], site)


def ranked(points: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The sites by the wait they account for, most first (``(other)`` last)."""
    rows = sorted((item for item in points.items() if item[0] != OTHER), key=_rank)
    if OTHER in points:
        rows.append((OTHER, points[OTHER]))
    return rows


def trim_points(lock: dict[str, Any], keep: int = KEEP, grown_past: int = 1) -> None:
    """Keep a lock entry's ``keep`` sites with the most wait, each table, and fold the rest
    into ``(other)``, in place; only for a table of more than ``grown_past`` times ``keep``
    sites (a streaming merge trims a table when it has doubled)."""
    for field in ("contention_points", "contending_points"):
        points = lock.get(field)
        if points is None or len(points) <= grown_past * keep + (OTHER in points):
            continue
        rows = ranked(points)
        kept = dict(row for row in rows[:keep] if row[0] != OTHER)
        for _site, value in rows[len(kept) :]:
            if isinstance(value, LogHistogram):
                mine = kept.get(OTHER)
                kept[OTHER] = value.copy() if mine is None else mine.merge(value)
            else:
                other = kept.setdefault(OTHER, dict.fromkeys(POINT_FIELDS, 0))
                for key in POINT_FIELDS:
                    other[key] += value[key]
        lock[field] = kept
