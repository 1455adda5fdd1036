"""The HTML report's timeline chart: wait and hold of each lock class per slice of the run.

One row per class (the most wait first, at most 8: the manifest's timeline keeps no more), all
rows on one time axis. In each bucket a grey bar is the time the class was held and an orange
bar, drawn over it, the time it was waited for, both on the row's own scale (its peak is
written at the row's right), so a burst (a checkpoint, a cache flush) stands out from steady
contention whatever the class's total. The name sits on a line of its own above its row,
cut to the room left of the peak figure; the axis labels sit under the last row.
"""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

__all__ = ["svg_timeline"]

_e = html.escape
_CHAR = 7.6  # an upper bound of a character's advance at 12 px, monospaced
WIDTH = 720  # fits the page's column at 800 px


def _seconds(ms: float) -> str:
    return f"{ms / 1000:.3g} s" if ms < 100_000 else f"{ms / 1000:.0f} s"


def svg_timeline(timeline: Mapping[str, Any] | None, duration: Any) -> str:
    """``svg#timeline-chart`` of a report's ``timeline`` (``_report_points.timeline_report``),
    figures written with ``duration`` (ms -> text); a one-line note without one."""
    if not timeline:
        return '<p class="muted" id="timeline-none">No timeline in this manifest.</p>'
    rows = timeline["locks"]
    n, width_ms = timeline["buckets"], timeline["width_ms"]
    left, right, label_h, plot_h, gap, top = 8, 8, 18, 34, 10, 4
    plot_w = WIDTH - left - right
    row_h = label_h + plot_h + gap
    height = top + row_h * len(rows) + 20
    slot = plot_w / n
    parts = [
        f'<svg id="timeline-chart" xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" '
        f'height="{height}" viewBox="0 0 {WIDTH} {height}" role="img" '
        f'aria-label="wait and hold of each lock class over the run">'
    ]
    for k, row in enumerate(rows):
        y0 = top + k * row_h
        base = y0 + label_h + plot_h
        peak = max(max(row["wait_ms"]), max(row["hold_ms"])) or 1.0
        figure = f"peak {duration(peak)} per {_seconds(width_ms)}"
        room = int((plot_w - _CHAR * len(figure) - 16) // _CHAR)
        name = row["lock"] if len(row["lock"]) <= room else row["lock"][: max(1, room - 1)] + "…"
        parts.append(
            f'<g class="timeline-row" data-lock="{_e(row["lock"])}">'
            f'<text x="{left}" y="{y0 + 13}">{_e(name)}<title>{_e(row["lock"])}</title></text>'
            f'<text x="{WIDTH - right}" y="{y0 + 13}" text-anchor="end" class="muted">'
            f"{_e(figure)}</text>"
            f'<line class="axis" x1="{left}" y1="{base}" x2="{left + plot_w}" y2="{base}"/>'
        )
        for cls, series in (("bar hold", row["hold_ms"]), ("bar wait", row["wait_ms"])):
            for i, v in enumerate(series):
                if v <= 0:
                    continue
                h = max(1.0, plot_h * v / peak)
                parts.append(
                    f'<rect class="{cls}" x="{left + i * slot:.1f}" y="{base - h:.1f}" '
                    f'width="{max(slot - 0.5, 0.8):.1f}" height="{h:.1f}"/>'
                )
        parts.append("</g>")
    axis_y = top + row_h * len(rows) + 12
    span = n * width_ms
    parts.append(
        f'<text x="{left}" y="{axis_y}" class="muted">0 s</text>'
        f'<text x="{WIDTH / 2:.0f}" y="{axis_y}" text-anchor="middle" class="muted">'
        f"buckets of {_e(_seconds(width_ms))}; grey: held, orange: waited</text>"
        f'<text x="{WIDTH - right}" y="{axis_y}" text-anchor="end" class="muted">'
        f"{_e(_seconds(span))}</text>"
    )
    parts.append("</svg>")
    return "".join(parts)
