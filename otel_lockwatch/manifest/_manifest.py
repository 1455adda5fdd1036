"""The contention manifest: evaluation, canonical JSON, digest, load, admission check, merge.

A pool that spins down leaves its successor the *contention topology* it ran under, not only its
task outcomes (design seed 004: sixteen workers "succeeded" while fourteen of them waited on one
mutex; a successor that inherits sixteen hits the same wall). The manifest is that record.

Two layers, one direction:

* **data** -- the mergeable part, produced by the recorder's snapshot (see
  ``docs/ARCHITECTURE.md``): per-lock counters and :class:`~..record._histogram.LogHistogram`
  distributions of wait and hold time, per-(worker, lock) totals, per-worker observed and waiting
  time, the lock-order graph, section statistics, the pool's nominal size and the process. Only
  sums, maxima and histograms: nothing grows with the number of acquisitions, and every field
  merges exactly (sum the counters, add the histograms, union the workers).
* **derived** -- everything :func:`evaluate` computes from the data: the verdict, the hot locks,
  the starvation signatures, the ordering witnesses, the effective throughput, the recommended
  pool and section sizes, and the thresholds that were in force.

Because the derived layer is a pure function of the data, manifests of many processes merge by
merging their data and evaluating again (:func:`merge_manifests`), and a manifest read back from
disk can be re-evaluated under other thresholds. The digest (SHA-256 over the canonical JSON of
everything else) lets :func:`load_manifest` refuse a manifest that was edited by hand, so a
successor never sizes its pool from numbers the run did not produce.

Verdict precedence: ``CYCLIC_ORDERING_DETECTED`` > ``STARVATION_OBSERVED`` >
``HOT_LOCK_DETECTED`` > ``LOW_CONTENTION``. Every threshold and floor is listed in the
manifest's ``thresholds`` and documented in the README ("The contention manifest").
"""

from __future__ import annotations

import contextlib
import copy
import enum
import hashlib
import json
import logging
import math
import operator
import os
import tempfile
from collections.abc import Mapping, Sequence
from fractions import Fraction
from itertools import chain
from pathlib import Path
from typing import Any, Union

from otel_lockwatch import environment_variables as _ev
from otel_lockwatch.exceptions import ManifestError
from otel_lockwatch.record._histogram import RELATIVE_ERROR, LogHistogram

__all__ = [
    "DEFAULT_HOT_LOCK_THRESHOLD_PCT",
    "DEFAULT_STARVATION_RATIO",
    "SCHEMA",
    "Manifest",
    "Verdict",
    "dump_manifest",
    "evaluate",
    "load_manifest",
    "may_spawn_pool_size",
    "merge_manifests",
    "recommended_workers",
]

_log = logging.getLogger(__name__)

SCHEMA = "otel-lockwatch/manifest/1"

ENV_HOT_LOCK_THRESHOLD_PCT = _ev.OTEL_PYTHON_LOCKWATCH_HOT_LOCK_THRESHOLD_PCT
ENV_STARVATION_RATIO = _ev.OTEL_PYTHON_LOCKWATCH_STARVATION_RATIO
ENV_POOL_SIZE = _ev.OTEL_PYTHON_LOCKWATCH_POOL_SIZE

#: A lock is hot when its share of the aggregate wait is at least this (percent)...
DEFAULT_HOT_LOCK_THRESHOLD_PCT = 20.0
#: ...and it made workers wait at least this long in total (ms)...
HOT_LOCK_MIN_WAIT_MS = 1.0
#: ...and that wait is at least this share of all observed worker time (percent).
HOT_LOCK_MIN_WAIT_PCT_OF_OBSERVED = 1.0
#: A worker starves on a lock when its wait exceeds this many times the lock's median...
DEFAULT_STARVATION_RATIO = 5.0
#: ...where a median below this (ms) counts as this...
STARVATION_MEDIAN_FLOOR_MS = 0.2
#: ...and in any case its wait is at least this (ms).
STARVATION_MIN_WAIT_MS = 1.0
#: Section sizing: the expected number of colliding pairs among the most concurrent holders.
SECTION_COLLISION_TARGET = 0.05

_NS_PER_MS = 1_000_000
_PERCENTILES = (("p50_ms", 0.5), ("p95_ms", 0.95), ("p99_ms", 0.99))

#: The data part's top-level keys; every other manifest field is derived.
DATA_FIELDS = (
    "blocking_under_lock",
    "lock_order",
    "locks",
    "pool",
    "process",
    "sections",
    "workers",
)
DERIVED_FIELDS = (
    "effective_throughput_pct",
    "hold_time_distribution",
    "hot_lock_register",
    "manifest_digest",
    "nominal_pool_size",
    "pool_size_source",
    "pre_deadlock_ordering_witness",
    "recommended_pool_size",
    "schema",
    "starvation_signatures",
    "thresholds",
    "verdict",
)
_LOCK_COUNTERS = ("acquisitions", "contentions", "skipped", "timeouts")
_LOCK_WORKER_FIELDS = ("acquisitions", "contentions", "wait_ns", "hold_ns")
_WORKER_FIELDS = ("observed_ns", "wait_ns")
_SECTION_FIELDS = ("count", "collision_waits", "max_held")
_POOL_SOURCE_RANK = {"executor": 0, "env": 1}

