"""The HTML report, laid out by a real headless Chromium as a person would look at it.

A string test can say that ``<svg id="wait-share-chart">`` is in the file; only a browser can
say that it lays out to a visible box, that no name runs off the page, that no label sits on an
arrow or on another label. One browser (``tests/chromium.py``, the DevTools protocol over a
pipe) serves the module: a tab 1400 px wide and a tab 800 px wide each load every report,
measure it with the browser's own geometry (``getBoundingClientRect``, ``getPointAtLength``
along each arrow of the lock-order graph) and take a full-page screenshot.

The reports: the billing snapshot of ``test_report.py``; the manifest of a real
``otel-lockwatch demo`` run; and generated manifests of 2, 5, 20 and 200 lock classes, with long
creation-site names, long worker names, chains, fans and cycles in their lock-order graphs, long
contention and contending sites, and a timeline of 256 buckets.

The tests skip only when Chromium is not installed *and* ``CI`` is unset.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from chromium import Browser, find_browser

from otel_lockwatch.cli._main import main
from otel_lockwatch.cli._report_graph import MAX_GRAPH_NODES, drawn_nodes
from otel_lockwatch.cli._report_html import render_html
from otel_lockwatch.cli._report_model import build_report
from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.manifest._io import dump_manifest
from otel_lockwatch.record._histogram import LogHistogram

pytestmark = pytest.mark.e2e

DATA = Path(__file__).parent / "data"
WIDTHS = (1400, 800)
GENERATED = (2, 5, 20, 200)
CYCLE_STROKE = "rgb(198, 40, 40)"

#: Measures the page: what overflows it, which label boxes overlap, where arrows cross labels.
PROBE = r"""
(function () {
  function all(sel, root) {
    return Array.prototype.slice.call((root || document).querySelectorAll(sel));
  }
  function rect(el) {
    var r = el.getBoundingClientRect();
    return {x: r.left, y: r.top, w: r.width, h: r.height, r: r.right, b: r.bottom};
  }
  function name(el) {
    var cls = el.getAttribute("class");
    var lock = el.getAttribute("data-lock") || el.getAttribute("data-holding");
    return el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") +
      (cls ? "." + cls.split(" ").join(".") : "") + (lock ? "[" + lock + "]" : "") +
      (el.tagName.toLowerCase() === "text" ? " '" + el.textContent + "'" : "");
  }
  function overlap(a, b, slack) {
    return a.x < b.r - slack && b.x < a.r - slack && a.y < b.b - slack && b.y < a.b - slack;
  }
  var vw = document.documentElement.clientWidth;
  var out = {
    viewport: vw,
    scroll_width: document.documentElement.scrollWidth,
    outside: all("body *").filter(function (el) {
      var r = el.getBoundingClientRect();
      return r.width > 0 && (r.right > vw + 0.5 || r.left < -0.5);
    }).map(name),
    cells: all("td, th").filter(function (c) {
      return c.scrollWidth > c.clientWidth + 1;
    }).map(function (c) { return c.textContent; }),
    overlaps: [],
    crossings: []
  };
  all("svg").forEach(function (svg) {
    // Label boxes: every text, and the lock boxes of the graph (a lock's own name is inside
    // its box, so the name is measured against everything else but that box).
    var boxes = all("text", svg).map(function (t) {
      return {el: t, r: rect(t), own: t.closest("g.node")};
    }).concat(all("g.node rect", svg).map(function (b) {
      return {el: b.parentNode, r: rect(b), own: b.parentNode};
    })).filter(function (x) { return x.r.w > 0; });
    for (var i = 0; i < boxes.length; i++) {
      for (var j = i + 1; j < boxes.length; j++) {
        var a = boxes[i], b = boxes[j];
        if (a.own && a.own === b.own) continue;
        if (overlap(a.r, b.r, 0.5)) out.overlaps.push([name(a.el), name(b.el)]);
      }
    }
    all("line.threshold", svg).forEach(function (line) {
      var l = rect(line);
      l.x -= 1; l.r += 1;
      boxes.forEach(function (x) {
        if (overlap(l, x.r, 0.5)) out.crossings.push([name(line), name(x.el)]);
      });
    });
    all("path.edge", svg).forEach(function (path) {
      var m = path.getScreenCTM(), length = path.getTotalLength();
      for (var s = 0; s <= length; s += 2) {
        var p = path.getPointAtLength(s);
        var x = m.a * p.x + m.c * p.y + m.e, y = m.b * p.x + m.d * p.y + m.f;
        for (var k = 0; k < boxes.length; k++) {
          var r = boxes[k].r;
          if (x > r.x + 1.5 && x < r.r - 1.5 && y > r.y + 1.5 && y < r.b - 1.5) {
            out.crossings.push([name(path), name(boxes[k].el)]);
            return;
          }
        }
      }
    });
  });
  function svgs(sel) {
    return all(sel).map(function (el) {
      var r = rect(el);
      r.scale = r.w / (parseFloat(el.getAttribute("width")) || r.w);
      return r;
    });
  }
  var graph = document.getElementById("lock-order-graph");
  out.graph = graph ? svgs("#lock-order-graph")[0] : null;
  out.wait_chart = svgs("#wait-share-chart")[0] || null;
  out.wait_bars = all("#wait-share-chart rect.bar").map(function (el) {
    var r = rect(el); r.lock = el.getAttribute("data-lock"); r.hot = el.classList.contains("hot");
    return r;
  });
  out.timeline = all("#timeline-chart g.timeline-row").map(function (el) {
    var r = rect(el); r.lock = el.getAttribute("data-lock");
    r.bars = all("rect.bar.wait", el).length;
    return r;
  });
  out.points = all("div.points").map(function (el) { return el.getAttribute("data-lock"); });
  out.hold_charts = all("svg.hold-chart").map(function (el) {
    var r = rect(el);
    r.lock = el.getAttribute("data-lock");
    r.kind = el.getAttribute("data-kind");
    r.bars = all("rect.bar", el).map(rect);
    return r;
  });
  out.nodes = all("#lock-order-graph g.node").map(function (el) {
    var r = rect(el); r.lock = el.getAttribute("data-lock");
    r.cycle = el.classList.contains("cycle");
    return r;
  });
  out.edges = all("#lock-order-graph path.edge").map(function (el) {
    var r = rect(el);
    r.holding = el.getAttribute("data-holding");
    r.acquiring = el.getAttribute("data-acquiring");
    r.cycle = el.classList.contains("cycle");
    r.stroke = getComputedStyle(el).stroke;
    return r;
  });
  out.edge_labels = all("#lock-order-graph text.edge-label").map(function (el) {
    return Array.prototype.slice.call(el.childNodes).filter(function (n) {
      return n.nodeType === 3;  // the label's own text, not its tooltip
    }).map(function (n) { return n.nodeValue; }).join("");
  });
  return out;
})()
"""


# --------------------------------------------------------------------------------------------
# The manifests


def generated_manifest(n: int, seed: int = 17) -> dict[str, Any]:
    """A manifest of ``n`` lock classes: one in three with a long creation-site name, the first
    two hot, a chain of nestings with fans, skips and cycles, long worker names."""
    rng = random.Random(seed)
    names = [
        f"billing.ledger.postings_by_account_and_currency_shard_{i:03d}"
        if i % 3 == 2
        else f"lock_{i:03d}"
        for i in range(n)
    ]
    locks = {}
    for i, name in enumerate(names):
        wait = 5000.0 / (i + 1) ** 2
        locks[name] = {
            "kind": "section" if i % 4 == 3 else "threading.Lock",
            "acquisitions": 1000 + 37 * i,
            "contentions": 100 + i,
            "skipped": 0,
            "timeouts": 0,
            "wait_ms_total": wait,
            "wait": {"p95_ms": wait / 50},
            "hold": {"p50_ms": 1.5, "p95_ms": 4.25, "max_ms": 31.0},
        }
    total = sum(entry["wait_ms_total"] for entry in locks.values())
    hot = [
        {"lock": names[i], "wait_ms": locks[names[i]]["wait_ms_total"]}
        | {"wait_share_pct": 100 * locks[names[i]]["wait_ms_total"] / total}
        for i in range(min(2, n))
    ]

    def edge(a: int, b: int) -> dict[str, Any]:
        worker = rng.choice(
            ["publisher-03", "compactor", "reporter", "ingest-worker-pool-thread-12"]
        )
        return {
            "holding": names[a],
            "acquiring": names[b],
            "worker": worker,
            "sites": [f"billing.app:handler_{a}:{10 + a}", f"billing.app:handler_{b}:{20 + b}"],
            "at": "2026-11-30T10:00:00.000Z",
        }

    pairs = {(i, i + 1) for i in range(n - 1)}  # a chain
    pairs |= {(0, j) for j in range(2, min(n, 6))}  # a fan out of the hottest lock
    pairs |= {(i, i + 3) for i in range(0, n - 3, 4)}  # skips over layers
    pairs |= {(rng.randrange(n), rng.randrange(n)) for _ in range(n // 4)}  # noise
    pairs = {(a, b) for a, b in pairs if a != b}
    cycles = [[0, 1]] + ([[2, 3, 4]] if n >= 5 else [])
    for cycle in cycles:
        for k, a in enumerate(cycle):
            pairs.add((a, cycle[(k + 1) % len(cycle)]))
    if n >= 5:
        pairs.add((4, 4))  # a lock class nested in itself (two locks of one class)
    edges = [edge(a, b) for a, b in sorted(pairs)]
    witnesses = [
        {
            "cycle": [names[i] for i in cycle],
            "edges": [edge(a, cycle[(k + 1) % len(cycle)]) for k, a in enumerate(cycle)],
        }
        for cycle in cycles
    ]
    # Contention points with long sites on both sides, the "(other)" row of a full table, and a
    # timeline of the longest kind (256 buckets) for the classes with the most wait.
    for i, name in enumerate(names):
        waits = [
            f"billing.ingest.handlers.postings_by_account_and_currency:apply_posting_batch:{k}"
            if k % 2
            else f"app:w{k}:{k}"
            for k in range(1 + i % 10)
        ]
        locks[name]["contention_points"] = {
            site: LogHistogram([1000 * (k + 1)] * (k + 1)).to_json() for k, site in enumerate(waits)
        }
        locks[name]["contending_points"] = {
            site.replace("apply", "hold"): {"count": k + 1, "wait_ns": 1000 * (k + 1) ** 2}
            for k, site in enumerate(waits)
        }
    series = {
        name: {
            "wait_ns": [rng.randrange(10**9) for _ in range(256)],
            "hold_ns": [rng.randrange(10**9) for _ in range(256)],
        }
        for name in names[:8]
    }
    timeline = {"width_ms": 800, "start_ms": 1_796_000_000_000, "buckets": 256, "locks": series}
    return {
        "verdict": "CYCLIC_ORDERING_DETECTED",
        "timeline": timeline,
        "nominal_pool_size": 16,
        "recommended_pool_size": 8,
        "effective_throughput_pct": 41.5,
        "thresholds": {"hot_lock_threshold_pct": 20},
        "locks": locks,
        "hot_lock_register": hot,
        "starvation_signatures": [
            {"worker": "ingest-worker-pool-thread-12", "lock": names[-1], "wait_ms": 900.0}
            | {"median_wait_ms": 12.0}
        ],
        "lock_order": {"edges": edges, "cycles": witnesses},
        "pre_deadlock_ordering_witness": witnesses,
        "manifest_digest": "d0fc6b845bc21d21e891f82dec00c28e5edf0d470ce97fdc0304c12c834ad17d",
    }


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, dict]]:
    """Every report the tests look at: name -> (HTML file, manifest)."""
    tmp = tmp_path_factory.mktemp("html-reports")
    out: dict[str, tuple[Path, dict]] = {}
    billing = evaluate(json.loads((DATA / "snapshot_billing.json").read_text()))
    dump_manifest(billing, tmp / "billing.json")
    demo = tmp / "demo.json"
    assert main(["demo", "--workers", "6", "--seconds", "1", "--manifest", str(demo)]) == 0
    for name in ("billing", "demo"):
        page = tmp / f"{name}.html"
        assert main(["report", str(tmp / f"{name}.json"), "--html", str(page)]) == 0
        out[name] = (page, json.loads((tmp / f"{name}.json").read_text()))
    for n in GENERATED:
        manifest = generated_manifest(n)
        page = tmp / f"generated-{n}.html"
        page.write_text(render_html(manifest))
        out[f"generated-{n}"] = (page, manifest)
    return out


@pytest.fixture(scope="module")
def measured(
    reports: dict[str, tuple[Path, dict]], tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, int], dict[str, Any]]:
    """Each report in a tab of each width of one browser: its probe figures and screenshot."""
    binary = find_browser()
    tmp = tmp_path_factory.mktemp("chromium")
    browser = Browser(binary, tmp / "profile")
    began = time.monotonic()
    out: dict[tuple[str, int], dict[str, Any]] = {}
    try:
        for width in WIDTHS:
            tab = browser.open(width)
            for name, (page, _) in reports.items():
                browser.load(tab, page.as_uri())
                probe = browser.evaluate(tab, PROBE)
                probe["png"] = browser.screenshot(tab, tmp / f"{name}-{width}.png")
                out[(name, width)] = probe
    finally:
        browser.close()
    print(f"chromium: {len(out)} pages measured in {time.monotonic() - began:.1f} s")
    return out


PAGES = ["billing", "demo", *(f"generated-{n}" for n in GENERATED)]


# --------------------------------------------------------------------------------------------
# Every page, at both widths


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", PAGES)
def test_nothing_runs_off_the_page(measured, name, width):
    """The page does not scroll sideways, no element reaches past its right edge, and no table
    cell's content overflows the cell (long names wrap)."""
    probe = measured[(name, width)]
    assert probe["viewport"] == width
    assert probe["scroll_width"] <= width
    assert probe["outside"] == []
    assert probe["cells"] == []


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", PAGES)
def test_no_label_overlaps_a_label_or_an_arrow(measured, name, width):
    """In every chart no two label boxes overlap (names, figures, edge labels, lock boxes), the
    dashed threshold line crosses no label, and no arrow of the lock-order graph passes
    through a label or a lock's box."""
    probe = measured[(name, width)]
    assert probe["overlaps"] == []
    assert probe["crossings"] == []


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", PAGES)
def test_the_page_paints_to_a_screenshot(measured, name, width):
    """Chromium paints the whole page to a PNG as wide as the window."""
    png = measured[(name, width)]["png"]
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    assert int.from_bytes(png[16:20], "big") == width


