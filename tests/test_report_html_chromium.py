"""The HTML report, rendered by a real headless Chromium: are the charts and the graph drawn?

A string test can say that ``<svg id="wait-share-chart">`` is in the file; only a browser can say
that it lays out to a visible box, that its bars have a width, that the cycle edges of the
lock-order graph are painted. The test appends a small probe script to a copy of the report (the
report itself has no script) that measures the elements with ``getBoundingClientRect`` and
writes the figures as JSON into ``<pre id="layout-probe">``; ``chromium --dump-dom`` prints the
DOM after the page has loaded and the probe has run, and the test reads the figures back.

The test skips only when Chromium is not installed *and* ``CI`` is unset: in CI (``.ci/run``
installs Debian's ``chromium``) a missing browser is a failure, not a skip.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_lockwatch.cli._main import main
from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.manifest._io import dump_manifest

pytestmark = pytest.mark.e2e

DATA = Path(__file__).parent / "data"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
TIMEOUT_S = 90

PROBE = """
<script>
(function () {
  function box(el) {
    var r = el.getBoundingClientRect();
    return {w: r.width, h: r.height, x: r.left, y: r.top};
  }
  function all(sel) { return Array.prototype.slice.call(document.querySelectorAll(sel)); }
  function one(sel) { var el = document.querySelector(sel); return el ? box(el) : null; }
  var probe = {
    viewport: {w: window.innerWidth, h: window.innerHeight},
    page: {w: document.documentElement.scrollWidth},
    wait_chart: one("#wait-share-chart"),
    wait_bars: all("#wait-share-chart rect.bar").map(function (el) {
      var b = box(el); b.lock = el.getAttribute("data-lock"); b.hot = el.classList.contains("hot");
      return b;
    }),
    hold_charts: all("svg.hold-chart").map(function (el) {
      var b = box(el);
      b.lock = el.getAttribute("data-lock");
      b.kind = el.getAttribute("data-kind");
      b.bars = all("svg.hold-chart[data-lock='" + b.lock + "'] rect.bar").map(box);
      return b;
    }),
    graph: one("#lock-order-graph"),
    nodes: all("#lock-order-graph g.node").map(function (el) {
      var b = box(el);
      b.lock = el.getAttribute("data-lock");
      b.cycle = el.classList.contains("cycle");
      return b;
    }),
    edges: all("#lock-order-graph path.edge").map(function (el) {
      var b = box(el);
      b.holding = el.getAttribute("data-holding");
      b.acquiring = el.getAttribute("data-acquiring");
      b.cycle = el.classList.contains("cycle");
      b.stroke = getComputedStyle(el).stroke;
      return b;
    })
  };
  var pre = document.createElement("pre");
  pre.id = "layout-probe";
  pre.textContent = JSON.stringify(probe);
  document.body.appendChild(pre);
})();
</script>
"""


def _chromium() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI"):
        pytest.fail(f"CI is set but no Chromium is installed (looked for {', '.join(BROWSERS)})")
    pytest.skip(f"Chromium is not installed (looked for {', '.join(BROWSERS)}); CI installs it")


def _run_chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--hide-scrollbars",
        "--window-size=1200,2000",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, str]:
    """``otel-lockwatch report --html`` of the billing snapshot's manifest, measured in Chromium.

    The snapshot (see ``test_report.py``): config hot at 93 %, worker-7 starved, an
    accounts/ledger cycle and a plain config -> metrics edge.
    """
    browser = _chromium()
    tmp_path = tmp_path_factory.mktemp("html-report")
    manifest = tmp_path / "manifest.json"
    dump_manifest(evaluate(json.loads((DATA / "snapshot_billing.json").read_text())), manifest)
    page = tmp_path / "report.html"
    assert main(["report", str(manifest), "--html", str(page)]) == 0
    probed = tmp_path / "probed.html"
    text = page.read_text()
    assert text.count("</body>") == 1
    probed.write_text(text.replace("</body>", PROBE + "</body>"))
    done = _run_chromium(browser, tmp_path / "profile", "--dump-dom", probed.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    match = re.search(r'<pre id="layout-probe">(.*?)</pre>', done.stdout, re.S)
    assert match, f"the probe did not run; chromium printed: {done.stdout[:500]!r}"
    return json.loads(html.unescape(match.group(1))), page, browser


def test_wait_share_chart_is_drawn_with_one_bar_per_waited_on_lock(rendered):
    """Every lock with a wait gets a visible bar, widths in proportion to its share; the hot
    lock's bar is the widest and marked hot."""
    probe, _, _ = rendered
    chart = probe["wait_chart"]
    assert chart and chart["w"] > 300 and chart["h"] > 80
    bars = {b["lock"]: b for b in probe["wait_bars"]}
    assert set(bars) == {"config", "accounts", "ledger", "emitter"}  # metrics waited 0 ms
    assert all(b["w"] > 0 and b["h"] > 0 for b in bars.values())
    assert [lock for lock, b in bars.items() if b["hot"]] == ["config"]
    # 4100 ms vs 200 ms of wait: the drawn widths keep the ratio.
    assert bars["config"]["w"] / bars["accounts"]["w"] == pytest.approx(4100 / 200, rel=0.02)


