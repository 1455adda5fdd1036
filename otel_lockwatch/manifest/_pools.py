"""Hand-off waits and resource pools: which waits are contention, and what a pool supports.

A worker pool often waits without waiting on a mutex: a connection pool's checkout blocks in
``Condition.wait()``, a queue's ``get()``, a semaphore's ``acquire()`` or an event's ``wait()``
until another worker gives a connection back. Those are *hand-off waits*, waits that end only
when another worker hands something over (a ``notify``, a queue ``put`` or ``get``, a semaphore
``release``, an event's ``set``): a *give*. The recorder keeps them apart from mutex waits, per
lock class, under the manifest's published names (``signal_waits``, with per worker its
``waits``, ``wait_ns`` and ``signals``, its gives that end waits), and for queues and semaphores
the pool they guard (``pool``: capacity, peak in use, checkouts, the checkout -> checkin
``hold_ns``). Whether such a wait is contention cannot be read from the wait alone: a consumer
blocked on an empty work queue waits as long as a worker blocked on an exhausted connection
pool. The rule reads it from who gives.

**The rule.** A hand-off wait by worker ``W`` on a class is *contention* when ``W`` also gives
to that class (``W`` gives back what it takes, so it waits for what its peers hold: every
checkout / checkin pool); it is *idle* when ``W`` never gives to it (a consumer waiting for work
nobody produced yet, a producer held back by a bounded queue). A class is a **resource pool**
when contention is at least half of its hand-off-wait time; a class nobody waited on is one when
its checkouts came back to it (its ``pool.hold_ns`` has samples). Contention counts like a mutex
wait everywhere: in the lock's wait share (hot locks), in the worker's wait (effective
throughput), in starvation. Idle waits never do; they are reported on their own
(``idle_waits``).

**What a pool supports.** Let ``H`` be the pool's total hold time (every checkout to its
checkin, ``pool.hold_ns.sum``), ``T`` the observed time of the workers that used it and ``C``
their contention wait on it. Had the pool never run dry, ``C`` would not have been spent and
everything else would have stayed, so a worker that never waits for a slot keeps

    u = H / (T - C)

slots busy on average (the pool's utilisation per worker; ``u = 1`` when a worker holds a slot
through all of its work). By Little's law ``n`` such workers keep ``n * u`` slots busy, so

    workers_supported = max(1, floor(capacity / u))
    capacity_needed   = max(1, ceil(nominal_pool_size * u))

computed exactly in rationals. Both are mean-load figures: a pool sized to them runs at 100 %
utilisation on average and still queues at bursts. ``workers_supported`` is null when the
capacity is unknown, both are null when the hold time is (a bare ``Condition`` has neither).

This module checks the new fields of a data part (:func:`with_pool_fields`, called by the
normalizer), splits each class's hand-off waits (:func:`split_handoff_waits`) for the
evaluation,
and builds the derived ``resource_pools`` and ``idle_waits`` (:func:`pool_reports`).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from fractions import Fraction
from itertools import chain
from typing import Any

from ..record._data import HANDOFF_WORKER_FIELDS
from ..record._histogram import LogHistogram

__all__ = [
    "POOL_DERIVED_FIELDS",
    "HandoffSplit",
    "pool_reports",
    "split_handoff_waits",
    "with_pool_fields",
]

#: The derived fields this module computes (absent from manifests written before them).
POOL_DERIVED_FIELDS = ("idle_waits", "resource_pools")

_NS_PER_MS = 1_000_000


# --------------------------------------------------------------------------------------------
# Checking the fields of a data part


def _count(v: object, where: str) -> int:
    if type(v) is not int or v < 0:  # noqa: E721  (bool is not a count)
        raise ValueError(f"{where} must be an int >= 0, got {v!r}")
    return v


def _optional_count(v: object, where: str) -> int | None:
    if v is not None and (type(v) is not int or v < 0):  # noqa: E721
        raise ValueError(f"{where} must be an int >= 0 or null, got {v!r}")
    return v


def _mapping(v: object, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise ValueError(f"{where} must be an object, got {type(v).__name__}")
    return v


def _histogram(v: object, where: str) -> LogHistogram:
    if isinstance(v, LogHistogram):
        return v.copy()
    try:
        return LogHistogram.from_json(v)  # type: ignore[arg-type]
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def _checked_waits(v: object, where: str) -> dict[str, Any]:
    """Check and copy a class's ``signal_waits`` field (its hand-off waits)."""
    v = _mapping(v, where)
    out: dict[str, Any] = {k: _count(v.get(k), f"{where}.{k}") for k in ("count", "timeouts")}
    if out["timeouts"] > out["count"]:
        raise ValueError(
            f"{where}.timeouts must be at most its count {out['count']}, got {out['timeouts']}"
        )
    out["wait_ns"] = _histogram(v.get("wait_ns"), f"{where}.wait_ns")
    out["workers"] = _checked_waiters(v.get("workers", {}), f"{where}.workers")
    return out