@pytest.mark.parametrize("name", [f"generated-{n}" for n in GENERATED] + ["demo"])
def test_lock_order_graph_draws_every_lock_and_edge_with_its_worker(measured, reports, name):
    """Every lock of an ordering edge (up to the drawn maximum) is a box, every edge between
    drawn locks an arrow labelled with its worker, cycle edges in the cycle colour."""
    _, manifest = reports[name]
    edges = {(e["holding"], e["acquiring"]): e for e in manifest["lock_order"]["edges"]}
    for c in manifest.get("pre_deadlock_ordering_witness") or []:
        for e in c["edges"]:  # the report's rule: the first edge of a pair is the one drawn
            edges.setdefault((e["holding"], e["acquiring"]), e)
    names = {n for pair in edges for n in pair}
    probe = measured[(name, 1400)]
    drawn = {n["lock"] for n in probe["nodes"]}
    assert len(drawn) == min(len(names), MAX_GRAPH_NODES) and drawn <= names
    assert drawn == set(drawn_nodes(build_report(manifest)["lock_order"]))
    arrows = {(e["holding"], e["acquiring"]): e for e in probe["edges"]}
    assert set(arrows) == {pair for pair in edges if set(pair) <= drawn}
    assert all(e["w"] > 0 or e["h"] > 0 for e in arrows.values())
    assert sorted(probe["edge_labels"]) == sorted(
        edges[pair]["worker"][:23] + "…"
        if len(edges[pair]["worker"]) > 24
        else edges[pair]["worker"]
        for pair in arrows
    )
    cycle_members = {
        n for c in manifest.get("pre_deadlock_ordering_witness") or [] for n in c["cycle"]
    }
    assert {n["lock"] for n in probe["nodes"] if n["cycle"]} == cycle_members & drawn
    for pair, arrow in arrows.items():
        assert (arrow["stroke"] == CYCLE_STROKE) == arrow["cycle"], pair


