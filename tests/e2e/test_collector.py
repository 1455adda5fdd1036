"""End to end through the collector: collector-config/otel-collector.yaml in a real collector.

The collector is the one ``scripts/build-otelcol.sh`` builds from tools/otelcol/manifest.yaml
(receiver otlp; processors memory_limiter, batch, filter; exporters otlp, prometheus, file;
extension health_check), run with the configuration file unchanged. Its two trace exporters
point at two Jaeger v2 instances: the session's Jaeger, and a second one standing in for Tempo
(both take OTLP/gRPC, and only Jaeger can be built here), so the test sees every span arrive on
both branches of the fan-out. The metrics pipeline is read back from the Prometheus exporter.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _e2e_harness import (
    CONFIG_DIR,
    START_TIMEOUT_S,
    Jaeger,
    Service,
    collector_env,
    free_ports,
    http_get,
    parent_id,
    run_service,
    run_workload,
    start_jaeger,
    tags,
    unique_service,
)

TASKS = 3
METRICS_TIMEOUT_S = 30.0


class Collector:
    """A running collector and its addresses."""

    def __init__(self, service: Service, otlp_grpc: str, prometheus_url: str) -> None:
        self.service = service
        self.otlp_grpc = otlp_grpc
        self.prometheus_url = prometheus_url

    def wait_for_sample(self, name: re.Pattern[str], labels: dict[str, str]) -> float:
        """Poll the Prometheus exporter until a sample whose name matches ``name`` carries
        ``labels``; return its value."""
        deadline = time.monotonic() + METRICS_TIMEOUT_S
        samples: list[tuple[str, dict[str, str], float]] = []
        while True:
            status, body = http_get(self.prometheus_url)
            samples = _parse_samples(body.decode(errors="replace")) if status == 200 else []
            for sample_name, sample_labels, value in samples:
                if name.fullmatch(sample_name) and labels.items() <= sample_labels.items():
                    return value
            if time.monotonic() > deadline:
                names = sorted({n for n, _, _ in samples})
                pytest.fail(
                    f"collector: no sample {name.pattern!r} with {labels} within "
                    f"{METRICS_TIMEOUT_S:.0f} s; metric names {names}{self.service.diagnose()}"
                )
            time.sleep(0.2)  # ok: polling with a deadline


_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})? (\S+)(?: \d+)?$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _parse_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """The samples of a Prometheus text exposition: (name, labels, value)."""
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match:
            name, labels, value = match.groups()
            samples.append((name, dict(_LABEL.findall(labels or "")), float(value)))
    return samples


@pytest.fixture(scope="module")
def tempo_stand_in(
    jaeger_binary: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Jaeger]:
    """A second Jaeger, receiving what the collector's ``otlp/tempo`` exporter sends."""
    with start_jaeger(jaeger_binary, tmp_path_factory.mktemp("tempo") / "jaeger.log") as running:
        yield running


@pytest.fixture(scope="module")
def collector(
    otelcol_binary: Path,
    jaeger: Jaeger,
    tempo_stand_in: Jaeger,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Collector]:
    """The collector with collector-config/otel-collector.yaml on free loopback ports,
    forwarding traces to ``jaeger`` and ``tempo_stand_in``; stopped at the end."""
    grpc, _, prometheus, health, _ = ports = free_ports(5)
    env = collector_env(ports, jaeger.otlp_grpc, tempo_stand_in.otlp_grpc)
    argv = [str(otelcol_binary), "--config", str(CONFIG_DIR / "otel-collector.yaml")]
    log_path = tmp_path_factory.mktemp("otelcol") / "otelcol.log"
    with run_service("collector", argv, env, log_path) as service:
        service.wait_until(
            lambda: http_get(f"http://127.0.0.1:{health}/", timeout=1)[0] == 200,
            "healthy status",
            START_TIMEOUT_S,
        )
        yield Collector(service, f"127.0.0.1:{grpc}", f"http://127.0.0.1:{prometheus}/metrics")


def _traces_with(trace_ids: set[str], operation: str):
    def ready(traces: list[dict[str, Any]]) -> bool:
        seen = {
            t["traceID"] for t in traces if any(s["operationName"] == operation for s in t["spans"])
        }
        return trace_ids <= seen

    return ready


def test_spans_pass_through_to_jaeger_and_tempo(
    collector: Collector, jaeger: Jaeger, tempo_stand_in: Jaeger, tmp_path: Path
) -> None:
    """Spans sent to the collector arrive, parent links intact, at both trace backends."""
    service = unique_service("e2e-otelcol")
    summary = run_workload("plain", service, collector.otlp_grpc, tmp_path, tasks=TASKS)
    trace_ids = set(summary["task_traces"].values())
    assert len(trace_ids) == TASKS

    for backend in (jaeger, tempo_stand_in):
        traces = backend.wait_for_traces(service, _traces_with(trace_ids, "plain.child"))
        by_id = {t["traceID"]: t for t in traces}
        for task, trace_id in summary["task_traces"].items():
            spans = by_id[trace_id]["spans"]
            (task_span,) = [s for s in spans if s["operationName"] == task]
            (child,) = [s for s in spans if s["operationName"] == "plain.child"]
            assert parent_id(child) == task_span["spanID"]


def test_lockwatch_spans_and_metrics_pass_through(
    collector: Collector, jaeger: Jaeger, tmp_path: Path
) -> None:
    """Through the collector, lockwatch's ``lock.wait`` spans and manifest span reach Jaeger,
    and its wait-duration histogram reaches the Prometheus exporter labelled with the lock."""
    service = unique_service("e2e-otelcol-lockwatch")
    summary = run_workload(
        "lockwatch", service, collector.otlp_grpc, tmp_path, tasks=TASKS, metrics=True
    )
    trace_ids = set(summary["task_traces"].values())

    traces = jaeger.wait_for_traces(service, _traces_with(trace_ids, "lock.wait"))
    waits = [
        s
        for t in traces
        for s in t["spans"]
        if s["operationName"] == "lock.wait"
        and tags(s).get("lockwatch.lock.name") == "global_config"
    ]
    assert len(waits) >= TASKS
    manifests = jaeger.wait_for_traces(
        service, lambda ts: len(ts) >= 1, operation="lockwatch.manifest"
    )
    assert any("lockwatch.verdict" in tags(s) for t in manifests for s in t["spans"])

    count = collector.wait_for_sample(
        re.compile(r"lockwatch_lock_wait_duration(_seconds)?_count"),
        {"lockwatch_lock_name": "global_config", "service_name": service},
    )
    assert count >= TASKS
