"""Renderings of a contention manifest: terminal text, JSON, one self-contained HTML page, DOT.

A manifest answers one question for the successor of a worker pool: *how many workers may I
spawn, and what will hurt if I spawn more?*  A report puts the answer first and the evidence
after it, in the order a reader checks it:

1. the verdict and the pool size (nominal -> recommended), and the effective throughput: the
   share of worker time not spent waiting for a lock (the seed's "phantom bandwidth");
2. the hot locks: their share of the aggregate wait, and how long they are held (p50/p95/max),
   since a hot lock is either held too long or taken too often;
3. the starved workers: who waited how many times the median on which lock;
4. the lock-order cycles, written lockdep-style: the cycle, then each edge with the worker that
   took it and the two acquisition sites, then the interleaving that would deadlock;
5. a per-lock table and the section arrays.

:func:`build_report` computes that model once from the manifest as a plain dict
(``Manifest.to_dict()`` or the JSON as loaded); :func:`render_text`, :func:`render_json` and
:func:`render_html` draw it, and :func:`render_dot` draws the lock-order graph alone. Every field
but ``verdict`` is optional here, so a manifest of an older or partial writer still renders.

The HTML page has no script and no external resource: CSS and SVG are inline, generated here, so
the file can be mailed, attached to a CI run, or opened offline. Its elements carry stable ids and
classes (``#wait-share-chart``, ``.hold-chart``, ``#lock-order-graph``, ``.edge.cycle``) for
tests and for anyone who wants to restyle it.
"""

from __future__ import annotations

import html
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from otel_lockwatch.manifest._io import write_atomically
from otel_lockwatch.record._histogram import LogHistogram, bucket_bounds
from otel_lockwatch.record._order import Cycle

__all__ = [
    "build_report",
    "render_dot",
    "render_html",
    "render_json",
    "render_text",
    "write_text_atomic",
]

#: How many locks the wait-share chart and the per-lock table show; the rest are summed up.
MAX_CHART_LOCKS = 20
#: How many locks the lock-order graph draws (cycle members first); a graph of thousands of
#: nodes on a circle is unreadable, and the DOT output has them all.
MAX_GRAPH_NODES = 40

_VERDICT_SEVERITY = {
    "LOW_CONTENTION": "ok",
    "HOT_LOCK_DETECTED": "warn",
    "STARVATION_OBSERVED": "bad",
    "CYCLIC_ORDERING_DETECTED": "bad",
}
_VERDICT_MEANING = {
    "LOW_CONTENTION": "no hot lock, no starvation, no cyclic ordering: the pool size can be kept",
    "HOT_LOCK_DETECTED": "one lock takes most of the waiting: shard it or shrink the pool",
    "STARVATION_OBSERVED": "a worker waited far longer than its peers on one lock",
    "CYCLIC_ORDERING_DETECTED": "locks were taken in conflicting orders: a deadlock is possible",
}


# --------------------------------------------------------------------------------------------
# The report model


