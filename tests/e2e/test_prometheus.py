"""The queries of docs/metrics.md, run against a real Prometheus after the demo.

The session's metrics run (``metrics_run``, tests/e2e/_e2e_metrics.py): a real collector with
collector-config/otel-collector.yaml, scraped every second by a real Prometheus with
collector-config/prometheus.yaml, while ``otel-lockwatch demo`` (the hot ``global_config``
lock, a starved reporter, sections, a connection pool that never runs dry) and
``tests/e2e/workload.py --mode pool`` (a connection pool that does run dry) export to it. Every
query documented in docs/metrics.md (each ``<!-- query: NAME -->`` before a ``promql`` block)
runs, with the documentation's service names replaced by this run's, and its answer is checked
against the manifest the program wrote: the hot lock first, the counts and sums equal, the
quantiles within the histogram's resolution (the bucket of the manifest's own quantile, or a
neighbour), the rates against the samples they come from. With ``pytest -s`` each query prints
its answer as the documentation shows it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from _e2e_harness import ROOT
from _e2e_metrics import (
    HOT_LOCK,
    POOL,
    POOL_ROUNDS,
    POOL_TASKS,
    MetricsRun,
    blocked_quantile_bounds,
    resolution,
)

from otel_lockwatch.record._histogram import bucket_bounds

DOCS = ROOT / "docs" / "metrics.md"
#: The service names the documentation's queries use (replaced by this run's).
DOC_DEMO_SERVICE = 'service_name="otel-lockwatch-demo"'
DOC_POOL_SERVICE = 'service_name="lockwatch-pool"'
#: The hold histogram takes holds of at least this long (``hold_metric_floor_ms``' default).
HOLD_FLOOR = 100_000
WAIT = "lockwatch_lock_wait_duration_seconds"
HOLD = "lockwatch_lock_hold_duration_seconds"


def substitute(expr: str, run: MetricsRun) -> str:
    """A documented query with this run's service names."""
    return expr.replace(DOC_DEMO_SERVICE, f'service_name="{run.demo_service}"').replace(
        DOC_POOL_SERVICE, f'service_name="{run.pool_service}"'
    )


# ----------------------------------------------------------------------------------------------
# The documented queries


def documented_queries() -> dict[str, str]:
    """Each ``<!-- query: NAME -->`` of docs/metrics.md and the ``promql`` block after it."""
    text = DOCS.read_text()
    found = re.findall(r"<!-- query: ([\w-]+) -->\s*```promql\n(.*?)```", text, re.S)
    queries = dict(found)
    assert len(queries) == len(found), "docs/metrics.md names a query twice"
    return {name: expr.strip() for name, expr in queries.items()}


def _by_lock(result: list[dict[str, Any]]) -> dict[str, float]:
    """An instant vector keyed by ``lockwatch_lock_name``, in the answer's order."""
    return {s["metric"].get("lockwatch_lock_name", ""): float(s["value"][1]) for s in result}


def _first(result: list[dict[str, Any]]) -> str:
    assert result, "the query returned no series"
    return result[0]["metric"].get("lockwatch_lock_name", "")


def _contended_locks(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: lock for name, lock in manifest["locks"].items() if lock["contentions"]}


@dataclass
class Growth:
    """One lock's series of a counter in the last minute: their last samples and their growth
    from the first samples, summed, and the fewest samples a series had."""

    last: float = 0.0
    growth: float = 0.0
    samples: int = 1 << 30

    def extrapolated(self) -> float:
        """The most a ``rate()`` times the window can exceed the growth: Prometheus extends
        it by half an interval before the first sample and up to 1.1 intervals after the last."""
        return self.growth * (1 + 1.6 / max(1, self.samples - 1))


def _window_growth(run: MetricsRun, series: str, service: str) -> dict[str, Growth]:
    """Per lock, ``series`` of ``service`` in the minute before the run's end, as a ``rate()``
    over ``[1m]`` sees it (without the counts that the first scrape already held)."""
    selector = f'{series}{{service_name="{service}"}}[1m]'
    answer = run.prometheus.api("query", query=selector, time=f"{run.end:.3f}")["result"]
    out: dict[str, Growth] = {}
    for s in answer:
        points = [float(v) for _, v in s["values"]]
        lock = out.setdefault(s["metric"]["lockwatch_lock_name"], Growth())
        lock.last += points[-1]
        lock.growth += points[-1] - points[0]
        lock.samples = min(lock.samples, len(points))
    return out


def _exported(lock: dict[str, Any], field: str) -> dict[str, Any]:
    """The manifest histogram of what the lock's ``field`` metric exports: its holds, or its
    waits, which for a condition, a queue, an event or a future include its hand-off waits
    (``signal_waits.wait_ns``: an event waited on before it was set exports a wait series whose
    ``wait_ns`` has no sample)."""
    parts = [lock[field]]
    if field == "wait_ns" and "signal_waits" in lock:
        parts.append(lock["signal_waits"]["wait_ns"])
    parts = [h for h in parts if h["count"]]
    if len(parts) < 2:
        return parts[0] if parts else lock[field]
    buckets: dict[int, int] = {}
    for h in parts:
        for i, n in h["buckets"]:
            buckets[i] = buckets.get(i, 0) + n
    return {
        "buckets": sorted(buckets.items()),
        "count": sum(h["count"] for h in parts),
        "min": min(h["min"] for h in parts),
        "max": max(h["max"] for h in parts),
    }


