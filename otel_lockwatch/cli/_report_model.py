"""The report of a contention manifest: what every rendering shows, computed once.

A manifest answers one question for the successor of a worker pool: *how many workers may I
spawn, and what will hurt if I spawn more?*  A report puts the answer first and the evidence
after it, in the order a reader checks it:

1. the verdict and the pool size (nominal -> recommended), and the effective throughput: the
   share of worker time not spent waiting for a lock (a worker that waits adds no throughput,
   however many the pool counts);
2. the hot locks: their share of the aggregate wait, and how long they are held (p50/p95/max),
   since a hot lock is either held too long or taken too often;
3. the starved workers: who waited how many times the median on which lock;
4. the resource pools (connection pools, semaphores, queues of resources): their capacity, the
   checkout waits, the holds, and -- for a pool that is a hot lock, the bottleneck -- the two
   ways out: fewer workers for its capacity, or the capacity the workers need; and the idle
   waits (consumers waiting for work), which are not contention;
5. the lock-order cycles, written lockdep-style: the cycle, then each edge with the worker that
   took it and the two acquisition sites, then the interleaving that would deadlock;
6. where the wait comes from: for the most waited-on classes, the sites that waited and the
   sites that held the lock meanwhile; and when: the timeline of wait and hold;
7. a per-lock table and the section arrays.

:func:`build_report` computes that model once from the manifest as a plain dict
(``Manifest.to_dict()`` or the JSON as loaded); ``_report_text`` draws it for a terminal, as
JSON and as DOT, ``_report_html`` as one HTML page. Every field but ``verdict`` is optional
here, so a manifest of an older or partial writer still renders.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from otel_lockwatch.record._histogram import LogHistogram, bucket_bounds
from otel_lockwatch.record._witness import Cycle

from ._report_points import points_report, timeline_report
from ._report_sizing import sizing_report

__all__ = ["VERDICT_SEVERITY", "build_report", "finite_number", "format_cycle", "pool_advice"]

#: How a verdict is shown: ``ok`` (green), ``warn`` (orange), ``bad`` (red).
VERDICT_SEVERITY = {
    "LOW_CONTENTION": "ok",
    "HOT_LOCK_DETECTED": "warn",
    "STARVATION_OBSERVED": "bad",
    "CYCLIC_ORDERING_DETECTED": "bad",
    "LEASE_OVERRUN_DETECTED": "bad",
}
_VERDICT_MEANING = {
    "LOW_CONTENTION": "no hot lock, no starvation, no cyclic ordering: the pool size can be kept",
    "HOT_LOCK_DETECTED": "one lock takes most of the waiting: shard it or shrink the pool",
    "STARVATION_OBSERVED": "a worker waited far longer than its peers on one lock",
    "CYCLIC_ORDERING_DETECTED": "locks were taken in conflicting orders: a deadlock is possible",
    "LEASE_OVERRUN_DETECTED": "a distributed lock's lease ran out while it was held: two workers "
    "may have held it at once",
}


def finite_number(value: Any) -> float | None:
    """A finite number from a manifest field, or None for a missing or malformed one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _unused(row: Mapping[str, Any]) -> bool:
    """No acquisition, try, timeout, wait or hold: nothing a lock row would show."""
    counts = (row["acquisitions"], row["contentions"], row["skipped"], row["timeouts"])
    return not any(counts) and not row["wait_ms_total"] and not row["hold_ms_total"]


def _lock_wait_ms(entry: Mapping[str, Any]) -> float:
    wait = finite_number(entry.get("wait_ms_total"))
    if wait is None:
        ns = finite_number(entry.get("wait_ns_total"))
        wait = ns / 1e6 if ns is not None else 0.0
    return wait


def _edge_from(raw: Mapping[str, Any]) -> dict[str, Any]:
    sites = _list(raw.get("sites"))
    sites += [None] * (2 - len(sites))
    return {
        "holding": str(raw.get("holding", "?")),
        "acquiring": str(raw.get("acquiring", "?")),
        "worker": raw.get("worker"),
        "sites": [sites[0], sites[1]],
        "at": raw.get("at"),
        "trace_id": raw.get("trace_id"),
        "span_id": raw.get("span_id"),
    }


