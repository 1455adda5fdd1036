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
                         Signal waits (``signal_waits``): counts, the histogram and every
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
                         (``_sites``), so the totals stay exact
``timeline``             the widest bucket width of the parts (doubled while the union of their
                         spans needs more than 256 buckets), every bucket's sums added into the
                         merged bucket holding it; the 8 classes with the most wait kept
                         (``_timeline``). Present when a part has one
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

from collections.abc import Iterable, Mapping
from typing import Any

from ._cycles import merge_order_data
from ._histogram import LogHistogram
from ._sites import merge_points, trim_points
from ._timeline import merge_timelines

__all__ = [
    "DATA_FIELDS",
    "FAILURE_KINDS",
    "LEASE_WORKER_FIELDS",
    "MAX_TEMPLATES",
    "LOCK_COUNTERS",
    "LOCK_WORKER_FIELDS",
    "SECTION_FIELDS",
    "SIGNAL_WORKER_FIELDS",
    "WORKER_FIELDS",
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
#: A lock's counters.
LOCK_COUNTERS = ("acquisitions", "contentions", "skipped", "timeouts")
#: A lock's totals per worker, in the order of a :class:`WorkerTotals` row.
LOCK_WORKER_FIELDS = ("acquisitions", "contentions", "wait_ns", "hold_ns")
#: A worker's totals over every lock.
WORKER_FIELDS = ("observed_ns", "wait_ns")
#: A lock class's signal waits per worker: blocked signal waits, their total, signals given.
SIGNAL_WORKER_FIELDS = ("waits", "wait_ns", "signals")
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
    for worker, r in WorkerTotals.of(lock["workers"]).rows.items():
        mine = rows.get(worker)
        rows[worker] = (
            r if mine is None else (mine[0] + r[0], mine[1] + r[1], mine[2] + r[2], mine[3] + r[3])
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
    """Add a lock's role, signal waits and pool (those it has) to the accumulator ``acc``."""
    role = lock.get("role")
    if role is not None and (acc.get("role") is None or role < acc["role"]):
        acc["role"] = role
    signal = lock.get("signal_waits")
    if signal is not None:
        into = acc.setdefault(
            "signal_waits", {"count": 0, "timeouts": 0, "wait_ns": LogHistogram(), "workers": {}}
        )
        into["count"] += signal["count"]
        into["timeouts"] += signal["timeouts"]
        into["wait_ns"].merge(signal["wait_ns"])
        for worker, w in signal["workers"].items():
            mine = into["workers"].setdefault(worker, dict.fromkeys(SIGNAL_WORKER_FIELDS, 0))
            for key in SIGNAL_WORKER_FIELDS:
                mine[key] += w[key]
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


def merge_data(parts: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge data parts exactly, by the rules of the module docstring.

    Args:
        parts: data parts, each as the recorder's snapshot or a normalized manifest's data:
            histograms as :class:`LogHistogram`, a lock's per-worker totals as
            :class:`WorkerTotals` or their JSON form. Absent keys count as empty; ``process``
            is ignored. The parts are not modified.

    Returns:
        A new data part without ``process``; its histograms are new objects, its per-lock
        workers :class:`WorkerTotals`.
    """
    locks: dict[str, dict[str, Any]] = {}
    workers: dict[str, dict[str, int]] = {}
    blocking: dict[str, dict[str, int]] = {}
    sections: dict[str, dict[str, int]] = {}
    orders: list[Mapping[str, Any]] = []
    pools: list[Mapping[str, Any]] = []
    peaks: list[int] = []
    timelines: list[Mapping[str, Any]] = []
    for part in parts:
        for name, lock in part.get("locks", {}).items():
            _merge_lock(locks, name, lock)
        for worker, totals in part.get("workers", {}).items():
            _add_counts(workers.setdefault(worker, dict.fromkeys(WORKER_FIELDS, 0)), totals)
        for lock_name, spans in part.get("blocking_under_lock", {}).items():
            _add_counts(blocking.setdefault(lock_name, {}), spans)
        for name, s in part.get("sections", {}).items():
            _merge_section(sections, name, s)
        if "lock_order" in part:
            orders.append(part["lock_order"])
        if part.get("timeline") is not None:
            timelines.append(part["timeline"])
        pool = part.get("pool")
        if pool is not None:
            if pool.get("nominal") is not None:
                pools.append(pool)
            if "peak_workers" in pool:
                peaks.append(pool["peak_workers"])
    for lock in locks.values():
        lock["workers"] = WorkerTotals(lock["workers"])
        trim_points(lock)
    best = min(pools, key=_pool_key) if pools else {"nominal": None, "source": None}
    merged_pool = {"nominal": best["nominal"], "source": best["source"]}
    if peaks:
        merged_pool["peak_workers"] = sum(peaks)
    merged: dict[str, Any] = {
        "locks": locks,
        "workers": workers,
        "lock_order": merge_order_data(orders),
        "blocking_under_lock": blocking,
        "sections": sections,
        "pool": merged_pool,
    }
    if timelines:
        merged["timeline"] = merge_timelines(timelines)
    return merged


def expand_lock_workers(data: dict[str, Any]) -> dict[str, Any]:
    """Turn every lock's :class:`WorkerTotals` into its JSON form, in place; return ``data``."""
    for lock in data["locks"].values():
        workers = lock["workers"]
        if isinstance(workers, WorkerTotals):
            lock["workers"] = workers.to_json()
    return data