_GET_WAITER_FIELDS = operator.itemgetter(*HANDOFF_WORKER_FIELDS)


def _checked_waiters(per_worker: object, where: str) -> dict[str, dict[str, int]]:
    """Check and copy ``{worker: {waits, wait_ns, signals}}``; extra keys are dropped.

    The common case is checked with C-level loops (itemgetter, set of types, min); only a
    failure walks the entries one by one to name the culprit.
    """
    per_worker = _mapping(per_worker, where)
    try:
        rows = list(map(_GET_WAITER_FIELDS, per_worker.values()))
        values = list(chain.from_iterable(rows))
        fast = (
            set(map(type, values)) <= {int}
            and (not values or min(values) >= 0)
            and set(map(type, per_worker)) <= {str}
        )
    except (KeyError, TypeError):
        fast = False
    if fast:
        return {
            worker: {"waits": r[0], "wait_ns": r[1], "signals": r[2]}
            for worker, r in zip(per_worker, rows, strict=True)
        }
    out: dict[str, dict[str, int]] = {}
    for worker, fields in per_worker.items():
        if not isinstance(worker, str):
            raise ValueError(f"{where} keys must be worker names, got {worker!r}")
        fields = _mapping(fields, f"{where}[{worker!r}]")
        out[worker] = {
            k: _count(fields.get(k), f"{where}[{worker!r}].{k}") for k in HANDOFF_WORKER_FIELDS
        }
    return out


def _pool(v: object, where: str) -> dict[str, Any]:
    v = _mapping(v, where)
    return {
        "capacity": _optional_count(v.get("capacity"), f"{where}.capacity"),
        "in_use_peak": _optional_count(v.get("in_use_peak"), f"{where}.in_use_peak"),
        "checkouts": _count(v.get("checkouts"), f"{where}.checkouts"),
        "hold_ns": _histogram(v.get("hold_ns"), f"{where}.hold_ns"),
    }


def with_pool_fields(data: Mapping[str, Any], norm: dict[str, Any]) -> dict[str, Any]:
    """Check the pool fields of ``data`` and copy them into its normalized form ``norm``.

    Per lock class: ``role`` (a str; null counts as absent), ``signal_waits`` and ``pool``
    (see the module docstring); at the top: ``pool.peak_workers``. Each is copied only when
    present, so a data part written before them normalizes as it always did.

    Args:
        data: the data part as given (already checked for everything else).
        norm: its normalized form, which receives the fields.

    Returns:
        ``norm``.

    Raises:
        ValueError: a field is malformed; the message names it
            (``locks['q'].signal_waits.workers['w1'].signals must be an int >= 0, got -1``).
    """
    locks = data.get("locks", {})
    for name, lock in norm["locks"].items():
        entry = locks[name]
        if "role" not in entry and "signal_waits" not in entry and "pool" not in entry:
            continue
        where = f"locks[{name!r}]"
        role = entry.get("role")
        if role is not None:
            if not isinstance(role, str):
                raise ValueError(f"{where}.role must be a str or null, got {role!r}")
            lock["role"] = role
        if "signal_waits" in entry:
            lock["signal_waits"] = _checked_waits(entry["signal_waits"], f"{where}.signal_waits")
        if "pool" in entry:
            lock["pool"] = _pool(entry["pool"], f"{where}.pool")
    pool = data.get("pool", {})
    if "peak_workers" in pool:
        norm["pool"]["peak_workers"] = _count(pool["peak_workers"], "pool.peak_workers")
    return norm


