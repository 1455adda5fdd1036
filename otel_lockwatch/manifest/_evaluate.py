"""Evaluation: the derived fields of a manifest, computed from its data part.

A pool that spins down leaves its successor the *contention topology* it ran under, not only its
task outcomes: sixteen workers can all "succeed" while fourteen of them waited on one mutex, and
a successor that inherits sixteen hits the same wall. :func:`evaluate` reads that topology from
the data and says what to do about it:

- **hot locks**: a lock whose share of the aggregate wait is at least the hot-lock threshold
  (``hot_lock_threshold_pct``), provided its wait is not negligible (the two floors below);
- **starvation**: a worker whose wait on a lock exceeds ``starvation_ratio`` times the lower
  median of that lock's per-worker waits (the lower median, so that one starved worker beside
  one idle one is still seen), with a floor under the median and a minimum wait, and that is a
  material share of the worker's observed time (one outlier wait in a long run is bad luck,
  not starvation);
- **resource pools**: a lock's waits are its mutex waits plus its *contention* hand-off waits
  (``_pools``: a checkout that waited for a connection a peer will give back); *idle* hand-off
  waits (a consumer waiting for work) count nowhere but in ``idle_waits``. A pool is reported
  with what its capacity supports and what the nominal pool size needs;
- **ordering witnesses**: the cycles of the lock-order graph, deadlocks that have not happened;
- **lease overruns** of distributed locks (``_distributed``): an exclusion that already failed;
- the **verdict**, by precedence ``LEASE_OVERRUN_DETECTED`` > ``CYCLIC_ORDERING_DETECTED`` >
  ``STARVATION_OBSERVED`` > ``HOT_LOCK_DETECTED`` > ``LOW_CONTENTION``, and the **recommended
  pool size** it implies (half the nominal size for an overrun, a cycle or starvation, three
  quarters for a hot lock);
- the effective throughput, the hold-time percentiles of the hot locks, the size each section
  array should have.

Comparisons run in exact integer arithmetic on nanoseconds; only displayed values are rounded.
Every threshold and floor in force is listed in the manifest's ``thresholds``.
"""

from __future__ import annotations

import copy
import math
import operator
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from .._settings import SETTINGS
from ..record._data import OTHER_WORKERS
from ..record._histogram import RELATIVE_ERROR, LogHistogram
from ._data import normalize
from ._distributed import distributed_reports
from ._model import SCHEMA, Manifest, Verdict
from ._pools import HandoffSplit, pool_reports, split_handoff_waits
from ._sizing import SIZING_MIN_COST_PCT, apart_report, pool_workers, size_pool

__all__ = [
    "HOT_LOCK_MIN_WAIT_MS",
    "SECTION_COLLISION_TARGET",
    "STARVATION_MEDIAN_FLOOR_MS",
    "STARVATION_MIN_WAIT_MS",
    "STARVATION_MIN_WAIT_PCT_OF_OBSERVED",
    "evaluate",
    "evaluate_normalized",
    "recommended_section_count",
]

# The thresholds that are options (hot_lock_threshold_pct, starvation_ratio) and the nominal
# pool size come from _settings; these floors are fixed.

#: A hot lock made workers wait at least this long in total (ms), and its wait is a material
#: share of the pool's worker time (``_sizing.SIZING_MIN_COST_PCT``).
HOT_LOCK_MIN_WAIT_MS = 1.0
#: A lock's median wait below this (ms) counts as this when looking for starvation...
STARVATION_MEDIAN_FLOOR_MS = 0.2
#: ...and a starved worker's wait is at least this (ms)...
STARVATION_MIN_WAIT_MS = 1.0
#: ...and at least this share of the worker's observed time (percent).
STARVATION_MIN_WAIT_PCT_OF_OBSERVED = 5.0
#: Section sizing: the expected number of colliding pairs among the most concurrent holders.
SECTION_COLLISION_TARGET = 0.05

_HOT_LOCK_THRESHOLD_PCT = SETTINGS["hot_lock_threshold_pct"]
_STARVATION_RATIO = SETTINGS["starvation_ratio"]
_POOL_SIZE = SETTINGS["pool_size"]

_NS_PER_MS = 1_000_000
_GET_WAIT = operator.itemgetter(2)  # a WorkerTotals row's wait_ns
_PERCENTILES = (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99))


