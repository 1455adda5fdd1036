"""Checking a data part and copying it into the form evaluation and merging work on.

A data part reaches the manifest from the recorder, from a manifest read back from disk, or from
a caller's hands: :func:`normalize` checks every field (a message naming the field that is wrong)
and returns an independent copy with histograms as :class:`LogHistogram` and each lock's
per-worker totals as :class:`~..record._data.WorkerTotals`. Absent top-level keys count as
empty; the derived fields of a manifest passed as data are ignored.
"""

from __future__ import annotations

import copy
import operator
from collections.abc import Mapping
from itertools import chain
from typing import Any

from ..record._data import (
    LOCK_COUNTERS,
    LOCK_WORKER_FIELDS,
    SECTION_FIELDS,
    WORKER_FIELDS,
    WorkerTotals,
)
from ..record._histogram import LogHistogram
from ._pools import with_pool_fields

__all__ = ["normalize"]


def _is_count(v: object) -> bool:
    return type(v) is int and v >= 0  # noqa: E721  (bool is not a count)


def _count(v: object, where: str) -> int:
    if type(v) is not int or v < 0:  # noqa: E721
        raise ValueError(f"{where} must be an int >= 0, got {v!r}")
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


_GET_LOCK_WORKER = operator.itemgetter(*LOCK_WORKER_FIELDS)


def _lock_workers(per_worker: object, where: str) -> WorkerTotals:
    """Check and copy one lock's ``{worker: {acquisitions, contentions, wait_ns, hold_ns}}``.

    The common case is checked with C-level loops (itemgetter, sum, min); only a failure walks
    the entries one by one to name the culprit. Extra keys are ignored.
    """
    if isinstance(per_worker, WorkerTotals):
        return WorkerTotals(dict(per_worker.rows))
    per_worker = _mapping(per_worker, where)
    try:
        rows = list(map(_GET_LOCK_WORKER, per_worker.values()))
        values = list(chain.from_iterable(rows))
        # A sum of ints is an int: a float among them makes it a float, a str a TypeError.
        fast = (
            type(sum(values)) is int
            and (not values or min(values) >= 0)
            and set(map(type, per_worker)) <= {str}
        )
    except (KeyError, TypeError):
        fast = False
    if fast:
        return WorkerTotals(dict(zip(per_worker.keys(), rows, strict=True)))
    out: dict[str, tuple[int, int, int, int]] = {}
    for worker, w in per_worker.items():
        if not isinstance(worker, str):
            raise ValueError(f"{where} keys must be worker names, got {worker!r}")
        if not isinstance(w, Mapping) or not all(k in w for k in LOCK_WORKER_FIELDS):
            raise ValueError(
                f"{where}[{worker!r}] must be an object with {', '.join(LOCK_WORKER_FIELDS)}"
            )
        a, c, wn, hn = (_count(w[k], f"{where}[{worker!r}].{k}") for k in LOCK_WORKER_FIELDS)
        out[worker] = (a, c, wn, hn)
    return WorkerTotals(out)


def _locks(locks: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, entry in _mapping(locks, "locks").items():
        where = f"locks[{name!r}]"
        entry = _mapping(entry, where)
        kind = entry.get("kind")
        if not isinstance(kind, str):
            raise ValueError(f"{where}.kind must be a str, got {kind!r}")
        lock: dict[str, Any] = {"kind": kind}
        for key in LOCK_COUNTERS:
            lock[key] = _count(entry.get(key), f"{where}.{key}")
        lock["wait_ns"] = _histogram(entry.get("wait_ns"), f"{where}.wait_ns")
        lock["hold_ns"] = _histogram(entry.get("hold_ns"), f"{where}.hold_ns")
        lock["workers"] = _lock_workers(entry.get("workers", {}), f"{where}.workers")
        out[name] = lock
    return out


def _workers(workers: object) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for worker, w in _mapping(workers, "workers").items():
        w = _mapping(w, f"workers[{worker!r}]")
        out[worker] = {k: _count(w.get(k), f"workers[{worker!r}].{k}") for k in WORKER_FIELDS}
    return out


def _blocking(blocking: object) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for lock_name, spans in _mapping(blocking, "blocking_under_lock").items():
        where = f"blocking_under_lock[{lock_name!r}]"
        out[lock_name] = {
            span: _count(n, f"{where}[{span!r}]") for span, n in _mapping(spans, where).items()
        }
    return out


def _lock_order(order: object) -> dict[str, Any]:
    order = _mapping(order, "lock_order")
    edges, cycles = order.get("edges", []), order.get("cycles", [])
    if not isinstance(edges, list) or not all(isinstance(e, Mapping) for e in edges):
        raise ValueError("lock_order.edges must be a list of objects")
    if not isinstance(cycles, list) or not all(
        isinstance(c, Mapping) and isinstance(c.get("cycle"), list) for c in cycles
    ):
        raise ValueError("lock_order.cycles must be a list of {cycle, edges} objects")
    return {"edges": copy.deepcopy(edges), "cycles": copy.deepcopy(cycles)}


def _sections(sections: object) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, s in _mapping(sections, "sections").items():
        s = _mapping(s, f"sections[{name!r}]")
        out[name] = {k: _count(s.get(k), f"sections[{name!r}].{k}") for k in SECTION_FIELDS}
        if out[name]["count"] < 1:
            raise ValueError(f"sections[{name!r}].count must be >= 1, got {s.get('count')!r}")
    return out


def _pool(pool: object) -> dict[str, Any]:
    pool = _mapping(pool, "pool")
    nominal, source = pool.get("nominal"), pool.get("source")
    if nominal is not None and (type(nominal) is not int or nominal < 1):  # noqa: E721
        raise ValueError(f"pool.nominal must be an int >= 1 or null, got {nominal!r}")
    if source is not None and not isinstance(source, str):
        raise ValueError(f"pool.source must be a str or null, got {source!r}")
    return {"nominal": nominal, "source": source if nominal is not None else None}


def _process(process: object) -> dict[str, Any]:
    out = dict(_mapping(process, "process"))
    if "pids" in out:
        pids = out["pids"]
        if not isinstance(pids, list) or not all(_is_count(p) for p in pids):
            raise ValueError(f"process.pids must be a list of ints, got {pids!r}")
    elif "pid" in out:
        _count(out["pid"], "process.pid")
    return copy.deepcopy(out)


def normalize(data: object) -> dict[str, Any]:
    """Return a checked, independent copy of a data part (see the module docstring).

    Raises:
        ValueError: a field is malformed; the message names it (``locks['l'].acquisitions
            must be an int >= 0, got -1``).
    """
    data = _mapping(data, "data")
    norm = {  # checked in this order: the first malformed field is the one named
        "locks": _locks(data.get("locks", {})),
        "workers": _workers(data.get("workers", {})),
        "lock_order": _lock_order(data.get("lock_order", {})),
        "blocking_under_lock": _blocking(data.get("blocking_under_lock", {})),
        "sections": _sections(data.get("sections", {})),
        "pool": _pool(data.get("pool", {})),
        "process": _process(data.get("process", {})),
    }
    return with_pool_fields(data, norm)  # signal waits, pools, peak workers: checked last