def _check_quantiles(
    result: list[dict[str, Any]], run: MetricsRun, q: float, metric: str, field: str, floor: int
) -> None:
    """Per lock, ``histogram_quantile`` over ``rate(...[1m])`` against the manifest's quantile
    of the samples of at least ``floor`` ns (its ``field`` histogram). The rate leaves out what
    the first scrape already held: where the minute holds at least half of the lock's samples
    (and 20 or more), the answer lies within the histogram's resolution of the manifest's
    quantile, one neighbouring bucket more either way; where it holds fewer, between the buckets
    of the lock's least and greatest sample; where none, there is no number (NaN)."""
    values = _by_lock(result)
    grown = {
        k: v.growth for k, v in _window_growth(run, f"{metric}_count", run.demo_service).items()
    }
    for name, lock in run.demo["locks"].items():
        histogram = _exported(lock, field)
        samples = sum(n for i, n in histogram["buckets"] if bucket_bounds(i)[1] >= floor)
        if samples == 0:
            assert name not in values, f"{name}: a {metric} series with no sample"
            continue
        if grown.get(name, 0) == 0:
            assert math.isnan(values.get(name, math.nan)), f"{name}: {values[name]}, not NaN"
            continue
        if grown[name] >= max(20, samples / 2):
            bounds = blocked_quantile_bounds(histogram, q, floor)
            low, high = resolution(*bounds, neighbours=1)
        else:
            bounds = (max(floor, histogram["min"]) / 1e9, histogram["max"] / 1e9)
            low, high = resolution(*bounds, neighbours=0)
        assert low <= values[name] <= high, (
            f"{name}: p{q * 100:g} {values[name]} s outside [{low}, {high}] around the "
            f"manifest's {bounds} ({grown[name]:g} of {samples} samples in the minute)"
        )


def _check_whole_run_quantile(result: list[dict[str, Any]], run: MetricsRun) -> None:
    values = _by_lock(result)
    for name, lock in _contended_locks(run.demo).items():
        low, high = resolution(*blocked_quantile_bounds(lock["wait_ns"], 0.95), neighbours=0)
        assert low <= values[name] <= high, f"{name}: {values[name]} not in [{low}, {high}]"


def _check_share(result: list[dict[str, Any]], run: MetricsRun) -> None:
    assert _first(result) == HOT_LOCK
    values = _by_lock(result)
    for entry in run.demo["hot_lock_register"]:
        assert abs(100 * values[entry["lock"]] - entry["wait_share_pct"]) < 0.5, (values, entry)
    assert abs(sum(values.values()) - 1) < 1e-6


def _check_total_wait(result: list[dict[str, Any]], run: MetricsRun) -> None:
    assert _first(result) == HOT_LOCK
    values = _by_lock(result)
    for name, lock in _contended_locks(run.demo).items():
        assert values[name] == pytest.approx(lock["wait_ms_total"] / 1e3, rel=1e-3), name


def _check_rate(
    metric: str, per_lock_total: Callable[[dict[str, Any]], float], first: str | None = None
) -> Any:
    """A ``rate(metric[1m])`` per lock (``first`` first, when given), against the manifest and
    the samples it was computed from: per lock, the last samples of its series add up to the
    manifest's total, and the rate times 60 s is their growth from the first samples (the counts
    that the first scrape already held are not in a ``rate()``), plus at most Prometheus's
    extrapolation past the first and last samples."""

    def check(result: list[dict[str, Any]], run: MetricsRun) -> None:
        if first is not None:
            assert _first(result) == first
        values = _by_lock(result)
        growth = _window_growth(run, metric, run.demo_service)
        for name, lock in run.demo["locks"].items():
            if name not in growth:
                assert per_lock_total(lock) == 0, name  # a counter appears at its first count
                continue
            seen = growth[name]
            assert seen.last == per_lock_total(lock), (name, seen, lock)
            assert seen.growth <= 60 * values[name] <= seen.extrapolated(), (name, values, seen)

    return check


def _check_contended_share(result: list[dict[str, Any]], run: MetricsRun) -> None:
    assert _first(result) == HOT_LOCK
    values = _by_lock(result)
    for name, lock in _contended_locks(run.demo).items():
        assert values[name] == pytest.approx(lock["contentions"] / lock["acquisitions"]), name


def _check_live_max(result: list[dict[str, Any]], run: MetricsRun) -> None:
    assert _first(result) == HOT_LOCK
    values = _by_lock(result)
    workers = run.demo["nominal_pool_size"]
    assert 2 <= values[HOT_LOCK] <= workers, values


