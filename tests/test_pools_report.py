"""The resource pools in the report: the model, the terminal summary, the HTML page, JSON.

An exhausted pool (16 workers on 2 slots, ``_snapshots.PoolRun``) is the bottleneck, and the
report gives both ways out; a producer's idle consumers are one line apart from the pools; a
manifest without pools renders as it always did; malformed entries of a partial manifest
render as unknown instead of failing.
"""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest
from _snapshots import PoolRun, locks_and_workers, pool_data, producer_consumer

from otel_lockwatch import _settings
from otel_lockwatch.cli import _report_html, _report_model, _report_text
from otel_lockwatch.manifest._evaluate import evaluate

POOL = "app.db:make_pool:12"
QUEUE = "app.jobs:make_queue:7"
ADVICE = (
    f"{POOL} is the bottleneck (100.0 % of the wait): 2 workers for its capacity of 2, "
    "or capacity 16 for the 16 workers"
)


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for setting in _settings.SETTINGS.values():
        monkeypatch.delenv(setting.variable, raising=False)


@pytest.fixture
def pools() -> dict:
    """An exhausted semaphore pool beside a work queue with four idle consumers."""
    data = pool_data(PoolRun(16, 2), "semaphore")
    work = producer_consumer()
    data["locks"] |= work["locks"]
    data["workers"] |= work["workers"]
    return evaluate(data).to_dict()


def test_the_model_lists_the_pool_with_both_ways_out(pools):
    report = _report_model.build_report(pools)
    (pool,) = report["resource_pools"]
    assert (pool["name"], pool["capacity"], pool["in_use_peak"], pool["waits"]) == (
        POOL,
        2,
        2,
        158,
    )
    assert (pool["hold_p50_ms"], pool["hold_p95_ms"], pool["timeouts"]) == (10.0, 10.0, 0)
    assert (pool["workers_supported"], pool["capacity_needed"]) == (2, 16)
    assert pool["hot"] and pool["advice"] == ADVICE
    (idle,) = report["idle_waits"]
    assert (idle["name"], idle["kind"], idle["count"], idle["workers"]) == (
        QUEUE,
        "queue.Queue",
        100,
        4,
    )
    assert report["idle_wait_ms"] == idle["total_ms"] > 3000
    (hot,) = report["hot_locks"]  # a pool's hold is checkout to checkin
    assert hot["hold"]["p50_ms"] == 10.0 and [b["count"] for b in hot["hold"]["buckets"]] == [160]


def test_the_terminal_report_has_a_pools_section(pools):
    text = _report_text.render_text(pools, width=1000)
    section = text[text.index("\nresource pools\n") : text.index("\nlock-order cycles\n")]
    lines = section.strip("\n").splitlines()
    assert lines[1].split() == [
        "pool",
        "kind",
        "capacity",
        "peak",
        "in",
        "use",
        "waits",
        "wait",
        "p95",
        "hold",
        "p50",
        "hold",
        "p95",
        "timeouts",
        "supports",
        "/",
        "needs",
    ]
    assert lines[2].split() == [
        POOL,
        "threading.BoundedSemaphore",
        "2",
        "2",
        "158",
        "69.2",
        "ms",
        "10",
        "ms",
        "10",
        "ms",
        "0",
        "2",
        "/",
        "16",
    ]
    assert lines[3] == "  " + ADVICE
    assert lines[4].startswith("  idle waits (not contention): 3.84 s on " + QUEUE)
    assert "(queue.Queue, 100 waits by 4 workers)" in lines[4]


def test_a_manifest_without_pools_renders_as_before():
    locks, workers = locks_and_workers([("a", "l", 5_000_000, 0), ("b", "l", 0, 0)])
    doc = evaluate({"locks": locks, "workers": workers}).to_dict()
    for field in ("resource_pools", "idle_waits"):
        del doc[field]
    assert "resource pools" not in _report_text.render_text(doc)
    assert "Resource pools" not in _report_html.render_html(doc)
    report = _report_model.build_report(doc)
    assert (report["resource_pools"], report["idle_waits"], report["idle_wait_ms"]) == ([], [], 0)


