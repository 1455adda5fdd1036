"""Merging the manifests of several processes (or runs) into one.

A multi-process pool spreads its contention over processes that each write a manifest. Their
data parts merge exactly (``record._data.merge_data``, the routine the recorder's snapshot is
built with), so the merged manifest is what one recorder watching every process would have
written: evaluated again from the merged data, its verdict can see a lock that is hot only when
every process's waits are added, or a cycle whose two edges were taken in two processes.

What only a merge of processes does: a single process's worker ``name`` becomes
``"<pid>/<name>"`` (workers of different processes are different workers, even with the same
thread name), and the processes themselves are listed (pids, service names, the first start and
the last end, how many manifests were merged).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from .._settings import SETTINGS
from ..record._data import WorkerTotals, merge_data
from ._check import check_doc, check_json
from ._data import normalize
from ._evaluate import evaluate_normalized
from ._io import DEFAULT_MAX_BYTES, PathLike, load_manifest
from ._model import Manifest

__all__ = ["merge_manifests"]


def _as_manifest(item: object, max_bytes: int) -> Manifest:
    if isinstance(item, Manifest):
        return item
    if isinstance(item, Mapping):
        return check_doc(dict(item), "manifest")
    if isinstance(item, (str, os.PathLike)):
        return load_manifest(item, max_bytes=max_bytes)
    raise TypeError(f"cannot merge a {type(item).__name__}: expected a Manifest, dict or path")


def _qualify_workers(data: dict[str, Any]) -> dict[str, Any]:
    """Prefix a single process's worker names with its pid, in place; return ``data``.

    Workers of an already merged manifest (its process has ``pids``) are prefixed already. A
    lock-order edge names its worker too; the cycles are found again from the merged edges, so
    theirs need no renaming.
    """
    process = data["process"]
    if "pids" in process:
        return data
    prefix = f"{process.get('pid', '?')}/"
    for lock in data["locks"].values():
        lock["workers"] = WorkerTotals({prefix + w: r for w, r in lock["workers"].rows.items()})
        if "signal_waits" in lock:
            lock["signal_waits"]["workers"] = {
                prefix + w: t for w, t in lock["signal_waits"]["workers"].items()
            }
        if "lease" in lock:
            lock["lease"]["workers"] = {prefix + w: t for w, t in lock["lease"]["workers"].items()}
    data["workers"] = {prefix + w: totals for w, totals in data["workers"].items()}
    for edge in data["lock_order"]["edges"]:
        if isinstance(edge.get("worker"), str):
            edge["worker"] = prefix + edge["worker"]
    return data


def _merge_processes(processes: list[Mapping[str, Any]]) -> dict[str, Any]:
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
    max_bytes: int = DEFAULT_MAX_BYTES,
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
        max_bytes: the largest manifest file read (as for :func:`load_manifest`).

    Raises:
        ValueError: no manifests, or a threshold out of range.
        ManifestError: a path or dict is not a valid manifest (as :func:`load_manifest` checks
            it), or the merged counts leave the range a manifest may hold (``2**63``).
        TypeError: an item is neither a Manifest, a dict nor a path.
    """
    items = [_as_manifest(m, max_bytes) for m in manifests]
    if not items:
        raise ValueError("merge_manifests needs at least one manifest")
    datas = [_qualify_workers(normalize(m._doc)) for m in items]
    merged = merge_data(datas)
    merged["process"] = _merge_processes([data["process"] for data in datas])

    def shared(key: str) -> Any:
        values = {m._doc["thresholds"].get(key) for m in items}
        return values.pop() if len(values) == 1 else None

    hot_pct, ratio = (
        SETTINGS[key].resolve(argument if argument is not None else shared(key))
        for key, argument in (
            ("hot_lock_threshold_pct", hot_lock_threshold_pct),
            ("starvation_ratio", starvation_ratio),
        )
    )
    result = evaluate_normalized(merged, hot_pct, ratio, SETTINGS["pool_size"].resolve(), "env")
    # Sums of counts below 2**63 may reach it: such a manifest could not be read back.
    check_json(result.to_dict(), "the merged manifest", surrogates=False)
    return result