PathLike = Union[str, "os.PathLike[str]"]


class Verdict(str, enum.Enum):
    """The manifest's verdict, in increasing precedence."""

    LOW_CONTENTION = "LOW_CONTENTION"
    HOT_LOCK_DETECTED = "HOT_LOCK_DETECTED"
    STARVATION_OBSERVED = "STARVATION_OBSERVED"
    CYCLIC_ORDERING_DETECTED = "CYCLIC_ORDERING_DETECTED"

    def __str__(self) -> str:
        return self.value


# --------------------------------------------------------------------------------------------
# Thresholds


_warned: set[tuple[str, str]] = set()


def _warn_once(name: str, raw: str, why: str) -> None:
    if (name, raw) not in _warned:
        _warned.add((name, raw))
        _log.warning("ignoring %s=%r: %s", name, raw, why)


def _is_number(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _hot_pct_ok(v: float) -> bool:
    return 0.0 < v <= 100.0


def _ratio_ok(v: float) -> bool:
    return v > 1.0


def _threshold(arg: object, env: str, default: float, ok: Any, name: str, expected: str) -> float:
    if arg is not None:
        if not _is_number(arg) or not ok(arg):
            raise ValueError(f"{name} must be {expected}, got {arg!r}")
        return float(arg)  # type: ignore[arg-type]
    raw = os.environ.get(env)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or not ok(value):
        _warn_once(env, raw, f"must be {expected}; using the default {default}")
        return default
    return value


def _resolve_pool_size(
    pool: Mapping[str, Any], pool_size: object, observed: int
) -> tuple[int, str]:
    nominal = pool.get("nominal")
    if nominal is not None:
        return nominal, pool.get("source") or "executor"
    if pool_size is not None:
        if not isinstance(pool_size, int) or isinstance(pool_size, bool):
            raise TypeError(f"pool_size must be an int, got {pool_size!r}")
        if pool_size < 1:
            raise ValueError(f"pool_size must be >= 1, got {pool_size}")
        return pool_size, "argument"
    raw = os.environ.get(ENV_POOL_SIZE)
    if raw is not None and raw.strip() != "":
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value >= 1:
            return value, "env"
        _warn_once(ENV_POOL_SIZE, raw, "must be an integer >= 1; using the workers observed")
    return max(1, observed), "observed"


# --------------------------------------------------------------------------------------------
# Data: validation and normalization


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


_GET_LOCK_WORKER = operator.itemgetter(*_LOCK_WORKER_FIELDS)
_GET_WAIT = operator.itemgetter(2)


class _WorkerTotals:
    """One lock's per-worker totals, ``{worker: (acquisitions, contentions, wait_ns, hold_ns)}``.

    Kept as tuples because this is the bulk of a large snapshot (10^4 locks x 64 workers would
    be 640 000 small dicts to copy); expanded into ``{worker: {acquisitions, contentions,
    wait_ns, hold_ns}}`` objects only when the manifest is serialized. Never mutated.
    """

    __slots__ = ("rows",)

    def __init__(self, rows: dict[str, tuple[int, int, int, int]]) -> None:
        self.rows = rows

    def to_json(self) -> dict[str, dict[str, int]]:
        return {w: dict(zip(_LOCK_WORKER_FIELDS, r, strict=True)) for w, r in self.rows.items()}


def _lock_workers(per_worker: object, where: str) -> _WorkerTotals:
    """Validate and copy one lock's ``{worker: {acquisitions, contentions, wait_ns, hold_ns}}``.

    The common case is checked with C-level loops (itemgetter, sum, min); only a failure walks
    the entries one by one to name the culprit. Extra keys are ignored.
    """
    if isinstance(per_worker, _WorkerTotals):
        return _WorkerTotals(dict(per_worker.rows))
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
        return _WorkerTotals(dict(zip(per_worker.keys(), rows, strict=True)))
    out: dict[str, tuple[int, int, int, int]] = {}
    for worker, w in per_worker.items():
        if not isinstance(worker, str):
            raise ValueError(f"{where} keys must be worker names, got {worker!r}")
        if not isinstance(w, Mapping) or not all(k in w for k in _LOCK_WORKER_FIELDS):
            raise ValueError(
                f"{where}[{worker!r}] must be an object with {', '.join(_LOCK_WORKER_FIELDS)}"
            )
        a, c, wn, hn = (_count(w[k], f"{where}[{worker!r}].{k}") for k in _LOCK_WORKER_FIELDS)
        out[worker] = (a, c, wn, hn)
    return _WorkerTotals(out)


def _normalize(data: object) -> dict[str, Any]:
    """Return a validated, independent copy of a data snapshot (histograms as LogHistogram).

    Absent top-level keys count as empty. Derived keys (of a manifest passed as data) are ignored.
    """
    data = _mapping(data, "data")
    out: dict[str, Any] = {}

    locks: dict[str, Any] = {}
    for name, entry in _mapping(data.get("locks", {}), "locks").items():
        where = f"locks[{name!r}]"
        entry = _mapping(entry, where)
        kind = entry.get("kind")
        if not isinstance(kind, str):
            raise ValueError(f"{where}.kind must be a str, got {kind!r}")
        lock: dict[str, Any] = {"kind": kind}
        for key in _LOCK_COUNTERS:
            lock[key] = _count(entry.get(key), f"{where}.{key}")
        lock["wait_ns"] = _histogram(entry.get("wait_ns"), f"{where}.wait_ns")
        lock["hold_ns"] = _histogram(entry.get("hold_ns"), f"{where}.hold_ns")
        workers = _lock_workers(entry.get("workers", {}), f"{where}.workers")
        lock["workers"] = workers
        locks[name] = lock
    out["locks"] = locks

    workers_out: dict[str, dict[str, int]] = {}
    for worker, w in _mapping(data.get("workers", {}), "workers").items():
        w = _mapping(w, f"workers[{worker!r}]")
        workers_out[worker] = {
            k: _count(w.get(k), f"workers[{worker!r}].{k}") for k in _WORKER_FIELDS
        }
    out["workers"] = workers_out

    order = _mapping(data.get("lock_order", {}), "lock_order")
    edges, cycles = order.get("edges", []), order.get("cycles", [])
    if not isinstance(edges, list) or not all(isinstance(e, Mapping) for e in edges):
        raise ValueError("lock_order.edges must be a list of objects")
    if not isinstance(cycles, list) or not all(
        isinstance(c, Mapping) and isinstance(c.get("cycle"), list) for c in cycles
    ):
        raise ValueError("lock_order.cycles must be a list of {cycle, edges} objects")
    out["lock_order"] = {"edges": copy.deepcopy(edges), "cycles": copy.deepcopy(cycles)}

    blocking: dict[str, dict[str, int]] = {}
    for lock_name, spans in _mapping(
        data.get("blocking_under_lock", {}), "blocking_under_lock"
    ).items():
        where = f"blocking_under_lock[{lock_name!r}]"
        blocking[lock_name] = {
            span: _count(n, f"{where}[{span!r}]") for span, n in _mapping(spans, where).items()
        }
    out["blocking_under_lock"] = blocking

    sections: dict[str, dict[str, int]] = {}
    for name, s in _mapping(data.get("sections", {}), "sections").items():
        s = _mapping(s, f"sections[{name!r}]")
        sections[name] = {k: _count(s.get(k), f"sections[{name!r}].{k}") for k in _SECTION_FIELDS}
        if sections[name]["count"] < 1:
            raise ValueError(f"sections[{name!r}].count must be >= 1, got {s.get('count')!r}")
    out["sections"] = sections

    pool = _mapping(data.get("pool", {}), "pool")
    nominal, source = pool.get("nominal"), pool.get("source")
    if nominal is not None and (type(nominal) is not int or nominal < 1):  # noqa: E721
        raise ValueError(f"pool.nominal must be an int >= 1 or null, got {nominal!r}")
    if source is not None and not isinstance(source, str):
        raise ValueError(f"pool.source must be a str or null, got {source!r}")
    out["pool"] = {"nominal": nominal, "source": source if nominal is not None else None}

    process = dict(_mapping(data.get("process", {}), "process"))
    if "pids" in process:
        pids = process["pids"]
        if not isinstance(pids, list) or not all(_is_count(p) for p in pids):
            raise ValueError(f"process.pids must be a list of ints, got {pids!r}")
    elif "pid" in process:
        _count(process["pid"], "process.pid")
    out["process"] = copy.deepcopy(process)
    return out


def _to_jsonable(obj: Any) -> Any:
    """A fresh JSON-ready copy of a document part (histograms in their JSON form)."""
    if isinstance(obj, dict):
        return {k: _to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_jsonable(v) for v in obj]
    if isinstance(obj, (LogHistogram, _WorkerTotals)):
        return obj.to_json()
    return obj


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (LogHistogram, _WorkerTotals)):
        return obj.to_json()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


