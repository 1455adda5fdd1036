"""Checking a data part and copying it into the form evaluation and merging work on.

A data part reaches the manifest from the recorder, from a manifest read back from disk, or from
a caller's hands: :func:`normalize` checks every field (a message naming the field that is wrong)
and returns an independent copy with histograms as :class:`LogHistogram` and each lock's
per-worker totals as :class:`~..record._data.WorkerTotals`. Absent top-level keys count as
empty; the derived fields of a manifest passed as data are ignored.

The checks are strict, because a manifest read back may have been written by anyone: every
count is an int in ``[0, 2**63)`` (so no sum, product or division in the evaluation overflows a
float), the lock-order graph is read by its own strict reader (exact keys, types and shapes;
each cycle's edges are edges of the graph, no edge is listed twice, and there are cycles exactly
when the edges close one), and the process is a flat object of known keys and scalar values.
Nothing of arbitrary shape is copied, so no input nests deeper than the data's own shape.
"""

from __future__ import annotations

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
from ..record._histogram import MERGE_SPEEDUPS, LogHistogram
from ..record._witness import Cycle, EdgeWitness
from ._distributed import with_distributed_fields
from ._points import with_points_fields
from ._pools import with_pool_fields

__all__ = [
    "COUNT_LIMIT",
    "lock_order",
    "lock_workers",
    "normalize",
]

#: Every count of the data is below this.
COUNT_LIMIT = 2**63


def _is_count(v: object) -> bool:
    return type(v) is int and 0 <= v < COUNT_LIMIT  # noqa: E721  (bool is not a count)


def _count(v: object, where: str) -> int:
    if type(v) is not int or v < 0:  # noqa: E721
        raise ValueError(f"{where} must be an int >= 0, got {_shown(v)}")
    if v >= COUNT_LIMIT:
        raise ValueError(f"{where} must be < 2**63, got {_shown(v)}")
    return v


def _shown(v: object) -> str:
    """A value in a message: its repr, cut past 80 characters (a name may be a megabyte)."""
    if type(v) is int and v.bit_length() > 64:  # repr() may refuse a huge int
        return f"<an int of {v.bit_length()} bits>"
    text = repr(v)
    return text if len(text) <= 80 else f"{text[:80]}...(+{len(text) - 80} chars)"


def _str(v: object, where: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"{where} must be a str, got {_shown(v)}")
    return v


