"""The manifest object: its fields, its verdict, its canonical JSON and its digest.

A manifest is a document of two layers. The **data** (``record._data``) is what the recorder
measured, and merges exactly; the **derived** fields are what ``evaluate()`` computes from the
data (verdict, hot locks, starvation, ordering witnesses, throughput, pool and section sizes,
the thresholds in force). Since the derived layer is a pure function of the data, a manifest
read back from disk can be evaluated again, and the manifests of many processes merge by
merging their data.

The digest is SHA-256 over the canonical JSON (sorted keys, no whitespace, UTF-8) of every
field but the digest: ``load_manifest`` refuses a manifest whose digest does not match (a hand
edit, a damaged file). The digest has no key, so anyone who can write the file can recompute
it: ``load_manifest`` also evaluates the data again and refuses derived fields that differ, so a
successor never sizes its pool from a recommendation the manifest's own data does not give.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from ..record._data import DATA_FIELDS, WorkerTotals, expand_lock_workers
from ..record._histogram import LogHistogram
from ._data import normalize
from ._distributed import DISTRIBUTED_DERIVED_FIELDS
from ._pools import POOL_DERIVED_FIELDS

__all__ = [
    "DATA_FIELDS",
    "DERIVED_FIELDS",
    "REQUIRED_FIELDS",
    "LEGACY_SCHEMAS",
    "SCHEMA",
    "Manifest",
    "Verdict",
    "canonical_json",
    "compute_digest",
]

SCHEMA = "otel-lockwatch/manifest/4"
#: Schemas this version still reads. A manifest of schema 1 was written before resource pools
#: and the starvation share existed, one of schema 2 before distributed locks (lease overruns,
#: release failures), one of schema 3 before the measured sizing (``sizing``,
#: ``other_threads``, a recommended size derived from the bottlenecks rather than the
#: verdict): its data is checked as strictly, and its derived fields are evaluated again under
#: today's rules rather than compared (they were derived by others).
LEGACY_SCHEMAS = (
    "otel-lockwatch/manifest/1",
    "otel-lockwatch/manifest/2",
    "otel-lockwatch/manifest/3",
)

#: Every field evaluate() derives from the data part (``DATA_FIELDS``).
DERIVED_FIELDS = (
    "effective_throughput_pct",
    "hold_time_distribution",
    "hot_lock_register",
    "idle_waits",
    "lease_overruns",
    "manifest_digest",
    "nominal_pool_size",
    "other_threads",
    "pool_size_source",
    "pre_deadlock_ordering_witness",
    "recommended_pool_size",
    "release_failures",
    "resource_pools",
    "schema",
    "sizing",
    "starvation_signatures",
    "thresholds",
    "verdict",
)
#: The fields a manifest document must have (the resource-pool and distributed-lock fields are
#: newer: a manifest written before them has none, and reads as having none).
#: The sizing's fields (``_sizing``), absent from manifests of schema 3 and before.
SIZING_DERIVED_FIELDS = ("other_threads", "sizing")
_NEWER_FIELDS = POOL_DERIVED_FIELDS + DISTRIBUTED_DERIVED_FIELDS + SIZING_DERIVED_FIELDS
REQUIRED_FIELDS = tuple(
    sorted(DATA_FIELDS + tuple(f for f in DERIVED_FIELDS if f not in _NEWER_FIELDS))
)


class Verdict(str, enum.Enum):  # noqa: UP042  (kept as it is published: a str mixin)
    """The manifest's verdict, in increasing precedence."""

    LOW_CONTENTION = "LOW_CONTENTION"
    HOT_LOCK_DETECTED = "HOT_LOCK_DETECTED"
    STARVATION_OBSERVED = "STARVATION_OBSERVED"
    CYCLIC_ORDERING_DETECTED = "CYCLIC_ORDERING_DETECTED"
    LEASE_OVERRUN_DETECTED = "LEASE_OVERRUN_DETECTED"

    def __str__(self) -> str:
        return self.value


def _to_jsonable(obj: Any) -> Any:
    """A fresh JSON-ready copy of a document part (histograms in their JSON form)."""
    if isinstance(obj, dict):
        return {k: _to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to_jsonable(v) for v in obj]
    if isinstance(obj, (LogHistogram, WorkerTotals)):
        return obj.to_json()
    return obj


def _json_default(obj: Any) -> Any:
    if isinstance(obj, (LogHistogram, WorkerTotals)):
        return obj.to_json()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


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
        return _to_jsonable(obj._doc.get(self.name, []))


class Manifest:
    """A contention manifest: read-only attributes for every field, ``to_dict`` / ``to_json``.

    Build one with :func:`evaluate`, :func:`load_manifest` or :func:`merge_manifests`.
    Container attributes return copies, so the manifest cannot be changed through them.
    """

    __slots__ = ("_doc", "_digest")
    _doc: dict[str, Any]
    _digest: str | None

    schema = _Field("``otel-lockwatch/manifest/4``.")
    nominal_pool_size = _Field("The pool size the run had (int >= 1).")
    pool_size_source = _Field("Where nominal_pool_size came from: executor, env, argument...")
    recommended_pool_size = _Field("The pool size a successor should use (int >= 1).")
    sizing = _Field(
        "How recommended_pool_size was derived: ``{basis, reason, workers, busy_workers, "
        "bottlenecks, workers_supported, predicted_throughput_pct, ...}`` (docs/sizing.md)."
    )
    other_threads = _Field("``{count, observed_ms, names}``: threads that are not the workers.")
    hot_lock_register = _Field("``[{lock, wait_ms, wait_share_pct}]``, most waited-on first.")
    hold_time_distribution = _Field("``{lock: {count, p50_ms, p95_ms, max_ms}}`` of hot locks.")
    starvation_signatures = _Field("``[{worker, lock, wait_ms, median_wait_ms}]``.")
    resource_pools = _Field(
        "``[{name, kind, capacity, waits, hold, workers_supported, capacity_needed, ...}]``."
    )
    idle_waits = _Field("``[{name, kind, role, count, total_ms, workers}]``: waits for work.")
    lease_overruns = _Field("``[{lock, worker, overruns, overrun_ms}]``: leases that ran out.")
    release_failures = _Field("``[{lock, not_owned, lock_error}]``: releases refused.")
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
        return expand_lock_workers(normalize(self._doc))

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