def test_hold_chart_of_the_hot_lock_draws_its_histogram(rendered):
    """The hot lock's hold-time chart is laid out and draws one bar per duration octave
    between its shortest and its longest hold (from the manifest's hold histogram)."""
    probe, _, _ = rendered
    charts = probe["hold_charts"]
    assert [c["lock"] for c in charts] == ["config"]
    chart = charts[0]
    assert chart["kind"] == "histogram"
    assert chart["w"] > 200 and chart["h"] > 100
    # Holds of 1.5, 5, 8.4 and 31 ms fall in the octaves starting at 2**20, 2**22, 2**23 and
    # 2**24 ns; the empty 2**21 octave between them is drawn too: five bars, four with a height.
    assert len(chart["bars"]) == 5
    assert sum(1 for b in chart["bars"] if b["h"] > 0) == 4
    assert all(b["w"] > 0 for b in chart["bars"])


def test_lock_order_graph_is_drawn_with_its_cycle_highlighted(rendered):
    """Every lock of an ordering edge is a drawn node; both edges of the accounts/ledger cycle
    are drawn in the cycle colour, the config -> metrics edge in the plain one."""
    probe, _, _ = rendered
    graph = probe["graph"]
    assert graph and graph["w"] > 300 and graph["h"] > 300
    nodes = {n["lock"]: n for n in probe["nodes"]}
    assert set(nodes) == {"accounts", "ledger", "config", "metrics"}
    assert all(n["w"] > 0 and n["h"] > 0 for n in nodes.values())
    assert {lock for lock, n in nodes.items() if n["cycle"]} == {"accounts", "ledger"}
    edges = {(e["holding"], e["acquiring"]): e for e in probe["edges"]}
    assert set(edges) == {("accounts", "ledger"), ("ledger", "accounts"), ("config", "metrics")}
    for key, edge in edges.items():
        assert edge["w"] > 0 and edge["h"] > 0, key
    assert edges[("accounts", "ledger")]["cycle"] and edges[("ledger", "accounts")]["cycle"]
    assert not edges[("config", "metrics")]["cycle"]
    assert edges[("accounts", "ledger")]["stroke"] == "rgb(198, 40, 40)"
    assert edges[("config", "metrics")]["stroke"] != "rgb(198, 40, 40)"


def test_report_fits_the_window_and_screenshots(rendered, tmp_path):
    """The page does not scroll sideways in a 1200 px window, and Chromium paints it to a PNG."""
    probe, page, browser = rendered
    assert probe["page"]["w"] <= probe["viewport"]["w"]
    shot = tmp_path / "report.png"
    done = _run_chromium(browser, tmp_path / "profile-shot", f"--screenshot={shot}", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
