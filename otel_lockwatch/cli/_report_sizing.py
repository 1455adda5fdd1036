"""How the recommended pool size was derived, as the reports show it (``docs/sizing.md``).

One line per bottleneck (what it supports, and from what), the recommendation's arithmetic,
the threads that are not the pool's workers, and the predicted throughput by worker count: as
text bars in the terminal (:func:`sizing_lines`) and as a curve in the HTML page
(:func:`svg_sizing`, ``svg#sizing-chart``). The report reads a manifest it may not have
written (a legacy one has no ``sizing``): every field is read defensively, and a part that is
not there is not shown.
"""

from __future__ import annotations

import html
import math
from collections.abc import Callable, Mapping
from typing import Any

__all__ = [
    "bottleneck_line",
    "recommendation_line",
    "sizing_lines",
    "sizing_report",
    "sizing_section",
    "svg_sizing",
]

_e = html.escape
#: The terminal's curve: a bar this many characters wide at 100 %.
_BAR = 24
_BLOCKS = " ▏▎▍▌▋▊▉█"
WIDTH = 720  # fits the HTML page's column at 800 px
#: Why a bottleneck is sized by saturation, by its ``capacity_source``.
_SOURCES = {
    "several instances": "capacity unknown: several locks of the class were held at once",
    "unknown": "capacity unknown",
    "declared": "its capacity holds no hold time",
}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def sizing_report(manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    """The report's ``sizing``: the manifest's, with only well-formed parts kept; None without."""
    raw = manifest.get("sizing")
    if not isinstance(raw, Mapping):
        return None
    bottlenecks = [b for b in raw.get("bottlenecks") or [] if isinstance(b, Mapping)]
    curve = []
    for point in raw.get("predicted_throughput_pct") or []:
        if isinstance(point, list) and len(point) == 2:
            k, pct = point
            if isinstance(k, int) and not isinstance(k, bool) and _number(pct) is not None:
                curve.append((k, float(pct)))
    apart = manifest.get("other_threads")
    apart = apart if isinstance(apart, Mapping) else {}
    names = [n for n in apart.get("names") or [] if isinstance(n, str)]
    return {
        "basis": str(raw.get("basis", "")),
        "reason": str(raw.get("reason", "")),
        "workers_supported": _number(raw.get("workers_supported")),
        "busy_workers": _number(raw.get("busy_workers")),
        "headroom_pct": _number(raw.get("headroom_pct")),
        "bottlenecks": [dict(b) for b in bottlenecks],
        "curve": curve,
        "recommended": manifest.get("recommended_pool_size"),
        "nominal": manifest.get("nominal_pool_size"),
        "apart": {"count": apart.get("count"), "names": names},
    }


def bottleneck_line(b: Mapping[str, Any]) -> str:
    """``config (threading.Lock): supports 3.92 workers by Little's law (...); costs 76 % ...``."""
    supports = _number(b.get("workers_supported"))
    head = f"{b.get('name', '?')} ({b.get('kind', '?')}): supports "
    head += "?" if supports is None else f"{supports:.3g}"
    u, capacity = _number(b.get("utilization_per_worker")), b.get("capacity")
    if b.get("method") == "littles_law" and u is not None:
        how = (
            f" workers by Little's law (held {100 * u:.3g} % of a worker's busy time, "
            f"capacity {capacity})"
        )
    else:
        source = _SOURCES.get(str(b.get("capacity_source")), "capacity unknown")
        how = f" workers, the most the run kept busy ({source})"
    cost = _number(b.get("cost_pct"))
    tail = "" if cost is None else f"; its waits cost {cost:.3g} % of the workers' time"
    return head + how + tail


def recommendation_line(sizing: Mapping[str, Any]) -> str:
    """``recommended 7: 6.24 workers x 1.1, rounded up``, or why the verdict's share applied."""
    rec, nominal = sizing["recommended"], sizing["nominal"]
    supported, headroom = sizing["workers_supported"], sizing["headroom_pct"]
    if sizing["basis"] != "measured":
        return f"recommended {rec}: the verdict's share of {nominal} ({sizing['reason']})"
    if supported is None:
        return f"recommended {rec}: {sizing['reason']}"
    factor = 1 + (headroom or 0) / 100
    wanted = math.ceil(supported * factor - 1e-9)
    capped = (
        " (capped at the nominal size)" if isinstance(nominal, int) and wanted > nominal else ""
    )
    return f"recommended {rec}: {supported:.3g} workers x {factor:g}, rounded up{capped}"


def _bar(pct: float) -> str:
    eighths = max(0, min(_BAR * 8, round(_BAR * 8 * pct / 100)))
    full, part = divmod(eighths, 8)
    return ("█" * full + (_BLOCKS[part] if part else "")).ljust(_BAR)


def _shown_points(curve: list[tuple[int, float]], recommended: Any) -> list[tuple[int, float]]:
    """The curve's points up to the first that reaches 100 % and the recommended size, then
    the last (the nominal size): the plateau is one line, not sixteen."""
    shown = []
    for k, pct in curve:
        shown.append((k, pct))
        if pct >= 100.0 and (not isinstance(recommended, int) or k >= recommended):
            break
    if curve and shown[-1] != curve[-1]:
        shown.append(curve[-1])
    return shown


def sizing_lines(sizing: Mapping[str, Any], style: Callable[[str], str]) -> list[str]:
    """The terminal's sizing section (``style`` dims the secondary text)."""
    out = [f"  {recommendation_line(sizing)}"]
    if sizing["basis"] == "measured" and sizing["bottlenecks"]:
        out += [f"  {bottleneck_line(b)}" for b in sizing["bottlenecks"]]
    apart = sizing["apart"]
    if apart["count"]:
        names = ", ".join(apart["names"])
        if apart["count"] > len(apart["names"]):
            names += ", ..."
        out.append(style(f"  not the pool's workers (they share no lock with it): {names}"))
    points = _shown_points(sizing["curve"], sizing["recommended"])
    if points:
        out.append(style("  predicted throughput by workers (share of the run's)"))
        previous = None
        for k, pct in points:
            if previous is not None and k > previous + 1:
                out.append(style("     ..."))
            mark = "  <- recommended" if k == sizing["recommended"] else ""
            out.append(f"    {k:>3} {_bar(pct)} {pct:5.1f} %{mark}")
            previous = k
    return out


def sizing_section(
    sizing: Mapping[str, Any] | None, bold: Callable[[str], str], dim: Callable[[str], str]
) -> list[str]:
    """The terminal's sizing section with its heading, after a blank line; none without."""
    if sizing is None:
        return []
    return ["", bold(f"sizing ({sizing['basis']}: docs/sizing.md)"), *sizing_lines(sizing, dim)]


def svg_sizing(sizing: Mapping[str, Any] | None) -> str:
    """``svg#sizing-chart``: the predicted throughput by worker count, the recommended size and
    the nominal one marked; a one-line note when the manifest has no curve."""
    if not sizing or not sizing["curve"]:
        reason = sizing["reason"] if sizing else "this manifest has no sizing"
        return f'<p class="muted" id="sizing-none">No predicted throughput: {_e(reason)}.</p>'
    curve = sizing["curve"]
    left, right, top, plot_h = 48, 16, 32, 180
    height = top + plot_h + 40
    plot_w = WIDTH - left - right
    last = curve[-1][0]

    def x(k: float) -> float:
        return left + plot_w * (k - 1) / max(1, last - 1)

    def y(pct: float) -> float:
        return top + plot_h * (1 - min(pct, 100.0) / 100)

    parts = [
        f'<svg id="sizing-chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="predicted throughput by number of workers">',
        f'<line class="axis" x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
        f'y2="{top + plot_h}"/>',
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}"/>',
        f'<text x="{left - 6}" y="{top + 4}" text-anchor="end">100 %</text>',
        f'<text x="{left}" y="14" class="muted">predicted throughput, as a share of '
        f"the run's, by number of workers</text>",
        f'<text x="{left - 6}" y="{top + plot_h + 4}" text-anchor="end">0</text>',
    ]
    path = " ".join(f"{x(k):.1f},{y(pct):.1f}" for k, pct in curve)
    parts.append(f'<polyline class="edge" points="{path}"/>')
    for k, pct in curve:
        parts.append(
            f'<circle class="point" data-workers="{k}" cx="{x(k):.1f}" cy="{y(pct):.1f}" r="3" '
            f'fill="#0969da"><title>{k} workers: {pct:.1f} %</title></circle>'
        )
    rec = sizing["recommended"]
    if isinstance(rec, int) and not isinstance(rec, bool) and 1 <= rec <= last:
        parts.append(
            f'<line class="threshold" id="sizing-recommended" x1="{x(rec):.1f}" y1="{top}" '
            f'x2="{x(rec):.1f}" y2="{top + plot_h}"/>'
            f'<text x="{x(rec):.1f}" y="{top + plot_h + 30}" text-anchor="middle" class="muted">'
            f"recommended {rec}</text>"
        )
    for k in sorted({1, last}):
        parts.append(
            f'<text x="{x(k):.1f}" y="{top + plot_h + 16}" text-anchor="middle">{k}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)