# --------------------------------------------------------------------------------------------
# Evaluation


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
    pairs is ``C(k, 2) / n``; this is the seed's "enough sections that concurrent holders
    practically never share one", computed.

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

    Args:
        data: the snapshot described in ``docs/ARCHITECTURE.md``; histograms may be
            :class:`LogHistogram` objects or their JSON form, so a loaded manifest's dict (or
            ``Manifest.data``) can be evaluated again. Absent top-level keys count as empty.
        hot_lock_threshold_pct: a lock is hot when its share of the aggregate wait is at least
            this; else ``OTEL_PYTHON_LOCKWATCH_HOT_LOCK_THRESHOLD_PCT``; else 20.
        starvation_ratio: a worker starves on a lock when its wait there exceeds this many
            times the lock's median per-worker wait; else
            ``OTEL_PYTHON_LOCKWATCH_STARVATION_RATIO``; else 5.
        pool_size: the nominal pool size when the data does not know it (``data["pool"]``);
            else ``OTEL_PYTHON_LOCKWATCH_POOL_SIZE``; else the number of workers observed.
        service_name: replaces the process's ``service.name``.

    Raises:
        ValueError: a threshold argument is not a number in range (hot pct in (0, 100],
            ratio > 1), ``pool_size`` < 1, or the data is malformed (the message names the field).
        TypeError: ``pool_size`` is not an int.

    Invalid environment values are logged once as a warning and replaced by the default.
    """
    hot_pct = _threshold(
        hot_lock_threshold_pct, ENV_HOT_LOCK_THRESHOLD_PCT, DEFAULT_HOT_LOCK_THRESHOLD_PCT,
        _hot_pct_ok, "hot_lock_threshold_pct", "a number in (0, 100]",
    )  # fmt: skip
    ratio = _threshold(
        starvation_ratio, ENV_STARVATION_RATIO, DEFAULT_STARVATION_RATIO,
        _ratio_ok, "starvation_ratio", "a number > 1",
    )  # fmt: skip
    norm = _normalize(data)
    if service_name is not None:
        if not isinstance(service_name, str):
            raise TypeError(f"service_name must be a str, got {service_name!r}")
        norm["process"]["service.name"] = service_name
    norm["process"].setdefault("service.name", "unknown_service")
    return _evaluate_normalized(norm, hot_pct, ratio, pool_size)


def _evaluate_normalized(
    norm: dict[str, Any], hot_pct: float, ratio: float, pool_size: object
) -> Manifest:
    locks: dict[str, Any] = norm["locks"]
    workers: dict[str, Any] = norm["workers"]

    total_wait = 0
    for lock in locks.values():
        total_wait += lock["wait_ns"].sum
    total_observed = sum(w["observed_ns"] for w in workers.values())
    total_worker_wait = sum(w["wait_ns"] for w in workers.values())

    # Hot locks: compare in exact integer/rational arithmetic, round only for display.
    hot_min_ns = HOT_LOCK_MIN_WAIT_MS * _NS_PER_MS
    hot: list[tuple[int, str]] = []
    if total_wait > 0:
        for name, lock in locks.items():
            w = lock["wait_ns"].sum
            if (
                w >= hot_min_ns
                and w * 100 >= hot_pct * total_wait
                and w * 100 >= HOT_LOCK_MIN_WAIT_PCT_OF_OBSERVED * total_observed
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
        p50, p95 = h.percentiles((0.5, 0.95))
        hold_time_distribution[name] = {
            "count": h.count,
            "p50_ms": _ms(p50),
            "p95_ms": _ms(p95),
            "max_ms": _ms(h.max),
        }

    # Starvation: a worker's wait on a lock against the lower median of that lock's per-worker
    # waits (the lower median, so that one starved worker beside one idle one is still seen).
    floor_ns = STARVATION_MEDIAN_FLOOR_MS * _NS_PER_MS
    min_wait_ns = STARVATION_MIN_WAIT_MS * _NS_PER_MS
    starving: list[tuple[int, str, str, int]] = []
    for name, lock in locks.items():
        per_worker = lock["workers"].rows
        if len(per_worker) < 2:
            continue
        waits = list(map(_GET_WAIT, per_worker.values()))
        top = max(waits)
        if top < min_wait_ns or top <= ratio * floor_ns:
            continue
        waits.sort()
        median = waits[(len(waits) - 1) // 2]
        limit = ratio * max(median, floor_ns)
        if top <= limit:
            continue
        for worker, w in per_worker.items():
            wn = w[2]
            if wn > limit and wn >= min_wait_ns:
                starving.append((wn, worker, name, median))
    starving.sort(key=lambda t: (-t[0], t[1], t[2]))
    signatures = [
        {"worker": worker, "lock": name, "wait_ms": _ms(wn), "median_wait_ms": _ms(median)}
        for wn, worker, name, median in starving
    ]

    cycles = norm["lock_order"]["cycles"]
    if cycles:
        verdict = Verdict.CYCLIC_ORDERING_DETECTED
    elif signatures:
        verdict = Verdict.STARVATION_OBSERVED
    elif hot_register:
        verdict = Verdict.HOT_LOCK_DETECTED
    else:
        verdict = Verdict.LOW_CONTENTION

    nominal, source = _resolve_pool_size(norm["pool"], pool_size, len(workers))
    if verdict in (Verdict.CYCLIC_ORDERING_DETECTED, Verdict.STARVATION_OBSERVED):
        recommended = max(1, nominal // 2)
    elif verdict is Verdict.HOT_LOCK_DETECTED:
        recommended = max(1, int(nominal * 0.75))
    else:
        recommended = nominal

    if total_observed > 0:
        throughput = 100.0 * (1.0 - total_worker_wait / total_observed)
        throughput = round(min(100.0, max(0.0, throughput)), 3)
    else:
        throughput = 100.0

    # The document takes over the normalized data (a private copy); its histograms stay
    # LogHistogram objects until the document is serialized.
    doc = norm
    for lock in locks.values():
        entry = lock
        entry["wait_ms_total"] = _ms(lock["wait_ns"].sum)
        entry["hold_ms_total"] = _ms(lock["hold_ns"].sum)
        entry["wait"] = _distribution(lock["wait_ns"])
        entry["hold"] = _distribution(lock["hold_ns"])
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
            "recommended_pool_size": recommended,
            "hot_lock_register": hot_register,
            "hold_time_distribution": hold_time_distribution,
            "starvation_signatures": signatures,
            "pre_deadlock_ordering_witness": copy.deepcopy(cycles),
            "effective_throughput_pct": throughput,
            "thresholds": {
                "hot_lock_threshold_pct": hot_pct,
                "hot_lock_min_wait_ms": HOT_LOCK_MIN_WAIT_MS,
                "hot_lock_min_wait_pct_of_observed": HOT_LOCK_MIN_WAIT_PCT_OF_OBSERVED,
                "starvation_ratio": ratio,
                "starvation_median_floor_ms": STARVATION_MEDIAN_FLOOR_MS,
                "starvation_min_wait_ms": STARVATION_MIN_WAIT_MS,
                "section_collision_target": SECTION_COLLISION_TARGET,
                "histogram_relative_error": RELATIVE_ERROR,
            },
        }
    )
    return Manifest._from_doc(doc, None)


# --------------------------------------------------------------------------------------------
# The Manifest object


def canonical_json(obj: Any) -> bytes:
    """The canonical encoding the digest is computed over: sorted keys, no whitespace, UTF-8."""
    return json.dumps(
        obj,
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
        default=_json_default,
    ).encode("utf-8")


def compute_digest(doc: Mapping[str, Any]) -> str:
    """SHA-256 hex digest of the canonical JSON of ``doc`` without its ``manifest_digest``."""
    body = {k: v for k, v in doc.items() if k != "manifest_digest"}
    return hashlib.sha256(canonical_json(body)).hexdigest()


class _Field:
    """A read-only attribute that returns a copy of one field of the manifest document."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Manifest | None, owner: type) -> Any:
        if obj is None:
            return self
        return _to_jsonable(obj._doc[self.name])


