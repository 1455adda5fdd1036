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

A merge streams: :class:`ManifestFold` takes one manifest (or one data part read from a file or
a Collector's record) at a time and keeps only the merged data, so a fleet of ten thousand
processes costs the memory of its lock classes, not of its manifests. The one part of the data
that grows with the processes, their workers (``<pid>/<name>``), is bounded per lock class
(:data:`MAX_MERGED_WORKERS`, the longest waits kept, the others summed exactly into one row).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from .._settings import SETTINGS
from ..exceptions import ManifestError
from ..record._data import DataFold, WorkerTotals
from ._check import MAX_POOL_SIZE, check_doc, check_json
from ._data import normalize
from ._evaluate import evaluate_normalized
from ._io import DEFAULT_MAX_BYTES, PathLike, load_mergeable
from ._model import Manifest

__all__ = ["MAX_MERGED_WORKERS", "ManifestFold", "merge_manifests"]

#: The workers a merge keeps per lock class by default (the longest waits; the others are
#: summed into one row); 16 times as many at the top level.
MAX_MERGED_WORKERS = 256


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


class _Processes:
    """The merged ``process`` field, folded one process (or merged manifest) at a time: the
    pids and service names seen, the first start, the last end, how many were merged."""

    __slots__ = ("ends", "merged", "names", "pids", "starts")

    def __init__(self) -> None:
        self.pids: set[int] = set()
        self.names: set[str] = set()
        self.starts: str | None = None
        self.ends: str | None = None
        self.merged = 0

    def add(self, p: Mapping[str, Any]) -> None:
        if "pids" in p:
            self.pids.update(p["pids"])
            self.names.update(p.get("service.names", [p.get("service.name", "unknown_service")]))
            self.merged += p.get("merged", len(p["pids"]))
        else:
            if "pid" in p:
                self.pids.add(p["pid"])
            self.names.add(p.get("service.name", "unknown_service"))
            self.merged += 1
        # ISO 8601 timestamps of one format and zone order as strings.
        if p.get("start") is not None:
            start = str(p["start"])
            self.starts = start if self.starts is None else min(self.starts, start)
        if p.get("end") is not None:
            end = str(p["end"])
            self.ends = end if self.ends is None else max(self.ends, end)

    def result(self) -> dict[str, Any]:
        ordered_names = sorted(self.names)
        return {
            "pids": sorted(self.pids),
            "service.name": ", ".join(ordered_names),
            "service.names": ordered_names,
            "start": self.starts,
            "end": self.ends,
            "merged": self.merged,
        }


#: The thresholds a merge carries over when every input shares them.
_THRESHOLDS = ("hot_lock_threshold_pct", "starvation_ratio")


class _Differ:
    """The value of a threshold the inputs do not share (pickled as this module's one)."""

    def __reduce__(self) -> str:
        return "_DIFFER"


_DIFFER = _Differ()


class ManifestFold:
    """Manifests merged one at a time, in memory bounded by what they hold in common.

    What it keeps is the merged data (:class:`~..record._data.DataFold`: per lock class and
    edge, with at most about ``max_workers`` workers per class), the pids and service names,
    and one value per threshold; never a list of the manifests. :meth:`result` is
    :func:`merge_manifests` of every manifest added.

    Args:
        max_workers: the workers kept per lock class (``None``: all); see
            :data:`MAX_MERGED_WORKERS`.
    """

    __slots__ = ("_data", "_processes", "_thresholds", "count")

    def __init__(self, max_workers: int | None = MAX_MERGED_WORKERS) -> None:
        self._data = DataFold(max_workers)
        self._processes = _Processes()
        self._thresholds: dict[str, Any] = {}
        #: How many manifests (or records) were added.
        self.count = 0

    def add_data(self, data: dict[str, Any], thresholds: Mapping[str, Any]) -> None:
        """Fold in one normalized data part (``_data.normalize``; it is taken over) and the
        thresholds of the manifest it came from."""
        _qualify_workers(data)
        self._data.add(data)
        self._processes.add(data["process"])
        self._add_thresholds(thresholds)
        self.count += 1

    def add_fold(self, other: ManifestFold) -> None:
        """Fold in every manifest another fold took (a share of the inputs folded in another
        process), as if each were added here; ``other`` is spent after."""
        if not other.count:
            return
        self._data.add(other._data.partial())
        self._processes.add(other._processes.result())
        self._add_thresholds(other._thresholds)
        self.count += other.count

    def _add_thresholds(self, thresholds: Mapping[str, Any]) -> None:
        for key in _THRESHOLDS:
            value = thresholds.get(key)
            if self.count == 0:
                self._thresholds[key] = value
            elif self._thresholds[key] is not _DIFFER and (
                value is _DIFFER or self._thresholds[key] != value
            ):
                self._thresholds[key] = _DIFFER

    def add(self, manifest: Manifest) -> None:
        """Fold in a manifest (it is not modified)."""
        self.add_data(normalize(manifest._doc), manifest._doc["thresholds"])

    def result(
        self,
        hot_lock_threshold_pct: float | None = None,
        starvation_ratio: float | None = None,
    ) -> Manifest:
        """The merged manifest, evaluated again (see :func:`merge_manifests`).

        Raises:
            ValueError: nothing was added, or a threshold is out of range.
            ManifestError: the merged counts leave the range a manifest may hold, or its nominal
            pool size passes :data:`~._check.MAX_POOL_SIZE`.
        """
        if not self.count:
            raise ValueError("merge_manifests needs at least one manifest")
        merged = self._data.result()
        merged["process"] = self._processes.result()

        def shared(key: str) -> Any:
            value = self._thresholds[key]
            return None if value is _DIFFER else value

        hot_pct, ratio = (
            SETTINGS[key].resolve(argument if argument is not None else shared(key))
            for key, argument in (
                ("hot_lock_threshold_pct", hot_lock_threshold_pct),
                ("starvation_ratio", starvation_ratio),
            )
        )
        result = evaluate_normalized(merged, hot_pct, ratio, SETTINGS["pool_size"].resolve(), "env")
        # Peak workers add up over a fleet (and the environment's size is not bounded): past the
        # largest size, the merged manifest could not be read back.
        if result.nominal_pool_size > MAX_POOL_SIZE:
            raise ManifestError(
                f"the merged nominal pool size {result.nominal_pool_size} is above the largest "
                f"pool size {MAX_POOL_SIZE}"
            )
        # Sums of counts below 2**63 may reach it: such a manifest could not be read back.
        check_json(result.to_dict(), "the merged manifest", surrogates=False)
        return result


def merge_manifests(
    manifests: Iterable[Manifest | Mapping[str, Any] | PathLike],
    *,
    hot_lock_threshold_pct: float | None = None,
    starvation_ratio: float | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_workers: int | None = MAX_MERGED_WORKERS,
) -> Manifest:
    """Merge the manifests of several processes (or runs) exactly, then evaluate again.

    Counters and histograms add, workers are united (a single process's worker ``name``
    becomes ``"<pid>/<name>"``; workers of an already merged manifest keep their names, so a
    process merged twice counts twice), the lock-order graphs merge (a cycle closed only by
    edges from different processes is found), sections keep the largest ``count`` and
    ``max_held`` and add ``collision_waits``, and the nominal pool size is the one a parent
    learnt from its executor (else from the environment; the largest such). The result does
    not depend on the order of the inputs nor on how they are grouped.

    The inputs are read and folded one at a time (an iterator is consumed lazily), so memory
    grows with the lock classes and edges, not with the number of manifests. Past
    ``max_workers`` workers on one lock class, the ones that waited longest are kept and the
    others are added into one ``(other workers)`` row (sums stay exact; see
    :class:`~..record._data.DataFold`).

    Args:
        manifests: :class:`Manifest` objects, manifest dicts (as loaded from JSON; their digest
            is checked) or paths of manifest files.
        hot_lock_threshold_pct: as for :func:`evaluate`; by default the threshold all inputs
            share, else the environment's or the default.
        starvation_ratio: likewise.
        max_bytes: the largest manifest file read (as for :func:`load_manifest`).
        max_workers: the workers kept per lock class (16 times as many at the top level);
            None keeps every one.

    Raises:
        ValueError: no manifests, or a threshold out of range.
        ManifestError: a path or dict is not a valid manifest (as :func:`load_manifest` checks
            it), or the merged counts leave the range a manifest may hold (``2**63``).
        TypeError: an item is neither a Manifest, a dict nor a path.
    """
    fold = ManifestFold(max_workers)
    for item in manifests:
        if isinstance(item, Manifest):
            fold.add(item)
        elif isinstance(item, Mapping):  # checked here and dropped: its document is taken over
            doc = check_doc(dict(item), "manifest")._doc
            fold.add_data(doc, doc["thresholds"])
        elif isinstance(item, (str, os.PathLike)):
            fold.add_data(*load_mergeable(item, max_bytes=max_bytes))
        else:
            raise TypeError(
                f"cannot merge a {type(item).__name__}: expected a Manifest, dict or path"
            )
    return fold.result(hot_lock_threshold_pct, starvation_ratio)
