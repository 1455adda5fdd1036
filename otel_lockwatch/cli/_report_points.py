"""The report's contention points and timeline: where the wait comes from, and when.

For each lock class that had to be waited for (most wait first), :func:`points_report` gives
its *contention points*, the sites that waited (waits, total, p95, share of the class's wait),
and its *contending points*, the sites that held the lock when a waiter arrived (waits they
caused, their total, share): the top ``contention_points`` of each (the setting), the rest in
one ``(other)`` row, so each table adds up to the class's contentions and wait.

:func:`timeline_report` gives the manifest's timeline in milliseconds, the classes with the
most wait first. Both read the manifest as a plain dict, and skip what is malformed: a report
still renders a manifest of an older or partial writer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from otel_lockwatch._settings import SETTINGS
from otel_lockwatch.record._histogram import LogHistogram
from otel_lockwatch.record._sites import OTHER

__all__ = ["MAX_POINT_LOCKS", "points_report", "timeline_report"]

#: The lock classes whose points a report shows (the most waited-on).
MAX_POINT_LOCKS = 8
_NS_PER_MS = 1_000_000


def _int(value: Any) -> int:
    return value if type(value) is int and value >= 0 else 0  # noqa: E721


def _waiter(site: str, raw: Any) -> dict[str, Any] | None:
    try:
        h = LogHistogram.from_json(raw)
    except (TypeError, ValueError, AttributeError):
        return None
    return {
        "site": site,
        "count": h.count,
        "wait_ns": h.sum,
        "p95_ms": h.percentile(0.95) / _NS_PER_MS if h.count else None,
        "hist": h,
    }


def _holder(site: str, raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, Mapping):
        return None
    return {"site": site, "count": _int(raw.get("count")), "wait_ns": _int(raw.get("wait_ns"))}


def _top(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The ``n`` rows with the most wait, then one ``(other)`` row for the rest."""
    rows.sort(key=lambda r: (r["site"] == OTHER, -r["wait_ns"], -r["count"], r["site"]))
    kept, rest = rows[:n], rows[n:]
    if kept and kept[-1]["site"] == OTHER:
        rest.insert(0, kept.pop())
    if rest:
        other = {"site": OTHER, "count": 0, "wait_ns": 0}
        hists = [r["hist"] for r in rest if "hist" in r]
        for r in rest:
            other["count"] += r["count"]
            other["wait_ns"] += r["wait_ns"]
        if hists:
            merged = LogHistogram().merged(*hists)
            other["p95_ms"] = merged.percentile(0.95) / _NS_PER_MS if merged.count else None
        kept.append(other)
    total = sum(r["wait_ns"] for r in kept)
    out = []
    for r in kept:
        row = {k: v for k, v in r.items() if k != "hist"}
        row["wait_ms"] = row.pop("wait_ns") / _NS_PER_MS
        row["share_pct"] = 100.0 * r["wait_ns"] / total if total else 0.0
        out.append(row)
    return out


def points_report(locks: Mapping[str, Any], n: int | None = None) -> list[dict[str, Any]]:
    """``[{lock, contentions, wait_ms, waiters: [...], holders: [...]}]``, the most wait first.

    Args:
        locks: the manifest's ``locks``.
        n: the sites shown per table (default: the ``contention_points`` setting).
    """
    n = SETTINGS["contention_points"].resolve() if n is None else n
    out = []
    for name, raw in locks.items():
        if not isinstance(raw, Mapping):
            continue
        waits, holds = raw.get("contention_points"), raw.get("contending_points")
        if not isinstance(waits, Mapping) or not isinstance(holds, Mapping) or not waits:
            continue
        waiters = [w for site, h in waits.items() if (w := _waiter(str(site), h)) is not None]
        holders = [h for site, r in holds.items() if (h := _holder(str(site), r)) is not None]
        if not waiters:
            continue
        out.append(
            {
                "lock": str(name),
                "contentions": sum(w["count"] for w in waiters),
                "wait_ms": sum(w["wait_ns"] for w in waiters) / _NS_PER_MS,
                "waiters": _top(waiters, n),
                "holders": _top(holders, n),
            }
        )
    out.sort(key=lambda p: (-p["wait_ms"], p["lock"]))
    return out[:MAX_POINT_LOCKS]


def timeline_report(timeline: Any) -> dict[str, Any] | None:
    """``{width_ms, start_ms, buckets, locks: [{lock, wait_ms: [...], hold_ms: [...]}]}``, the
    most wait first; None without a (well-formed) timeline."""
    if not isinstance(timeline, Mapping):
        return None
    width, start, n = (_int(timeline.get(k)) for k in ("width_ms", "start_ms", "buckets"))
    series = timeline.get("locks")
    if not width or not n or not isinstance(series, Mapping):
        return None
    locks: list[dict[str, Any]] = []
    for name, raw in series.items():
        if not isinstance(raw, Mapping):
            continue
        rows = [raw.get("wait_ns"), raw.get("hold_ns")]
        if not all(isinstance(r, list) and len(r) == n for r in rows):
            continue
        wait, hold = ([_int(v) / _NS_PER_MS for v in r] for r in rows)  # type: ignore[union-attr]
        locks.append({"lock": str(name), "wait_ms": wait, "hold_ms": hold})
    if not locks:
        return None
    locks.sort(key=lambda s: (-sum(s["wait_ms"]), -sum(s["hold_ms"]), s["lock"]))
    return {"width_ms": width, "start_ms": start, "buckets": n, "locks": locks}