def _num(value: Any) -> float | None:
    """A finite number from a manifest field, or None for a missing or malformed one."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (list, tuple)) else []


def _lock_wait_ms(entry: Mapping[str, Any]) -> float:
    wait = _num(entry.get("wait_ms_total"))
    if wait is None:
        ns = _num(entry.get("wait_ns_total"))
        wait = ns / 1e6 if ns is not None else 0.0
    return wait


def _edge_from(raw: Mapping[str, Any]) -> dict[str, Any]:
    sites = _list(raw.get("sites"))
    sites += [None] * (2 - len(sites))
    return {
        "holding": str(raw.get("holding", "?")),
        "acquiring": str(raw.get("acquiring", "?")),
        "worker": raw.get("worker"),
        "sites": [sites[0], sites[1]],
        "at": raw.get("at"),
        "trace_id": raw.get("trace_id"),
        "span_id": raw.get("span_id"),
    }


def build_report(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The report of a manifest: what every rendering shows, as plain JSON-ready data.

    Args:
        manifest: the manifest as a dict (``Manifest.to_dict()`` or the loaded JSON). Only
            ``verdict`` is required; every other field may be missing.

    Returns:
        A dict with ``verdict``, ``verdict_meaning``, ``nominal_pool_size``,
        ``recommended_pool_size``, ``effective_throughput_pct``, ``process``, ``thresholds``,
        ``hot_locks`` (each with its ``hold`` distribution), ``starvation`` (each with its
        ``ratio`` to the median), ``cycles`` (each with its lockdep-style ``text``), ``locks``
        (one row per lock, most waited-on first, with its ``wait_share_pct``), ``lock_order``
        (node and edge lists of the lock-order graph, cycle edges flagged), ``sections`` and
        ``manifest_digest``.

    Raises:
        ValueError: when ``manifest`` is not a mapping or has no ``verdict``.
    """
    if not isinstance(manifest, Mapping):
        raise ValueError(f"a manifest must be a JSON object, got {type(manifest).__name__}")
    verdict = manifest.get("verdict")
    if not isinstance(verdict, str) or not verdict:
        raise ValueError(f"a manifest must have a verdict, got {verdict!r}")

    locks = _mapping(manifest.get("locks"))
    total_wait = sum(_lock_wait_ms(_mapping(entry)) for entry in locks.values())
    rows: list[dict[str, Any]] = []
    for name, raw in locks.items():
        entry = _mapping(raw)
        wait_ms = _lock_wait_ms(entry)
        wait = _mapping(entry.get("wait"))
        hold = _mapping(entry.get("hold"))
        rows.append(
            {
                "lock": str(name),
                "kind": entry.get("kind"),
                "acquisitions": entry.get("acquisitions"),
                "contentions": entry.get("contentions"),
                "skipped": entry.get("skipped"),
                "timeouts": entry.get("timeouts"),
                "wait_ms_total": wait_ms,
                "wait_share_pct": 100.0 * wait_ms / total_wait if total_wait > 0 else 0.0,
                "wait_p95_ms": _num(wait.get("p95_ms")),
                "hold_ms_total": _num(entry.get("hold_ms_total")),
                "hold_p50_ms": _num(hold.get("p50_ms")),
                "hold_p95_ms": _num(hold.get("p95_ms")),
                "hold_max_ms": _num(hold.get("max_ms")),
            }
        )
    rows.sort(key=lambda r: (-r["wait_ms_total"], r["lock"]))

    distribution = _mapping(manifest.get("hold_time_distribution"))
    hot_locks = []
    for raw in _list(manifest.get("hot_lock_register")):
        item = _mapping(raw)
        name = str(item.get("lock", "?"))
        dist = _mapping(distribution.get(name))
        lock_entry = _mapping(locks.get(name))
        hold_fallback = _mapping(lock_entry.get("hold"))
        hold = {
            "count": dist.get("count", hold_fallback.get("count", lock_entry.get("acquisitions"))),
            "p50_ms": _num(dist.get("p50_ms", hold_fallback.get("p50_ms"))),
            "p95_ms": _num(dist.get("p95_ms", hold_fallback.get("p95_ms"))),
            "max_ms": _num(dist.get("max_ms", hold_fallback.get("max_ms"))),
            "buckets": _hold_buckets(lock_entry),
        }
        hot_locks.append(
            {
                "lock": name,
                "wait_ms": _num(item.get("wait_ms")),
                "wait_share_pct": _num(item.get("wait_share_pct")),
                "hold": hold,
            }
        )

    starvation = []
    for raw in _list(manifest.get("starvation_signatures")):
        item = _mapping(raw)
        starved_ms = _num(item.get("wait_ms"))
        median = _num(item.get("median_wait_ms"))
        starvation.append(
            {
                "worker": str(item.get("worker", "?")),
                "lock": str(item.get("lock", "?")),
                "wait_ms": starved_ms,
                "median_wait_ms": median,
                "ratio": starved_ms / median if starved_ms is not None and median else None,
            }
        )

    raw_cycles = _list(manifest.get("pre_deadlock_ordering_witness"))
    if not raw_cycles:
        raw_cycles = _list(_mapping(manifest.get("lock_order")).get("cycles"))
    cycles = []
    for raw in raw_cycles:
        item = _mapping(raw)
        cycle = {
            "cycle": [str(n) for n in _list(item.get("cycle"))],
            "edges": [_edge_from(_mapping(e)) for e in _list(item.get("edges"))],
        }
        cycle["text"] = format_cycle(item)
        cycles.append(cycle)

    sections = []
    for name, raw in sorted(_mapping(manifest.get("sections")).items()):
        item = _mapping(raw)
        sections.append(
            {
                "name": str(name),
                "count": item.get("count"),
                "collision_waits": item.get("collision_waits"),
                "max_held": item.get("max_held"),
                "recommended_count": item.get("recommended_count"),
            }
        )

    process = manifest.get("process")
    return {
        "verdict": verdict,
        "verdict_meaning": _VERDICT_MEANING.get(verdict, ""),
        "nominal_pool_size": manifest.get("nominal_pool_size"),
        "recommended_pool_size": manifest.get("recommended_pool_size"),
        "effective_throughput_pct": _num(manifest.get("effective_throughput_pct")),
        "process": dict(process) if isinstance(process, Mapping) else None,
        "thresholds": dict(_mapping(manifest.get("thresholds"))),
        "hot_locks": hot_locks,
        "starvation": starvation,
        "cycles": cycles,
        "locks": rows,
        "total_wait_ms": total_wait,
        "lock_order": _graph(manifest, cycles),
        "sections": sections,
        "manifest_digest": manifest.get("manifest_digest"),
    }


