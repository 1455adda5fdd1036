"""The metrics side of the end-to-end tests: Prometheus, the collector in front of it, and the
one run of the demo and the pool workload that the query and dashboard tests share.

Prometheus is the one ``scripts/build-prometheus.sh`` builds (``LOCKWATCH_PROMETHEUS_BIN``, the
cache, or PATH, as for Jaeger and the collector); it runs collector-config/prometheus.yaml with
only its scrape target (the collector's exporter, on a free port) and its scrape interval (1 s)
replaced, since Prometheus does not expand environment variables in a target. The collector
runs collector-config/otel-collector.yaml unchanged. Readiness, and the data's arrival, are
polled with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from _e2e_harness import (
    CACHE_BIN,
    CONFIG_DIR,
    QUERY_TIMEOUT_S,
    ROOT,
    START_TIMEOUT_S,
    Jaeger,
    Service,
    _pinned_version,
    collector_env,
    free_ports,
    http_get,
    run_service,
    run_workload,
    unique_service,
)

from otel_lockwatch.record._histogram import bucket_bounds
from otel_lockwatch.telemetry._emitter import DURATION_BUCKETS

#: The run: Prometheus scrapes every second; the demo runs 6 s exporting every 500 ms; the pool
#: workload runs 8 rounds of 4 checkouts that wait; the demo's hot lock, and the pool's name.
SCRAPE_INTERVAL_S = 1
DEMO_SECONDS = 6
EXPORT_INTERVAL_MS = 500
POOL_TASKS = 4
POOL_ROUNDS = 8
HOT_LOCK = "global_config"
POOL = "connections"

PROMETHEUS_CONFIG = CONFIG_DIR / "prometheus.yaml"
#: The scrape target and interval written in collector-config/prometheus.yaml, which the tests
#: replace (Prometheus does not expand environment variables in a target).
PROMETHEUS_TARGET = '"127.0.0.1:9464"'
PROMETHEUS_INTERVAL = "scrape_interval: 5s"


def cached_prometheus() -> Path | None:
    """The Prometheus scripts/build-prometheus.sh caches for the version pinned in
    tools/prometheus."""
    version = _pinned_version(
        ROOT / "tools" / "prometheus" / "go.mod", "github.com/prometheus/prometheus"
    )
    return CACHE_BIN / f"prometheus-{version}" if version else None


def prometheus_config(target: str, scrape_interval: str) -> str:
    """collector-config/prometheus.yaml with only its scrape target and interval replaced.

    Raises:
        AssertionError: the file no longer holds the target or the interval replaced here.
    """
    text = PROMETHEUS_CONFIG.read_text()
    for needle in (PROMETHEUS_TARGET, PROMETHEUS_INTERVAL):
        assert text.count(needle) == 1, f"{PROMETHEUS_CONFIG} has not one {needle!r}"
    return text.replace(PROMETHEUS_TARGET, f'"{target}"').replace(
        PROMETHEUS_INTERVAL, f"scrape_interval: {scrape_interval}"
    )


@dataclass
class Prometheus:
    """A running Prometheus server and its HTTP API."""

    service: Service
    url: str  # http://host:port

    def api(self, path: str, **params: str) -> Any:
        """GET ``/api/v1/<path>`` with ``params``; the ``data`` of the answer.

        Raises:
            AssertionError: the answer is not 200 with status "success" (a PromQL error shows
                here, with Prometheus's message).
        """
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        status, body = http_get(url, timeout=QUERY_TIMEOUT_S)
        answer = json.loads(body) if body[:1] == b"{" else {}
        assert status == 200 and answer.get("status") == "success", (
            f"GET {url}: {status} {body[:500]!r}{self.service.diagnose()}"
        )
        return answer["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """The instant vector (or scalar, as one sample) ``expr`` at unix time ``at``."""
        data = self.api("query", query=expr, time=f"{at:.3f}")
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        return data["result"]

    def query_range(self, expr: str, start: float, end: float, step: str) -> list[dict[str, Any]]:
        """The range vector ``expr`` from ``start`` to ``end`` every ``step``."""
        data = self.api(
            "query_range", query=expr, start=f"{start:.3f}", end=f"{end:.3f}", step=step
        )
        return data["result"]

    def wait_for(
        self,
        expr: str,
        ready: Callable[[list[dict[str, Any]]], bool],
        timeout: float = QUERY_TIMEOUT_S,
    ) -> list[dict[str, Any]]:
        """Poll the instant query ``expr`` (at the current time) until ``ready(result)``; return
        the result. Metrics are exported, batched and scraped at intervals, so the data reaches
        Prometheus some time after the program wrote it: the poll waits for it.

        Raises:
            pytest.fail.Exception: the deadline passed; the message holds the last result.
        """
        deadline = time.monotonic() + timeout
        while True:
            result = self.query(expr, time.time())
            if ready(result):
                return result
            if time.monotonic() > deadline:
                targets = self.api("targets")["activeTargets"]
                health = [(t["scrapeUrl"], t["health"], t["lastError"]) for t in targets]
                pytest.fail(
                    f"Prometheus: {expr!r} not ready within {timeout:.0f} s; last result "
                    f"{json.dumps(result)[:1000]}; targets {health}{self.service.diagnose()}"
                )
            time.sleep(0.2)  # ok: polling with a deadline


def start_prometheus(
    binary: Path, target: str, scrape_interval: str, work_dir: Path
) -> contextlib.AbstractContextManager[Prometheus]:
    """Start Prometheus with collector-config/prometheus.yaml (its target set to ``target``, its
    scrape interval to ``scrape_interval``) on a free loopback port, storing in ``work_dir``;
    wait until it is ready."""

    @contextlib.contextmanager
    def manager() -> Iterator[Prometheus]:
        (port,) = free_ports(1)
        work_dir.mkdir(parents=True, exist_ok=True)
        config = work_dir / "prometheus.yaml"
        config.write_text(prometheus_config(target, scrape_interval))
        argv = [
            str(binary),
            f"--config.file={config}",
            f"--storage.tsdb.path={work_dir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ]
        with run_service("prometheus", argv, {}, work_dir / "prometheus.log") as service:
            prometheus = Prometheus(service, f"http://127.0.0.1:{port}")
            service.wait_until(
                lambda: http_get(f"{prometheus.url}/-/ready", timeout=1)[0] == 200,
                "ready status",
                START_TIMEOUT_S,
            )
            # Ready is not scraping: the scrape manager takes up its targets on a 5 s tick.
            service.wait_until(
                lambda: [t["health"] for t in prometheus.api("targets")["activeTargets"]] == ["up"],
                f"a scrape of {target}",
                START_TIMEOUT_S,
            )
            yield prometheus

    return manager()


@dataclass
class Collector:
    """A running collector (collector-config/otel-collector.yaml) and its addresses."""

    service: Service
    otlp_grpc: str  # host:port
    otlp_http: str  # host:port
    prometheus_endpoint: str  # host:port of its Prometheus exporter (/metrics)


def start_collector(
    binary: Path, jaeger_otlp: str, tempo_otlp: str, log_path: Path
) -> contextlib.AbstractContextManager[Collector]:
    """Start the collector with collector-config/otel-collector.yaml on free loopback ports,
    its trace exporters sending to ``jaeger_otlp`` and ``tempo_otlp``; wait until healthy."""

    @contextlib.contextmanager
    def manager() -> Iterator[Collector]:
        grpc, http, prometheus, health, _ = ports = free_ports(5)
        env = collector_env(ports, jaeger_otlp, tempo_otlp)
        env["OTELCOL_LOCKWATCH_MANIFESTS"] = str(log_path.parent / "lockwatch-manifests.jsonl")
        argv = [str(binary), "--config", str(CONFIG_DIR / "otel-collector.yaml")]
        with run_service("collector", argv, env, log_path) as service:
            service.wait_until(
                lambda: http_get(f"http://127.0.0.1:{health}/", timeout=1)[0] == 200,
                "healthy status",
                START_TIMEOUT_S,
            )
            yield Collector(
                service, f"127.0.0.1:{grpc}", f"127.0.0.1:{http}", f"127.0.0.1:{prometheus}"
            )

    return manager()


def run_demo(
    service: str, otlp_http: str, cwd: Path, seconds: float, export_interval_ms: int
) -> tuple[dict[str, Any], str]:
    """Run ``otel-lockwatch demo`` in ``cwd`` exporting OTLP/HTTP (its default protocol) to
    ``otlp_http`` as ``service``, its metrics every ``export_interval_ms``.

    Returns:
        The manifest it wrote (``cwd/lockwatch-manifest.json``) and its output.

    Raises:
        AssertionError: the demo failed; the message holds its output.
    """
    env = {
        **os.environ,
        "OTEL_SERVICE_NAME": service,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{otlp_http}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_METRIC_EXPORT_INTERVAL": str(export_interval_ms),
    }
    manifest = cwd / "lockwatch-manifest.json"
    result = subprocess.run(
        [sys.executable, "-m", "otel_lockwatch", "demo", "--seconds", str(seconds)]
        + ["--manifest", str(manifest)],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (
        f"demo exited with {result.returncode}\nstdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    )
    return json.loads(manifest.read_text()), result.stdout


# ----------------------------------------------------------------------------------------------
# The run the metrics tests share


@dataclass
class MetricsRun:
    """What the two programs left: where to ask, and what they said."""

    prometheus: Prometheus
    jaeger: Jaeger
    demo_service: str
    pool_service: str
    demo: dict[str, Any]  # the demo's manifest
    pool: dict[str, Any]  # the pool workload's manifest
    start: float  # unix time before the demo started
    end: float  # unix time when the last export had been scraped


@contextlib.contextmanager
def metrics_run_in(
    otelcol_binary: Path, prometheus_binary: Path, jaeger: Jaeger, work: Path
) -> Iterator[MetricsRun]:
    """Collector + Prometheus on free loopback ports (working in ``work``); the demo and the pool
    workload exported through them; the data waited for in Prometheus; everything stopped at
    the end."""
    with (
        start_collector(
            otelcol_binary, jaeger.otlp_grpc, jaeger.otlp_grpc, work / "otelcol" / "otelcol.log"
        ) as collector,
        start_prometheus(
            prometheus_binary,
            collector.prometheus_endpoint,
            f"{SCRAPE_INTERVAL_S}s",
            work / "prometheus",
        ) as prometheus,
    ):
        start = time.time()
        demo_service = unique_service("lockwatch-demo")
        (work / "demo").mkdir()
        demo, _ = run_demo(
            demo_service, collector.otlp_http, work / "demo", DEMO_SECONDS, EXPORT_INTERVAL_MS
        )
        pool_service = unique_service("lockwatch-pool")
        (work / "pool").mkdir()
        run_workload(
            "pool",
            pool_service,
            collector.otlp_grpc,
            work / "pool",
            POOL_TASKS,
            metrics=True,
            rounds=POOL_ROUNDS,
        )
        pool = json.loads((work / "pool" / "lockwatch-manifest.json").read_text())
        _wait_for_final_values(prometheus, demo_service, demo, pool_service, pool)
        # What the manifests said, beside the queries' output (pytest -s): docs/metrics.md.
        print(f"\n<!-- output: manifest -->\n{format_manifest(demo, pool)}\n<!-- end -->")
        yield MetricsRun(
            prometheus, jaeger, demo_service, pool_service, demo, pool, start, time.time()
        )


def _wait_for_final_values(
    prometheus: Prometheus,
    demo_service: str,
    demo: dict[str, Any],
    pool_service: str,
    pool: dict[str, Any],
) -> None:
    """Poll until Prometheus has scraped the last export of both programs: the hot lock's
    acquisitions and the pool's checkout waits equal their manifests' counts."""
    acquired = demo["locks"][HOT_LOCK]["acquisitions"]
    prometheus.wait_for(
        f'lockwatch_lock_acquisitions_total{{service_name="{demo_service}",'
        f'lockwatch_lock_name="{HOT_LOCK}",lockwatch_outcome="acquired"}}',
        lambda result: [float(s["value"][1]) for s in result] == [acquired],
    )
    waits = pool["locks"][POOL]["signal_waits"]["count"]
    prometheus.wait_for(
        f'sum(lockwatch_lock_wait_duration_seconds_count{{service_name="{pool_service}",'
        f'lockwatch_lock_name="{POOL}"}})',
        lambda result: [float(s["value"][1]) for s in result] == [waits],
    )


def format_manifest(demo: dict[str, Any], pool: dict[str, Any]) -> str:
    """What the two manifests say of each lock, as the docs show it beside the queries."""
    width = max(len(name) for name in demo["locks"])
    lines = [f"{'lock':{width}}  acquisitions  contentions  wait total  blocked-wait p95"]
    for name, lock in sorted(demo["locks"].items(), key=lambda kv: -kv[1]["wait_ms_total"]):
        p95 = "-"
        if lock["contentions"]:
            low, high = blocked_quantile_bounds(lock["wait_ns"], 0.95)
            p95 = f"{(low + high) / 2 * 1e3:.3g} ms"
        lines.append(
            f"{name:{width}}  {lock['acquisitions']:12}  {lock['contentions']:11}  "
            f"{lock['wait_ms_total'] / 1e3:8.4g} s  {p95}"
        )
    waits = pool["locks"][POOL]["signal_waits"]
    low, high = blocked_quantile_bounds(waits["wait_ns"], 0.95)
    lines.append(
        f"{POOL} (pool)  {waits['count']} checkout waits, {waits['wait_ns']['sum'] / 1e9:.4g} s, "
        f"p95 {(low + high) / 2 * 1e3:.3g} ms"
    )
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# The manifest's side: quantiles of the waits that blocked, and the buckets around them


def blocked_quantile_bounds(
    histogram: dict[str, Any], q: float, floor_ns: int = 1
) -> tuple[float, float]:
    """The (low, high) seconds of the manifest histogram bucket that holds the nearest-rank
    ``q`` quantile of its samples of at least ``floor_ns`` (a wait of 0 is an acquisition that
    did not block: the Prometheus histogram has only the waits that blocked)."""
    buckets = sorted(
        (bucket_bounds(i), n) for i, n in histogram["buckets"] if bucket_bounds(i)[1] >= floor_ns
    )
    total = sum(n for _, n in buckets)
    assert total > 0, f"no samples of at least {floor_ns} ns in {histogram}"
    rank = math.ceil(q * total)
    seen = 0
    for (low, high), n in buckets:
        seen += n
        if seen >= rank:
            return low / 1e9, high / 1e9
    raise AssertionError("unreachable")


def resolution(low: float, high: float, neighbours: int) -> tuple[float, float]:
    """The span of the OpenTelemetry buckets (``DURATION_BUCKETS``) that hold ``low`` and
    ``high``, widened by ``neighbours`` buckets each way: where ``histogram_quantile`` may
    answer for a quantile the manifest puts between ``low`` and ``high``."""
    bounds = [0.0, *DURATION_BUCKETS, math.inf]

    def index(value: float) -> int:  # the bucket (bounds[i-1], bounds[i]] holding value
        return next(i for i, b in enumerate(bounds) if value <= b and i > 0)

    lo = max(0, index(low) - 1 - neighbours)
    hi = min(len(bounds) - 1, index(high) + neighbours)
    return bounds[lo], bounds[hi]