class Manifest:
    """A contention manifest: read-only attributes for every field, ``to_dict`` / ``to_json``.

    Build one with :func:`evaluate`, :func:`load_manifest` or :func:`merge_manifests`.
    Container attributes return copies, so the manifest cannot be changed through them.
    """

    __slots__ = ("_doc", "_digest")
    _doc: dict[str, Any]
    _digest: str | None

    schema = _Field("``otel-lockwatch/manifest/1``.")
    nominal_pool_size = _Field("The pool size the run had (int >= 1).")
    pool_size_source = _Field("Where nominal_pool_size came from: executor, env, argument...")
    recommended_pool_size = _Field("The pool size a successor should use (int >= 1).")
    hot_lock_register = _Field("``[{lock, wait_ms, wait_share_pct}]``, most waited-on first.")
    hold_time_distribution = _Field("``{lock: {count, p50_ms, p95_ms, max_ms}}`` of hot locks.")
    starvation_signatures = _Field("``[{worker, lock, wait_ms, median_wait_ms}]``.")
    pre_deadlock_ordering_witness = _Field("The lock-order cycles, ``[{cycle, edges}]``.")
    effective_throughput_pct = _Field("Share of observed worker time not spent waiting (0..100).")
    thresholds = _Field("Every threshold and floor in force.")
    locks = _Field("Per-lock counters, totals, percentiles, histograms and per-worker totals.")
    workers = _Field("``{worker: {observed_ns, wait_ns}}``.")
    sections = _Field("``{array: {count, collision_waits, max_held, recommended_count, ...}}``.")
    lock_order = _Field("The lock-order graph: ``{edges, cycles}``.")
    blocking_under_lock = _Field("``{lock: {span name: count}}``.")
    pool = _Field("``{nominal, source}`` as the data knew it.")
    process = _Field("The process (pid, service.name, start, end), or the merged processes.")

    def __init__(self) -> None:
        raise TypeError("build a Manifest with evaluate(), load_manifest() or merge_manifests()")

    @classmethod
    def _from_doc(cls, doc: dict[str, Any], digest: str | None) -> Manifest:
        self = object.__new__(cls)
        object.__setattr__(self, "_doc", doc)
        object.__setattr__(self, "_digest", digest)
        return self

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Manifest is read-only; cannot set {name!r}")

    @property
    def verdict(self) -> Verdict:
        """The :class:`Verdict` (a str enum)."""
        return Verdict(self._doc["verdict"])

    @property
    def manifest_digest(self) -> str:
        """SHA-256 hex over the canonical JSON of every other field."""
        if self._digest is None:
            object.__setattr__(self, "_digest", compute_digest(self._doc))
        return self._digest  # type: ignore[return-value]

    @property
    def data(self) -> dict[str, Any]:
        """The mergeable part as a fresh snapshot (histograms as :class:`LogHistogram`), in the
        recorder's form (``docs/ARCHITECTURE.md``)."""
        data = _normalize(self._doc)
        for lock in data["locks"].values():
            lock["workers"] = lock["workers"].to_json()
        return data

    def to_dict(self) -> dict[str, Any]:
        """Return the whole manifest, digest included, as a fresh JSON-ready dict."""
        doc = _to_jsonable(self._doc)
        doc["manifest_digest"] = self.manifest_digest
        return doc

    def to_json(self) -> str:
        """Return the manifest as JSON: sorted keys, indent 2, a trailing newline."""
        doc = dict(self._doc)
        doc["manifest_digest"] = self.manifest_digest
        text = json.dumps(
            doc,
            sort_keys=True,
            indent=2,
            ensure_ascii=False,
            allow_nan=False,
            default=_json_default,
        )
        return text + "\n"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Manifest):
            return NotImplemented
        return self.manifest_digest == other.manifest_digest

    def __hash__(self) -> int:
        return hash(self.manifest_digest)

    def __repr__(self) -> str:
        return (
            f"<Manifest {self._doc['verdict']} recommended_pool_size="
            f"{self._doc['recommended_pool_size']} of {self._doc['nominal_pool_size']}, "
            f"{len(self._doc['locks'])} locks>"
        )


