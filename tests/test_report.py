"""The renderings of a manifest (text, JSON, HTML, DOT), on manifests evaluated from snapshots.

``tests/data/snapshot_billing.json`` is a recorder snapshot with known ground truth: eight workers
on a ``config`` lock that takes 4100 ms of the 4405 ms of waiting (hot; holds of 1.5 ms x 600,
5 ms x 480, 8.4 ms x 114, 31 ms x 6), ``worker-7`` waiting 2000 ms on it against a 300 ms median
(starved), an ``accounts -> ledger -> accounts`` cycle beside a plain ``config -> metrics`` edge,
and a 64-section ``emitter`` array; the pool's nominal size is 16. The renderers take the
manifest as a plain dict, so the tests also feed them partial dicts a real manifest never is.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from otel_lockwatch.cli import _common, _report_html, _report_model, _report_text
from otel_lockwatch.cli._report_table import fit
from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.record._witness import Cycle

DATA = Path(__file__).parent / "data"
ANSI = re.compile(r"\x1b\[")


@pytest.fixture
def full() -> dict:
    return evaluate(json.loads((DATA / "snapshot_billing.json").read_text())).to_dict()


@pytest.fixture
def minimal() -> dict:
    """A dict with a verdict and nothing else: every renderer must cope."""
    return {"verdict": "LOW_CONTENTION"}


def test_build_report_orders_locks_by_wait_and_computes_shares(full):
    """The per-lock rows come most waited-on first, with shares of the total wait summing to
    100 %, and the hot lock carries its hold distribution and histogram buckets."""
    report = _report_model.build_report(full)
    assert [row["lock"] for row in report["locks"]] == [
        "config",
        "accounts",
        "ledger",
        "emitter",
        "metrics",
    ]
    assert sum(row["wait_share_pct"] for row in report["locks"]) == pytest.approx(100.0)
    assert report["total_wait_ms"] == pytest.approx(4100 + 200 + 100 + 5)
    (hot,) = report["hot_locks"]
    assert hot["lock"] == "config" and hot["wait_share_pct"] == pytest.approx(93.076)
    assert hot["hold"]["p50_ms"] == 1.5 and hot["hold"]["max_ms"] == 31.0
    assert hot["hold"]["p95_ms"] == pytest.approx(8.4, rel=1 / 32)
    buckets = hot["hold"]["buckets"]
    assert [b["count"] for b in buckets] == [600, 480, 114, 6]
    for b, held_ms in zip(buckets, (1.5, 5, 8.4, 31), strict=True):
        assert b["lo_ms"] <= held_ms < b["hi_ms"]
    (starved,) = report["starvation"]
    assert starved["worker"] == "worker-7" and starved["ratio"] == pytest.approx(2000 / 300)


def test_build_report_flags_exactly_the_cycle_edges(full):
    graph = _report_model.build_report(full)["lock_order"]
    flagged = {(e["holding"], e["acquiring"]): e["cycle"] for e in graph["edges"]}
    assert flagged == {
        ("accounts", "ledger"): True,
        ("ledger", "accounts"): True,
        ("config", "metrics"): False,
    }
    assert graph["nodes"][:2] == ["accounts", "ledger"]  # cycle members first


def test_build_report_refuses_a_manifest_without_verdict():
    with pytest.raises(ValueError, match=r"^a manifest must have a verdict, got None$"):
        _report_model.build_report({"schema": "otel-lockwatch/manifest/1"})
    with pytest.raises(ValueError, match=r"^a manifest must be a JSON object, got list$"):
        _report_model.build_report([])  # type: ignore[arg-type]


def test_text_report_shows_every_part_in_plain_text(full):
    """Verdict, pool sizes, throughput, hot lock with share and hold percentiles, starvation,
    the lockdep text of the cycle, the per-lock table and the sections, and no ANSI code."""
    text = _report_text.render_text(full, source="m.json", width=1000)
    assert not ANSI.search(text)
    assert text.startswith("otel-lockwatch contention report: m.json\n")
    assert re.search(r"^verdict +CYCLIC_ORDERING_DETECTED$", text, re.M)
    assert re.search(r"^pool size +nominal 16 -> recommended 8  \(shrink by 8\)$", text, re.M)
    assert re.search(r"^effective throughput +87\.8 % of worker time", text, re.M)
    assert re.search(r"^  config +4\.1 s +93\.1 % +1200 +1\.5 ms +8\.65 ms +31 ms$", text, re.M)
    assert "  worker-7 waited 2 s on config (median 300 ms, 6.7x)\n" in text
    cycle_text = Cycle.from_json(full["pre_deadlock_ordering_witness"][0]).format()
    assert "\n".join("  " + line for line in cycle_text.splitlines()) in text
    assert re.search(r"^  ledger +threading\.Lock +300 +25 +0 +1 +100 ms +2\.3 %", text, re.M)
    recommended = full["sections"]["emitter"]["recommended_count"]
    assert re.search(rf"^  emitter +64 +12 +16 +{recommended}$", text, re.M)


@pytest.mark.parametrize("width", [40, 60, 80, 100, 160])
def test_text_report_colours_only_when_asked(full, width):
    """With ``color=True`` the verdict is red; stripping the codes gives the plain report, at
    any width: a code takes no column (before, an 80-column terminal wrapped the coloured
    report's dim process line where the plain one fits)."""
    coloured = _report_text.render_text(full, color=True, width=width)
    assert "\x1b[1;31mCYCLIC_ORDERING_DETECTED\x1b[0m" in coloured
    plain = re.sub(r"\x1b\[[0-9;]*m", "", coloured)
    assert plain == _report_text.render_text(full, color=False, width=width)
    assert max(len(line) for line in plain.splitlines()) <= width


def test_a_coloured_line_wraps_as_the_plain_one_with_its_style_carried():
    dim, reset = "\x1b[2m", "\x1b[0m"
    assert fit([f"{dim}  aaaa bbbb cccc dddd{reset}"], 12) == [
        f"{dim}  aaaa bbbb{reset}",
        f"      {dim}cccc{reset}",
        f"      {dim}dddd{reset}",
    ]
    assert fit([f"  aaaa {dim}bbbb{reset} cccc"], 11) == [
        f"  aaaa {dim}bbbb{reset}",
        "      cccc",
    ]


def test_minimal_manifest_renders_everywhere(minimal):
    """A manifest with only a verdict still renders in every format."""
    text = _report_text.render_text(minimal)
    assert re.search(r"^verdict +LOW_CONTENTION$", text, re.M)
    assert "hot locks\n  none\n" in text and "starvation\n  none\n" in text
    assert "lock-order cycles\n  none (0 ordering edges among 0 locks)\n" in text
    assert json.loads(_report_text.render_json(minimal))["verdict"] == "LOW_CONTENTION"
    page = _report_html.render_html(minimal)
    assert 'id="wait-share-chart"' in page and 'id="lock-order-graph"' in page
    assert "no nested acquisition was recorded" in page
    assert _report_text.render_dot(minimal).startswith("digraph lock_order {\n")


def test_json_report_has_sorted_keys_and_is_the_report(full):
    text = _report_text.render_json(full)
    data = json.loads(text)
    assert data == json.loads(json.dumps(_report_model.build_report(full)))
    assert text == json.dumps(data, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def test_dot_marks_cycle_edges_red_and_labels_workers(full):
    """Nodes are n0, n1, ... (cycle members first) labelled with their lock; cycle edges and
    their nodes are red; each edge is labelled with its worker."""
    dot = _report_text.render_dot(full)
    assert '  n0 [label="accounts", color="#c62828", penwidth=2];\n' in dot
    assert '  n1 [label="ledger", color="#c62828", penwidth=2];\n' in dot
    assert '  n2 [label="config"];\n  n3 [label="metrics"];\n' in dot
    assert (
        '  n0 -> n1 [label="worker-3", color="#c62828", fontcolor="#c62828", penwidth=2];\n' in dot
    )
    assert '  n1 -> n0 [label="worker-5", color="#c62828"' in dot
    assert '  n2 -> n3 [label="worker-1"];\n' in dot
    assert dot.rstrip().endswith("}")


def test_dot_escapes_quotes_in_lock_names():
    manifest = {
        "verdict": "LOW_CONTENTION",
        "lock_order": {
            "edges": [{"holding": 'a"b', "acquiring": "c\\d", "worker": "w", "sites": ["x", "y"]}]
        },
    }
    dot = _report_text.render_dot(manifest)
    assert '  n0 [label="a\\"b"];\n  n1 [label="c\\\\d"];\n  n0 -> n1 [label="w"];\n' in dot


def test_html_is_self_contained(full):
    """No script, no stylesheet link, no image, no URL other than the SVG namespace."""
    page = _report_html.render_html(full)
    assert "<script" not in page and "<link" not in page and "<img" not in page
    assert "@import" not in page and "@font-face" not in page
    urls = set(re.findall(r"https?://[^\s\"')]+", page))
    assert urls == {"http://www.w3.org/2000/svg"}
    assert page.count('class="hold-chart"') == 1
    assert page.count('class="edge cycle"') == 2


def test_html_escapes_lock_and_worker_names(full):
    full["locks"]['<b>&"x'] = {"kind": "threading.Lock", "wait_ms_total": 1.0}
    full["lock_order"]["edges"].append(
        {"holding": "<script>", "acquiring": "config", "worker": "<w>", "sites": ["a", "b"]}
    )
    page = _report_html.render_html(full)
    assert "<script>" not in page and "<b>&" not in page and "<w>" not in page
    assert "&lt;b&gt;&amp;&quot;x" in page and "&lt;script&gt;" in page


def test_write_text_atomic_replaces_whole_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "out.html"
    target.write_text("old")
    _common.write_text_atomic(target, "new ünïcode")
    assert target.read_text(encoding="utf-8") == "new ünïcode"
    assert os.listdir(tmp_path) == ["out.html"]


def test_write_text_atomic_into_missing_directory_raises_and_writes_nothing(tmp_path):
    with pytest.raises(FileNotFoundError):
        _common.write_text_atomic(tmp_path / "missing" / "out.html", "x")
    assert os.listdir(tmp_path) == []


def test_merged_process_is_named_by_its_pids(full):
    full["process"] = {"pids": [11, 12], "merged": 2, "service.name": "a, b"}
    assert "  a, b, merged from 2 processes (pids 11, 12)\n" in _report_text.render_text(full)


def _long_named(full: dict) -> dict:
    """The billing snapshot with a lock of a long dotted name, waited on at long sites."""
    name = "billing.ledger.postings_by_account_and_currency_shard_017.settlement_window_lock"
    site = "billing.ingest.handlers.postings_by_account_and_currency:apply_posting_batch:412"
    doc = json.loads(json.dumps(full))
    entry = doc["locks"].pop("config")
    entry["contention_points"] = {site: {"sub_bits": 4, "buckets": [[216, 3]], "count": 3,
                                         "sum": 300000, "min": 100000, "max": 100000}}  # fmt: skip
    entry["contending_points"] = {site.replace("apply", "hold"): {"count": 3, "wait_ns": 300000}}
    doc["locks"][name] = entry
    return doc


@pytest.mark.parametrize("width", [100, 80, 60])
def test_text_report_lines_fit_the_width_and_tables_wrap_long_names(full, width):
    """No line is wider than the terminal; a table whose names do not fit wraps them in their
    column (or puts them on a line of their own above the figures), losing no character."""
    doc = _long_named(full)
    text = _report_text.render_text(doc, width=width)
    lines = text.splitlines()
    assert max(map(len, lines)) <= width, [line for line in lines if len(line) > width]
    squeezed = "".join(line.strip() for line in lines)
    assert "billing.ledger.postings_by_account_and_currency_shard_017.settlement_window_lock" in (
        squeezed.replace(" ", "")
    )
    assert "contention points" in text
    site = "billing.ingest.handlers.postings_by_account_and_currency:apply_posting_batch:412"
    assert all(piece in text for piece in re.split(r"[.:_]", site))  # wrapped at separators


def test_text_report_keeps_its_one_line_tables_when_they_fit(full):
    """A table that fits the width is drawn as before: one line per row."""
    text = _report_text.render_text(full, width=1000)
    assert re.search(r"^  config +4\.1 s +93\.1 % +1200 +1\.5 ms +8\.65 ms +31 ms$", text, re.M)
