"""Sizing: which threads are the pool's workers, what limits them, and how many to spawn.

A manifest's ``recommended_pool_size`` is the answer an orchestrator acts on, so it is derived
from what the run measured rather than from the verdict: the successor should spawn the fewest
workers that keep the throughput the pool's tightest bottleneck allows. ``docs/sizing.md``
states the model with a worked example; in short:

**The pool's workers.** Two threads are linked when they take part in one lock class (acquire
it, wait on it, give to it). The workers are the largest group of linked threads and every other
group of two or more at least half its size (every thread when none shares anything); a thread
linked to none, or in a smaller group (a library's maintenance thread, a scheduler), is reported
apart (``other_threads``) and counts in neither the effective throughput nor the sizing.

**Busy time.** ``T`` is the workers' observed time, ``W`` their contention (mutex waits and
contention hand-off waits), ``B = T - W`` the time they worked. With ``n`` workers at once (the
nominal size, or fewer when fewer were seen) the run kept ``n * B / T`` workers busy on average.

**Bottlenecks.** A lock class (a mutex, a pool, a semaphore, a condition, a section array) is a
bottleneck when its contention cost the workers at least ``SIZING_MIN_COST_PCT`` of ``T``. Each
bottleneck supports ``S`` workers:

- by Little's law when its capacity ``c`` and total hold ``H`` are known (``c = 1`` for a mutex
  class, the declared capacity of a semaphore or bounded queue): a worker that never waits holds
  it ``u = H / B`` of its time, so ``c`` units serve ``c / u`` workers;
- else by saturation: a bottleneck the workers queued on was saturated, and the workers it let
  work at once, ``n * B / T``, are what it supports.

A mutex class held longer in total than the run lasted has several locks held at once (a lock
created per object is one class): its capacity is unknown, and it is sized by saturation.
Little's law depends only on ``u``, which does not change with the number of workers, so it is
preferred wherever it applies.

**The recommendation.** ``S*`` is the least ``S`` of the bottlenecks. The predicted throughput
of ``k`` workers, as a share of the run's, is ``min(k, S*) / min(n, S*)`` (the asymptotic bound
of a closed system: throughput grows with workers until the bottleneck saturates). The bound is
optimistic where it bends (workers arriving together queue even below ``S*``), so the
recommended size is ``SIZING_HEADROOM_PCT`` more workers than ``S*``, rounded up and capped at
the nominal size: ``ceil(S* * 1.1)``, which keeps at least 90 % of the run's throughput. ``u``
and ``B / T`` do not depend on how many workers ran, so a run at the recommended size
recommends the same size: a fixed point, never a spiral. With no bottleneck, every lock
supported the run: the nominal size.

**Too little to size.** A bottleneck seen fewer than ``SIZING_MIN_SAMPLES`` times (holds,
checkouts or waits), or a run with no worker time, sizes nothing: the verdict's fraction of the
nominal size applies (half for an overrun, a cycle or starvation, three quarters for a hot
lock) and ``sizing.basis`` says ``verdict``.

Everything is exact rational arithmetic on integer nanoseconds; only the manifest's figures are
rounded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from ._model import Verdict
from ._pools import HandoffSplit

__all__ = [
    "SIZING_HEADROOM_PCT",
    "SIZING_MIN_COST_PCT",
    "SIZING_MIN_SAMPLES",
    "Sizing",
    "apart_report",
    "pool_workers",
    "size_pool",
    "workers_with_headroom",
]

#: A lock class is a bottleneck when its contention costs the workers this share of their
#: observed time (percent). The same floor makes a lock hot: a pool that loses less than this
#: to waiting is past no knee worth acting on (a well-sized pool at 94 % is LOW_CONTENTION).
SIZING_MIN_COST_PCT = 10.0
#: The recommended size is this share (percent) more workers than the tightest bottleneck
#: supports, rounded up: the asymptotic bound is optimistic where it bends (workers queue at
#: bursts: 90-97 % of the plateau at the bend on benchmarks/bench_sizing.py's workloads).
SIZING_HEADROOM_PCT = 10.0
#: A bottleneck seen fewer times than this (holds, checkouts or waits) sizes nothing.
SIZING_MIN_SAMPLES = 20
#: The predicted throughput is listed for 1..this many workers (and the nominal size).
_CURVE_POINTS = 32
#: A mutex class held longer in total than this share of the run lasted has several instances
#: held at once (a lock per object): its capacity is unknown.
_ONE_INSTANCE_SLACK = Fraction(21, 20)
#: Kinds whose classes have many instances by design: their capacity is not the class's.
_MANY_INSTANCE_KINDS = frozenset({"section"})
#: At most this many names of the threads apart are listed (all are counted).
_APART_LISTED = 16

_NS_PER_MS = 1_000_000


def _ms(ns: int | Fraction) -> float:
    return round(float(ns) / _NS_PER_MS, 6)


def _class_members(lock: Mapping[str, Any]) -> Iterable[str]:
    """The workers that took part in a lock class: acquired, waited, held, gave."""
    for worker, row in lock["workers"].rows.items():
        if any(row):
            yield worker
    handoff_waits = lock.get("signal_waits")
    if handoff_waits is not None:
        for worker, waiter in handoff_waits["workers"].items():
            if waiter["waits"] or waiter["signals"]:  # (``signals``: its gives, published name)
                yield worker


def pool_workers(norm: Mapping[str, Any]) -> tuple[set[str], list[str]]:
    """``(workers, apart)``: the pool's workers and, sorted, the threads reported apart.

    Two threads are linked when they take part in one lock class; the workers are the largest
    linked group and every other group of two or more at least half its size (two pools side by
    side, the processes of a merged fleet), or every thread when no two share a class.
    """
    parent: dict[str, str] = {w: w for w in norm["workers"]}

    def find(w: str) -> str:
        root = w
        while parent[root] != root:
            root = parent[root]
        while parent[w] != root:  # path compression
            parent[w], w = root, parent[w]
        return root

    groups_left = len(parent)
    for lock in norm["locks"].values():
        if groups_left <= 1:
            break  # one group already: no lock can link more
        first = None
        for worker in _class_members(lock):
            if worker not in parent:
                parent[worker] = worker
                groups_left += 1
            if first is None:
                first = find(worker)
            else:
                root = find(worker)
                if root != first:
                    parent[root] = first
                    groups_left -= 1
    groups: dict[str, list[str]] = {}
    for worker in norm["workers"]:
        groups.setdefault(find(worker), []).append(worker)
    largest = max(map(len, groups.values()), default=0)
    if largest < 2:
        return set(norm["workers"]), []
    workers: set[str] = set()
    apart: list[str] = []
    for members in groups.values():
        if len(members) >= 2 and 2 * len(members) >= largest:
            workers.update(members)
        else:
            apart.extend(members)
    return workers, sorted(apart)


class Sizing:
    """The sizing of one data part: :func:`size_pool`'s result.

    Attributes:
        recommended: the recommended pool size.
        doc: the manifest's ``sizing`` field.
        supported: ``{class: (u, workers_supported)}`` of every class Little's law sized, for
            the resource pools' table (``u`` rounded; ``workers_supported``, ``c / u`` to the
            nearest int: the bound itself, where the recommended size adds the headroom).
    """

    __slots__ = ("recommended", "doc", "supported")

    def __init__(
        self, recommended: int, doc: dict[str, Any], supported: dict[str, tuple[float, int]]
    ) -> None:
        self.recommended = recommended
        self.doc = doc
        self.supported = supported


def workers_with_headroom(bound: Fraction) -> int:
    """The workers to spawn for a bottleneck that supports ``bound``: the headroom added."""
    return max(1, math.ceil(bound * (100 + Fraction(str(SIZING_HEADROOM_PCT))) / 100))


def _fallback(verdict: Verdict, nominal: int) -> int:
    if verdict in (
        Verdict.LEASE_OVERRUN_DETECTED,
        Verdict.CYCLIC_ORDERING_DETECTED,
        Verdict.STARVATION_OBSERVED,
    ):
        return max(1, nominal // 2)
    if verdict is Verdict.HOT_LOCK_DETECTED:
        return max(1, int(nominal * 0.75))
    return nominal


def _capacity(
    name: str, lock: Mapping[str, Any], split: HandoffSplit | None, hold_ns: int, elapsed: Fraction
) -> tuple[int | None, str, int]:
    """``(capacity, where it comes from, samples)`` of a class, its capacity None when unknown."""
    pool = lock.get("pool")
    if split is not None and split.is_pool and pool is not None and pool["hold_ns"].count:
        samples = max(pool["checkouts"], pool["hold_ns"].count)
        return pool["capacity"], "declared" if pool["capacity"] else "unknown", samples
    acquisitions = lock["acquisitions"]
    waits = 0 if split is None else sum(n for n, _ in split.contention.values())
    if split is not None or lock["kind"] in _MANY_INSTANCE_KINDS:
        return None, "unknown", max(acquisitions, waits)
    if elapsed and hold_ns > elapsed * _ONE_INSTANCE_SLACK:
        return None, "several instances", acquisitions
    return 1, "mutex", acquisitions


def size_pool(
    norm: Mapping[str, Any],
    splits: Mapping[str, HandoffSplit],
    lock_wait: Mapping[str, int],
    worker_wait: Mapping[str, int],
    workers: set[str],
    nominal: int,
    verdict: Verdict,
) -> Sizing:
    """Size the pool of a normalized data part by the model of the module docstring.

    Args:
        norm: the normalized data part.
        splits: its hand-off waits split (``_pools.split_handoff_waits``).
        lock_wait: each class's contention (mutex waits and contention hand-off waits), ns.
        worker_wait: each worker's contention, ns.
        workers: the pool's workers (:func:`pool_workers`).
        nominal: the nominal pool size.
        verdict: the verdict, whose fraction applies when the run measured too little.
    """
    observed = sum(norm["workers"][w]["observed_ns"] for w in workers)
    waited = sum(worker_wait.get(w, 0) for w in workers)
    busy = max(0, observed - waited)
    n = max(1, min(nominal, len(workers)))
    doc: dict[str, Any] = {
        "basis": "measured",
        "reason": "",
        "workers": len(workers),
        "busy_workers": round(n * busy / observed, 3) if observed else None,
        "min_cost_pct": SIZING_MIN_COST_PCT,
        "headroom_pct": SIZING_HEADROOM_PCT,
        "min_samples": SIZING_MIN_SAMPLES,
        "bottlenecks": [],
        "workers_supported": None,
        "predicted_throughput_pct": [],
    }
    supported_table: dict[str, tuple[float, int]] = {}
    if observed == 0 or busy == 0:
        doc["basis"] = "verdict"
        doc["reason"] = (
            "no worker time was observed" if observed == 0 else "the workers did nothing but wait"
        )
        return Sizing(_fallback(verdict, nominal), doc, supported_table)

    elapsed = Fraction(observed, n)  # the run's length, as the workers saw it
    saturation = Fraction(n * busy, observed)
    bottlenecks: list[tuple[Fraction, str, dict[str, Any]]] = []
    too_few: list[str] = []
    every_thread = len(workers) == len(norm["workers"])
    for name, lock in norm["locks"].items():
        split = splits.get(name)
        pool = lock.get("pool")
        cost = lock_wait.get(name, 0)
        material = cost * 100 >= SIZING_MIN_COST_PCT * observed
        is_pool = split is not None and split.is_pool and pool is not None
        if not material and not is_pool:
            continue  # sized only for the pools' table, or as a bottleneck
        if is_pool and pool["hold_ns"].count:
            hold_ns = pool["hold_ns"].sum  # a pool is held from checkout to checkin
        elif split is None:
            rows = lock["workers"].rows
            if every_thread:
                hold_ns = lock["hold_ns"].sum
            else:
                hold_ns = sum(rows[w][3] for w in workers if w in rows)
        else:
            hold_ns = 0  # a bare condition: no hold time
        capacity, source, samples = _capacity(name, lock, split, hold_ns, elapsed)
        little: Fraction | None = None
        u: Fraction | None = None
        if capacity and hold_ns:
            u = Fraction(hold_ns, busy)
            little = capacity / u
            nearest = max(1, math.floor(little + Fraction(1, 2)))
            supported_table[name] = (round(float(u), 6), nearest)
        if not material:
            continue  # not a bottleneck: the run's workers did not queue on it
        if samples < SIZING_MIN_SAMPLES:
            too_few.append(f"{name} ({samples})")
            continue
        bound = saturation if little is None else little
        bottlenecks.append(
            (
                bound,
                name,
                {
                    "name": name,
                    "kind": lock["kind"],
                    "method": "saturation" if little is None else "littles_law",
                    "capacity": capacity,
                    "capacity_source": source,
                    "samples": samples,
                    "hold_ms": _ms(hold_ns) if hold_ns else None,
                    "utilization_per_worker": None if u is None else round(float(u), 6),
                    "cost_pct": round(100 * cost / observed, 3),
                    "workers_supported": round(float(bound), 3),
                },
            )
        )
    bottlenecks.sort(key=lambda t: (t[0], t[1]))
    doc["bottlenecks"] = [entry for _, _, entry in bottlenecks]
    if too_few:
        doc["basis"] = "verdict"
        doc["reason"] = (
            f"too few samples to size (at least {SIZING_MIN_SAMPLES} needed): "
            + ", ".join(sorted(too_few))
        )
        return Sizing(_fallback(verdict, nominal), doc, supported_table)
    if not bottlenecks:
        doc["reason"] = (
            f"no lock cost the workers {SIZING_MIN_COST_PCT:g} % of their time: "
            "every lock supported the run"
        )
        return Sizing(nominal, doc, supported_table)

    tightest, name, _ = bottlenecks[0]
    recommended = min(nominal, workers_with_headroom(tightest))
    doc["workers_supported"] = round(float(tightest), 3)
    doc["reason"] = f"{name} supports {float(tightest):.3g} workers"
    top: Fraction = min(Fraction(n), tightest)
    points = list(range(1, min(nominal, _CURVE_POINTS) + 1))
    if nominal > _CURVE_POINTS:
        points.append(nominal)
    doc["predicted_throughput_pct"] = [
        [k, round(float(100 * min(Fraction(k), tightest) / top), 3)] for k in points
    ]
    return Sizing(recommended, doc, supported_table)


def apart_report(norm: Mapping[str, Any], apart: list[str]) -> dict[str, Any]:
    """The manifest's ``other_threads``: the threads that are not the pool's workers."""
    rows = [norm["workers"][w] for w in apart]
    return {
        "count": len(apart),
        "observed_ms": _ms(sum(r["observed_ns"] for r in rows)),
        "names": apart[:_APART_LISTED],
    }
