"""Recorder snapshots built from raw acquisitions, for tests with a known ground truth."""

from __future__ import annotations

from otel_lockwatch.record._histogram import LogHistogram


def locks_and_workers(events, idle_ns: int = 0) -> tuple[dict, dict]:
    """The ``locks`` and ``workers`` parts of a snapshot of ``(worker, lock, wait_ns, hold_ns)``
    acquisitions; each worker's observed time is its waits and holds plus ``idle_ns``."""
    locks: dict = {}
    workers: dict = {}
    for worker, lock, wait, hold in events:
        entry = locks.setdefault(
            lock,
            {
                "kind": "threading.Lock",
                "acquisitions": 0,
                "contentions": 0,
                "skipped": 0,
                "timeouts": 0,
                "wait_ns": LogHistogram(),
                "hold_ns": LogHistogram(),
                "workers": {},
            },
        )
        entry["acquisitions"] += 1
        entry["contentions"] += wait > 0
        entry["wait_ns"].add(wait)
        entry["hold_ns"].add(hold)
        w = entry["workers"].setdefault(
            worker, {"acquisitions": 0, "contentions": 0, "wait_ns": 0, "hold_ns": 0}
        )
        w["acquisitions"] += 1
        w["contentions"] += wait > 0
        w["wait_ns"] += wait
        w["hold_ns"] += hold
        ww = workers.setdefault(worker, {"observed_ns": idle_ns, "wait_ns": 0})
        ww["observed_ns"] += wait + hold
        ww["wait_ns"] += wait
    return locks, workers
