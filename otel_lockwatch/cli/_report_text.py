"""The report for a terminal, as JSON, and the lock-order graph as Graphviz DOT.

:func:`render_text` is the summary ``otel-lockwatch report`` prints: the answer first (verdict,
pool size, effective throughput), then the hot locks, the starved workers, the lock-order
cycles in lockdep's words, the per-lock table and the section arrays, in the order of
``_report_model``. Colour only when asked (the CLI asks for a terminal without ``NO_COLOR``).
:func:`render_json` is the same model as JSON with sorted keys, for scripts and diffs;
:func:`render_dot` draws the lock-order graph alone, every node and edge, cycle edges in red.

The cell formats (durations a reader compares at a glance, percentages, counts, the per-lock
row, the process line) are shared with the HTML page, so both say the same thing.

Lock, worker, array and service names often come from request data. What goes to a terminal
or into a DOT file shows each of them through ``printable`` (``record._witness``): a control
character is written as its escape (ESC as ``\\x1b``, a newline as ``\\n``), so a name can
neither clear the screen, set the terminal's title nor forge a line of the report, and a name
longer than ``NAME_LIMIT`` characters is cut with a visible ``...(+N chars)``. The JSON report
keeps every character, but writes each one a terminal would act on as a JSON ``\\u`` escape.
The DOT file names each node ``n0``, ``n1``, ... and labels it with the printable name, so that
it stays valid for Graphviz (strings under its 16,384-character limit, no NUL) and two names
cut to the same text are still two nodes.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from typing import Any

from otel_lockwatch.cli._report_model import VERDICT_SEVERITY, build_report, finite_number
from otel_lockwatch.cli._report_sizing import sizing_section
from otel_lockwatch.cli._report_table import DEFAULT_WIDTH, fit, table
from otel_lockwatch.record._witness import printable

__all__ = [
    "MAX_CHART_LOCKS",
    "duration",
    "integer",
    "lock_row",
    "percent",
    "process_line",
    "render_dot",
    "render_json",
    "HOLDER_HEADERS",
    "WAITER_HEADERS",
    "holder_row",
    "points_section",
    "waiter_row",
    "render_text",
]

#: How many locks the wait-share chart and the per-lock table show; the rest are summed up.
MAX_CHART_LOCKS = 20


# --------------------------------------------------------------------------------------------
# Cells, shared with the HTML page


def lock_row(row: dict[str, Any]) -> list[str]:
    """One lock's cells in the per-lock table (terminal and HTML alike)."""
    return [
        row["lock"],
        str(row["kind"] or "-"),
        integer(row["acquisitions"]),
        integer(row["contentions"]),
        integer(row["skipped"]),
        integer(row["timeouts"]),
        duration(row["wait_ms_total"]),
        percent(row["wait_share_pct"]),
        duration(row["wait_p95_ms"]),
        duration(row["hold_p50_ms"]),
        duration(row["hold_p95_ms"]),
        duration(row["hold_max_ms"]),
    ]


def duration(ms: float | None) -> str:
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


def percent(value: float | None) -> str:
    """``12.5 %``, or ``-`` when unknown."""
    return "-" if value is None else f"{value:.1f} %"


def integer(value: Any) -> str:
    """A count or size as written, or ``-`` when missing."""
    return "-" if value is None or isinstance(value, bool) else str(value)


def process_line(proc: Any) -> str:
    """``billing, pid 4242, start .. end``; for a merged manifest, the processes it merges.
    Every value is :func:`printable`."""
    if not isinstance(proc, Mapping) or not proc:
        return ""
    bits = []
    if proc.get("service.name"):
        bits.append(printable(proc["service.name"]))
    pids = proc.get("pids")
    if isinstance(pids, list):
        merged = printable(proc.get("merged", len(pids)))
        shown = ", ".join(printable(p) for p in pids[:8]) + (", ..." if len(pids) > 8 else "")
        bits.append(f"merged from {merged} processes (pids {shown})")
    elif proc.get("pid") is not None:
        bits.append(f"pid {printable(proc['pid'])}")
    if proc.get("start") and proc.get("end"):
        bits.append(f"{printable(proc['start'])} .. {printable(proc['end'])}")
    return ", ".join(bits)


# --------------------------------------------------------------------------------------------
# Terminal and JSON


