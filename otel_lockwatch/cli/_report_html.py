"""The report as one self-contained HTML page, with its charts drawn in SVG.

The page has no script and no external resource: CSS and SVG are inline, generated here, so
the file can be mailed, attached to a CI run, or opened offline. It shows the model of
``_report_model`` in the same order as the terminal summary, with three charts: the share of the
aggregate wait per lock, the hold-time distribution of each hot lock (from its histogram when
the manifest carries one, else its p50/p95/max), and the lock-order graph on a circle, cycle
edges in red; a table of the resource pools, with the way out of a pool that is the
bottleneck. Its elements carry stable ids and classes (``#wait-share-chart``, ``.hold-chart``,
``#lock-order-graph``, ``.edge.cycle``, ``#resource-pools``, ``.bottleneck``,
``#idle-waits``) for tests and for anyone who wants to restyle it.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from otel_lockwatch.cli._report_model import VERDICT_SEVERITY, build_report, finite_number
from otel_lockwatch.cli._report_text import (
    MAX_CHART_LOCKS,
    POOL_HEADERS,
    duration,
    idle_line,
    integer,
    lock_row,
    percent,
    pool_row,
    process_line,
)

__all__ = ["render_html"]

#: How many locks the lock-order graph draws (cycle members first); a graph of thousands of
#: nodes on a circle is unreadable, and the DOT output has them all.
MAX_GRAPH_NODES = 40

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
svg .node circle { fill: #ffffff; stroke: var(--bar); stroke-width: 1.5; }
svg .node.cycle circle { stroke: var(--bad); stroke-width: 2.5; fill: #fff5f5; }
svg .edge { fill: none; stroke: var(--bar); stroke-width: 1.5; }
svg .edge.cycle { stroke: var(--bad); stroke-width: 2.5; }
svg .edge-label { font-size: 11px; fill: var(--muted); }
svg .edge-label.cycle { fill: var(--bad); }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { padding: 4px 8px; border-bottom: 1px solid var(--rule); text-align: right;
         white-space: nowrap; }
th.text, td.text { text-align: left; }
th { color: var(--muted); font-weight: 600; }
p.bottleneck { color: var(--warn); font-weight: 600; }
pre { background: var(--panel); border: 1px solid var(--rule); border-radius: 8px; padding: 12px;
      overflow-x: auto; font-size: 12.5px; white-space: pre-wrap; }
footer { margin-top: 40px; font-size: 12px; color: var(--muted); }
"""

_e = html.escape


def _svg_wait_share(report: Mapping[str, Any]) -> str:
    rows = [row for row in report["locks"] if row["wait_ms_total"] > 0][:MAX_CHART_LOCKS]
    hot = {h["lock"] for h in report["hot_locks"]}
    threshold = finite_number(report["thresholds"].get("hot_lock_threshold_pct"))
    label_w = min(260, max(80, 8 * max((len(r["lock"]) for r in rows), default=8) + 12))
    bar_w, row_h, top = 560, 24, 24
    width = label_w + bar_w + 140
    height = top + row_h * max(1, len(rows)) + 28
    parts = [
        f'<svg id="wait-share-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="share of the aggregate lock wait per lock">'
    ]
    parts.append(f'<text x="{label_w}" y="14" class="muted">share of the aggregate wait</text>')
    if not rows:
        parts.append(f'<text x="{label_w}" y="{top + 16}">no lock was waited on</text>')
    for i, row in enumerate(rows):
        y = top + i * row_h
        w = max(1.0, bar_w * row["wait_share_pct"] / 100.0)
        cls = "bar hot" if row["lock"] in hot else "bar"
        name = (
            row["lock"]
            if len(row["lock"]) * 8 <= label_w - 12
            else row["lock"][: (label_w - 12) // 8 - 1] + "…"
        )
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 16}" text-anchor="end">{_e(name)}</text>'
            f'<rect class="{cls}" data-lock="{_e(row["lock"])}" x="{label_w}" y="{y + 4}" '
            f'width="{w:.1f}" height="{row_h - 8}" rx="2"><title>{_e(row["lock"])}: '
            f"{_e(duration(row['wait_ms_total']))}, {row['wait_share_pct']:.1f} %</title></rect>"
            f'<text x="{label_w + w + 6:.1f}" y="{y + 16}">{row["wait_share_pct"]:.1f} % · '
            f"{_e(duration(row['wait_ms_total']))}</text>"
        )
    axis_y = top + row_h * max(1, len(rows)) + 2
    parts.append(f'<line class="axis" x1="{label_w}" y1="{top}" x2="{label_w}" y2="{axis_y}"/>')
    if threshold is not None and rows:
        x = label_w + bar_w * threshold / 100.0
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