def build_report(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The report of a manifest: what every rendering shows, as plain JSON-ready data.

    Args:
        manifest: the manifest as a dict (``Manifest.to_dict()`` or the loaded JSON). Only
            ``verdict`` is required; every other field may be missing.

    Returns:
        A dict with ``verdict``, ``verdict_meaning``, ``nominal_pool_size``,
        ``recommended_pool_size``, ``sizing`` (``_report_sizing``),
        ``effective_throughput_pct``, ``process``, ``thresholds``,
        ``hot_locks`` (each with its ``hold`` distribution), ``starvation`` (each with its
        ``ratio`` to the median), ``resource_pools`` (each with its ``advice`` when it is the
        bottleneck), ``idle_waits`` and their ``idle_wait_ms`` in all, ``lease_overruns`` and
        ``release_failures`` of distributed locks, ``cycles`` (each with
        its lockdep-style ``text``), ``contention_points`` and ``timeline``
        (``_report_points``), ``locks``
        (one row per lock, most waited-on first, with its ``wait_share_pct``), ``lock_order``
        (node and edge lists of the lock-order graph, cycle edges flagged), ``sections`` and
        ``manifest_digest``.

    Raises:
        ValueError: when ``manifest`` is not a mapping or has no ``verdict``.
    """
    if not isinstance(manifest, Mapping):
        raise ValueError(f"a manifest must be a JSON object, got {type(manifest).__name__}")
    verdict = manifest.get("verdict")
    if not isinstance(verdict, str) or not verdict:
        raise ValueError(f"a manifest must have a verdict, got {verdict!r}")

    locks = _mapping(manifest.get("locks"))
    total_wait = sum(_lock_wait_ms(_mapping(entry)) for entry in locks.values())
    rows: list[dict[str, Any]] = []
    for name, raw in locks.items():
        entry = _mapping(raw)
        wait_ms = _lock_wait_ms(entry)
        wait = _mapping(entry.get("wait"))
        hold = _mapping(entry.get("hold"))
        rows.append(
            {
                "lock": str(name),
                "kind": entry.get("kind"),
                "acquisitions": entry.get("acquisitions"),
                "contentions": entry.get("contentions"),
                "skipped": entry.get("skipped"),
                "timeouts": entry.get("timeouts"),
                "wait_ms_total": wait_ms,
                "wait_share_pct": 100.0 * wait_ms / total_wait if total_wait > 0 else 0.0,
                "wait_p95_ms": finite_number(wait.get("p95_ms")),
                "hold_ms_total": finite_number(entry.get("hold_ms_total")),
                "hold_p50_ms": finite_number(hold.get("p50_ms")),
                "hold_p95_ms": finite_number(hold.get("p95_ms")),
                "hold_max_ms": finite_number(hold.get("max_ms")),
            }
        )
    rows.sort(key=lambda r: (-r["wait_ms_total"], r["lock"]))
    # A class never taken as a mutex and never waited on (a queue or a semaphore whose pool is
    # reported on its own, a lock made and left alone) would be a row of zeros.
    unused = [r["lock"] for r in rows if _unused(r)]
    rows = [r for r in rows if not _unused(r)]

    distribution = _mapping(manifest.get("hold_time_distribution"))
    pool_names = {_mapping(raw).get("name") for raw in _list(manifest.get("resource_pools"))}
    hot_locks = []
    for raw in _list(manifest.get("hot_lock_register")):
        item = _mapping(raw)
        name = str(item.get("lock", "?"))
        dist = _mapping(distribution.get(name))
        lock_entry = _mapping(locks.get(name))
        hold_fallback = _mapping(lock_entry.get("hold"))
        hold = {
            "count": dist.get("count", hold_fallback.get("count", lock_entry.get("acquisitions"))),
            "p50_ms": finite_number(dist.get("p50_ms", hold_fallback.get("p50_ms"))),
            "p95_ms": finite_number(dist.get("p95_ms", hold_fallback.get("p95_ms"))),
            "max_ms": finite_number(dist.get("max_ms", hold_fallback.get("max_ms"))),
            "buckets": _hold_buckets(lock_entry, name in pool_names),
        }
        hot_locks.append(
            {
                "lock": name,
                "wait_ms": finite_number(item.get("wait_ms")),
                "wait_share_pct": finite_number(item.get("wait_share_pct")),
                "hold": hold,
            }
        )

    starvation = []
    for raw in _list(manifest.get("starvation_signatures")):
        item = _mapping(raw)
        starved_ms = finite_number(item.get("wait_ms"))
        median = finite_number(item.get("median_wait_ms"))
        starvation.append(
            {
                "worker": str(item.get("worker", "?")),
                "lock": str(item.get("lock", "?")),
                "wait_ms": starved_ms,
                "median_wait_ms": median,
                "ratio": starved_ms / median if starved_ms is not None and median else None,
            }
        )

    raw_cycles = _list(manifest.get("pre_deadlock_ordering_witness"))
    if not raw_cycles:
        raw_cycles = _list(_mapping(manifest.get("lock_order")).get("cycles"))
    cycles = []
    for raw in raw_cycles:
        item = _mapping(raw)
        cycle = {
            "cycle": [str(n) for n in _list(item.get("cycle"))],
            "edges": [_edge_from(_mapping(e)) for e in _list(item.get("edges"))],
        }
        cycle["text"] = format_cycle(item)
        cycles.append(cycle)

    sections = []
    for name, raw in sorted(_mapping(manifest.get("sections")).items()):
        item = _mapping(raw)
        sections.append(
            {
                "name": str(name),
                "count": item.get("count"),
                "collision_waits": item.get("collision_waits"),
                "max_held": item.get("max_held"),
                "recommended_count": item.get("recommended_count"),
            }
        )

    resource_pools = [_pool_from(_mapping(raw)) for raw in _list(manifest.get("resource_pools"))]
    idle_waits = [_idle_from(_mapping(raw)) for raw in _list(manifest.get("idle_waits"))]
    lease_overruns = [
        {
            "lock": str(item.get("lock", "?")),
            "worker": str(item.get("worker", "?")),
            "overruns": item.get("overruns"),
            "overrun_ms": finite_number(item.get("overrun_ms")),
        }
        for item in map(_mapping, _list(manifest.get("lease_overruns")))
    ]
    release_failures = [
        {
            "lock": str(item.get("lock", "?")),
            "not_owned": item.get("not_owned"),
            "lock_error": item.get("lock_error"),
        }
        for item in map(_mapping, _list(manifest.get("release_failures")))
    ]

    process = manifest.get("process")
    return {
        "verdict": verdict,
        "verdict_meaning": _VERDICT_MEANING.get(verdict, ""),
        "nominal_pool_size": manifest.get("nominal_pool_size"),
        "recommended_pool_size": manifest.get("recommended_pool_size"),
        "sizing": sizing_report(manifest),
        "effective_throughput_pct": finite_number(manifest.get("effective_throughput_pct")),
        "process": dict(process) if isinstance(process, Mapping) else None,
        "thresholds": dict(_mapping(manifest.get("thresholds"))),
        "hot_locks": hot_locks,
        "starvation": starvation,
        "resource_pools": resource_pools,
        "idle_waits": idle_waits,
        "idle_wait_ms": sum(i["total_ms"] or 0.0 for i in idle_waits),
        "lease_overruns": lease_overruns,
        "release_failures": release_failures,
        "cycles": cycles,
        "contention_points": points_report(locks),
        "timeline": timeline_report(manifest.get("timeline")),
        "locks": rows,
        "unused_locks": unused,
        "total_wait_ms": total_wait,
        "lock_order": _graph(manifest, cycles),
        "sections": sections,
        "manifest_digest": manifest.get("manifest_digest"),
    }


def _count(value: Any) -> int | None:
    """A count or size from a manifest field, or None for a missing or malformed one."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _pool_from(raw: Mapping[str, Any]) -> dict[str, Any]:
    waits, hold = _mapping(raw.get("waits")), _mapping(raw.get("hold"))
    workers = _list(raw.get("workers"))
    pool = {
        "name": str(raw.get("name", "?")),
        "kind": raw.get("kind"),
        "role": raw.get("role"),
        "capacity": _count(raw.get("capacity")),
        "in_use_peak": _count(raw.get("in_use_peak")),
        "waits": _count(waits.get("count")),
        "wait_ms": finite_number(waits.get("total_ms")),
        "wait_p95_ms": finite_number(waits.get("p95_ms")),
        "wait_max_ms": finite_number(waits.get("max_ms")),
        "hold_p50_ms": finite_number(hold.get("p50_ms")),
        "hold_p95_ms": finite_number(hold.get("p95_ms")),
        "timeouts": _count(raw.get("timeouts")),
        "waiting_workers": len(workers),
        "wait_share_pct": finite_number(raw.get("wait_share_pct")),
        "hot": raw.get("hot") is True,
        "workers_supported": _count(raw.get("workers_supported")),
        "capacity_needed": _count(raw.get("capacity_needed")),
        "nominal_pool_size": _count(raw.get("nominal_pool_size")),
    }
    pool["advice"] = pool_advice(pool)
    return pool


def _idle_from(raw: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "name": str(raw.get("name", "?")),
        "kind": raw.get("kind"),
        "role": raw.get("role"),
        "count": _count(raw.get("count")),
        "total_ms": finite_number(raw.get("total_ms")),
        "workers": len(_list(raw.get("workers"))),
    }


def pool_advice(pool: Mapping[str, Any]) -> str | None:
    """What to do about a resource pool that is the bottleneck (a hot lock), or None.

    Both ways out when the manifest knows them: ``N workers for its capacity of C, or
    capacity K for the W workers``; else what is known.

    Args:
        pool: a resource pool as :func:`build_report` lists it.
    """
    if not pool["hot"]:
        return None
    head = f"{pool['name']} is the bottleneck"
    share = pool["wait_share_pct"]
    if share is not None:
        head += f" ({share:.1f} % of the wait)"
    capacity, supported = pool["capacity"], pool["workers_supported"]
    needed, workers = pool["capacity_needed"], pool["nominal_pool_size"]
    ways = []
    if supported is not None and capacity is not None:
        noun = "worker" if supported == 1 else "workers"
        ways.append(f"{supported} {noun} for its capacity of {capacity}")
    if needed is not None and workers is not None:
        ways.append(f"capacity {needed} for the {workers} workers")
    if ways:
        return f"{head}: {', or '.join(ways)}"
    return (
        f"{head}: its capacity and hold times are unknown, so the sizing counts the workers it "
        "let work at once"
    )


def _hold_buckets(
    lock_entry: Mapping[str, Any], is_pool: bool = False
) -> list[dict[str, float]] | None:
    """The hold-time histogram of a lock as ``[{lo_ms, hi_ms, count}]`` (ascending buckets), or
    None when the manifest carries none (or a malformed one).

    The recorder's data part keeps ``hold_ns`` as ``LogHistogram.to_json()``; a manifest that
    also puts it under ``hold.histogram`` is read from there. A resource pool is held from
    checkout to checkin: its ``pool.hold_ns`` when it has samples.
    """
    raw = lock_entry.get("hold_ns")
    pool_hold = _mapping(_mapping(lock_entry.get("pool")).get("hold_ns"))
    if is_pool and pool_hold.get("count"):
        raw = pool_hold
    if not isinstance(raw, Mapping):
        raw = _mapping(lock_entry.get("hold")).get("histogram")
    if not isinstance(raw, Mapping):
        return None
    try:
        hist = LogHistogram.from_json(raw)
    except ValueError:
        return None
    out = []
    for index in sorted(hist.counts):
        low, high = bucket_bounds(index)
        out.append({"lo_ms": low / 1e6, "hi_ms": (high + 1) / 1e6, "count": hist.counts[index]})
    return out or None


def _graph(manifest: Mapping[str, Any], cycles: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The lock-order graph: nodes (cycle members first) and edges, cycle edges flagged."""
    in_cycle = {(e["holding"], e["acquiring"]) for c in cycles for e in c["edges"]}
    for c in cycles:  # a cycle listed by names only still marks its edges
        names = c["cycle"]
        if names and names[0] == names[-1]:
            names = names[:-1]
        for i, name in enumerate(names):
            if len(names) > 1:
                in_cycle.add((name, names[(i + 1) % len(names)]))
    edges = []
    seen = set()
    raw_edges = _list(_mapping(manifest.get("lock_order")).get("edges"))
    raw_edges += [e for c in cycles for e in c["edges"]]
    for raw in raw_edges:
        edge = _edge_from(_mapping(raw))
        key = (edge["holding"], edge["acquiring"])
        if key in seen:
            continue
        seen.add(key)
        edge["cycle"] = key in in_cycle
        edges.append(edge)
    cycle_nodes = [n for c in cycles for n in c["cycle"]]
    nodes: list[str] = []
    for name in cycle_nodes + sorted({n for e in edges for n in (e["holding"], e["acquiring"])}):
        if name not in nodes:
            nodes.append(name)
    return {"nodes": nodes, "edges": edges}


# --------------------------------------------------------------------------------------------
# Lockdep-style cycles


def format_cycle(raw: Mapping[str, Any]) -> str:
    """A cycle of the lock-order graph written lockdep-style: the cycle, then one line per edge
    saying which worker held what where, and when.

    The text is :meth:`otel_lockwatch.record._witness.Cycle.format`'s, so the report and
    ``PotentialDeadlockError`` say the same thing. A cycle that the lock-order module refuses to
    read (a manifest of another version) is written by a plain fallback instead of failing.

    Args:
        raw: the cycle as stored in the manifest: ``{cycle: [names], edges: [EdgeWitness]}``.
    """
    try:
        return Cycle.from_json(dict(raw)).format()
    except (TypeError, ValueError):
        pass
    names = [str(n) for n in _list(raw.get("cycle"))]
    lines = [f"possible circular locking dependency: {' -> '.join(names + names[:1])}"]
    for e in (_edge_from(_mapping(e)) for e in _list(raw.get("edges"))):
        lines.append(
            f"  {e['holding']} -> {e['acquiring']}: worker {e['worker']!r} held {e['holding']}"
            f" (acquired at {e['sites'][0]}) and acquired {e['acquiring']} (at {e['sites'][1]})"
            + (f", {e['at']}" if e["at"] else "")
        )
    return "\n".join(lines)