def _hold_buckets(lock_entry: Mapping[str, Any]) -> list[dict[str, float]] | None:
    """The hold-time histogram of a lock as ``[{lo_ms, hi_ms, count}]`` (ascending buckets), or
    None when the manifest carries none (or a malformed one).

    The recorder's data part keeps ``hold_ns`` as ``LogHistogram.to_json()``; a manifest that
    also puts it under ``hold.histogram`` is read from there.
    """
    raw = lock_entry.get("hold_ns")
    if not isinstance(raw, Mapping):
        raw = _mapping(lock_entry.get("hold")).get("histogram")
    if not isinstance(raw, Mapping):
        return None
    try:
        hist = LogHistogram.from_json(raw)
    except ValueError:
        return None
    out = []
    for index in sorted(hist.counts):
        low, high = bucket_bounds(index)
        out.append({"lo_ms": low / 1e6, "hi_ms": (high + 1) / 1e6, "count": hist.counts[index]})
    return out or None


def _graph(manifest: Mapping[str, Any], cycles: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The lock-order graph: nodes (cycle members first) and edges, cycle edges flagged."""
    in_cycle = {(e["holding"], e["acquiring"]) for c in cycles for e in c["edges"]}
    for c in cycles:  # a cycle listed by names only still marks its edges
        names = c["cycle"]
        if names and names[0] == names[-1]:
            names = names[:-1]
        for i, name in enumerate(names):
            if len(names) > 1:
                in_cycle.add((name, names[(i + 1) % len(names)]))
    edges = []
    seen = set()
    raw_edges = _list(_mapping(manifest.get("lock_order")).get("edges"))
    raw_edges += [e for c in cycles for e in c["edges"]]
    for raw in raw_edges:
        edge = _edge_from(_mapping(raw))
        key = (edge["holding"], edge["acquiring"])
        if key in seen:
            continue
        seen.add(key)
        edge["cycle"] = key in in_cycle
        edges.append(edge)
    cycle_nodes = [n for c in cycles for n in c["cycle"]]
    nodes: list[str] = []
    for name in cycle_nodes + sorted({n for e in edges for n in (e["holding"], e["acquiring"])}):
        if name not in nodes:
            nodes.append(name)
    return {"nodes": nodes, "edges": edges}


# --------------------------------------------------------------------------------------------
# Lockdep-style cycles


def format_cycle(raw: Mapping[str, Any]) -> str:
    """A cycle of the lock-order graph written lockdep-style: the cycle, then one line per edge
    saying which worker held what where, and when.

    The text is :meth:`otel_lockwatch.record._order.Cycle.format`'s, so the report and
    ``PotentialDeadlockError`` say the same thing. A cycle that the lock-order module refuses to
    read (a manifest of another version) is written by a plain fallback instead of failing.

    Args:
        raw: the cycle as stored in the manifest: ``{cycle: [names], edges: [EdgeWitness]}``.
    """
    try:
        return Cycle.from_json(dict(raw)).format()
    except (TypeError, ValueError):
        pass
    names = [str(n) for n in _list(raw.get("cycle"))]
    lines = [f"possible circular locking dependency: {' -> '.join(names + names[:1])}"]
    for e in (_edge_from(_mapping(e)) for e in _list(raw.get("edges"))):
        lines.append(
            f"  {e['holding']} -> {e['acquiring']}: worker {e['worker']!r} held {e['holding']}"
            f" (acquired at {e['sites'][0]}) and acquired {e['acquiring']} (at {e['sites'][1]})"
            + (f", {e['at']}" if e["at"] else "")
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Text


def _lock_row(row: dict[str, Any]) -> list[str]:
    """One lock's cells in the per-lock table (terminal and HTML alike)."""
    return [
        row["lock"],
        str(row["kind"] or "-"),
        _int(row["acquisitions"]),
        _int(row["contentions"]),
        _int(row["skipped"]),
        _int(row["timeouts"]),
        _duration(row["wait_ms_total"]),
        _pct(row["wait_share_pct"]),
        _duration(row["wait_p95_ms"]),
        _duration(row["hold_p50_ms"]),
        _duration(row["hold_p95_ms"]),
        _duration(row["hold_max_ms"]),
    ]


def _duration(ms: float | None) -> str:
    """``850 µs``, ``12.3 ms``, ``4.20 s``: a duration a reader compares at a glance."""
    if ms is None:
        return "-"
    if ms == 0:
        return "0"
    if ms < 1:
        return f"{ms * 1000:.0f} µs"
    if ms < 1000:
        return f"{ms:.3g} ms" if ms < 100 else f"{ms:.0f} ms"
    return f"{ms / 1000:.3g} s" if ms < 100_000 else f"{ms / 1000:.0f} s"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} %"