@pytest.mark.parametrize("width", WIDTHS)
def test_small_graphs_take_small_space(measured, width):
    """Two locks and their cycle fit in a small box, drawn at full size; five locks too."""
    two, five = measured[("generated-2", width)]["graph"], measured[("generated-5", width)]["graph"]
    assert two["scale"] == 1 and two["h"] <= 160 and two["w"] <= 400, two
    assert five["scale"] == 1 and five["h"] <= 400, five
    demo = measured[("demo", width)]["graph"]
    assert demo["scale"] == 1 and demo["h"] <= 160, demo


def test_graphs_of_20_locks_are_drawn_full_size_at_1400(measured):
    """Up to a few dozen locks the layers fit the page's column: no scaling down at 1400 px."""
    assert measured[("generated-20", 1400)]["graph"]["scale"] == 1


# --------------------------------------------------------------------------------------------
# The billing snapshot: what the charts draw


def test_wait_share_chart_is_drawn_with_one_bar_per_waited_on_lock(measured):
    """Every lock with a wait gets a visible bar, widths in proportion to its share; the hot
    lock's bar is the widest and marked hot."""
    probe = measured[("billing", 1400)]
    chart = probe["wait_chart"]
    assert chart and chart["w"] > 300 and chart["h"] > 80
    bars = {b["lock"]: b for b in probe["wait_bars"]}
    assert set(bars) == {"config", "accounts", "ledger", "emitter"}  # metrics waited 0 ms
    assert all(b["w"] > 0 and b["h"] > 0 for b in bars.values())
    assert [lock for lock, b in bars.items() if b["hot"]] == ["config"]
    # 4100 ms vs 200 ms of wait: the drawn widths keep the ratio.
    assert bars["config"]["w"] / bars["accounts"]["w"] == pytest.approx(4100 / 200, rel=0.02)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("n", GENERATED)
