"""The data part of a manifest, and the one routine that merges data parts.

The recorder's snapshot, a manifest's ``data`` and the merge of several manifests share one
shape (drawn in ``docs/ARCHITECTURE.md``, "Recorder snapshot"): per lock, counters, the wait and
hold distributions (:class:`LogHistogram`) and per-worker totals; per worker, the time observed
and the time spent waiting; the lock-order graph; the spans started under a held lock; the
section arrays; the pool's nominal size; the process. Only sums, maxima, histograms and graph
edges: nothing in it grows with the number of acquisitions, and every field merges exactly.

=======================  ==========================================================================
``locks``                counters add, histograms merge (bucket counts add), per-worker totals
                         add; the kind is the least of the kinds seen (two lock classes may share
                         a name; the least is a choice that does not depend on the order).
                         Hand-off waits (``signal_waits``): counts, the histogram and every
                         per-worker number add; the pool a class guards (``pool``): ``capacity``
                         and ``in_use_peak`` the largest known, ``checkouts`` add, ``hold_ns``
                         merges; ``role``: the least one given. Each is present in the merge when
                         a part has it. A distributed lock's ``key_templates`` unite (at most
                         16, the least kept), its ``lease`` counts and per-worker overruns add
                         (the longest overrun: the largest), its ``release_failures`` add
``workers``              observed and waiting time add
``lock_order``           the union of the edges, each keeping its earliest witness, and the cycles
                         found again in the union (:func:`~._cycles.merge_order_data`), so that
                         ``A -> B`` in one part and ``B -> A`` in another is a cycle
``blocking_under_lock``  counts add
``sections``             ``count`` and ``max_held``: the largest; ``collision_waits`` add
``pool``                 the best-informed source: an executor's size before the environment's
                         before any other, then the largest size; ``peak_workers`` (the most
                         workers alive at once) add, since processes run side by side
``locks`` (points)       a lock's ``contention_points`` (site -> wait histogram) and
                         ``contending_points`` (site -> ``{count, wait_ns}``): sites unite,
                         histograms merge, counts add; then the ``4 x contention_points`` sites
                         with the most wait are kept and the rest fold into ``(other)``
                         (``_sites``), so the totals stay exact (a fold trims a table when it
                         has doubled, so its memory does not grow with the parts)
``timeline``             the widest bucket width of the parts (doubled while the union of their
                         spans needs more than 256 buckets), every bucket's sums added into the
                         merged bucket holding it; the 8 classes with the most wait kept
                         (``_timeline``; a fold keeps every class until its result). Present
                         when a part has one
=======================  ==========================================================================

Each rule is commutative and associative, so a merge depends neither on the order of its parts
nor on how they are grouped (the points and the timeline's classes: while nothing is folded
away, that is while each part keeps every site and class it saw). :func:`merge_data` is the
one implementation: the recorder's snapshot is the merge of one part per (worker, lock
class) statistics, and ``merge_manifests`` merges the data of several processes with it. The
``process`` field says who recorded, not what: a merge leaves it to the caller (the recorder
writes its own process, ``merge_manifests`` the list of processes).

In memory a lock's per-worker totals are a :class:`WorkerTotals` (tuples: the bulk of a large
snapshot); they become ``{worker: {acquisitions, contentions, wait_ns, hold_ns}}`` objects only in
the snapshot handed out and in JSON.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._cycles import EdgeUnion
from ._histogram import MERGE_SPEEDUPS, LogHistogram
from ._sites import KEEP, merge_points, trim_points
from ._timeline import merge_timelines

__all__ = [
    "DATA_FIELDS",
    "OPTIONAL_DATA_FIELDS",
    "FAILURE_KINDS",
    "LEASE_WORKER_FIELDS",
    "MAX_TEMPLATES",
    "OTHER_WORKERS",
    "LOCK_COUNTERS",
    "LOCK_WORKER_FIELDS",
    "SECTION_FIELDS",
    "HANDOFF_WORKER_FIELDS",
    "WORKER_FIELDS",
    "DataFold",
    "WorkerTotals",
    "expand_lock_workers",
    "merge_data",
]

#: The data part's top-level keys.
DATA_FIELDS = (
    "blocking_under_lock",
    "lock_order",
    "locks",
    "pool",
    "process",
    "sections",
    "workers",
)
#: The data part's keys present only when recorded (a process's ``timeline``).
OPTIONAL_DATA_FIELDS = ("timeline",)
#: A lock's counters.
LOCK_COUNTERS = ("acquisitions", "contentions", "skipped", "timeouts")
#: A lock's totals per worker, in the order of a :class:`WorkerTotals` row.
LOCK_WORKER_FIELDS = ("acquisitions", "contentions", "wait_ns", "hold_ns")
#: A worker's totals over every lock.
WORKER_FIELDS = ("observed_ns", "wait_ns")
#: A lock class's hand-off waits per worker (``signal_waits.workers``): blocked hand-off waits,
#: their total, and the gives that end waits (published as ``signals``).
HANDOFF_WORKER_FIELDS = ("waits", "wait_ns", "signals")
#: A distributed lock's key templates kept (the least, in code-point order).
MAX_TEMPLATES = 16
#: A distributed lock's lease overruns per worker.
LEASE_WORKER_FIELDS = ("overruns", "overrun_ns")
#: How a distributed lock's release failed.
FAILURE_KINDS = ("not_owned", "lock_error")
#: A section array's statistics.
SECTION_FIELDS = ("count", "collision_waits", "max_held")
#: The pool size sources, best informed first; any other source ranks after these.
_POOL_SOURCE_RANK = {"executor": 0, "env": 1}
#: The row a bounded merge (:class:`DataFold`) adds the workers it does not keep into. Its name
#: has no ``/``: a merged manifest's workers are all ``<pid>/<name>``.
OTHER_WORKERS = "(other workers)"
#: A bounded merge keeps this many times more workers at the top level than per lock class.
_TOP_LEVEL_FACTOR = 16
_GET_WAIT = operator.itemgetter("wait_ns")

Row = tuple[int, int, int, int]


class WorkerTotals:
    """One lock's per-worker totals, ``{worker: (acquisitions, contentions, wait_ns, hold_ns)}``.

    Kept as tuples because this is the bulk of a large snapshot (10^4 locks x 64 workers would
    be 640 000 small dicts to copy); expanded into ``{worker: {acquisitions, contentions,
    wait_ns, hold_ns}}`` objects by :meth:`to_json`. Never mutated once built.
    """

    __slots__ = ("rows",)

    def __init__(self, rows: dict[str, Row]) -> None:
        self.rows = rows

    @classmethod
    def of(cls, per_worker: WorkerTotals | Mapping[str, Mapping[str, int]]) -> WorkerTotals:
        """The totals themselves, or built (unchecked) from their JSON form."""
        if isinstance(per_worker, WorkerTotals):
            return per_worker
        return cls(
            {
                worker: (w["acquisitions"], w["contentions"], w["wait_ns"], w["hold_ns"])
                for worker, w in per_worker.items()
            }
        )

    def to_json(self) -> dict[str, dict[str, int]]:
        return {w: dict(zip(LOCK_WORKER_FIELDS, r, strict=True)) for w, r in self.rows.items()}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WorkerTotals):
            return NotImplemented
        return self.rows == other.rows

    __hash__ = None  # type: ignore[assignment]  # compared by value, like the dict it stands for

    def __repr__(self) -> str:
        return f"<WorkerTotals {len(self.rows)} workers>"


def _merge_lock(into: dict[str, dict[str, Any]], name: str, lock: Mapping[str, Any]) -> None:
    """Add one lock's data to the accumulator ``into[name]`` (per-worker rows in a plain dict
    until :func:`merge_data` wraps them)."""
    acc = into.get(name)
    if acc is None:
        acc = into[name] = {
            "kind": lock["kind"],
            **dict.fromkeys(LOCK_COUNTERS, 0),
            "wait_ns": LogHistogram(),
            "hold_ns": LogHistogram(),
            "workers": {},
        }
    elif lock["kind"] < acc["kind"]:
        acc["kind"] = lock["kind"]
    for key in LOCK_COUNTERS:
        acc[key] += lock[key]
    acc["wait_ns"].merge(lock["wait_ns"])
    acc["hold_ns"].merge(lock["hold_ns"])
    rows: dict[str, Row] = acc["workers"]
    if MERGE_SPEEDUPS is not None:  # the loop below, in C
        MERGE_SPEEDUPS.add_rows(rows, WorkerTotals.of(lock["workers"]).rows)
    else:
        for worker, r in WorkerTotals.of(lock["workers"]).rows.items():
            mine = rows.get(worker)
            rows[worker] = (
                r
                if mine is None
                else (mine[0] + r[0], mine[1] + r[1], mine[2] + r[2], mine[3] + r[3])
            )
    if "role" in lock or "signal_waits" in lock or "pool" in lock:
        _merge_pool_fields(acc, lock)
    if "key_templates" in lock or "lease" in lock or "release_failures" in lock:
        _merge_distributed_fields(acc, lock)
    if "contention_points" in lock or "contending_points" in lock:
        merge_points(acc, lock)


def _larger(a: int | None, b: int | None) -> int | None:
    """The larger of two optional values (None is unknown, not zero)."""
    return b if a is None else a if b is None else max(a, b)


def _merge_pool_fields(acc: dict[str, Any], lock: Mapping[str, Any]) -> None:
    """Add a lock's role, hand-off waits and pool (those it has) to the accumulator ``acc``."""
    role = lock.get("role")
    if role is not None and (acc.get("role") is None or role < acc["role"]):
        acc["role"] = role
    handoff_waits = lock.get("signal_waits")
    if handoff_waits is not None:
        into = acc.setdefault(
            "signal_waits", {"count": 0, "timeouts": 0, "wait_ns": LogHistogram(), "workers": {}}
        )
        into["count"] += handoff_waits["count"]
        into["timeouts"] += handoff_waits["timeouts"]
        into["wait_ns"].merge(handoff_waits["wait_ns"])
        for worker, waiter in handoff_waits["workers"].items():
            mine = into["workers"].setdefault(worker, dict.fromkeys(HANDOFF_WORKER_FIELDS, 0))
            for key in HANDOFF_WORKER_FIELDS:
                mine[key] += waiter[key]
    pool = lock.get("pool")
    if pool is not None:
        into = acc.setdefault(
            "pool",
            {"capacity": None, "in_use_peak": None, "checkouts": 0, "hold_ns": LogHistogram()},
        )
        into["capacity"] = _larger(into["capacity"], pool["capacity"])
        into["in_use_peak"] = _larger(into["in_use_peak"], pool["in_use_peak"])
        into["checkouts"] += pool["checkouts"]
        into["hold_ns"].merge(pool["hold_ns"])


