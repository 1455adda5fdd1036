"""End to end: lockwatch spans exported over OTLP reach a real Jaeger v2 and read back right.

A workload subprocess (``workload.py``) runs task spans around a contended, named lock and
exports to the session's Jaeger (collector-config/jaeger.yaml on free loopback ports); the
tests read the traces back through Jaeger's HTTP query API, as a user's UI would. So does
``otel-lockwatch demo``, run as a user runs it, whose waits must sit under its task spans.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from _e2e_harness import Jaeger, parent_id, run_workload, tags, unique_service

from otel_lockwatch.manifest._model import Verdict

TASKS = 3


def _task_trace(trace: dict[str, Any], task: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The task span of ``trace`` and the spans whose parent it is."""
    (task_span,) = [s for s in trace["spans"] if s["operationName"] == task]
    children = [s for s in trace["spans"] if parent_id(s) == task_span["spanID"]]
    return task_span, children


def _has_all(trace_ids: set[str], operation: str):
    """A readiness predicate: every trace of ``trace_ids`` holds a span named ``operation``."""

    def ready(traces: list[dict[str, Any]]) -> bool:
        seen = {
            t["traceID"] for t in traces if any(s["operationName"] == operation for s in t["spans"])
        }
        return trace_ids <= seen

    return ready


def test_plain_spans_reach_jaeger(jaeger: Jaeger, tmp_path: Path) -> None:
    """The harness itself, without lockwatch: OTLP spans of a service come back from Jaeger's
    API with their parent links (a failure here is Jaeger's or the harness's, not lockwatch's)."""
    service = unique_service("e2e-plain")
    summary = run_workload("plain", service, jaeger.otlp_grpc, tmp_path, tasks=TASKS)
    trace_ids = set(summary["task_traces"].values())
    assert len(trace_ids) == TASKS

    traces = jaeger.wait_for_traces(service, _has_all(trace_ids, "plain.child"))

    assert service in jaeger.services()
    by_id = {t["traceID"]: t for t in traces}
    for task, trace_id in summary["task_traces"].items():
        _, children = _task_trace(by_id[trace_id], task)
        assert [c["operationName"] for c in children] == ["plain.child"]


