"""A worker state's data parts: what the recorder's snapshot merges, one worker at a time.

Each worker state gives one part per lock class it touched (its counters, its wait and hold
histograms, its contention points) and one of its own (its observed time, its spans started
under a lock); ``_data.merge_data`` merges them, as it merges manifests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ._data import WorkerTotals
from ._histogram import from_buckets
from ._sites import read_points, with_unfiled

__all__ = ["state_parts", "stats_data", "track_section"]


def state_parts(state: Any, now: int) -> Iterator[dict[str, Any]]:
    """One worker state's data parts: one per lock class it touched, then the worker's own."""
    wait = 0
    for cls, s in list(state.stats.items()):
        wait += s.wait_total_ns
        yield {"locks": {cls.name: stats_data(cls.kind, state.worker, s)}}
    end = now if state.held else state.last_event_ns()
    spans: dict[str, dict[str, int]] = {}
    for (lock_name, span_name), n in list(state.spans.items()):
        spans.setdefault(lock_name, {})[span_name] = n
    yield {
        "workers": {
            state.worker: {
                "observed_ns": max(0, end - state.first) + state.retired,
                "wait_ns": wait,
            }
        },
        "blocking_under_lock": spans,
    }


def stats_data(kind: str, worker: str, s: Any) -> dict[str, Any]:
    """One worker's statistics for one lock class, as a lock's entry of the data part.

    Every blocking attempt is a wait sample; the uncontended ones (``acq - tryok + tmo``
    attempts minus ``cont`` contended ones) are samples of 0, which the hot path never wrote.
    """
    points, contentions, wait_total = read_points(s)  # the points first: never ahead
    blocking = s.acquisitions - s.try_acquisitions + s.timeouts
    return {
        "kind": kind,
        "acquisitions": s.acquisitions,
        "contentions": contentions,
        "skipped": s.skipped,
        "timeouts": s.timeouts,
        "wait_ns": from_buckets(
            s.wait_histogram,
            wait_total,
            s.wait_min_ns if s.wait_histogram else 0,
            s.wait_max_ns,
            zeros=blocking - contentions,
        ),
        "hold_ns": from_buckets(
            s.hold_histogram,
            s.hold_total_ns,
            s.hold_min_ns if s.hold_histogram else 0,
            s.hold_max_ns,
        ),
        "workers": WorkerTotals(
            {worker: (s.acquisitions, contentions, wait_total, s.hold_total_ns)}
        ),
        **with_unfiled(points, contentions, wait_total),
    }


def track_section(track: Any) -> dict[str, int]:
    """A section array's count and the most sections held at once (its ``ArrayTrack``)."""
    return {"count": track.count, "max_held": track.max_held, "collision_waits": 0}