class _Style:
    """ANSI styling, or none at all."""

    def __init__(self, color: bool, width: int = DEFAULT_WIDTH) -> None:
        self.color = color
        self.width = width  # what every line fits

    def _wrap(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.color else text

    def bold(self, text: str) -> str:
        return self._wrap("1", text)

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def verdict(self, verdict: str) -> str:
        code = {"ok": "1;32", "warn": "1;33", "bad": "1;31"}.get(
            VERDICT_SEVERITY.get(verdict, ""), "1"
        )
        return self._wrap(code, verdict)

    def red(self, text: str) -> str:
        return self._wrap("31", text)


def render_text(
    manifest: Mapping[str, Any],
    *,
    color: bool = False,
    source: str | None = None,
    width: int | None = None,
) -> str:
    """The terminal summary of a manifest.

    Args:
        manifest: the manifest as a dict.
        color: emit ANSI colour codes (the CLI passes True only for a tty without ``NO_COLOR``).
        source: the manifest's path, shown in the title.
        width: the columns every line fits (default: the terminal's, ``COLUMNS``, else 100);
            tables wrap their names to fit (``_report_table``).

    Raises:
        ValueError: as :func:`build_report`.
    """
    r = build_report(manifest)
    if width is None:
        width = shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns
    s = _Style(color, max(width, 40))
    out: list[str] = []
    title = "otel-lockwatch contention report"
    out.append(s.bold(title + (f": {printable(source, None)}" if source else "")))
    proc_line = process_line(r["process"])
    if proc_line:
        out.append(s.dim("  " + proc_line))
    out.append("")
    label = 22
    out.append("verdict".ljust(label) + s.verdict(printable(r["verdict"])))
    if r["verdict_meaning"]:
        out.append(" " * label + s.dim(r["verdict_meaning"]))
    nominal, recommended = r["nominal_pool_size"], r["recommended_pool_size"]
    if nominal is not None or recommended is not None:
        change = ""
        if isinstance(nominal, int) and isinstance(recommended, int) and recommended < nominal:
            change = s.dim(f"  (shrink by {nominal - recommended})")
        out.append(
            "pool size".ljust(label)
            + f"nominal {integer(nominal)} -> recommended {s.bold(integer(recommended))}{change}"
        )
    if r["effective_throughput_pct"] is not None:
        out.append(
            "effective throughput".ljust(label)
            + f"{percent(r['effective_throughput_pct'])} of worker time not spent waiting for locks"
        )
    out.append(
        "aggregate lock wait".ljust(label)
        + f"{duration(r['total_wait_ms'])} over {len(r['locks'])} lock classes"
    )

    out.extend(sizing_section(r["sizing"], s.bold, s.dim))

    threshold = r["thresholds"].get("hot_lock_threshold_pct")
    out.append("")
    heading = "hot locks" + (
        f" (>= {threshold:g} % of the aggregate wait)"
        if finite_number(threshold) is not None
        else ""
    )
    out.append(s.bold(heading))
    if r["hot_locks"]:
        rows = [
            [
                h["lock"],
                duration(h["wait_ms"]),
                percent(h["wait_share_pct"]),
                integer(h["hold"]["count"]),
                duration(h["hold"]["p50_ms"]),
                duration(h["hold"]["p95_ms"]),
                duration(h["hold"]["max_ms"]),
            ]
            for h in r["hot_locks"]
        ]
        headers = ["lock", "wait", "share", "holds", "hold p50", "p95", "max"]
        out += ["  " + line for line in table(headers, rows, {1, 2, 3, 4, 5, 6}, s.width)]
    else:
        out.append("  none")

    out.append("")
    out.append(s.bold("starvation"))
    if r["starvation"]:
        for item in r["starvation"]:
            ratio = f", {item['ratio']:.1f}x" if item["ratio"] is not None else ""
            out.append(
                f"  {printable(item['worker'])} waited {duration(item['wait_ms'])} on "
                f"{printable(item['lock'])} (median {duration(item['median_wait_ms'])}{ratio})"
            )
    else:
        out.append("  none")
    out += pools_section(r, s)
    out += distributed_section(r, s)

    out.append("")
    out.append(s.bold("lock-order cycles"))
    if r["cycles"]:
        for cycle in r["cycles"]:
            # Cycle.format() writes printable names already; a second pass changes nothing
            # there and covers a cycle the model had to write itself.
            text_lines = [printable(line, None) for line in cycle["text"].split("\n")]
            out.append("  " + s.red(text_lines[0]) if text_lines else "")
            out += ["  " + line for line in text_lines[1:]]
    else:
        graph = r["lock_order"]
        out.append(
            f"  none ({len(graph['edges'])} ordering edges among {len(graph['nodes'])} locks)"
        )

    out += points_section(r, s)

    if r["locks"]:
        out.append("")
        out.append(s.bold("locks") + s.dim(" (most waited-on first)"))
        shown = r["locks"][:MAX_CHART_LOCKS]
        rows = [lock_row(row) for row in shown]
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
        out += ["  " + line for line in table(headers, rows, set(range(2, 12)), s.width)]
        if len(r["locks"]) > len(shown):
            out.append(s.dim(f"  ... and {len(r['locks']) - len(shown)} more"))
    if r["unused_locks"]:
        names = ", ".join(printable(n) for n in r["unused_locks"][:MAX_CHART_LOCKS])
        more = len(r["unused_locks"]) - MAX_CHART_LOCKS
        out.append(
            s.dim(f"  never taken as a mutex: {names}" + (f" and {more} more" if more > 0 else ""))
        )

    if r["sections"]:
        out.append("")
        out.append(s.bold("section arrays"))
        rows = [
            [
                sec["name"],
                integer(sec["count"]),
                integer(sec["collision_waits"]),
                integer(sec["max_held"]),
                integer(sec["recommended_count"]),
            ]
            for sec in r["sections"]
        ]
        headers = ["array", "sections", "collision waits", "max held", "recommended"]
        out += ["  " + line for line in table(headers, rows, {1, 2, 3, 4}, s.width)]
    return "\n".join(fit(out, s.width)) + "\n"


def _json_escape(char: str) -> str:
    code = ord(char)
    if code > 0xFFFF:  # a UTF-16 surrogate pair, as JSON writes a character beyond the BMP
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    return f"\\u{code:04x}"


#: The columns of the resource pools table (terminal and HTML alike).
POOL_HEADERS = (
    "pool",
    "kind",
    "capacity",
    "peak in use",
    "waits",
    "wait p95",
    "hold p50",
    "hold p95",
    "timeouts",
    "supports / needs",
)


def pool_row(pool: Mapping[str, Any]) -> list[str]:
    """One resource pool's cells: the last is the workers its capacity supports and the
    capacity the nominal workers need (terminal and HTML alike)."""
    return [
        printable(pool["name"]),
        printable(str(pool["kind"] or "-")),
        integer(pool["capacity"]),
        integer(pool["in_use_peak"]),
        integer(pool["waits"]),
        duration(pool["wait_p95_ms"]),
        duration(pool["hold_p50_ms"]),
        duration(pool["hold_p95_ms"]),
        integer(pool["timeouts"]),
        f"{integer(pool['workers_supported'])} / {integer(pool['capacity_needed'])}",
    ]


def distributed_section(report: Mapping[str, Any], s: Any) -> list[str]:
    """The lease overruns and release failures of distributed locks, for the terminal; nothing
    for a manifest without them."""
    out: list[str] = []
    if report["lease_overruns"]:
        out += ["", s.bold("lease overruns (held past the lease: two holders at once)")]
        for item in report["lease_overruns"]:
            times = item["overruns"]
            out.append(
                f"  {printable(item['worker'])} held {printable(item['lock'])} past its lease "
                f"{times} time{'' if times == 1 else 's'}, {duration(item['overrun_ms'])} in all"
            )
    if report["release_failures"]:
        out += ["", s.bold("release failures")]
        for item in report["release_failures"]:
            out.append(
                f"  {printable(item['lock'])}: {item['not_owned']} not owned, "
                f"{item['lock_error']} lock errors"
            )
    return out


def idle_line(report: Mapping[str, Any]) -> str:
    """``3.84 s in 100 waits on app.jobs (queue.Queue, 4 workers)``: the idle waits in one line."""
    idle = report["idle_waits"]
    parts = [
        f"{printable(i['name'])} ({printable(i['kind'] or '-')}, "
        f"{integer(i['count'])} waits by {i['workers']} workers)"
        for i in idle[:3]
    ]
    more = f" and {len(idle) - 3} more" if len(idle) > 3 else ""
    return f"{duration(report['idle_wait_ms'])} on {', '.join(parts)}{more}"


def pools_section(report: Mapping[str, Any], s: _Style) -> list[str]:
    """The resource pools and the idle waits of a report, for the terminal; nothing for a
    manifest that has neither (one written before they were recorded)."""
    if not report["resource_pools"] and not report["idle_waits"]:
        return []
    out = ["", s.bold("resource pools")]
    pools = report["resource_pools"]
    if pools:
        rows = [pool_row(p) for p in pools]
        out += ["  " + line for line in table(POOL_HEADERS, rows, set(range(2, 10)), s.width)]
        out += ["  " + s.red(p["advice"]) for p in pools if p["advice"]]
    else:
        out.append("  none")
    if report["idle_waits"]:
        out.append("  " + s.dim("idle waits (not contention): " + idle_line(report)))
    return out


#: The columns of a class's contention points and of its contending points.
WAITER_HEADERS = ("waited at", "waits", "wait", "share", "wait p95")
HOLDER_HEADERS = ("held by (the holder's site)", "waits", "wait", "share")


def waiter_row(w: Mapping[str, Any]) -> list[str]:
    """A contention point (a site that waited) as the cells of :data:`WAITER_HEADERS`."""
    return [*holder_row(w), duration(w.get("p95_ms"))]


def holder_row(h: Mapping[str, Any]) -> list[str]:
    """A contending point (a site holding the lock meanwhile) as :data:`HOLDER_HEADERS`."""
    return [h["site"], integer(h["count"]), duration(h["wait_ms"]), percent(h["share_pct"])]


def points_section(report: Mapping[str, Any], s: _Style) -> list[str]:
    """Where the wait comes from: per class, the sites that waited and the sites holding it."""
    if not report["contention_points"]:
        return []
    out = ["", s.bold("contention points") + s.dim(" (who waits, and who held the lock meanwhile)")]
    for p in report["contention_points"]:
        out.append(
            f"  {printable(p['lock'])}: {integer(p['contentions'])} waits, {duration(p['wait_ms'])}"
        )
        for headers, rows in (
            (WAITER_HEADERS, [waiter_row(w) for w in p["waiters"]]),
            (HOLDER_HEADERS, [holder_row(h) for h in p["holders"]]),
        ):
            figures = set(range(1, len(headers)))
            out += ["    " + line for line in table(headers, rows, figures, s.width, 4)]
    return out


def render_json(manifest: Mapping[str, Any]) -> str:
    """The report of :func:`build_report` as JSON with sorted keys (diffable, scriptable).

    Non-ASCII text is kept as it is, but a character that is not printable (``json`` escapes
    only the C0 controls; this also covers DEL, the C1 controls, bidirectional overrides, line
    separators, lone surrogates) is written as a ``\\u`` escape: the same JSON value, nothing
    a terminal would act on.

    Raises:
        ValueError: as :func:`build_report`.
    """
    text = json.dumps(build_report(manifest), sort_keys=True, indent=2, ensure_ascii=False)
    lines = text.split("\n")  # a JSON text's only raw newlines are between its tokens
    for i, line in enumerate(lines):
        if not line.isprintable():
            lines[i] = "".join(c if c.isprintable() else _json_escape(c) for c in line)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------
# DOT


def _dot_string(text: str) -> str:
    """A DOT quoted string showing ``text``: printable (cut past ``NAME_LIMIT`` characters),
    with ``\\`` and ``"`` escaped, so Graphviz shows the printable text itself."""
    return '"' + printable(text).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_dot(manifest: Mapping[str, Any]) -> str:
    """The lock-order graph as Graphviz DOT: an edge ``A -> B`` means some worker acquired B
    while holding A; each edge is labelled with that worker, cycle edges are red and bold.

    Nodes are ``n0``, ``n1``, ... (cycle members first), each labelled with its lock's
    printable name: a DOT string never holds a control character nor approaches Graphviz's
    16,384-character limit, whatever the names.

    Raises:
        ValueError: as :func:`build_report`.
    """
    graph = build_report(manifest)["lock_order"]
    cycle_nodes = {n for e in graph["edges"] if e["cycle"] for n in (e["holding"], e["acquiring"])}
    ids = {name: f"n{i}" for i, name in enumerate(graph["nodes"])}
    lines = [
        "digraph lock_order {",
        "  rankdir=LR;",
        '  node [shape=box, style="rounded", fontname="monospace"];',
        '  edge [fontname="monospace", fontsize=10];',
    ]
    for name in graph["nodes"]:
        style = ', color="#c62828", penwidth=2' if name in cycle_nodes else ""
        lines.append(f"  {ids[name]} [label={_dot_string(name)}{style}];")
    for e in graph["edges"]:
        for name in (e["holding"], e["acquiring"]):
            if name not in ids:  # an edge whose lock the model did not list
                ids[name] = f"n{len(ids)}"
                lines.append(f"  {ids[name]} [label={_dot_string(name)}];")
        attrs = [f"label={_dot_string(str(e['worker'] or ''))}"]
        if e["cycle"]:
            attrs += ['color="#c62828"', 'fontcolor="#c62828"', "penwidth=2"]
        lines.append(f"  {ids[e['holding']]} -> {ids[e['acquiring']]} [{', '.join(attrs)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"