def _merge_distributed_fields(acc: dict[str, Any], lock: Mapping[str, Any]) -> None:
    """Add a distributed lock's key templates, lease and release failures (those it has) to
    the accumulator ``acc``: templates unite (the least :data:`MAX_TEMPLATES` kept), counts and
    per-worker overruns add, the longest overrun is the largest."""
    templates = lock.get("key_templates")
    if templates is not None:
        united = set(acc.get("key_templates", ())) | set(templates)
        acc["key_templates"] = sorted(united)[:MAX_TEMPLATES]
    lease = lock.get("lease")
    if lease is not None:
        into = acc.setdefault(
            "lease",
            {"overruns": 0, "overrun_ns": 0, "overrun_max_ns": 0, "workers": {}},
        )
        for key in ("overruns", "overrun_ns"):
            into[key] += lease[key]
        into["overrun_max_ns"] = max(into["overrun_max_ns"], lease["overrun_max_ns"])
        for worker, w in lease["workers"].items():
            mine = into["workers"].setdefault(worker, dict.fromkeys(LEASE_WORKER_FIELDS, 0))
            for key in LEASE_WORKER_FIELDS:
                mine[key] += w[key]
    failures = lock.get("release_failures")
    if failures is not None:
        into = acc.setdefault("release_failures", dict.fromkeys(FAILURE_KINDS, 0))
        for key in FAILURE_KINDS:
            into[key] += failures[key]


