"""The Grafana dashboard, checked without Grafana: every panel's queries run against the real
Prometheus of the session's metrics run (``metrics_run``, tests/e2e/_e2e_metrics.py) as Grafana
would run them, and each returns data after the demo.

Grafana is AGPL-licensed and not built here, so the test does what Grafana does with the
dashboard JSON (collector-config/grafana/dashboards/lockwatch.json): the variables set to All
through Prometheus's label API (``label_values(...)``), ``$__rate_interval`` and ``$__range``
computed as Grafana computes them, an instant query for an instant target and a range query over
the run otherwise. Each panel's data links point at traces that exist: the Jaeger link's own
API parameters are asked of the Jaeger the collector sends to. docker-compose.yaml is checked to
mount Prometheus's and Grafana's files from files that exist.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from typing import Any

import pytest
from _e2e_harness import CONFIG_DIR
from _e2e_metrics import HOT_LOCK, SCRAPE_INTERVAL_S, MetricsRun

DASHBOARD = CONFIG_DIR / "grafana" / "dashboards" / "lockwatch.json"


def dashboard_panels() -> list[dict[str, Any]]:
    """Every panel of the dashboard, rows' panels included."""
    panels = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return [p for p in panels if p.get("type") != "row"]


def _variable_values(
    run: MetricsRun, variable: dict[str, Any], resolved: dict[str, str]
) -> list[str]:
    """What Grafana lists for a ``label_values(selector, label)`` variable: the label's values
    on the series the selector (its variables resolved) matches."""
    query = variable["query"]
    query = query["query"] if isinstance(query, dict) else query
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", query.strip())
    assert match, f"variable {variable['name']}: not a label_values() query: {query!r}"
    selector, label = match.groups()
    for name, value in resolved.items():
        selector = selector.replace(f"${name}", value)
    return run.prometheus.api(
        f"label/{label}/values",
        **{"match[]": selector, "start": f"{run.start:.3f}", "end": f"{run.end:.3f}"},
    )