def _mapping(v: object, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise ValueError(f"{where} must be an object, got {type(v).__name__}")
    return v


def _histogram(v: object, where: str) -> LogHistogram:
    if isinstance(v, LogHistogram):
        return v.copy()
    try:
        h = LogHistogram.from_json(v)  # type: ignore[arg-type]
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    for key in ("count", "sum", "max"):
        _count(getattr(h, key), f"{where}.{key}")
    return h


_GET_LOCK_WORKER = operator.itemgetter(*LOCK_WORKER_FIELDS)


def lock_workers(per_worker: object, where: str) -> WorkerTotals:
    """Check and copy one lock's ``{worker: {acquisitions, contentions, wait_ns, hold_ns}}``.

    The common case is checked in one call of the merge's C fast path, or with C-level loops
    (itemgetter, sum, min); only a failure walks the entries one by one to name the culprit.
    Extra keys are ignored.
    """
    if isinstance(per_worker, WorkerTotals):
        return WorkerTotals(dict(per_worker.rows))
    if MERGE_SPEEDUPS is not None:  # the same check in one C call
        rows = MERGE_SPEEDUPS.worker_rows(per_worker, LOCK_WORKER_FIELDS)
        if rows is not None:
            return WorkerTotals(rows)
    per_worker = _mapping(per_worker, where)
    try:
        rows = list(map(_GET_LOCK_WORKER, per_worker.values()))
        values = list(chain.from_iterable(rows))
        fast = (
            set(map(type, values)) <= {int}  # not a bool, a float or a str among them
            and (not values or (min(values) >= 0 and max(values) < COUNT_LIMIT))
            and set(map(type, per_worker)) <= {str}
        )
    except (KeyError, TypeError):
        fast = False
    if fast:
        return WorkerTotals(dict(zip(per_worker.keys(), rows, strict=True)))
    out: dict[str, tuple[int, int, int, int]] = {}
    for worker, w in per_worker.items():
        if not isinstance(worker, str):
            raise ValueError(f"{where} keys must be worker names, got {_shown(worker)}")
        if not isinstance(w, Mapping) or not all(k in w for k in LOCK_WORKER_FIELDS):
            raise ValueError(
                f"{where}[{_shown(worker)}] must be an object with {', '.join(LOCK_WORKER_FIELDS)}"
            )
        a, c, wn, hn = (_count(w[k], f"{where}[{_shown(worker)}].{k}") for k in LOCK_WORKER_FIELDS)
        out[worker] = (a, c, wn, hn)
    return WorkerTotals(out)


def _locks(locks: object) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, entry in _mapping(locks, "locks").items():
        where = f"locks[{_shown(name)}]"
        entry = _mapping(entry, where)
        lock: dict[str, Any] = {"kind": _str(entry.get("kind"), f"{where}.kind")}
        for key in LOCK_COUNTERS:
            lock[key] = _count(entry.get(key), f"{where}.{key}")
        lock["wait_ns"] = _histogram(entry.get("wait_ns"), f"{where}.wait_ns")
        lock["hold_ns"] = _histogram(entry.get("hold_ns"), f"{where}.hold_ns")
        lock["workers"] = lock_workers(entry.get("workers", {}), f"{where}.workers")
        out[name] = lock
    return out


def _workers(workers: object) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for worker, w in _mapping(workers, "workers").items():
        w = _mapping(w, f"workers[{_shown(worker)}]")
        out[worker] = {k: _count(w.get(k), f"workers[{_shown(worker)}].{k}") for k in WORKER_FIELDS}
    return out


def _blocking(blocking: object) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for lock_name, spans in _mapping(blocking, "blocking_under_lock").items():
        where = f"blocking_under_lock[{_shown(lock_name)}]"
        out[lock_name] = {
            span: _count(n, f"{where}[{_shown(span)}]")
            for span, n in _mapping(spans, where).items()
        }
    return out


def _list(v: object, where: str) -> list[Any]:
    if not isinstance(v, list):
        raise ValueError(f"{where} must be a list, got {type(v).__name__}")
    return v


def _closes_a_cycle(edges: Mapping[tuple[str, str], object]) -> bool:
    """Whether the directed graph of these ``(holding, acquiring)`` edges has a cycle (a
    self-edge included): Kahn's algorithm leaves a node unremoved exactly when it does."""
    successors: dict[str, list[str]] = {}
    indegree: dict[str, int] = {}
    for a, b in edges:
        successors.setdefault(a, []).append(b)
        indegree[b] = indegree.get(b, 0) + 1
        indegree.setdefault(a, 0)
    ready = [node for node, n in indegree.items() if n == 0]
    removed = 0
    while ready:
        node = ready.pop()
        removed += 1
        for nxt in successors.get(node, ()):
            indegree[nxt] -= 1
            if indegree[nxt] == 0:
                ready.append(nxt)
    return removed < len(indegree)


def lock_order(order: object) -> dict[str, Any]:
    """The lock-order graph, read strictly (``record._witness``) and written out afresh."""
    order = _mapping(order, "lock_order")
    edges: list[EdgeWitness] = []
    seen: dict[tuple[str, str], EdgeWitness] = {}
    for i, raw in enumerate(_list(order.get("edges", []), "lock_order.edges")):
        try:
            edge = EdgeWitness.from_json(raw)
        except ValueError as e:
            raise ValueError(f"lock_order.edges[{i}]: {e}") from None
        key = (edge.holding, edge.acquiring)
        if key in seen:
            raise ValueError(f"lock_order.edges[{i}] repeats the edge {_shown(key)}")
        seen[key] = edge
        edges.append(edge)
    cycles: list[Cycle] = []
    for i, raw in enumerate(_list(order.get("cycles", []), "lock_order.cycles")):
        try:
            cycle = Cycle.from_json(raw)
        except ValueError as e:
            raise ValueError(f"lock_order.cycles[{i}]: {e}") from None
        for edge in cycle.edges:
            if seen.get((edge.holding, edge.acquiring)) != edge:
                raise ValueError(
                    f"lock_order.cycles[{i}] has an edge that is not in lock_order.edges: "
                    f"{_shown(edge.holding)} -> {_shown(edge.acquiring)}"
                )
        cycles.append(cycle)
    # The graph reports a cycle whenever an edge closes one, so it has cycles exactly when its
    # edges do. One is enough to know.
    if bool(cycles) != _closes_a_cycle(seen):
        raise ValueError(
            "lock_order.cycles is empty but its edges close a cycle"
            if not cycles
            else "lock_order.cycles lists cycles but its edges close none"
        )
    return {"edges": [e.to_json() for e in edges], "cycles": [c.to_json() for c in cycles]}


def _sections(sections: object) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for name, s in _mapping(sections, "sections").items():
        s = _mapping(s, f"sections[{_shown(name)}]")
        where = f"sections[{_shown(name)}]"
        out[name] = {k: _count(s.get(k), f"{where}.{k}") for k in SECTION_FIELDS}
        if out[name]["count"] < 1:
            raise ValueError(f"{where}.count must be >= 1, got {s.get('count')!r}")
    return out


def _pool(pool: object) -> dict[str, Any]:
    pool = _mapping(pool, "pool")
    nominal, source = pool.get("nominal"), pool.get("source")
    if nominal is not None and (not _is_count(nominal) or nominal < 1):
        raise ValueError(f"pool.nominal must be an int >= 1 or null, got {_shown(nominal)}")
    if source is not None and not isinstance(source, str):
        raise ValueError(f"pool.source must be a str or null, got {_shown(source)}")
    return {"nominal": nominal, "source": source if nominal is not None else None}


_SCALARS = (str, int, float, bool, type(None))


def _process(process: object) -> dict[str, Any]:
    """The process: ``pid`` or ``pids`` (ints), ``service.name`` (str), ``service.names`` (a
    list of str), ``start`` / ``end`` (str or null), ``merged`` (int >= 1); any other key only
    with a scalar value."""
    out = dict(_mapping(process, "process"))
    for key, value in out.items():
        named = isinstance(key, str) and key.isidentifier()
        where = f"process.{key}" if named else f"process[{_shown(key)}]"
        if key == "pids":
            if not isinstance(value, list) or not all(_is_count(p) for p in value):
                raise ValueError(f"{where} must be a list of ints >= 0, got {_shown(value)}")
            out[key] = list(value)
        elif key == "service.names":
            if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                raise ValueError(f"{where} must be a list of str, got {_shown(value)}")
            out[key] = list(value)
        elif key == "pid":
            _count(value, where)
        elif key == "merged":
            if not _is_count(value) or value < 1:
                raise ValueError(f"{where} must be an int >= 1, got {_shown(value)}")
        elif key == "service.name":
            _str(value, where)
        elif key in ("start", "end"):
            if value is not None:
                _str(value, where)
        elif type(value) not in _SCALARS:
            raise ValueError(f"{where} must be a str, number, bool or null, got {_shown(value)}")
    return out


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
        "lock_order": lock_order(data.get("lock_order", {})),
        "blocking_under_lock": _blocking(data.get("blocking_under_lock", {})),
        "sections": _sections(data.get("sections", {})),
        "pool": _pool(data.get("pool", {})),
        "process": _process(data.get("process", {})),
    }
    with_pool_fields(data, norm)  # hand-off waits, pools, peak workers: checked last
    with_distributed_fields(data, norm)  # key templates, leases, release failures
    return with_points_fields(data, norm)  # contention points, the timeline