def test_the_timeline_and_the_contention_points_are_drawn(measured, reports, n, width):
    """One timeline row per class of the manifest's timeline, the most wait first, each with its
    wait bars, inside the page; the points of the most waited-on classes (at most 8)."""
    probe = measured[(f"generated-{n}", width)]
    _, manifest = reports[f"generated-{n}"]
    rows = probe["timeline"]
    series = manifest["timeline"]["locks"]
    most = sorted(series, key=lambda k: (-sum(series[k]["wait_ns"]), -sum(series[k]["hold_ns"])))
    assert [r["lock"] for r in rows] == most
    assert all(r["bars"] > 200 and r["w"] > 0 and r["r"] <= width for r in rows)
    locks = manifest["locks"]
    waited = {k: sum(h["sum"] for h in locks[k]["contention_points"].values()) for k in locks}
    assert probe["points"] == sorted(locks, key=lambda k: (-waited[k], k))[:8]


def test_the_demo_shows_the_points_of_global_config_and_its_timeline(measured):
    probe = measured[("demo", 1400)]
    assert probe["points"][0] == "global_config"
    assert probe["timeline"][0]["lock"] == "global_config"


def test_hold_chart_of_the_hot_lock_draws_its_histogram(measured):
    """The hot lock's hold-time chart is laid out and draws one bar per duration octave
    between its shortest and its longest hold (from the manifest's hold histogram)."""
    charts = measured[("billing", 1400)]["hold_charts"]
    assert [c["lock"] for c in charts] == ["config"]
    chart = charts[0]
    assert chart["kind"] == "histogram"
    assert chart["w"] > 200 and chart["h"] > 100
    # Holds of 1.5, 5, 8.4 and 31 ms fall in the octaves starting at 2**20, 2**22, 2**23 and
    # 2**24 ns; the empty 2**21 octave between them is drawn too: five bars, four with a height.
    assert len(chart["bars"]) == 5
    assert sum(1 for b in chart["bars"] if b["h"] > 0) == 4
    assert all(b["w"] > 0 for b in chart["bars"])


def test_lock_order_graph_is_drawn_with_its_cycle_highlighted(measured):
    """Every lock of an ordering edge is a drawn node; both edges of the accounts/ledger cycle
    are drawn in the cycle colour, the config -> metrics edge in the plain one."""
    probe = measured[("billing", 1400)]
    nodes = {n["lock"]: n for n in probe["nodes"]}
    assert set(nodes) == {"accounts", "ledger", "config", "metrics"}
    assert all(n["w"] > 0 and n["h"] > 0 for n in nodes.values())
    assert {lock for lock, n in nodes.items() if n["cycle"]} == {"accounts", "ledger"}
    edges = {(e["holding"], e["acquiring"]): e for e in probe["edges"]}
    assert set(edges) == {("accounts", "ledger"), ("ledger", "accounts"), ("config", "metrics")}
    assert edges[("accounts", "ledger")]["cycle"] and edges[("ledger", "accounts")]["cycle"]
    assert not edges[("config", "metrics")]["cycle"]
    assert edges[("accounts", "ledger")]["stroke"] == CYCLE_STROKE
    assert edges[("config", "metrics")]["stroke"] != CYCLE_STROKE
    assert sorted(probe["edge_labels"]) == ["worker-1", "worker-3", "worker-5"]