# --------------------------------------------------------------------------------------------
# Splitting hand-off waits


class HandoffSplit:
    """One class's hand-off waits split by the rule of the module docstring.

    Attributes:
        contention: ``{worker: (waits, wait_ns)}`` for every worker that gives to the class
            (waits may be 0): its hand-off waits are contention.
        idle: ``{worker: (waits, wait_ns)}`` for the workers that waited but never give.
        contention_ns: the contention wait of the class.
        idle_ns: its idle wait.
        is_pool: the class is a resource pool.
    """

    __slots__ = ("contention", "idle", "contention_ns", "idle_ns", "is_pool")

    def __init__(self, lock: Mapping[str, Any]) -> None:
        contention: dict[str, tuple[int, int]] = {}
        idle: dict[str, tuple[int, int]] = {}
        for worker, waiter in lock["signal_waits"]["workers"].items():
            if waiter["signals"] > 0:  # (the published name of its gives)
                contention[worker] = (waiter["waits"], waiter["wait_ns"])
            elif waiter["waits"] > 0 or waiter["wait_ns"] > 0:
                idle[worker] = (waiter["waits"], waiter["wait_ns"])
        self.contention = contention
        self.idle = idle
        self.contention_ns = sum(wait_ns for _, wait_ns in contention.values())
        self.idle_ns = sum(wait_ns for _, wait_ns in idle.values())
        if self.contention_ns + self.idle_ns > 0:
            self.is_pool = self.contention_ns >= self.idle_ns
        else:  # nobody waited: a pool when its checkouts came back to it
            pool = lock.get("pool")
            self.is_pool = pool is not None and pool["hold_ns"].count > 0

    def __repr__(self) -> str:
        kind = "pool" if self.is_pool else "not a pool"
        return (
            f"<HandoffSplit {kind}: contention {self.contention_ns} ns by "
            f"{len(self.contention)} workers, idle {self.idle_ns} ns by {len(self.idle)}>"
        )


def split_handoff_waits(locks: Mapping[str, Any]) -> dict[str, HandoffSplit]:
    """The :class:`HandoffSplit` of every normalized lock class that has ``signal_waits``."""
    return {name: HandoffSplit(lock) for name, lock in locks.items() if "signal_waits" in lock}


# --------------------------------------------------------------------------------------------
# The derived fields


def _ms(ns: int) -> float:
    return ns / _NS_PER_MS


def _workers_list(rows: Mapping[str, tuple[int, int]]) -> list[dict[str, Any]]:
    """``[{worker, waits, wait_ms}]`` of the workers that waited, longest wait first."""
    waited = [
        (wait_ns, worker, waits)
        for worker, (waits, wait_ns) in rows.items()
        if waits > 0 or wait_ns > 0
    ]
    waited.sort(key=lambda row: (-row[0], row[1]))
    return [
        {"worker": worker, "waits": waits, "wait_ms": _ms(wait_ns)}
        for wait_ns, worker, waits in waited
    ]


def _utilization(
    lock: Mapping[str, Any], split: HandoffSplit, workers: Mapping[str, Mapping[str, int]]
) -> Fraction | None:
    """``u = H / (T - C)`` of the module docstring, or None when a term is unknown."""
    pool = lock.get("pool")
    if pool is None or pool["hold_ns"].sum == 0:
        return None
    users = split.contention.keys() | split.idle.keys()
    observed = sum(workers[user]["observed_ns"] for user in users if user in workers)
    busy = observed - split.contention_ns
    if busy <= 0:
        return None
    return Fraction(pool["hold_ns"].sum, busy)