def _ms(ns: int) -> float:
    return ns / _NS_PER_MS


def _distribution(h: LogHistogram) -> dict[str, float]:
    ps = h.percentiles([q for _, q in _PERCENTILES])
    out = {key: _ms(p) for (key, _), p in zip(_PERCENTILES, ps, strict=True)}
    out["max_ms"] = _ms(h.max)
    return out


def recommended_section_count(max_held: int, target: float = SECTION_COLLISION_TARGET) -> int:
    """Return the smallest power of two ``n`` with ``C(max_held, 2) / n <= target``.

    With ``k`` holders in ``n`` uniformly hashed sections the expected number of colliding
    pairs is ``C(k, 2) / n``: enough sections that the most concurrent holders practically never
    share one, computed.

    Args:
        max_held: the most sections held at once.
        target: the expected colliding pairs allowed, > 0.

    Raises:
        ValueError: ``max_held`` is negative or ``target`` is not > 0.
    """
    if max_held < 0:
        raise ValueError(f"max_held must be >= 0, got {max_held!r}")
    if not target > 0:
        raise ValueError(f"target must be > 0, got {target!r}")
    pairs = max_held * (max_held - 1) // 2
    need = math.ceil(Fraction(pairs) / Fraction(str(target)))
    return 1 if need <= 1 else 1 << (need - 1).bit_length()


def evaluate(
    data: Mapping[str, Any],
    *,
    hot_lock_threshold_pct: float | None = None,
    starvation_ratio: float | None = None,
    pool_size: int | None = None,
    service_name: str | None = None,
) -> Manifest:
    """Derive the manifest from a recorder snapshot (or from a manifest's data part).

    The thresholds and the pool size are options (``otel_lockwatch._settings``): an argument
    given here wins, else the ``OTEL_PYTHON_LOCKWATCH_*`` variable, else the option's default.

    Args:
        data: the snapshot described in ``docs/ARCHITECTURE.md``; histograms may be
            :class:`LogHistogram` objects or their JSON form, so a loaded manifest's dict (or
            ``Manifest.data``) can be evaluated again. Absent top-level keys count as empty.
        hot_lock_threshold_pct: a lock is hot when its share of the aggregate wait is at least
            this (percent).
        starvation_ratio: a worker starves on a lock when its wait there exceeds this many
            times the lock's median per-worker wait.
        pool_size: the nominal pool size when the data does not know it (``data["pool"]``);
            without it or its variable, the number of workers observed.
        service_name: replaces the process's ``service.name``.

    Raises:
        ValueError: an argument is not a valid value of its option (``hot_lock_threshold_pct
            must be a percentage in (0, 100], got 0``), or the data is malformed (the message
            names the field).
        TypeError: ``service_name`` is not a str.

    Invalid environment values are logged once as a warning and replaced by the default.
    """
    hot_pct = _HOT_LOCK_THRESHOLD_PCT.resolve(hot_lock_threshold_pct)
    ratio = _STARVATION_RATIO.resolve(starvation_ratio)
    size = _POOL_SIZE.resolve(pool_size)
    norm = normalize(data)
    if service_name is not None:
        if not isinstance(service_name, str):
            raise TypeError(f"service_name must be a str, got {service_name!r}")
        norm["process"]["service.name"] = service_name
    norm["process"].setdefault("service.name", "unknown_service")
    return evaluate_normalized(
        norm, hot_pct, ratio, size, "argument" if pool_size is not None else "env"
    )