def _add_counts(into: dict[str, int], counts: Mapping[str, int]) -> None:
    for key, n in counts.items():
        into[key] = into.get(key, 0) + n


def _merge_section(into: dict[str, dict[str, int]], name: str, s: Mapping[str, int]) -> None:
    acc = into.get(name)
    if acc is None:
        into[name] = {key: s[key] for key in SECTION_FIELDS}
        return
    acc["count"] = max(acc["count"], s["count"])
    acc["max_held"] = max(acc["max_held"], s["max_held"])
    acc["collision_waits"] += s["collision_waits"]


def _pool_key(pool: Mapping[str, Any]) -> tuple[int, int, str]:
    """Sorts the best-informed pool first: by source, then the largest size."""
    source = pool["source"]
    return (_POOL_SOURCE_RANK.get(source, len(_POOL_SOURCE_RANK)), -pool["nominal"], source or "")


def _keep_top(
    rows: dict[str, Any], keep: int, wait: Callable[[Any], int], total: Callable[[list[Any]], Any]
) -> None:
    """Keep, in place, the ``keep`` rows of the longest ``wait`` (ties: the least name) and fold
    every other into the :data:`OTHER_WORKERS` row with ``total`` (the sum of a list of rows),
    so that sums stay exact."""
    other = rows.pop(OTHER_WORKERS, None)
    if len(rows) > keep:
        # By name, then (stable) by wait, longest first: C-level sorts, no Python key call.
        waits = dict(zip(rows, map(wait, rows.values()), strict=True))
        ranked = sorted(sorted(rows), key=waits.__getitem__, reverse=True)
        evicted = [rows.pop(worker) for worker in ranked[keep:]]
        other = total(evicted if other is None else [other, *evicted])
    if other is not None:
        rows[OTHER_WORKERS] = other