def _check_holders_max(result: list[dict[str, Any]], run: MetricsRun) -> None:
    values = _by_lock(result)
    assert values[HOT_LOCK] == 1.0, values  # a mutex: one holder at a time
    assert all(0 <= v <= run.demo["nominal_pool_size"] for v in values.values()), values


def _check_pool_waits(result: list[dict[str, Any]], run: MetricsRun) -> None:
    values = _by_lock(result)
    assert values == {POOL: run.pool["locks"][POOL]["signal_waits"]["count"]}
    assert values[POOL] == POOL_TASKS * POOL_ROUNDS  # every checkout waited (--mode pool)


def _check_pool_quantile(result: list[dict[str, Any]], run: MetricsRun) -> None:
    values = _by_lock(result)
    waits = run.pool["locks"][POOL]["signal_waits"]["wait_ns"]
    # The rate over the last minute leaves out what the first scrape already held, which on a
    # loaded machine can be some of the checkouts (at load average 10: 0.0975 against the
    # manifest's bucket from 0.1): within one neighbouring bucket, as _check_quantiles allows.
    low, high = resolution(*blocked_quantile_bounds(waits, 0.95), neighbours=1)
    assert list(values) == [POOL] and low <= values[POOL] <= high, (values, low, high)
    assert values[POOL] >= 0.05  # every checkout waited HOLD_S at least


CHECKS: dict[str, Callable[[list[dict[str, Any]], MetricsRun], None]] = {
    "wait-p50": lambda r, run: _check_quantiles(r, run, 0.5, WAIT, "wait_ns", 1),
    "wait-p95": lambda r, run: _check_quantiles(r, run, 0.95, WAIT, "wait_ns", 1),
    "wait-p99": lambda r, run: _check_quantiles(r, run, 0.99, WAIT, "wait_ns", 1),
    "hold-p50": lambda r, run: _check_quantiles(r, run, 0.5, HOLD, "hold_ns", HOLD_FLOOR),
    "hold-p95": lambda r, run: _check_quantiles(r, run, 0.95, HOLD, "hold_ns", HOLD_FLOOR),
    "hold-p99": lambda r, run: _check_quantiles(r, run, 0.99, HOLD, "hold_ns", HOLD_FLOOR),
    "wait-p95-whole-run": _check_whole_run_quantile,
    "wait-share": _check_share,
    "wait-total": _check_total_wait,
    "contentions-per-second": _check_rate(
        "lockwatch_lock_contentions_total", lambda lock: lock["contentions"], HOT_LOCK
    ),
    "contended-share": _check_contended_share,
    "acquisitions-per-second": _check_rate(
        "lockwatch_lock_acquisitions_total",
        lambda lock: lock["acquisitions"] + lock["skipped"] + lock["timeouts"],
    ),
    "waiting-max": _check_live_max,
    "holding-max": _check_holders_max,
    "pool-checkout-waits": _check_pool_waits,
    "pool-checkout-wait-p95": _check_pool_quantile,
}


def test_the_names_prometheus_has_are_documented(metrics_run: MetricsRun) -> None:
    """Every lockwatch metric name and label that Prometheus holds for the two programs is
    written in docs/metrics.md (the names a user will see, after the collector's translation)."""
    run = metrics_run
    docs = DOCS.read_text()
    selector = f'{{service_name=~"{run.demo_service}|{run.pool_service}"}}'
    window = {"match[]": selector, "start": f"{run.start:.3f}", "end": f"{run.end:.3f}"}
    names = run.prometheus.api("label/__name__/values", **window)
    labels = run.prometheus.api("labels", **window)
    lockwatch = [n for n in names if n.startswith("lockwatch_")]
    assert len(lockwatch) >= 10, names  # 2 histograms of 3 series, 2 counters, 2 gauges
    names_and_labels = lockwatch + [label for label in labels if label.startswith("lockwatch_")]
    missing = [name for name in names_and_labels if f"`{name}`" not in docs]
    assert not missing, f"not in docs/metrics.md: {missing}"


def test_every_documented_query_is_checked() -> None:
    """docs/metrics.md and this module name the same queries: none documented and unchecked."""
    assert set(documented_queries()) == set(CHECKS)


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_documented_query(metrics_run: MetricsRun, name: str) -> None:
    """The documented query answers, at the end of the run, what the manifest says."""
    run = metrics_run
    expr = substitute(documented_queries()[name], run)
    result = run.prometheus.query(expr, run.end)
    # The docs' output (shown with pytest -s): docs/metrics.md's ``<!-- output: NAME -->``.
    print(f"\n<!-- output: {name} -->\n{format_result(result)}\n<!-- end -->")
    CHECKS[name](result, run)


def format_result(result: list[dict[str, Any]]) -> str:
    """An instant vector as the docs show it: the labels that vary, and the value."""
    lines = []
    for sample in result:
        labels = {
            k: v
            for k, v in sample["metric"].items()
            if k not in ("service_name", "job", "instance")
        }
        shown = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        lines.append(f"{{{shown}}}  {float(sample['value'][1]):.6g}")
    return "\n".join(lines)