def _int(value: Any) -> str:
    return "-" if value is None or isinstance(value, bool) else str(value)


class _Style:
    """ANSI styling, or none at all."""

    def __init__(self, color: bool) -> None:
        self.color = color

    def _wrap(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def verdict(self, verdict: str) -> str:
        code = {"ok": "1;32", "warn": "1;33", "bad": "1;31"}.get(
            _VERDICT_SEVERITY.get(verdict, ""), "1"
        )
        return self._wrap(code, verdict)

    def red(self, text: str) -> str:
        return self._wrap("31", text)


def _process_line(proc: Any) -> str:
    """``billing, pid 4242, start .. end``; for a merged manifest, the processes it merges."""
    if not isinstance(proc, Mapping) or not proc:
        return ""
    bits = []
    if proc.get("service.name"):
        bits.append(str(proc["service.name"]))
    pids = proc.get("pids")
    if isinstance(pids, list):
        merged = proc.get("merged", len(pids))
        shown = ", ".join(str(p) for p in pids[:8]) + (", ..." if len(pids) > 8 else "")
        bits.append(f"merged from {merged} processes (pids {shown})")
    elif proc.get("pid") is not None:
        bits.append(f"pid {proc['pid']}")
    if proc.get("start") and proc.get("end"):
        bits.append(f"{proc['start']} .. {proc['end']}")
    return ", ".join(bits)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], right: set[int]) -> list[str]:
    rows = [list(r) for r in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)
        ).rstrip()

    return [line(headers)] + [line(r) for r in rows]