class _Tables(HTMLParser):
    """The cells of the table with id ``resource-pools`` and the text of ``p.bottleneck`` and
    ``p#idle-waits``."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.bottlenecks: list[str] = []
        self.idle: list[str] = []
        self._in_table = False
        self._cell: list[str] | None = None
        self._para: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and a.get("id") == "resource-pools":
            self._in_table = True
        elif self._in_table and tag == "tr":
            self.rows.append([])
        elif self._in_table and tag in ("td", "th"):
            self._cell = []
        elif tag == "p" and (a.get("class") == "bottleneck" or a.get("id") == "idle-waits"):
            self._para = self.bottlenecks if a.get("class") == "bottleneck" else self.idle
            self._para.append("")

    def handle_endtag(self, tag):
        if tag == "table":
            self._in_table = False
        elif tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append("".join(self._cell))
            self._cell = None
        elif tag == "p":
            self._para = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._para is not None:
            self._para[-1] += data


def test_the_html_page_has_the_pools_table_the_way_out_and_the_idle_waits(pools):
    page = _Tables()
    page.feed(_report_html.render_html(pools))
    header, row = page.rows
    assert header == list(_report_text.POOL_HEADERS)
    assert row == [
        POOL,
        "threading.BoundedSemaphore",
        "2",
        "2",
        "158",
        "69.2 ms",
        "10 ms",
        "10 ms",
        "0",
        "2 / 16",
    ]
    assert page.bottlenecks == [ADVICE]
    (idle,) = page.idle
    assert idle.startswith(f"Idle waits (not contention): 3.84 s on {QUEUE}")


def test_the_json_report_carries_the_pools(pools):
    report = json.loads(_report_text.render_json(pools))
    assert report["resource_pools"][0]["advice"] == ADVICE
    assert report["idle_waits"][0]["name"] == QUEUE


def test_a_pool_with_unknown_sizes_says_what_is_known():
    base = {"name": "p", "hot": True, "wait_share_pct": 80.0, "nominal_pool_size": 8}
    report = _report_model.build_report(
        {
            "verdict": "HOT_LOCK_DETECTED",
            "resource_pools": [
                base,
                base | {"name": "q", "capacity_needed": 4},
                base | {"name": "r", "capacity": 1, "workers_supported": 1, "capacity_needed": 3},
                base | {"name": "s", "hot": False, "capacity": 4},
            ],
        }
    )
    assert [p["advice"] for p in report["resource_pools"]] == [
        "p is the bottleneck (80.0 % of the wait): its capacity and hold times are unknown, "
        "so the sizing counts the workers it let work at once",
        "q is the bottleneck (80.0 % of the wait): capacity 4 for the 8 workers",
        "r is the bottleneck (80.0 % of the wait): 1 worker for its capacity of 1, "
        "or capacity 3 for the 8 workers",
        None,
    ]


def test_malformed_pool_entries_render_as_unknown():
    """A partial or foreign manifest: wrong types become unknown cells, never an exception."""
    doc = {
        "verdict": "HOT_LOCK_DETECTED",
        "resource_pools": [
            {"name": 3, "capacity": "lots", "waits": [], "hold": 7, "hot": "yes"},
            "not an object",
        ],
        "idle_waits": [{"count": True, "total_ms": float("nan")}, None],
    }
    report = _report_model.build_report(doc)
    first = report["resource_pools"][0]
    assert (first["name"], first["capacity"], first["waits"], first["advice"]) == (
        "3",
        None,
        None,
        None,
    )
    assert report["idle_wait_ms"] == 0
    assert "resource pools" in _report_text.render_text(doc)
    assert 'id="resource-pools"' in _report_html.render_html(doc)