def resolved_variables(run: MetricsRun) -> dict[str, str]:
    """The dashboard's variables set to All, as Grafana expands them into a regular
    expression: the values joined by ``|`` in parentheses (regex-escaped)."""
    resolved: dict[str, str] = {}
    for variable in json.loads(DASHBOARD.read_text())["templating"]["list"]:
        if variable["type"] == "datasource":
            continue
        values = _variable_values(run, variable, resolved)
        assert values, f"variable {variable['name']}: no values"
        escaped = [re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\\\1", v) for v in values]
        resolved[variable["name"]] = "(" + "|".join(escaped) + ")"
    return resolved


def grafana_expr(expr: str, variables: dict[str, str], run: MetricsRun, step_s: int) -> str:
    """``expr`` with the dashboard's variables and Grafana's built-ins as Grafana sets them for
    this run's time range: ``$__rate_interval`` = max(step + scrape interval, 4 x scrape
    interval), ``$__interval`` = the step, ``$__range`` = the range, whole seconds up."""
    rate_interval = max(step_s + SCRAPE_INTERVAL_S, 4 * SCRAPE_INTERVAL_S)
    builtins = {
        "$__rate_interval": f"{rate_interval}s",
        "$__interval": f"{step_s}s",
        "$__range": f"{math.ceil(run.end - run.start)}s",
    }
    for name, value in builtins.items():
        expr = expr.replace(name, value)
    for name, value in sorted(variables.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(f"${{{name}}}", value).replace(f"${name}", value)
    assert "$" not in expr, f"a variable is left in {expr!r}"
    return expr


def _has_data(result: list[dict[str, Any]]) -> bool:
    """Whether a result has a number that is not NaN (an instant or a range vector)."""
    for series in result:
        points = series.get("values") or [series["value"]]
        if any(not math.isnan(float(v)) for _, v in points):
            return True
    return False


@pytest.mark.parametrize(
    "panel", dashboard_panels(), ids=lambda p: re.sub(r"\W+", "-", p["title"]).strip("-")
)
def test_dashboard_panel_returns_data(metrics_run: MetricsRun, panel: dict[str, Any]) -> None:
    """The panel's every query, run as Grafana runs it (an instant query for an instant target,
    else a range query over the run, one point per second), returns data after the demo."""
    run = metrics_run
    variables = resolved_variables(run)
    assert panel["targets"], f"panel {panel['title']!r} has no query"
    for target in panel["targets"]:
        expr = grafana_expr(target["expr"], variables, run, step_s=1)
        if target.get("instant"):
            result = run.prometheus.query(expr, run.end)
        else:
            result = run.prometheus.query_range(expr, run.start, run.end, "1s")
        assert _has_data(result), f"panel {panel['title']!r}: no data for {expr}"


def test_dashboard_links_find_the_hot_locks_traces(metrics_run: MetricsRun) -> None:
    """The panels' Jaeger data link, its label placeholders set from the hot lock's series,
    asks Jaeger's API (the link's own parameters) for ``lock.wait`` spans, and they exist; the
    Tempo link's TraceQL names the same span name and attributes."""
    run = metrics_run
    links = [
        link
        for panel in dashboard_panels()
        for link in panel.get("fieldConfig", {}).get("defaults", {}).get("links", [])
    ]
    jaeger_links = {link["url"] for link in links if "/search?" in link["url"]}
    tempo_links = {link["url"] for link in links if "traceql" in link["url"]}
    assert jaeger_links and tempo_links, links
    labels = {"service_name": run.demo_service, "lockwatch_lock_name": HOT_LOCK}

    def fill(url: str) -> str:
        for label, value in labels.items():
            url = url.replace(f"${{__field.labels.{label}}}", value)
        return url

    for url in jaeger_links:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(fill(url)).query)
        params = {k: v[0] for k, v in query.items() if k in ("service", "operation", "tags")}
        assert params["operation"] == "lock.wait"
        traces = run.jaeger.wait_for_traces(
            params.pop("service"), lambda ts: len(ts) >= 1, **params
        )
        spans = [s for t in traces for s in t["spans"] if s["operationName"] == "lock.wait"]
        assert any(
            {"key": "lockwatch.lock.name", "type": "string", "value": HOT_LOCK} in s["tags"]
            for s in spans
        )
    for url in tempo_links:
        text = urllib.parse.unquote(fill(url))
        assert 'name = \\"lock.wait\\"' in text or 'name = "lock.wait"' in text, text
        assert "span.lockwatch.lock.name = " in text and HOT_LOCK in text, text


# ----------------------------------------------------------------------------------------------
# docker-compose


def test_compose_mounts_prometheus_and_grafana_files_that_exist() -> None:
    """docker-compose.yaml runs Prometheus and Grafana with this directory's files mounted:
    every ``./...`` volume of theirs names a file or directory that exists."""
    services: dict[str, str] = {}  # service -> the lines of its block
    name = None
    for line in (CONFIG_DIR / "docker-compose.yaml").read_text().splitlines():
        header = re.fullmatch(r"  ([\w-]+):", line)
        if header or re.match(r"\S", line):
            name = header.group(1) if header else None
        elif name is not None:
            services[name] = services.get(name, "") + line + "\n"
    for name, needed in (
        ("prometheus", {"prometheus.yaml"}),
        ("grafana", {"grafana/datasources.yaml", "grafana/dashboards.yaml", "grafana/dashboards"}),
    ):
        assert name in services, f"no {name} service in docker-compose.yaml"
        mounts = re.findall(r"- \./([^:\s]+):", services[name])
        assert needed <= set(mounts), (name, mounts)
        for mount in mounts:
            assert (CONFIG_DIR / mount).exists(), f"{name} mounts ./{mount}, which is missing"