# --------------------------------------------------------------------------------------------
# File format


def write_atomically(target: Path, payload: bytes) -> None:
    """Write ``payload`` to ``target`` through a temporary file in the same directory, fsynced,
    then ``os.replace``: a reader sees the old file or the whole new one. On any error the
    temporary file is removed and the old file survives.

    Raises:
        OSError: the file could not be written (its directory must exist).
    """
    directory = target.parent
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with contextlib.suppress(AttributeError, OSError):  # not every platform has fchmod
            os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    try:  # make the rename itself durable; best effort (not every platform opens directories)
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover
        return
    try:
        os.fsync(dfd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(dfd)


def dump_manifest(manifest: Manifest, path: PathLike) -> Path:
    """Write ``manifest`` to ``path`` atomically and return the path written.

    The JSON goes to a temporary file in the same directory, is flushed and fsynced, then
    renamed over ``path`` (``os.replace``): a reader sees the previous manifest or the new one,
    never a truncated file. On any error the temporary file is removed and the previous
    manifest survives. ``{pid}`` in ``path`` is replaced by the process id.

    Args:
        manifest: the manifest to write.
        path: the destination; its directory must exist.

    Raises:
        TypeError: ``manifest`` is not a :class:`Manifest`.
        OSError: the file could not be written.
    """
    if not isinstance(manifest, Manifest):
        raise TypeError(f"manifest must be a Manifest, got {type(manifest).__name__}")
    target = Path(os.fspath(path).replace("{pid}", str(os.getpid())))
    write_atomically(target, manifest.to_json().encode("utf-8"))
    return target


_REQUIRED_FIELDS = tuple(sorted(DATA_FIELDS + DERIVED_FIELDS))


def _check_doc(doc: object, where: str) -> Manifest:
    """Validate a manifest document (schema, fields, digest, data) and wrap it."""
    if not isinstance(doc, dict):
        raise ManifestError(f"{where} is not a JSON object")
    if doc.get("schema") != SCHEMA:
        raise ManifestError(f"{where} has schema {doc.get('schema')!r}, expected {SCHEMA!r}")
    missing = [k for k in _REQUIRED_FIELDS if k not in doc]
    if missing:
        raise ManifestError(f"{where} lacks field(s): {', '.join(missing)}")
    digest = doc["manifest_digest"]
    try:
        actual = compute_digest(doc)
    except ValueError:  # NaN / Infinity in the document
        actual = None
    if digest != actual:
        raise ManifestError(f"{where} was edited: its manifest_digest does not match its content")
    try:
        _normalize(doc)
        Verdict(doc["verdict"])
        rec = doc["recommended_pool_size"]
        if type(rec) is not int or rec < 1:  # noqa: E721
            raise ValueError(f"recommended_pool_size must be an int >= 1, got {rec!r}")
    except ValueError as e:
        raise ManifestError(f"{where} is invalid: {e}") from None
    body = {k: v for k, v in doc.items() if k != "manifest_digest"}
    return Manifest._from_doc(body, digest)


def load_manifest(path: PathLike) -> Manifest:
    """Read a manifest back, refusing anything this library did not write as-is.

    Args:
        path: the manifest file.

    Raises:
        ManifestError: (one line naming the path) the file is missing or unreadable, is not
            JSON, not an object, of another schema, lacks fields, or its digest does not match
            its content (it was edited).
    """
    where = f"manifest {os.fspath(path)}"
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise ManifestError(f"{where} does not exist") from None
    except OSError as e:
        raise ManifestError(f"{where} cannot be read: {e.strerror or e}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ManifestError(f"{where} is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ManifestError(
            f"{where} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}"
        ) from None
    return _check_doc(doc, where)


def may_spawn_pool_size(manifest: Manifest, requested: int) -> tuple[bool, str]:
    """The successor's admission check: may it spawn ``requested`` workers?

    Args:
        manifest: the predecessor's manifest.
        requested: the pool size the successor wants, an int >= 1.

    Returns:
        ``(True, "POOL_SIZE_ADMISSIBLE: ...")`` when ``requested`` is at most the recommended
        size, else ``(False, "POOL_SIZE_VIOLATION: Requested 16 exceeds recommended 8 based on
        verdict STARVATION_OBSERVED.")``.

    Raises:
        TypeError: ``manifest`` is not a Manifest or ``requested`` is not an int.
        ValueError: ``requested`` < 1.
    """
    if not isinstance(manifest, Manifest):
        raise TypeError(f"manifest must be a Manifest, got {type(manifest).__name__}")
    if type(requested) is not int:  # noqa: E721
        raise TypeError(f"requested must be an int, got {requested!r}")
    if requested < 1:
        raise ValueError(f"requested must be >= 1, got {requested}")
    rec, verdict = manifest.recommended_pool_size, manifest.verdict.value
    if requested > rec:
        return False, (
            f"POOL_SIZE_VIOLATION: Requested {requested} exceeds recommended {rec} "
            f"based on verdict {verdict}."
        )
    return True, (
        f"POOL_SIZE_ADMISSIBLE: Requested {requested} is within recommended {rec} "
        f"based on verdict {verdict}."
    )


def recommended_workers(path: PathLike, default: int) -> int:
    """The pool size a successor should spawn, from the last manifest at ``path``.

    Returns the manifest's ``recommended_pool_size``; ``default`` when no file exists. A file
    that exists but cannot be trusted (corrupt, another schema, edited) is not trusted and
    does not crash the successor: a warning naming the reason is logged and ``default`` is
    returned.

    Args:
        path: the manifest file.
        default: the size to use without a (valid) manifest, an int >= 1.

    Raises:
        TypeError: ``default`` is not an int.
        ValueError: ``default`` < 1.
    """
    if type(default) is not int:  # noqa: E721
        raise TypeError(f"default must be an int, got {default!r}")
    if default < 1:
        raise ValueError(f"default must be >= 1, got {default}")
    if not os.path.exists(path):
        return default
    try:
        return load_manifest(path).recommended_pool_size
    except ManifestError as e:
        _log.warning("not trusting the last manifest, using %d workers: %s", default, e)
        return default


# --------------------------------------------------------------------------------------------
# Merge


def _merge_lock_order(datas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Merge lock-order graphs with :func:`..record._order.merge_order_data`: the union of
    the edges (each keeping its earliest witness) and the cycles recomputed from that union, so
    that ``A -> B`` seen in one process and ``B -> A`` in another is a cycle."""
    from otel_lockwatch.record._cycles import merge_order_data

    merged = merge_order_data(datas)
    return {"edges": list(merged["edges"]), "cycles": list(merged["cycles"])}


def _as_manifest(item: object) -> Manifest:
    if isinstance(item, Manifest):
        return item
    if isinstance(item, Mapping):
        return _check_doc(dict(item), "manifest")
    if isinstance(item, (str, os.PathLike)):
        return load_manifest(item)
    raise TypeError(f"cannot merge a {type(item).__name__}: expected a Manifest, dict or path")


def _merge_process(processes: list[Mapping[str, Any]]) -> dict[str, Any]:
    pids: set[int] = set()
    names: set[str] = set()
    starts, ends, merged = [], [], 0
    for p in processes:
        if "pids" in p:
            pids.update(p["pids"])
            names.update(p.get("service.names", [p.get("service.name", "unknown_service")]))
            merged += p.get("merged", len(p["pids"]))
        else:
            if "pid" in p:
                pids.add(p["pid"])
            names.add(p.get("service.name", "unknown_service"))
            merged += 1
        if p.get("start") is not None:
            starts.append(str(p["start"]))
        if p.get("end") is not None:
            ends.append(str(p["end"]))
    ordered_names = sorted(names)
    return {
        "pids": sorted(pids),
        "service.name": ", ".join(ordered_names),
        "service.names": ordered_names,
        # ISO 8601 timestamps of one format and zone order as strings.
        "start": min(starts) if starts else None,
        "end": max(ends) if ends else None,
        "merged": merged,
    }


def merge_manifests(
    manifests: Sequence[Manifest | Mapping[str, Any] | PathLike],
    *,
    hot_lock_threshold_pct: float | None = None,
    starvation_ratio: float | None = None,
) -> Manifest:
    """Merge the manifests of several processes (or runs) exactly, then evaluate again.

    Counters and histograms add, workers are united (a single process's worker ``name``
    becomes ``"<pid>/<name>"``; workers of an already merged manifest keep their names, so a
    process merged twice counts twice), the lock-order graphs merge (a cycle closed only by
    edges from different processes is found), sections keep the largest ``count`` and
    ``max_held`` and add ``collision_waits``, and the nominal pool size is the one a parent
    learnt from its executor (else from the environment; the largest such). The result does
    not depend on the order of the inputs nor on how they are grouped.

    Args:
        manifests: :class:`Manifest` objects, manifest dicts (as loaded from JSON; their digest
            is checked) or paths of manifest files.
        hot_lock_threshold_pct: as for :func:`evaluate`; by default the threshold all inputs
            share, else the environment's or the default.
        starvation_ratio: likewise.

    Raises:
        ValueError: no manifests, or a threshold out of range.
        ManifestError: a path or dict is not a valid, unedited manifest.
        TypeError: an item is neither a Manifest, a dict nor a path.
    """
    items = [_as_manifest(m) for m in manifests]
    if not items:
        raise ValueError("merge_manifests needs at least one manifest")

    locks: dict[str, dict[str, Any]] = {}
    workers: dict[str, dict[str, int]] = {}
    blocking: dict[str, dict[str, int]] = {}
    sections: dict[str, dict[str, int]] = {}
    orders: list[dict[str, Any]] = []
    pools: list[tuple[int, int, str | None]] = []
    processes: list[Mapping[str, Any]] = []

    for m in items:
        data = _normalize(m._doc)
        process = data["process"]
        processes.append(process)
        # Workers of an already merged manifest are prefixed already.
        prefix = "" if "pids" in process else f"{process.get('pid', '?')}/"
        prefixed = bool(prefix)

        def rename(name: str, prefix: str = prefix) -> str:
            return prefix + name

        for name, lock in data["locks"].items():
            into = locks.get(name)
            if into is None:
                into = locks[name] = {
                    "kind": lock["kind"],
                    **{k: 0 for k in _LOCK_COUNTERS},
                    "wait_ns": LogHistogram(),
                    "hold_ns": LogHistogram(),
                    "workers": {},
                }
            into["kind"] = min(into["kind"], lock["kind"])
            for k in _LOCK_COUNTERS:
                into[k] += lock[k]
            into["wait_ns"].merge(lock["wait_ns"])
            into["hold_ns"].merge(lock["hold_ns"])
            per_worker = into["workers"]
            for worker, w in lock["workers"].rows.items():
                key = rename(worker)
                acc = per_worker.get(key)
                per_worker[key] = w if acc is None else tuple(map(operator.add, acc, w))
        for worker, w in data["workers"].items():
            key = rename(worker)
            acc = workers.get(key)
            if acc is None:
                workers[key] = dict(w)
            else:
                for k in _WORKER_FIELDS:
                    acc[k] += w[k]
        for lock_name, spans in data["blocking_under_lock"].items():
            acc = blocking.setdefault(lock_name, {})
            for span, n in spans.items():
                acc[span] = acc.get(span, 0) + n
        for name, s in data["sections"].items():
            acc = sections.get(name)
            if acc is None:
                sections[name] = dict(s)
            else:
                acc["count"] = max(acc["count"], s["count"])
                acc["max_held"] = max(acc["max_held"], s["max_held"])
                acc["collision_waits"] += s["collision_waits"]
        order = data["lock_order"]
        if prefixed:
            for e in order["edges"]:
                if isinstance(e.get("worker"), str):
                    e["worker"] = rename(e["worker"])
            for c in order["cycles"]:
                for e in c.get("edges", []):
                    if isinstance(e, dict) and isinstance(e.get("worker"), str):
                        e["worker"] = rename(e["worker"])
        orders.append(order)
        pool = data["pool"]
        if pool["nominal"] is not None:
            rank = _POOL_SOURCE_RANK.get(pool["source"], len(_POOL_SOURCE_RANK))
            pools.append((rank, -pool["nominal"], pool["source"]))

    for lock in locks.values():
        lock["workers"] = _WorkerTotals(lock["workers"])
    if pools:
        rank, neg, source = min(pools, key=lambda t: (t[0], t[1], t[2] or ""))
        merged_pool: dict[str, Any] = {"nominal": -neg, "source": source}
    else:
        merged_pool = {"nominal": None, "source": None}

    merged = {
        "locks": locks,
        "workers": workers,
        "lock_order": _merge_lock_order(orders),
        "blocking_under_lock": blocking,
        "sections": sections,
        "pool": merged_pool,
        "process": _merge_process(processes),
    }

    def shared(key: str) -> float | None:
        values = {m._doc["thresholds"].get(key) for m in items}
        return values.pop() if len(values) == 1 else None

    hot_pct = _threshold(
        hot_lock_threshold_pct if hot_lock_threshold_pct is not None
        else shared("hot_lock_threshold_pct"),
        ENV_HOT_LOCK_THRESHOLD_PCT, DEFAULT_HOT_LOCK_THRESHOLD_PCT,
        _hot_pct_ok, "hot_lock_threshold_pct", "a number in (0, 100]",
    )  # fmt: skip
    ratio = _threshold(
        starvation_ratio if starvation_ratio is not None else shared("starvation_ratio"),
        ENV_STARVATION_RATIO, DEFAULT_STARVATION_RATIO,
        _ratio_ok, "starvation_ratio", "a number > 1",
    )  # fmt: skip
    return _evaluate_normalized(merged, hot_pct, ratio, None)