def _starving(
    locks: dict[str, Any],
    workers: dict[str, Any],
    splits: dict[str, HandoffSplit],
    worker_wait: dict[str, int],
    ratio: float,
) -> list[tuple[int, str, str, int]]:
    """``(wait_ns, worker, lock, median_ns)`` of every starved worker (see the module docstring).

    A worker's wait on a lock is its mutex wait plus its contention hand-off wait; a worker that
    only ever waited idle on a class takes no part in that class's median.
    """
    floor_ns = STARVATION_MEDIAN_FLOOR_MS * _NS_PER_MS
    min_wait_ns = STARVATION_MIN_WAIT_MS * _NS_PER_MS
    starving: list[tuple[int, str, str, int]] = []
    for name, lock in locks.items():
        rows = lock["workers"].rows
        if OTHER_WORKERS in rows:  # a bounded merge's sum of many workers: no one worker
            rows = {worker: row for worker, row in rows.items() if worker != OTHER_WORKERS}
        split = splits.get(name)
        if split is None:
            names: Iterable[str] = rows.keys()
            waits = list(map(_GET_WAIT, rows.values()))
        else:
            per_worker = {worker: row[2] for worker, row in rows.items()}
            for worker, (_, wn) in split.contention.items():
                per_worker[worker] = per_worker.get(worker, 0) + wn
            names, waits = per_worker.keys(), list(per_worker.values())
        if len(waits) < 2:
            continue
        top = max(waits)
        if top < min_wait_ns or top <= ratio * floor_ns:
            continue
        ordered = sorted(waits)
        median = ordered[(len(ordered) - 1) // 2]
        limit = ratio * max(median, floor_ns)
        if top <= limit:
            continue
        for worker, wn in zip(names, waits, strict=True):
            if wn <= limit or wn < min_wait_ns:
                continue
            # A material share of the worker's time: its observed time, or (when the data
            # lacks it) at least its own wait.
            w = workers.get(worker)
            observed = max(w["observed_ns"] if w else 0, worker_wait.get(worker, 0), wn)
            if wn * 100 >= STARVATION_MIN_WAIT_PCT_OF_OBSERVED * observed:
                starving.append((wn, worker, name, median))
    return starving


def _nominal(
    pool: dict[str, Any], workers: dict[str, Any], pool_size: int | None, pool_source: str
) -> tuple[int, str]:
    """The nominal pool size and where it came from: the executor's (or the recorder's own
    source), else the argument or the environment, else the most workers alive at once, else
    the workers observed."""
    if pool["nominal"] is not None:
        return pool["nominal"], pool["source"] or "executor"
    if pool_size is not None:
        return pool_size, pool_source
    if pool.get("peak_workers"):
        return pool["peak_workers"], "peak_workers"
    return max(1, len(workers)), "observed"


def evaluate_normalized(
    norm: dict[str, Any], hot_pct: float, ratio: float, pool_size: int | None, pool_source: str
) -> Manifest:
    """The manifest of a normalized data part (which it takes over), under resolved thresholds.

    Args:
        norm: a data part as :func:`~._data.normalize` returns it; it becomes the manifest's
            document.
        hot_pct: the hot-lock threshold (percent).
        ratio: the starvation ratio.
        pool_size: the nominal pool size when ``norm["pool"]`` has none; None for the peak
            number of workers alive at once (else of workers observed).
        pool_source: where ``pool_size`` came from (``argument``, ``env``).
    """
    locks: dict[str, Any] = norm["locks"]
    workers: dict[str, Any] = norm["workers"]

    # A lock's wait is its mutex wait plus its contention hand-off wait; so is a worker's.
    splits = split_handoff_waits(locks)
    lock_wait = {name: lock["wait_ns"].sum for name, lock in locks.items()}
    worker_wait = {worker: w["wait_ns"] for worker, w in workers.items()}
    for name, split in splits.items():
        lock_wait[name] += split.contention_ns
        for worker, (_, wn) in split.contention.items():
            worker_wait[worker] = worker_wait.get(worker, 0) + wn
    total_wait = sum(lock_wait.values())
    # The pool's workers: the threads reported apart count in neither the throughput nor the
    # materiality of a lock (_sizing).
    pool, apart = pool_workers(norm)
    total_observed = sum(workers[w]["observed_ns"] for w in pool)
    total_worker_wait = sum(worker_wait.get(w, 0) for w in pool)

    # Hot locks: compare in exact integer/rational arithmetic, round only for display.
    hot_min_ns = HOT_LOCK_MIN_WAIT_MS * _NS_PER_MS
    hot: list[tuple[int, str]] = []
    if total_wait > 0:
        for name, w in lock_wait.items():
            if (
                w >= hot_min_ns
                and w * 100 >= hot_pct * total_wait
                and w * 100 >= SIZING_MIN_COST_PCT * total_observed
            ):
                hot.append((w, name))
    hot.sort(key=lambda t: (-t[0], t[1]))
    hot_register = [
        {"lock": name, "wait_ms": _ms(w), "wait_share_pct": round(100 * w / total_wait, 3)}
        for w, name in hot
    ]
    hold_time_distribution = {}
    for _, name in hot:
        h = locks[name]["hold_ns"]
        lock_pool = locks[name].get("pool")
        if (
            lock_pool is not None
            and lock_pool["hold_ns"].count
            and name in splits
            and splits[name].is_pool
        ):
            h = lock_pool["hold_ns"]  # a pool is held from checkout to checkin, not by its mutex
        p50, p95 = h.percentiles((0.5, 0.95))
        hold_time_distribution[name] = {
            "count": h.count,
            "p50_ms": _ms(p50),
            "p95_ms": _ms(p95),
            "max_ms": _ms(h.max),
        }

    starving = _starving(locks, workers, splits, worker_wait, ratio)
    starving.sort(key=lambda t: (-t[0], t[1], t[2]))
    signatures = [
        {"worker": worker, "lock": name, "wait_ms": _ms(wn), "median_wait_ms": _ms(median)}
        for wn, worker, name, median in starving
    ]

    lease_overruns, release_failures = distributed_reports(locks)
    cycles = norm["lock_order"]["cycles"]
    if lease_overruns:
        verdict = Verdict.LEASE_OVERRUN_DETECTED
    elif cycles:
        verdict = Verdict.CYCLIC_ORDERING_DETECTED
    elif signatures:
        verdict = Verdict.STARVATION_OBSERVED
    elif hot_register:
        verdict = Verdict.HOT_LOCK_DETECTED
    else:
        verdict = Verdict.LOW_CONTENTION

    nominal, source = _nominal(norm["pool"], workers, pool_size, pool_source)
    sizing = size_pool(norm, splits, lock_wait, worker_wait, pool, nominal, verdict)

    if total_observed > 0:
        throughput = 100.0 * (1.0 - total_worker_wait / total_observed)
        throughput = round(min(100.0, max(0.0, throughput)), 3)
    else:
        throughput = 100.0

    resource_pools, idle_waits = pool_reports(
        norm, splits, total_wait, {name for _, name in hot}, nominal, sizing.supported
    )

    # The document takes over the normalized data (a private copy); its histograms stay
    # LogHistogram objects until the document is serialized.
    doc = norm
    for name, lock in locks.items():
        lock["wait_ms_total"] = _ms(lock_wait[name])
        lock["hold_ms_total"] = _ms(lock["hold_ns"].sum)
        lock["wait"] = _distribution(lock["wait_ns"])
        lock["hold"] = _distribution(lock["hold_ns"])
    for name, split in splits.items():
        locks[name]["signal_wait_ms"] = {  # (its hand-off waits: a published name)
            "contention": _ms(split.contention_ns),
            "idle": _ms(split.idle_ns),
        }
    for s in doc["sections"].values():
        pairs = s["max_held"] * (s["max_held"] - 1) // 2
        s["expected_colliding_pairs"] = round(pairs / s["count"], 6)
        s["recommended_count"] = recommended_section_count(s["max_held"])

    doc.update(
        {
            "schema": SCHEMA,
            "verdict": verdict.value,
            "nominal_pool_size": nominal,
            "pool_size_source": source,
            "recommended_pool_size": sizing.recommended,
            "sizing": sizing.doc,
            "other_threads": apart_report(norm, apart),
            "hot_lock_register": hot_register,
            "hold_time_distribution": hold_time_distribution,
            "starvation_signatures": signatures,
            "pre_deadlock_ordering_witness": copy.deepcopy(cycles),
            "effective_throughput_pct": throughput,
            "resource_pools": resource_pools,
            "idle_waits": idle_waits,
            "lease_overruns": lease_overruns,
            "release_failures": release_failures,
            "thresholds": {
                "hot_lock_threshold_pct": hot_pct,
                "hot_lock_min_wait_ms": HOT_LOCK_MIN_WAIT_MS,
                "hot_lock_min_cost_pct": SIZING_MIN_COST_PCT,
                "starvation_ratio": ratio,
                "starvation_median_floor_ms": STARVATION_MEDIAN_FLOOR_MS,
                "starvation_min_wait_ms": STARVATION_MIN_WAIT_MS,
                "starvation_min_wait_pct_of_observed": STARVATION_MIN_WAIT_PCT_OF_OBSERVED,
                "section_collision_target": SECTION_COLLISION_TARGET,
                "histogram_relative_error": RELATIVE_ERROR,
            },
        }
    )
    return Manifest._from_doc(doc, None)
