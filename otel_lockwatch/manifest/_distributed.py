"""Distributed locks in a manifest: key templates, lease overruns, release failures.

A Redis lock or a file lock is a lock entry like any other (its waits and holds count in the hot
locks, the starvation and the lock order as a local lock's do). Its entry may carry three more
fields, which this module checks (:func:`with_distributed_fields`, called by the normalizer) and
reports (:func:`distributed_reports`):

- ``key_templates``: the templates of its keys (``lock:order:*``), at most 16, sorted;
- ``lease`` (Redis locks taken with a ``timeout``): ``overruns``, ``overrun_ns`` (their total
  past the lease), ``overrun_max_ns``, and per worker ``{overruns, overrun_ns}``;
- ``release_failures``: ``{not_owned, lock_error}``.

**A lease overrun is a correctness fault**, not a slowdown: Redis expired the key while its
holder still worked, so another worker may have held the lock at the same time. It outranks
every other finding: the verdict is ``LEASE_OVERRUN_DETECTED`` whenever one is recorded, above
``CYCLIC_ORDERING_DETECTED`` (a deadlock that has not happened; an overrun is an exclusion that
already failed), and the recommended pool size is halved, as for a cycle (fewer workers, less
load on whatever made the holds run long). ``lease_overruns`` names each lock class and worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..record._data import FAILURE_KINDS, LEASE_WORKER_FIELDS, MAX_TEMPLATES

__all__ = ["DISTRIBUTED_DERIVED_FIELDS", "distributed_reports", "with_distributed_fields"]

#: The derived fields this module computes (absent from manifests written before them).
DISTRIBUTED_DERIVED_FIELDS = ("lease_overruns", "release_failures")

_NS_PER_MS = 1_000_000
_LEASE_COUNTS = ("overruns", "overrun_ns", "overrun_max_ns")


def _count(v: object, where: str) -> int:
    if type(v) is not int or not 0 <= v < 2**63:  # noqa: E721  (bool is not a count)
        raise ValueError(f"{where} must be an int in [0, 2**63), got {v!r}")
    return v


def _mapping(v: object, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise ValueError(f"{where} must be an object, got {type(v).__name__}")
    return v


def _templates(v: object, where: str) -> list[str]:
    if not isinstance(v, list) or not all(isinstance(t, str) for t in v):
        raise ValueError(f"{where} must be a list of str")
    if len(v) > MAX_TEMPLATES or v != sorted(set(v)):
        raise ValueError(f"{where} must be at most {MAX_TEMPLATES} distinct str, sorted")
    return list(v)


def _lease(v: object, where: str) -> dict[str, Any]:
    v = _mapping(v, where)
    out: dict[str, Any] = {k: _count(v.get(k), f"{where}.{k}") for k in _LEASE_COUNTS}
    if out["overrun_max_ns"] > out["overrun_ns"]:
        raise ValueError(f"{where}.overrun_max_ns must be at most its overrun_ns")
    workers: dict[str, dict[str, int]] = {}
    for worker, w in _mapping(v.get("workers", {}), f"{where}.workers").items():
        at = f"{where}.workers[{worker!r}]"
        w = _mapping(w, at)
        workers[worker] = {k: _count(w.get(k), f"{at}.{k}") for k in LEASE_WORKER_FIELDS}
    if sum(w["overruns"] for w in workers.values()) != out["overruns"]:
        raise ValueError(f"{where}.workers' overruns must add up to its overruns")
    out["workers"] = workers
    return out


def with_distributed_fields(data: Mapping[str, Any], norm: dict[str, Any]) -> dict[str, Any]:
    """Check the distributed-lock fields of ``data``'s locks and copy them into ``norm``.

    Each is copied only when present, so a data part written before them normalizes as it
    always did.

    Returns:
        ``norm``.

    Raises:
        ValueError: a field is malformed; the message names it.
    """
    locks = data.get("locks", {})
    for name, lock in norm["locks"].items():
        entry = locks[name]
        if (
            "key_templates" not in entry
            and "lease" not in entry
            and "release_failures" not in entry
        ):
            continue
        where = f"locks[{name!r}]"
        if "key_templates" in entry:
            lock["key_templates"] = _templates(entry["key_templates"], f"{where}.key_templates")
        if "lease" in entry:
            lock["lease"] = _lease(entry["lease"], f"{where}.lease")
        if "release_failures" in entry:
            at = f"{where}.release_failures"
            failures = _mapping(entry["release_failures"], at)
            lock["release_failures"] = {
                k: _count(failures.get(k), f"{at}.{k}") for k in FAILURE_KINDS
            }
    return norm


def distributed_reports(
    locks: Mapping[str, Any],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The derived ``lease_overruns`` and ``release_failures`` of a normalized data part.

    ``lease_overruns``: one ``{lock, worker, overruns, overrun_ms}`` per lock class and worker
    with an overrun, the largest total first. ``release_failures``: one ``{lock, not_owned,
    lock_error}`` per lock class with a failure, by name.
    """
    overruns: list[tuple[int, str, str, int]] = []
    failures: list[dict[str, Any]] = []
    for name, lock in locks.items():
        lease = lock.get("lease")
        if lease is not None:
            for worker, w in lease["workers"].items():
                if w["overruns"]:
                    overruns.append((w["overrun_ns"], name, worker, w["overruns"]))
        failed = lock.get("release_failures")
        if failed is not None and any(failed.values()):
            failures.append({"lock": name, **{k: failed[k] for k in FAILURE_KINDS}})
    overruns.sort(key=lambda t: (-t[0], t[1], t[2]))
    failures.sort(key=lambda f: f["lock"])
    return (
        [
            {"lock": name, "worker": worker, "overruns": n, "overrun_ms": ns / _NS_PER_MS}
            for ns, name, worker, n in overruns
        ],
        failures,
    )
