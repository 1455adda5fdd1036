"""Contention points, contending points and the timeline in a manifest: checked as strictly as
the rest of the data (:func:`with_points_fields`, called by the normalizer).

A lock entry may carry (``record._sites``):

- ``contention_points``: ``{site: wait histogram}``, the sites that waited;
- ``contending_points``: ``{site: {count, wait_ns}}``, the sites that held the lock when a
  waiter arrived, and the wait they caused.

Both or neither; at most :data:`MAX_SITES` sites each (4 x the largest ``contention_points``
setting, and ``(other)``); every site a non-empty str of at most :data:`MAX_SITE_CHARS`
characters; every count at least 1; and each table adds up to the lock's contentions and to
the sum of its wait histogram, exactly (so no site can be invented or dropped by hand).

The data may carry a ``timeline`` (``record._timeline``): ``width_ms`` 100 ms times a power of
two (at most 2**40), ``start_ms`` a multiple of it, ``buckets`` in ``[1, 256]``, at most 8
classes, each one of the data's locks, each series ``buckets`` counts long, and no class's
series adding up to more than its wait or hold total (a sample is taken before the totals are
read, so it may be behind them, never ahead).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._settings import MAX_CONTENTION_POINTS
from ..record._histogram import LogHistogram
from ..record._sites import POINT_FIELDS
from ..record._timeline import BASE_MS, MAX_BUCKETS, MAX_LOCKS, SERIES

__all__ = ["MAX_SITES", "MAX_SITE_CHARS", "with_points_fields"]

#: The most sites a lock's points table has: 4 x the largest setting, and ``(other)``.
MAX_SITES = 4 * MAX_CONTENTION_POINTS + 1
#: The longest site (``module:function:line``).
MAX_SITE_CHARS = 1000
_MAX_DOUBLINGS = 40
_FIELDS = ("contention_points", "contending_points")


def _count(v: object, where: str, least: int = 0) -> int:
    if type(v) is not int or not least <= v < 2**63:  # noqa: E721  (bool is not a count)
        raise ValueError(f"{where} must be an int in [{least}, 2**63), got {_shown(v)}")
    return v


def _shown(v: object) -> str:
    text = repr(v)
    return text if len(text) <= 80 else f"{text[:80]}...(+{len(text) - 80} chars)"


def _mapping(v: object, where: str) -> Mapping[str, Any]:
    if not isinstance(v, Mapping):
        raise ValueError(f"{where} must be an object, got {type(v).__name__}")
    return v


def _sites(v: object, where: str) -> Mapping[str, Any]:
    v = _mapping(v, where)
    if len(v) > MAX_SITES:
        raise ValueError(f"{where} must have at most {MAX_SITES} sites, got {len(v)}")
    for site in v:
        if not isinstance(site, str) or not 0 < len(site) <= MAX_SITE_CHARS:
            raise ValueError(
                f"{where} keys must be sites of 1 to {MAX_SITE_CHARS} chars, got {_shown(site)}"
            )
    return v


def _histogram(v: object, where: str) -> LogHistogram:
    if isinstance(v, LogHistogram):
        h = v.copy()
    else:
        try:
            h = LogHistogram.from_json(_mapping(v, where))
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None
    for key in ("sum", "max"):
        _count(getattr(h, key), f"{where}.{key}")
    _count(h.count, f"{where}.count", 1)
    return h


def _points(name: str, entry: Mapping[str, Any], lock: dict[str, Any]) -> None:
    where = f"locks[{_shown(name)}]"
    present = [field for field in _FIELDS if field in entry]
    if not present:
        return
    if len(present) == 1:
        raise ValueError(f"{where} has {present[0]} without {_FIELDS[present[0] == _FIELDS[0]]}")
    total = (lock["contentions"], lock["wait_ns"].sum)
    at = f"{where}.contention_points"
    waits = {
        site: _histogram(h, f"{at}[{_shown(site)}]")
        for site, h in _sites(entry["contention_points"], at).items()
    }
    if (sum(h.count for h in waits.values()), sum(h.sum for h in waits.values())) != total:
        raise ValueError(f"{at} must add up to the lock's contentions and wait_ns.sum")
    at = f"{where}.contending_points"
    holders: dict[str, dict[str, int]] = {}
    for site, row in _sites(entry["contending_points"], at).items():
        here = f"{at}[{_shown(site)}]"
        row = _mapping(row, here)
        if set(row) != set(POINT_FIELDS):
            raise ValueError(f"{here} must be an object with exactly {', '.join(POINT_FIELDS)}")
        holders[site] = {
            "count": _count(row["count"], f"{here}.count", 1),
            "wait_ns": _count(row["wait_ns"], f"{here}.wait_ns"),
        }
    if (
        sum(r["count"] for r in holders.values()),
        sum(r["wait_ns"] for r in holders.values()),
    ) != total:
        raise ValueError(f"{at} must add up to the lock's contentions and wait_ns.sum")
    lock["contention_points"], lock["contending_points"] = waits, holders


def _timeline(v: object, locks: Mapping[str, Any]) -> dict[str, Any]:
    v = _mapping(v, "timeline")
    if set(v) != {"width_ms", "start_ms", "buckets", "locks"}:
        raise ValueError(
            "timeline must be an object with exactly buckets, locks, start_ms, width_ms"
        )
    width = _count(v["width_ms"], "timeline.width_ms", BASE_MS)
    if (
        width % BASE_MS
        or (width // BASE_MS) & (width // BASE_MS - 1)
        or width > BASE_MS << _MAX_DOUBLINGS
    ):
        raise ValueError(
            f"timeline.width_ms must be {BASE_MS} times a power of two up to 2**{_MAX_DOUBLINGS}, "
            f"got {_shown(width)}"
        )
    start = _count(v["start_ms"], "timeline.start_ms")
    if start % width:
        raise ValueError(f"timeline.start_ms must be a multiple of width_ms, got {start}")
    n = _count(v["buckets"], "timeline.buckets", 1)
    if n > MAX_BUCKETS:
        raise ValueError(f"timeline.buckets must be at most {MAX_BUCKETS}, got {n}")
    classes = _mapping(v["locks"], "timeline.locks")
    if len(classes) > MAX_LOCKS:
        raise ValueError(
            f"timeline.locks must have at most {MAX_LOCKS} classes, got {len(classes)}"
        )
    out: dict[str, Any] = {}
    for name, series in classes.items():
        where = f"timeline.locks[{_shown(name)}]"
        if name not in locks:
            raise ValueError(f"{where} is not a lock of the data")
        series = _mapping(series, where)
        if set(series) != set(SERIES):
            raise ValueError(f"{where} must be an object with exactly {', '.join(SERIES)}")
        rows = {}
        for key, total in zip(
            SERIES, (locks[name]["wait_ns"].sum, locks[name]["hold_ns"].sum), strict=True
        ):
            row = series[key]
            if not isinstance(row, list) or len(row) != n:
                raise ValueError(f"{where}.{key} must be a list of {n} counts")
            rows[key] = [_count(x, f"{where}.{key}[{i}]") for i, x in enumerate(row)]
            if sum(rows[key]) > total:
                raise ValueError(f"{where}.{key} adds up to more than the lock's {key}.sum")
        out[name] = rows
    return {"width_ms": width, "start_ms": start, "buckets": n, "locks": out}


def with_points_fields(data: Mapping[str, Any], norm: dict[str, Any]) -> dict[str, Any]:
    """Check the points of ``data``'s locks and its timeline, and copy them into ``norm`` (each
    only when present: data written before them normalizes as it always did).

    Returns:
        ``norm``.

    Raises:
        ValueError: a field is malformed; the message names it.
    """
    locks = data.get("locks", {})
    for name, lock in norm["locks"].items():
        _points(name, locks[name], lock)
    if data.get("timeline") is not None:
        norm["timeline"] = _timeline(data["timeline"], norm["locks"])
    return norm