def pool_reports(
    norm: Mapping[str, Any],
    splits: Mapping[str, HandoffSplit],
    total_wait: int,
    hot: set[str],
    nominal: int,
    supported: Mapping[str, tuple[float, int]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The derived ``resource_pools`` and ``idle_waits`` of a normalized data part.

    Args:
        norm: the normalized data part.
        splits: :func:`split_handoff_waits` of its locks.
        total_wait: the aggregate wait (mutex waits and contention), the hot locks' yardstick.
        hot: the names of the hot locks.
        nominal: the nominal pool size (the workers ``capacity_needed`` is for).
        supported: ``{class: (u, workers_supported)}`` as the sizing computed them
            (``_sizing``): one model for the pool's table and the recommended size.

    Returns:
        ``(resource_pools, idle_waits)``, each most waited-on first (ties by name).
    """
    locks, workers = norm["locks"], norm["workers"]
    pools: list[tuple[int, str, dict[str, Any]]] = []
    idle: list[tuple[int, str, dict[str, Any]]] = []
    for name, split in splits.items():
        lock = locks[name]
        waits_field = lock["signal_waits"]
        if split.idle:
            idle.append(
                (
                    split.idle_ns,
                    name,
                    {
                        "name": name,
                        "kind": lock["kind"],
                        "role": lock.get("role"),
                        "count": sum(waits for waits, _ in split.idle.values()),
                        "total_ms": _ms(split.idle_ns),
                        "workers": _workers_list(split.idle),
                    },
                )
            )
        if not split.is_pool:
            continue
        pool = lock.get("pool") or {}
        wait_histogram: LogHistogram = waits_field["wait_ns"]
        wait_p50, wait_p95 = wait_histogram.percentiles((0.5, 0.95))
        hold_h: LogHistogram | None = pool.get("hold_ns")
        hold = None
        if hold_h is not None and hold_h.count:
            p50, p95 = hold_h.percentiles((0.5, 0.95))
            hold = {"count": hold_h.count, "p50_ms": _ms(p50), "p95_ms": _ms(p95)}
            hold["max_ms"] = _ms(hold_h.max)
        u, workers_supported = supported.get(name, (None, None))
        needed = None
        if u is None:  # the sizing knows no capacity: the needed capacity still follows
            exact = _utilization(lock, split, workers)
            if exact is not None:
                u = round(float(exact), 6)
                needed = max(1, math.ceil(nominal * exact))
        else:
            needed = max(1, math.ceil(nominal * Fraction(u)))
        lock_wait = lock["wait_ns"].sum + split.contention_ns
        share = round(100 * lock_wait / total_wait, 3) if total_wait else 0.0
        pools.append(
            (
                split.contention_ns,
                name,
                {
                    "name": name,
                    "kind": lock["kind"],
                    "role": lock.get("role"),
                    "capacity": pool.get("capacity"),
                    "in_use_peak": pool.get("in_use_peak"),
                    "checkouts": pool.get("checkouts"),
                    "waits": {
                        "count": sum(waits for waits, _ in split.contention.values()),
                        "total_ms": _ms(split.contention_ns),
                        "p50_ms": _ms(wait_p50),
                        "p95_ms": _ms(wait_p95),
                        "max_ms": _ms(wait_histogram.max),
                    },
                    "timeouts": waits_field["timeouts"],
                    "hold": hold,
                    "workers": _workers_list(split.contention),
                    "wait_share_pct": share,
                    "hot": name in hot,
                    "utilization_per_worker": u,
                    "workers_supported": workers_supported,
                    "capacity_needed": needed,
                    "nominal_pool_size": nominal,
                },
            )
        )
    pools.sort(key=lambda t: (-t[0], t[1]))
    idle.sort(key=lambda t: (-t[0], t[1]))
    return [p for _, _, p in pools], [i for _, _, i in idle]
