"""The report as one self-contained HTML page, with its charts drawn in SVG.

The page has no script and no external resource: CSS and SVG are inline, generated here, so
the file can be mailed, attached to a CI run, or opened offline. It shows the model of
``_report_model`` in the same order as the terminal summary, with three charts: the share of the
aggregate wait per lock, the hold-time distribution of each hot lock (from its histogram when
the manifest carries one, else its p50/p95/max), and the lock-order graph in layers
(``_report_graph``: labels never crossed, the size following the graph), cycle edges in red; a
table of the resource pools, with the way out of a pool that is the bottleneck; the contention
points of the most waited-on classes; and the timeline of wait and hold
(``_report_timeline``). Tables wrap long names in their cells rather than overflow the page.
Its elements carry stable ids and classes (``#wait-share-chart``, ``.hold-chart``,
``#lock-order-graph``, ``.edge.cycle``, ``#resource-pools``, ``.bottleneck``, ``#idle-waits``,
``div.points``, ``#timeline-chart``) for tests and for anyone who wants to
restyle it.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from otel_lockwatch.cli._report_graph import MAX_GRAPH_NODES, svg_lock_order
from otel_lockwatch.cli._report_model import VERDICT_SEVERITY, build_report, finite_number
from otel_lockwatch.cli._report_sizing import bottleneck_line, recommendation_line, svg_sizing
from otel_lockwatch.cli._report_text import (
    HOLDER_HEADERS,
    MAX_CHART_LOCKS,
    POOL_HEADERS,
    WAITER_HEADERS,
    duration,
    holder_row,
    idle_line,
    integer,
    lock_row,
    percent,
    pool_row,
    process_line,
    waiter_row,
)
from otel_lockwatch.cli._report_timeline import svg_timeline

__all__ = ["render_html"]

_CSS = """
:root { --ok: #2e7d32; --warn: #ef6c00; --bad: #c62828; --ink: #1f2328; --muted: #59636e;
        --rule: #d0d7de; --bar: #6e7781; --hot: #ef6c00; --bg: #ffffff; --panel: #f6f8fa; }
* { box-sizing: border-box; }
body { margin: 0; padding: 24px 32px 48px; font: 14px/1.45 system-ui, -apple-system, "Segoe UI",
       Roboto, "Helvetica Neue", Arial, sans-serif; color: var(--ink); background: var(--bg); }
main { max-width: 1040px; margin: 0 auto; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 32px 0 8px; padding-bottom: 4px;
     border-bottom: 1px solid var(--rule); }
h3 { font-size: 14px; margin: 0 0 6px;
     font-family: ui-monospace, SFMono-Regular, Menlo, monospace; }
.muted { color: var(--muted); }
.summary { display: flex; flex-wrap: wrap; gap: 12px; margin-top: 16px; }
.card { background: var(--panel); border: 1px solid var(--rule); border-radius: 8px;
        padding: 10px 14px; min-width: 180px; }
.card .label { font-size: 12px; color: var(--muted); text-transform: uppercase;
               letter-spacing: .04em; }
.card .value { font-size: 20px; font-weight: 600; }
.verdict.ok { color: var(--ok); }
.verdict.warn { color: var(--warn); }
.verdict.bad { color: var(--bad); }
svg { display: block; max-width: 100%; height: auto; }
svg text { font: 12px ui-monospace, SFMono-Regular, Menlo, monospace; fill: var(--ink); }
svg .axis { stroke: var(--rule); }
svg .bar { fill: var(--bar); } svg .bar.hot { fill: var(--hot); }
svg .threshold { stroke: var(--bad); stroke-dasharray: 4 3; }
.hold-charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr));
               gap: 16px; }
.hold-panel { background: var(--panel); border: 1px solid var(--rule); border-radius: 8px;
              padding: 12px; }