def _svg_lock_order(report: Mapping[str, Any]) -> str:
    graph = report["lock_order"]
    nodes = graph["nodes"][:MAX_GRAPH_NODES]
    drawn = set(nodes)
    edges = [e for e in graph["edges"] if e["holding"] in drawn and e["acquiring"] in drawn]
    size = 560 if len(nodes) <= 12 else 760
    cx = cy = size / 2
    radius = size / 2 - 90 if len(nodes) > 1 else 0
    node_r = 9
    pos = {
        name: (
            cx + radius * math.cos(2 * math.pi * i / len(nodes) - math.pi / 2),
            cy + radius * math.sin(2 * math.pi * i / len(nodes) - math.pi / 2),
        )
        for i, name in enumerate(nodes)
    }
    cycle_nodes = {n for e in edges if e["cycle"] for n in (e["holding"], e["acquiring"])}
    parts = [
        f'<svg id="lock-order-graph" xmlns="http://www.w3.org/2000/svg" width="{size}" '
        f'height="{size}" viewBox="0 0 {size} {size}" role="img" '
        f'aria-label="lock-order graph">',
        "<defs>"
        '<marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#6e7781"/></marker>'
        '<marker id="arrow-cycle" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
        'markerHeight="7" orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" '
        'fill="#c62828"/></marker></defs>',
    ]
    if not nodes:
        parts.append(
            f'<text x="{cx}" y="{cy}" text-anchor="middle">'
            "no nested acquisition was recorded</text>"
        )
    for e in edges:
        (x1, y1), (x2, y2) = pos[e["holding"]], pos[e["acquiring"]]
        dx, dy = x2 - x1, y2 - y1
        dist = math.hypot(dx, dy) or 1.0
        ux, uy = dx / dist, dy / dist
        # Bend every edge to its right: A->B and B->A then stay two visible arcs.
        bend = 0.18 * dist
        mx, my = (x1 + x2) / 2 - uy * bend, (y1 + y2) / 2 + ux * bend
        sx, sy = x1 + ux * node_r, y1 + uy * node_r
        ex, ey = x2 - ux * (node_r + 2), y2 - uy * (node_r + 2)
        cls = "edge cycle" if e["cycle"] else "edge"
        marker = "arrow-cycle" if e["cycle"] else "arrow"
        tip = f"{e['worker'] or '?'} held {e['holding']} then acquired {e['acquiring']}"
        if e["sites"][0] or e["sites"][1]:
            tip += f" ({e['sites'][0] or '?'} -> {e['sites'][1] or '?'})"
        parts.append(
            f'<path class="{cls}" data-holding="{_e(e["holding"])}" '
            f'data-acquiring="{_e(e["acquiring"])}" d="M{sx:.1f},{sy:.1f} Q{mx:.1f},{my:.1f} '
            f'{ex:.1f},{ey:.1f}" marker-end="url(#{marker})"><title>{_e(tip)}</title></path>'
        )
        if e["worker"]:
            lx, ly = (x1 + x2) / 2 - uy * bend * 0.55, (y1 + y2) / 2 + ux * bend * 0.55
            label_cls = "edge-label cycle" if e["cycle"] else "edge-label"
            parts.append(
                f'<text class="{label_cls}" x="{lx:.1f}" y="{ly:.1f}" text-anchor="middle">'
                f"{_e(str(e['worker']))}</text>"
            )
    for name in nodes:
        x, y = pos[name]
        cls = "node cycle" if name in cycle_nodes else "node"
        # Labels point away from the centre so they do not sit on the edges.
        anchor = "middle" if abs(x - cx) < 20 else ("start" if x > cx else "end")
        lx = x + (14 if anchor == "start" else -14 if anchor == "end" else 0)
        ly = y + (-14 if y < cy - 20 else 22 if y > cy + 20 else 4)
        parts.append(
            f'<g class="{cls}" data-lock="{_e(name)}"><circle cx="{x:.1f}" cy="{y:.1f}" '
            f'r="{node_r}"/><text x="{lx:.1f}" y="{ly:.1f}" text-anchor="{anchor}">'
            f"{_e(name)}</text></g>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _html_table(headers: Sequence[str], rows: Iterable[Sequence[str]], text_cols: int = 1) -> str:
    head = "".join(
        f'<th class="text">{_e(h)}</th>' if i < text_cols else f"<th>{_e(h)}</th>"
        for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="text">{_e(c)}</td>' if i < text_cols else f"<td>{_e(c)}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


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


def render_html(manifest: Mapping[str, Any], *, title: str | None = None) -> str:
    """One self-contained HTML page: summary cards, the wait share per lock
    (``svg#wait-share-chart``), a hold-time chart per hot lock (``svg.hold-chart``, from the
    hold histogram when the manifest has one, else its p50/p95/max), the lock-order graph
    (``svg#lock-order-graph``, cycle edges ``path.edge.cycle``), the lockdep text of each cycle,
    the starvation signatures, the resource pools (``table#resource-pools``, a bottleneck's way
    out in ``p.bottleneck``, the idle waits in ``p#idle-waits``) and the per-lock table. No
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
    body.append(_svg_lock_order(r))
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