def render_text(
    manifest: Mapping[str, Any], *, color: bool = False, source: str | None = None
) -> str:
    """The terminal summary of a manifest.

    Args:
        manifest: the manifest as a dict.
        color: emit ANSI colour codes (the CLI passes True only for a tty without ``NO_COLOR``).
        source: the manifest's path, shown in the title.

    Raises:
        ValueError: as :func:`build_report`.
    """
    r = build_report(manifest)
    s = _Style(color)
    out: list[str] = []
    title = "otel-lockwatch contention report"
    out.append(s.bold(title + (f": {source}" if source else "")))
    proc_line = _process_line(r["process"])
    if proc_line:
        out.append(s.dim("  " + proc_line))
    out.append("")
    label = 22
    out.append("verdict".ljust(label) + s.verdict(r["verdict"]))
    if r["verdict_meaning"]:
        out.append(" " * label + s.dim(r["verdict_meaning"]))
    nominal, recommended = r["nominal_pool_size"], r["recommended_pool_size"]
    if nominal is not None or recommended is not None:
        change = ""
        if isinstance(nominal, int) and isinstance(recommended, int) and recommended < nominal:
            change = s.dim(f"  (shrink by {nominal - recommended})")
        out.append(
            "pool size".ljust(label)
            + f"nominal {_int(nominal)} -> recommended {s.bold(_int(recommended))}{change}"
        )
    if r["effective_throughput_pct"] is not None:
        out.append(
            "effective throughput".ljust(label)
            + f"{_pct(r['effective_throughput_pct'])} of worker time not spent waiting for locks"
        )
    out.append(
        "aggregate lock wait".ljust(label)
        + f"{_duration(r['total_wait_ms'])} over {len(r['locks'])} lock classes"
    )

    threshold = r["thresholds"].get("hot_lock_threshold_pct")
    out.append("")
    heading = "hot locks" + (
        f" (>= {threshold:g} % of the aggregate wait)" if _num(threshold) is not None else ""
    )
    out.append(s.bold(heading))
    if r["hot_locks"]:
        rows = [
            [
                h["lock"],
                _duration(h["wait_ms"]),
                _pct(h["wait_share_pct"]),
                _int(h["hold"]["count"]),
                _duration(h["hold"]["p50_ms"]),
                _duration(h["hold"]["p95_ms"]),
                _duration(h["hold"]["max_ms"]),
            ]
            for h in r["hot_locks"]
        ]
        headers = ["lock", "wait", "share", "holds", "hold p50", "p95", "max"]
        out += ["  " + line for line in _table(headers, rows, right={1, 2, 3, 4, 5, 6})]
    else:
        out.append("  none")

    out.append("")
    out.append(s.bold("starvation"))
    if r["starvation"]:
        for item in r["starvation"]:
            ratio = f", {item['ratio']:.1f}x" if item["ratio"] is not None else ""
            out.append(
                f"  {item['worker']} waited {_duration(item['wait_ms'])} on {item['lock']}"
                f" (median {_duration(item['median_wait_ms'])}{ratio})"
            )
    else:
        out.append("  none")

    out.append("")
    out.append(s.bold("lock-order cycles"))
    if r["cycles"]:
        for cycle in r["cycles"]:
            text_lines = cycle["text"].splitlines()
            out.append("  " + s.red(text_lines[0]) if text_lines else "")
            out += ["  " + line for line in text_lines[1:]]
    else:
        graph = r["lock_order"]
        out.append(
            f"  none ({len(graph['edges'])} ordering edges among {len(graph['nodes'])} locks)"
        )

    if r["locks"]:
        out.append("")
        out.append(s.bold("locks") + s.dim(" (most waited-on first)"))
        shown = r["locks"][:MAX_CHART_LOCKS]
        rows = [_lock_row(row) for row in shown]
        headers = [
            "lock",
            "kind",
            "acq",
            "contended",
            "skipped",
            "timeouts",
            "wait",
            "share",
            "wait p95",
            "hold p50",
            "p95",
            "max",
        ]
        out += ["  " + line for line in _table(headers, rows, right=set(range(2, 12)))]
        if len(r["locks"]) > len(shown):
            out.append(s.dim(f"  ... and {len(r['locks']) - len(shown)} more"))

    if r["sections"]:
        out.append("")
        out.append(s.bold("section arrays"))
        rows = [
            [
                sec["name"],
                _int(sec["count"]),
                _int(sec["collision_waits"]),
                _int(sec["max_held"]),
                _int(sec["recommended_count"]),
            ]
            for sec in r["sections"]
        ]
        headers = ["array", "sections", "collision waits", "max held", "recommended"]
        out += ["  " + line for line in _table(headers, rows, right={1, 2, 3, 4})]
    return "\n".join(out) + "\n"


def render_json(manifest: Mapping[str, Any]) -> str:
    """The report of :func:`build_report` as JSON with sorted keys (diffable, scriptable).

    Raises:
        ValueError: as :func:`build_report`.
    """
    return json.dumps(build_report(manifest), sort_keys=True, indent=2, ensure_ascii=False) + "\n"


# --------------------------------------------------------------------------------------------
# DOT