svg.hold-chart .bar { fill: #0969da; }
svg .bar.hold { fill: #afb8c1; } svg .bar.wait { fill: var(--hot); }
.points { display: grid; grid-template-columns: repeat(auto-fill, minmax(460px, 1fr));
          gap: 16px; margin-bottom: 16px; }
svg .node rect { fill: #ffffff; stroke: var(--bar); stroke-width: 1.5; }
svg .node.cycle rect { stroke: var(--bad); stroke-width: 2.5; fill: #fff5f5; }
svg .edge { fill: none; stroke: var(--bar); stroke-width: 1.5; }
svg .edge.cycle { stroke: var(--bad); stroke-width: 2.5; }
svg .edge-label { font-size: 11px; fill: var(--muted); }
svg .edge-label.cycle { fill: var(--bad); }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { padding: 4px 6px; border-bottom: 1px solid var(--rule); text-align: right;
         vertical-align: top; }
td { white-space: nowrap; }
th { overflow-wrap: normal; }
th.text, td.text { text-align: left; white-space: normal; overflow-wrap: anywhere;
                   min-width: 5em; }
@media (max-width: 960px) {
  body { padding: 16px 16px 32px; }
  table { font-size: 12px; }
  th, td { padding: 3px 4px; }
}
code { overflow-wrap: anywhere; }
th { color: var(--muted); font-weight: 600; }
p.bottleneck { color: var(--warn); font-weight: 600; }
pre { background: var(--panel); border: 1px solid var(--rule); border-radius: 8px; padding: 12px;
      overflow-x: auto; font-size: 12.5px; white-space: pre-wrap; overflow-wrap: anywhere; }
footer { margin-top: 40px; font-size: 12px; color: var(--muted); }
"""

_e = html.escape


def _svg_wait_share(report: Mapping[str, Any]) -> str:
    """One bar per waited-on lock. The names are right-aligned left of the plot, the figures in
    a column right of it: the dashed threshold line, which crosses the plot, crosses no text."""
    rows = [row for row in report["locks"] if row["wait_ms_total"] > 0][:MAX_CHART_LOCKS]
    hot = {h["lock"] for h in report["hot_locks"]}
    threshold = finite_number(report["thresholds"].get("hot_lock_threshold_pct"))
    char = 7.6  # an upper bound of a character's advance at 12 px, monospaced
    longest = max((len(r["lock"]) for r in rows), default=8)
    label_w = min(240, max(80, math.ceil(char * longest) + 14))
    value_w, row_h, top = 132, 24, 24
    width = 720  # fits the page's column at 800 px: the chart is never scaled down there
    bar_w = width - label_w - value_w
    height = top + row_h * max(1, len(rows)) + 28
    parts = [
        f'<svg id="wait-share-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="share of the aggregate lock wait per lock">'
    ]
    parts.append(f'<text x="{label_w}" y="14" class="muted">share of the aggregate wait</text>')
    if not rows:
        parts.append(f'<text x="{label_w}" y="{top + 16}">no lock was waited on</text>')
    fit = int((label_w - 14) // char)
    for i, row in enumerate(rows):
        y = top + i * row_h
        w = max(1.0, bar_w * row["wait_share_pct"] / 100.0)
        cls = "bar hot" if row["lock"] in hot else "bar"
        name = row["lock"] if len(row["lock"]) <= fit else row["lock"][: fit - 1] + "…"
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 16}" text-anchor="end">{_e(name)}'
            f"<title>{_e(row['lock'])}</title></text>"
            f'<rect class="{cls}" data-lock="{_e(row["lock"])}" x="{label_w}" y="{y + 4}" '
            f'width="{w:.1f}" height="{row_h - 8}" rx="2"><title>{_e(row["lock"])}: '
            f"{_e(duration(row['wait_ms_total']))}, {row['wait_share_pct']:.1f} %</title></rect>"
            f'<text class="value" x="{width - 4}" y="{y + 16}" text-anchor="end">'
            f"{row['wait_share_pct']:.1f} % · {_e(duration(row['wait_ms_total']))}</text>"
        )
    axis_y = top + row_h * max(1, len(rows)) + 2
    parts.append(f'<line class="axis" x1="{label_w}" y1="{top}" x2="{label_w}" y2="{axis_y}"/>')
    if threshold is not None and rows:
        x = label_w + bar_w * min(threshold, 100.0) / 100.0
        parts.append(
            f'<line class="threshold" x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{axis_y}"/>'
            f'<text x="{x:.1f}" y="{axis_y + 16}" text-anchor="middle" class="muted">'
            f"hot ≥ {threshold:g} %</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _hold_bins(hold: Mapping[str, Any]) -> tuple[list[tuple[str, float, str]], str]:
    """Bars of a hold-time chart: ``(label, value, tooltip)`` and the value axis's meaning."""
    buckets = hold.get("buckets")
    if buckets:
        # Regroup the fine log-linear buckets by power of two: one bar per octave of duration.
        bins: dict[int, float] = {}
        for b in buckets:
            lo_ns = max(1.0, b["lo_ms"] * 1e6)
            bins[int(math.log2(lo_ns))] = bins.get(int(math.log2(lo_ns)), 0.0) + b["count"]
        lo, hi = min(bins), max(bins)
        bars = []
        for octave in range(lo, hi + 1):
            start_ms = (2**octave) / 1e6
            count = bins.get(octave, 0.0)
            bars.append(
                (
                    duration(start_ms),
                    count,
                    f"{duration(start_ms)} – {duration(2 * start_ms)}: {count:g} holds",
                )
            )
        return bars, "holds"
    bars = []
    for key, label in (("p50_ms", "p50"), ("p95_ms", "p95"), ("max_ms", "max")):
        value = finite_number(hold.get(key))
        if value is not None:
            bars.append((label, value, f"{label}: {duration(value)}"))
    return bars, "ms"


def _svg_hold_chart(hot: Mapping[str, Any]) -> str:
    bars, unit = _hold_bins(hot["hold"])
    width, height, left, bottom, top = 440, 180, 44, 34, 14
    plot_w, plot_h = width - left - 10, height - top - bottom
    peak = max((v for _, v, _ in bars), default=0.0) or 1.0
    kind = "histogram" if unit == "holds" else "percentiles"
    parts = [
        f'<svg class="hold-chart" data-lock="{_e(hot["lock"])}" data-kind="{kind}" '
        f'xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="hold-time distribution of '
        f'{_e(hot["lock"])}">'
    ]
    parts.append(
        f'<line class="axis" x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
        f'y2="{top + plot_h}"/>'
        f'<line class="axis" x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}"/>'
        f'<text x="{left - 6}" y="{top + 8}" text-anchor="end" class="muted">'
        f"{_e(duration(peak) if unit == 'ms' else f'{peak:g}')}</text>"
        f'<text x="{left - 6}" y="{top + plot_h}" text-anchor="end" class="muted">0</text>'
    )
    if not bars:
        parts.append(f'<text x="{left + 8}" y="{top + plot_h / 2:.0f}">no hold recorded</text>')
    slot = plot_w / max(1, len(bars))
    every = max(1, math.ceil(len(bars) / 8))  # at most ~8 axis labels
    for i, (label, value, tip) in enumerate(bars):
        h = plot_h * value / peak
        if value > 0:
            h = max(h, 1.5)
        x = left + i * slot + slot * 0.12
        parts.append(
            f'<rect class="bar" x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{slot * 0.76:.1f}" '
            f'height="{h:.1f}"><title>{_e(tip)}</title></rect>'
        )
        if i % every == 0:
            parts.append(
                f'<text x="{x + slot * 0.38:.1f}" y="{top + plot_h + 15}" text-anchor="middle">'
                f"{_e(label)}</text>"
            )
        if unit == "ms":
            parts.append(
                f'<text x="{x + slot * 0.38:.1f}" y="{top + plot_h - h - 4:.1f}" '
                f'text-anchor="middle">{_e(duration(value))}</text>'
            )
    caption = "holds per duration octave" if unit == "holds" else "hold time p50 / p95 / max"
    parts.append(
        f'<text x="{left + plot_w}" y="{height - 2}" text-anchor="end" class="muted">'
        f"{caption}</text>"
    )
    parts.append("</svg>")
    return "".join(parts)


_BREAK_AFTER = re.compile(r"([_.:/\\-]+)(?=\w)")


def _wrappable(text: str) -> str:
    """A name escaped, with a line-break opportunity after each of its separators (``_ . : /
    -``): a long lock or site name wraps at a word of its own before anywhere else."""
    return _BREAK_AFTER.sub(r"\1<wbr>", _e(text))


def _html_table(headers: Sequence[str], rows: Iterable[Sequence[str]], text_cols: int = 1) -> str:
    """A table whose first ``text_cols`` columns hold names (left-aligned, wrapping when long)
    and the others figures (right-aligned, never wrapped)."""
    head = "".join(
        f'<th class="text">{_e(h)}</th>' if i < text_cols else f"<th>{_e(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="text">{_wrappable(c)}</td>' if i < text_cols else f"<td>{_e(c)}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _sizing_html(r: Mapping[str, Any]) -> list[str]:
    """How the recommended size was derived: its arithmetic, one line per bottleneck
    (``p.sizing-bottleneck``), and the predicted-throughput curve (``svg#sizing-chart``)."""
    sizing = r["sizing"]
    if sizing is None:
        return []
    out = ["<h2>Sizing</h2>", f'<p id="sizing-basis">{_e(recommendation_line(sizing))}</p>']
    if sizing["basis"] == "measured":
        out += [
            f'<p class="sizing-bottleneck">{_e(bottleneck_line(b))}</p>'
            for b in sizing["bottlenecks"]
        ]
    out.append(svg_sizing(sizing))
    return out


def _pools_html(r: Mapping[str, Any]) -> list[str]:
    """The resource pools table, the way out of each bottleneck, the idle waits; nothing for a
    manifest that has neither pools nor idle waits."""
    if not r["resource_pools"] and not r["idle_waits"]:
        return []
    out = ["<h2>Resource pools</h2>"]
    if r["resource_pools"]:
        table = _html_table(POOL_HEADERS, (pool_row(p) for p in r["resource_pools"]), 2)
        out.append(table.replace("<table>", '<table id="resource-pools">', 1))
        advice = [p["advice"] for p in r["resource_pools"] if p["advice"]]
        out += [f'<p class="bottleneck">{_e(line)}</p>' for line in advice]
    else:
        out.append('<p class="muted">No resource pool: no checkout waited for a peer.</p>')
    if r["idle_waits"]:
        idle = _e(idle_line(r))
        out.append(f'<p id="idle-waits" class="muted">Idle waits (not contention): {idle}</p>')
    return out


def _points_html(r: Mapping[str, Any]) -> list[str]:
    """Where the wait comes from (the sites that waited, the sites holding the lock meanwhile,
    per class) and when (the timeline)."""
    out = ["<h2>Contention points</h2>"]
    if r["contention_points"]:
        out.append(
            '<p class="muted">Per lock class, the sites that waited for it, and the sites that '
            "held it when a waiter arrived (whom they waited for).</p>"
        )
    else:
        out.append('<p class="muted">No wait recorded its sites.</p>')
    for p in r["contention_points"]:
        waiters = _html_table(WAITER_HEADERS, map(waiter_row, p["waiters"]))
        holders = _html_table(HOLDER_HEADERS, map(holder_row, p["holders"]))
        out.append(
            f'<h3>{_wrappable(p["lock"])} <span class="muted">· {_e(integer(p["contentions"]))} '
            f"waits, {_e(duration(p['wait_ms']))}</span></h3>"
            f'<div class="points" data-lock="{_e(p["lock"])}">'
            + waiters.replace("<table>", '<table class="waiters">', 1)
            + holders.replace("<table>", '<table class="holders">', 1)
            + "</div>"
        )
    out.append("<h2>Timeline</h2>")
    out.append(svg_timeline(r["timeline"], duration))
    return out


def render_html(manifest: Mapping[str, Any], *, title: str | None = None) -> str:
    """One self-contained HTML page: summary cards, the wait share per lock
    (``svg#wait-share-chart``), the sizing (``svg#sizing-chart``), a hold-time chart per hot
    lock (``svg.hold-chart``, from the hold histogram when the manifest has one, else its
    p50/p95/max), the lock-order graph
    (``svg#lock-order-graph``, cycle edges ``path.edge.cycle``), the lockdep text of each cycle,
    the starvation signatures, the resource pools (``table#resource-pools``, a bottleneck's way
    out in ``p.bottleneck``, the idle waits in ``p#idle-waits``), the contention points
    (``div.points``, a ``table.waiters`` and a ``table.holders`` per class), the timeline
    (``svg#timeline-chart``) and the per-lock table. No
    script, no network.

    Args:
        manifest: the manifest as a dict.
        title: the page title (defaults to one naming the verdict).

    Raises:
        ValueError: as :func:`build_report`.
    """
    r = build_report(manifest)
    severity = VERDICT_SEVERITY.get(r["verdict"], "")
    page_title = title or f"otel-lockwatch report: {r['verdict']}"
    proc_line = process_line(r["process"])

    cards = [
        ("verdict", f'<span class="verdict {severity}">{_e(r["verdict"])}</span>'),
        (
            "pool size",
            f"{_e(integer(r['nominal_pool_size']))} → {_e(integer(r['recommended_pool_size']))}",
        ),
        ("effective throughput", _e(percent(r["effective_throughput_pct"]))),
        ("aggregate wait", _e(duration(r["total_wait_ms"]))),
    ]
    body = [
        f"<h1>{_e(page_title)}</h1>",
        f'<div class="muted">{_e(proc_line)}</div>' if proc_line else "",
        f'<p class="muted">{_e(r["verdict_meaning"])}</p>' if r["verdict_meaning"] else "",
        '<div class="summary">'
        + "".join(
            f'<div class="card"><div class="label">{_e(k)}</div><div class="value">{v}</div></div>'
            for k, v in cards
        )
        + "</div>",
        *_sizing_html(r),
        "<h2>Wait share per lock</h2>",
        _svg_wait_share(r),
        "<h2>Hold-time distribution of the hot locks</h2>",
    ]
    if r["hot_locks"]:
        body.append('<div class="hold-charts">')
        for hot in r["hot_locks"]:
            h = hot["hold"]
            body.append(
                f'<div class="hold-panel"><h3>{_e(hot["lock"])}</h3>'
                f'<div class="muted">{_e(percent(hot["wait_share_pct"]))} of the wait · '
                f"p50 {_e(duration(h['p50_ms']))} · p95 {_e(duration(h['p95_ms']))} · "
                f"max {_e(duration(h['max_ms']))}</div>{_svg_hold_chart(hot)}</div>"
            )
        body.append("</div>")
    else:
        body.append('<p class="muted">No lock is hot.</p>')

    body.append("<h2>Lock-order graph</h2>")
    body.append(
        '<p class="muted">An arrow A → B: a worker acquired B while holding A. '
        "Red arrows close a cycle: workers taking them concurrently can deadlock.</p>"
    )
    body.append(svg_lock_order(r["lock_order"]))
    if len(r["lock_order"]["nodes"]) > MAX_GRAPH_NODES:
        body.append(
            f'<p class="muted">{len(r["lock_order"]["nodes"]) - MAX_GRAPH_NODES} more locks '
            "not drawn; <code>otel-lockwatch report --dot</code> has them all.</p>"
        )
    if r["cycles"]:
        body.append("<h2>Lock-order cycles</h2>")
        body += [f'<pre class="cycle">{_e(c["text"])}</pre>' for c in r["cycles"]]

    body.append("<h2>Starvation</h2>")
    if r["starvation"]:
        body.append(
            _html_table(
                ["worker", "lock", "wait", "median wait", "ratio"],
                (
                    [
                        s["worker"],
                        s["lock"],
                        duration(s["wait_ms"]),
                        duration(s["median_wait_ms"]),
                        "-" if s["ratio"] is None else f"{s['ratio']:.1f}x",
                    ]
                    for s in r["starvation"]
                ),
                text_cols=2,
            )
        )
    else:
        body.append('<p class="muted">No worker starved.</p>')
    body += _pools_html(r)
    body += _points_html(r)

    if r["locks"]:
        body.append("<h2>Locks</h2>")
        body.append(
            _html_table(
                [
                    "lock",
                    "kind",
                    "acquisitions",
                    "contended",
                    "skipped",
                    "timeouts",
                    "wait",
                    "share",
                    "wait p95",
                    "hold p50",
                    "hold p95",
                    "hold max",
                ],
                (lock_row(row) for row in r["locks"]),
                text_cols=2,
            )
        )
    if r["unused_locks"]:
        names = ", ".join(_e(name) for name in r["unused_locks"])
        body.append(f'<p class="muted">Never taken as a mutex: {names}.</p>')
    if r["sections"]:
        body.append("<h2>Section arrays</h2>")
        body.append(
            _html_table(
                ["array", "sections", "collision waits", "max held", "recommended"],
                (
                    [
                        s["name"],
                        integer(s["count"]),
                        integer(s["collision_waits"]),
                        integer(s["max_held"]),
                        integer(s["recommended_count"]),
                    ]
                    for s in r["sections"]
                ),
            )
        )
    digest = r["manifest_digest"]
    body.append(
        "<footer>otel-lockwatch"
        + (f" · manifest digest <code>{_e(str(digest))}</code>" if digest else "")
        + "</footer>"
    )
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{_e(page_title)}</title><style>{_CSS}</style></head>\n"
        "<body><main>\n" + "\n".join(part for part in body if part) + "\n</main></body></html>\n"
    )