def _total_rows(rows: list[Row]) -> Row:
    return tuple(map(sum, zip(*rows, strict=True)))  # type: ignore[return-value]


def _total_totals(rows: list[Mapping[str, int]]) -> dict[str, int]:
    return {key: sum(row[key] for row in rows) for key in WORKER_FIELDS}


class DataFold:
    """Data parts folded in one at a time, by the rules of the module docstring.

    What it holds grows with the lock classes, workers, edges and sections it has seen, never
    with the number of parts; :meth:`result` is :func:`merge_data` of every part added.

    Args:
        max_workers: None (the default) keeps every worker. A number bounds the workers kept per
            lock class and at the top level to about that many: when a class has twice as many,
            the ones that waited longest are kept (ties: the least name) and the others are
            added into one row named :data:`OTHER_WORKERS`, so every sum stays exact. A merge
            of parts whose worker names are disjoint (one process each) keeps the same workers
            in any order; a worker evicted and seen again in a later part starts a new row.
        sites_kept: the contention and contending points kept per lock class (``_sites``).
    """

    __slots__ = (
        "_blocking",
        "_sites_kept",
        "_locks",
        "_max_workers",
        "_order",
        "_peak_workers",
        "_pool",
        "_sections",
        "_timeline",
        "_workers",
    )

    def __init__(self, max_workers: int | None = None, sites_kept: int = KEEP) -> None:
        self._max_workers = max_workers
        self._sites_kept = sites_kept
        self._locks: dict[str, dict[str, Any]] = {}
        self._workers: dict[str, dict[str, int]] = {}
        self._blocking: dict[str, dict[str, int]] = {}
        self._sections: dict[str, dict[str, int]] = {}
        self._order = EdgeUnion()
        self._pool: Mapping[str, Any] | None = None
        self._peak_workers: int | None = None
        self._timeline: dict[str, Any] | None = None

    def add(self, part: Mapping[str, Any]) -> None:
        """Fold one data part in (see :func:`merge_data` for its form; it is not modified).

        Raises:
            ValueError: its lock-order graph is malformed.
        """
        locks, bound = self._locks, self._max_workers
        for name, lock in part.get("locks", {}).items():
            _merge_lock(locks, name, lock)
            rows = locks[name]["workers"]
            if bound is not None and len(rows) > 2 * bound:
                _keep_top(rows, bound, operator.itemgetter(2), _total_rows)
            trim_points(locks[name], self._sites_kept, grown_past=2)
        workers = self._workers
        for worker, totals in part.get("workers", {}).items():
            _add_counts(workers.setdefault(worker, dict.fromkeys(WORKER_FIELDS, 0)), totals)
        if bound is not None and len(workers) > 2 * _TOP_LEVEL_FACTOR * bound:
            _keep_top(workers, _TOP_LEVEL_FACTOR * bound, _GET_WAIT, _total_totals)
        for lock_name, spans in part.get("blocking_under_lock", {}).items():
            _add_counts(self._blocking.setdefault(lock_name, {}), spans)
        for name, s in part.get("sections", {}).items():
            _merge_section(self._sections, name, s)
        if "lock_order" in part:
            self._order.add(part["lock_order"])
        timeline = part.get("timeline")
        if timeline is not None:  # every class kept until the result picks the top ones
            self._timeline = merge_timelines(
                [timeline] if self._timeline is None else [self._timeline, timeline], keep=None
            )
        pool = part.get("pool")
        if pool is not None:
            if pool.get("nominal") is not None and (
                self._pool is None or _pool_key(pool) < _pool_key(self._pool)
            ):
                self._pool = {"nominal": pool["nominal"], "source": pool["source"]}
            if "peak_workers" in pool:
                self._peak_workers = (self._peak_workers or 0) + pool["peak_workers"]

    def partial(self) -> dict[str, Any]:
        """What the fold holds, as one data part that another fold adds as if it added every
        part this one did (a merge run in several processes: each folds a share of the parts,
        one adds the others' partials). Unlike :meth:`result`, nothing more is trimmed or
        chosen: the workers are those this fold keeps (with its :data:`OTHER_WORKERS` row, which
        adds into the other's), the timeline keeps every class, the points every site they
        have. The fold is spent after."""
        part: dict[str, Any] = {
            "locks": {
                name: {**lock, "workers": WorkerTotals(lock["workers"])}
                for name, lock in self._locks.items()
            },
            "workers": self._workers,
            "lock_order": self._order.result(),
            "blocking_under_lock": self._blocking,
            "sections": self._sections,
            "pool": dict(self._pool or {"nominal": None, "source": None}),
        }
        if self._peak_workers is not None:
            part["pool"]["peak_workers"] = self._peak_workers
        if self._timeline is not None:
            part["timeline"] = self._timeline
        return part

    def result(self) -> dict[str, Any]:
        """The merge of every part added: a new data part without ``process``, its histograms
        new objects, its per-lock workers :class:`WorkerTotals`. The fold is spent after."""
        bound = self._max_workers
        locks = self._locks
        for lock in locks.values():
            if bound is not None:
                _keep_top(lock["workers"], bound, operator.itemgetter(2), _total_rows)
            lock["workers"] = WorkerTotals(lock["workers"])
            trim_points(lock, self._sites_kept)
        if bound is not None:
            _keep_top(self._workers, _TOP_LEVEL_FACTOR * bound, _GET_WAIT, _total_totals)
        best = self._pool or {"nominal": None, "source": None}
        merged_pool = {"nominal": best["nominal"], "source": best["source"]}
        if self._peak_workers is not None:
            merged_pool["peak_workers"] = self._peak_workers
        merged: dict[str, Any] = {
            "locks": locks,
            "workers": self._workers,
            "lock_order": self._order.result(),
            "blocking_under_lock": self._blocking,
            "sections": self._sections,
            "pool": merged_pool,
        }
        if self._timeline is not None:
            merged["timeline"] = merge_timelines([self._timeline])
        return merged


def merge_data(parts: Iterable[Mapping[str, Any]], sites_kept: int = KEEP) -> dict[str, Any]:
    """Merge data parts exactly, by the rules of the module docstring.

    Args:
        parts: data parts, each as the recorder's snapshot or a normalized manifest's data:
            histograms as :class:`LogHistogram`, a lock's per-worker totals as
            :class:`WorkerTotals` or their JSON form. Absent keys count as empty; ``process``
            is ignored. The parts are not modified.
        sites_kept: the contention and contending points kept per lock class.

    Returns:
        A new data part without ``process``; its histograms are new objects, its per-lock
        workers :class:`WorkerTotals`.
    """
    fold = DataFold(sites_kept=sites_kept)
    for part in parts:
        fold.add(part)
    return fold.result()


def expand_lock_workers(data: dict[str, Any]) -> dict[str, Any]:
    """Turn every lock's :class:`WorkerTotals` into its JSON form, in place; return ``data``."""
    for lock in data["locks"].values():
        workers = lock["workers"]
        if isinstance(workers, WorkerTotals):
            lock["workers"] = workers.to_json()
    return data