def _dot_id(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def render_dot(manifest: Mapping[str, Any]) -> str:
    """The lock-order graph as Graphviz DOT: an edge ``A -> B`` means some worker acquired B
    while holding A; each edge is labelled with that worker, cycle edges are red and bold.

    Raises:
        ValueError: as :func:`build_report`.
    """
    graph = build_report(manifest)["lock_order"]
    cycle_nodes = {n for e in graph["edges"] if e["cycle"] for n in (e["holding"], e["acquiring"])}
    lines = [
        "digraph lock_order {",
        "  rankdir=LR;",
        '  node [shape=box, style="rounded", fontname="monospace"];',
        '  edge [fontname="monospace", fontsize=10];',
    ]
    for name in graph["nodes"]:
        style = ' [color="#c62828", penwidth=2]' if name in cycle_nodes else ""
        lines.append(f"  {_dot_id(name)}{style};")
    for e in graph["edges"]:
        attrs = [f"label={_dot_id(str(e['worker'] or ''))}"]
        if e["cycle"]:
            attrs += ['color="#c62828"', 'fontcolor="#c62828"', "penwidth=2"]
        lines.append(
            f"  {_dot_id(e['holding'])} -> {_dot_id(e['acquiring'])} [{', '.join(attrs)}];"
        )
    lines.append("}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# HTML

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
pre { background: var(--panel); border: 1px solid var(--rule); border-radius: 8px; padding: 12px;
      overflow-x: auto; font-size: 12.5px; white-space: pre-wrap; }
footer { margin-top: 40px; font-size: 12px; color: var(--muted); }
"""

_e = html.escape


def _svg_wait_share(report: Mapping[str, Any]) -> str:
    rows = [row for row in report["locks"] if row["wait_ms_total"] > 0][:MAX_CHART_LOCKS]
    hot = {h["lock"] for h in report["hot_locks"]}
    threshold = _num(report["thresholds"].get("hot_lock_threshold_pct"))
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
            f"{_e(_duration(row['wait_ms_total']))}, {row['wait_share_pct']:.1f} %</title></rect>"
            f'<text x="{label_w + w + 6:.1f}" y="{y + 16}">{row["wait_share_pct"]:.1f} % · '
            f"{_e(_duration(row['wait_ms_total']))}</text>"
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
                    _duration(start_ms),
                    count,
                    f"{_duration(start_ms)} – {_duration(2 * start_ms)}: {count:g} holds",
                )
            )
        return bars, "holds"
    bars = []
    for key, label in (("p50_ms", "p50"), ("p95_ms", "p95"), ("max_ms", "max")):
        value = _num(hold.get(key))
        if value is not None:
            bars.append((label, value, f"{label}: {_duration(value)}"))
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
        f"{_e(_duration(peak) if unit == 'ms' else f'{peak:g}')}</text>"
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
                f'text-anchor="middle">{_e(_duration(value))}</text>'
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


def render_html(manifest: Mapping[str, Any], *, title: str | None = None) -> str:
    """One self-contained HTML page: summary cards, the wait share per lock
    (``svg#wait-share-chart``), a hold-time chart per hot lock (``svg.hold-chart``, from the
    hold histogram when the manifest has one, else its p50/p95/max), the lock-order graph
    (``svg#lock-order-graph``, cycle edges ``path.edge.cycle``), the lockdep text of each cycle,
    the starvation signatures and the per-lock table. No script, no network.

    Args:
        manifest: the manifest as a dict.
        title: the page title (defaults to one naming the verdict).

    Raises:
        ValueError: as :func:`build_report`.
    """
    r = build_report(manifest)
    severity = _VERDICT_SEVERITY.get(r["verdict"], "")
    page_title = title or f"otel-lockwatch report: {r['verdict']}"
    proc_line = _process_line(r["process"])

    cards = [
        ("verdict", f'<span class="verdict {severity}">{_e(r["verdict"])}</span>'),
        (
            "pool size",
            f"{_e(_int(r['nominal_pool_size']))} → {_e(_int(r['recommended_pool_size']))}",
        ),
        ("effective throughput", _e(_pct(r["effective_throughput_pct"]))),
        ("aggregate wait", _e(_duration(r["total_wait_ms"]))),
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
                f'<div class="muted">{_e(_pct(hot["wait_share_pct"]))} of the wait · '
                f"p50 {_e(_duration(h['p50_ms']))} · p95 {_e(_duration(h['p95_ms']))} · "
                f"max {_e(_duration(h['max_ms']))}</div>{_svg_hold_chart(hot)}</div>"
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
                        _duration(s["wait_ms"]),
                        _duration(s["median_wait_ms"]),
                        "-" if s["ratio"] is None else f"{s['ratio']:.1f}x",
                    ]
                    for s in r["starvation"]
                ),
                text_cols=2,
            )
        )
    else:
        body.append('<p class="muted">No worker starved.</p>')

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
                (_lock_row(row) for row in r["locks"]),
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
                        _int(s["count"]),
                        _int(s["collision_waits"]),
                        _int(s["max_held"]),
                        _int(s["recommended_count"]),
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


# --------------------------------------------------------------------------------------------
# Files


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file in the same directory and
    ``os.replace``: a reader sees the old file or the whole new one, never a partial one.

    Raises:
        OSError: when the directory does not exist or is not writable (nothing is left behind).
    """
    write_atomically(Path(os.path.abspath(os.fspath(path))), text.encode("utf-8"))