@pytest.fixture(scope="module")
def lockwatch_run(jaeger: Jaeger, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The instrumented workload, run once: its service, its task traces as Jaeger holds them
    (polled until every task trace has its ``lock.wait`` span), and the manifest traces."""
    service = unique_service("e2e-lockwatch")
    workdir = tmp_path_factory.mktemp("workload")
    summary = run_workload("lockwatch", service, jaeger.otlp_grpc, workdir, tasks=TASKS)
    trace_ids = set(summary["task_traces"].values())
    traces = jaeger.wait_for_traces(service, _has_all(trace_ids, "lock.wait"))
    manifests = jaeger.wait_for_traces(
        service, lambda ts: len(ts) >= 1, operation="lockwatch.manifest"
    )
    return {
        "service": service,
        "task_traces": summary["task_traces"],
        "traces": {t["traceID"]: t for t in traces},
        "manifests": manifests,
        "workdir": workdir,
    }


def test_service_is_listed(jaeger: Jaeger, lockwatch_run: dict[str, Any]) -> None:
    """The instrumented program's ``OTEL_SERVICE_NAME`` is a Jaeger service."""
    assert lockwatch_run["service"] in jaeger.services()


def test_lock_wait_spans_are_children_of_the_task_span(lockwatch_run: dict[str, Any]) -> None:
    """Each task waited (> 1 ms) for the named lock inside its task span: its trace holds a
    ``lock.wait`` span parented to the task span, with the lock's name and kind and the
    waiting thread, lasting at least the 1 ms span threshold."""
    for i, (task, trace_id) in enumerate(sorted(lockwatch_run["task_traces"].items())):
        task_span, children = _task_trace(lockwatch_run["traces"][trace_id], task)
        waits = [c for c in children if c["operationName"] == "lock.wait"]
        assert waits, (
            f"{task}: no lock.wait child; children {[c['operationName'] for c in children]}"
        )
        named = [w for w in waits if tags(w).get("lockwatch.lock.name") == "global_config"]
        assert len(named) == 1, f"{task}: lock.wait children {[tags(w) for w in waits]}"
        attributes = tags(named[0])
        assert attributes["lockwatch.lock.kind"] == "threading.Lock"
        assert attributes["thread.name"] == f"worker-{i}"
        assert named[0]["duration"] >= 1000  # microseconds
        # The wait happened inside the task span.
        assert task_span["startTime"] <= named[0]["startTime"]
        assert (
            named[0]["startTime"] + named[0]["duration"]
            <= task_span["startTime"] + task_span["duration"]
        )


def test_manifest_span_carries_the_verdict(lockwatch_run: dict[str, Any]) -> None:
    """At tracer-provider shutdown lockwatch exported exactly one ``lockwatch.manifest`` span,
    whose ``lockwatch.verdict`` is the verdict of the manifest file the run wrote."""
    spans = [
        s
        for t in lockwatch_run["manifests"]
        for s in t["spans"]
        if s["operationName"] == "lockwatch.manifest"
    ]
    assert len(spans) == 1, spans
    attributes = tags(spans[0])
    assert attributes.get("lockwatch.verdict") in {v.value for v in Verdict}, attributes
    # The span and the file are the same manifest.
    manifest = json.loads(
        (lockwatch_run["workdir"] / attributes["lockwatch.manifest.path"]).read_text()
    )
    assert attributes["lockwatch.verdict"] == manifest["verdict"]


# --------------------------------------------------------------------------------------------
# otel-lockwatch demo

#: The demo's task spans (one per unit of work) and the locks waited on under each.
DEMO_TASKS = {"publish", "sweep", "snapshot", "compact", "reconcile"}
#: How far two clocks' readings of one instant may disagree in Jaeger's microseconds.
SKEW_US = 1000


@pytest.fixture(scope="module")
def demo_run(jaeger: Jaeger, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``otel-lockwatch demo`` exporting to the session's Jaeger, run once; its ``lock.wait``
    traces as Jaeger holds them, those of ``global_config`` and those of ``stats_snapshot``."""
    service = unique_service("e2e-demo")
    workdir = tmp_path_factory.mktemp("demo")
    env = {
        **os.environ,
        "OTEL_SERVICE_NAME": service,
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{jaeger.otlp_grpc}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",  # the grpc extra (in the test extra)
        "OTEL_EXPORTER_OTLP_INSECURE": "true",
    }
    argv = [sys.executable, "-m", "otel_lockwatch", "demo", "--workers", "6", "--seconds", "1"]
    done = subprocess.run(
        [*argv, "--manifest", str(workdir / "manifest.json")],
        env=env,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"demo exited {done.returncode}:\n{done.stderr[-3000:]}"

    def parented_waits(lock: str):
        """Ready when a ``lock.wait`` on ``lock`` came back and every wait's parent with it
        (Jaeger stores the spans of one trace as their batches arrive)."""

        def ready(traces: list[dict[str, Any]]) -> bool:
            waits = 0
            for t in traces:
                ids = {s["spanID"] for s in t["spans"]}
                for s in t["spans"]:
                    if s["operationName"] == "lock.wait":
                        waits += 1
                        if parent_id(s) not in ids:
                            return False
            return waits > 0

        return ready

    # One query per lock: the 100 traces a query returns would all be publishes otherwise.
    traces = [
        trace
        for lock in ("global_config", "stats_snapshot")
        for trace in jaeger.wait_for_traces(
            service,
            parented_waits(lock),
            operation="lock.wait",
            tags=json.dumps({"lockwatch.lock.name": lock}),
        )
    ]
    return {"service": service, "traces": traces}


def test_demo_lock_waits_are_children_of_its_task_spans(demo_run: dict[str, Any]) -> None:
    """Every ``lock.wait`` span the demo exported has a parent in its own trace, and that parent
    is one of the demo's task spans: ``global_config`` is waited on by publishes (and the
    sweeper's), ``stats_snapshot`` by the reporter's snapshots (and a compaction's, when one
    finds a snapshot in progress). No wait is a trace of its own."""
    parents: dict[str, set[str]] = {}
    for trace in demo_run["traces"]:
        by_id = {s["spanID"]: s for s in trace["spans"]}
        for span in trace["spans"]:
            if span["operationName"] != "lock.wait":
                continue
            parent = by_id.get(parent_id(span) or "")
            assert parent is not None, f"a lock.wait with no parent in its trace: {tags(span)}"
            assert parent["operationName"] in DEMO_TASKS, parent["operationName"]
            # Within the task, to the clocks' agreement: a wait's times are taken on the
            # monotonic clock and moved to the epoch when the span is made, the task's on the
            # epoch clock; a publish waits from its first microsecond.
            assert parent["startTime"] - SKEW_US <= span["startTime"]
            end, parent_end = (s["startTime"] + s["duration"] for s in (span, parent))
            assert end <= parent_end + SKEW_US
            parents.setdefault(tags(span)["lockwatch.lock.name"], set()).add(
                parent["operationName"]
            )
    assert (
        parents["global_config"] <= {"publish", "sweep"} and "publish" in parents["global_config"]
    )
    # The reporter's snapshots starve behind the compactor; a compaction that finds a snapshot
    # in progress waits too, when the schedule makes it.
    assert (
        parents["stats_snapshot"] <= {"snapshot", "compact"}
        and "snapshot" in parents["stats_snapshot"]
    )


def test_demo_lock_waits_name_the_holders_site(demo_run: dict[str, Any]) -> None:
    """A slow wait in Jaeger names who held the lock: the ``lock.wait`` spans of
    ``stats_snapshot`` carry the compactor's hold site (``lockwatch.holder.code.*``), those of
    ``global_config`` a publish's (the lock's only holders)."""
    holders: dict[str, set[tuple[str, str]]] = {}
    for trace in demo_run["traces"]:
        for span in trace["spans"]:
            if span["operationName"] != "lock.wait":
                continue
            t = tags(span)
            assert isinstance(t["lockwatch.holder.code.lineno"], int), t
            holders.setdefault(t["lockwatch.lock.name"], set()).add(
                (t["lockwatch.holder.code.namespace"], t["lockwatch.holder.code.function"])
            )
    assert holders["global_config"] == {("lockwatch_demo", "publish_event")}
    assert ("lockwatch_demo", "compactor") in holders["stats_snapshot"]
    assert holders["stats_snapshot"] <= {
        ("lockwatch_demo", "compactor"),
        ("lockwatch_demo", "reporter"),
    }
