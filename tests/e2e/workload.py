"""The workload the end-to-end tests run in a subprocess: task spans around a contended lock.

It exports over OTLP/gRPC to ``OTEL_EXPORTER_OTLP_ENDPOINT`` (Jaeger, or a collector in front
of it), under ``OTEL_SERVICE_NAME``, then prints one JSON line on stdout:
``{"service": ..., "task_traces": {"<task name>": "<trace id hex>", ...}}`` so the test can
fetch each task's trace by id. Metrics are exported too with ``--metrics`` (a collector takes
them; Jaeger has no metrics service).

The contention is made deterministic by a handshake, not by timing luck: the main thread takes
the lock first, every worker announces that it is about to acquire, and the main thread waits
until lockwatch's own ``lockwatch.lock.waiting`` gauge (read by an in-memory metric reader)
counts every worker blocked on the lock (on either path: the C path's acquire has no Python
frame to look for; a workload that does not see them within ``BLOCKED_TIMEOUT_S`` exits 3);
only then does it keep the lock ``HOLD_S`` more and release it. Each worker, inside its task
span, therefore waits far longer than lockwatch's 1 ms span threshold.

Modes:
  lockwatch  the real instrumentation: ``LockwatchInstrumentor().instrument(...)`` before the
             lock is created, ``name_lock(lock, "global_config")``; lockwatch emits the
             ``lock.wait`` spans and, at tracer-provider shutdown, the ``lockwatch.manifest`` span.
  plain      no lockwatch at all: the same task spans with an ordinary child span each, to
             prove the exporter -> Jaeger -> query path independently of the instrumentation.
  pool       the real instrumentation on a connection pool that runs dry: a ``queue.LifoQueue``
             of ``CONNECTIONS`` connections, named ``connections``, which the main thread empties
             first; every worker blocks in its checkout (``get``) until the main thread, having
             seen them all waiting on the pool (its gauge), gives the connections back after
             ``HOLD_S``, and each worker holds its connection ``POOL_HOLD_S``. Every checkout
             therefore waits at least ``HOLD_S``: the pool's checkout waits in the metrics.
             ``--rounds N`` does it N times, ``POOL_PAUSE_S`` apart, so that a metrics backend
             sampling every second sees the counts grow.
"""

from __future__ import annotations

import argparse
import json
import queue
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

HOLD_S = 0.05
LOCK_NAME = "global_config"
POOL_NAME = "connections"
CONNECTIONS = 2
POOL_HOLD_S = 0.02
POOL_PAUSE_S = 0.4
BLOCKED_TIMEOUT_S = 30.0


def _waiting(reader: InMemoryMetricReader, name: str) -> int:
    """The ``lockwatch.lock.waiting`` gauge of the lock class ``name`` as ``reader`` collects it
    now: the workers lockwatch has seen blocked on it (on either path: the C path's acquire has
    no Python frame to look for)."""
    data = reader.get_metrics_data()
    for resource_metrics in data.resource_metrics if data else ():
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name != "lockwatch.lock.waiting":
                    continue
                for point in metric.data.data_points:
                    if point.attributes.get("lockwatch.lock.name") == name:
                        return int(point.value)
    return 0


def _wait_blocked(reader: InMemoryMetricReader, name: str, count: int) -> None:
    """Poll until lockwatch sees ``count`` workers blocked on ``name``; exit 3 if it has not
    within ``BLOCKED_TIMEOUT_S`` (the test fails on the status, rather than going on with a
    handshake that did not happen)."""
    deadline = time.monotonic() + BLOCKED_TIMEOUT_S
    while (seen := _waiting(reader, name)) < count:
        if time.monotonic() > deadline:
            print(f"workload: {seen} of {count} workers seen blocked on {name}", file=sys.stderr)
            raise SystemExit(3)
        time.sleep(0.001)  # ok: polling with a deadline


def main(argv: Sequence[str] | None = None) -> int:
    """Run the workload and print the task traces as one JSON line.

    Args:
        argv: ``--mode {lockwatch,plain,pool}``, ``--tasks N`` (default 3), ``--metrics``,
            ``--rounds N`` (pool mode, default 1).
    """
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=("lockwatch", "plain", "pool"), required=True)
    parser.add_argument("--tasks", type=int, default=3)
    parser.add_argument("--metrics", action="store_true", help="export metrics over OTLP too")
    parser.add_argument("--rounds", type=int, default=1, help="pool mode: rounds of checkouts")
    args = parser.parse_args(argv)

    resource = Resource.create()  # service.name from OTEL_SERVICE_NAME
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    readers = (
        [PeriodicExportingMetricReader(OTLPMetricExporter(), export_interval_millis=500)]
        if args.metrics
        else []
    )
    watch = InMemoryMetricReader()  # lockwatch's waiting gauge, read by _wait_blocked
    meter_provider = MeterProvider(resource=resource, metric_readers=[*readers, watch])

    instrumentor = None
    if args.mode in ("lockwatch", "pool"):
        from otel_lockwatch import LockwatchInstrumentor, name_lock

        instrumentor = LockwatchInstrumentor()
        instrumentor.instrument(tracer_provider=tracer_provider, meter_provider=meter_provider)
        if args.mode == "pool":
            return _run_pool(args, tracer_provider, meter_provider, watch, instrumentor)
        lock = threading.Lock()  # created after instrument(): instrumented
        name_lock(lock, LOCK_NAME)
    else:
        lock = threading.Lock()

    tracer = tracer_provider.get_tracer("otel-lockwatch-e2e")
    task_traces: dict[str, str] = {}
    about_to_acquire = [threading.Event() for _ in range(args.tasks)]

    def worker(i: int) -> None:
        name = f"task-{i}"
        with tracer.start_as_current_span(name, attributes={"e2e.task": i}) as span:
            task_traces[name] = format(span.get_span_context().trace_id, "032x")
            about_to_acquire[i].set()
            with lock:
                if args.mode == "plain":
                    with tracer.start_as_current_span("plain.child"):
                        pass
                time.sleep(0.002)  # hold

    lock.acquire()
    workers = [
        threading.Thread(target=worker, args=(i,), name=f"worker-{i}") for i in range(args.tasks)
    ]
    for thread in workers:
        thread.start()
    for event in about_to_acquire:
        event.wait()
    if instrumentor is not None:
        _wait_blocked(watch, LOCK_NAME, args.tasks)
    time.sleep(HOLD_S)  # hold: every worker is now blocked on the lock
    lock.release()
    for thread in workers:
        thread.join()

    # Tracer provider first: lockwatch exports its manifest span at this shutdown.
    tracer_provider.shutdown()
    meter_provider.shutdown()
    if instrumentor is not None:
        instrumentor.uninstrument()
    print(json.dumps({"task_traces": task_traces}, sort_keys=True), flush=True)
    return 0


def _run_pool(
    args: argparse.Namespace,
    tracer_provider: Any,
    meter_provider: Any,
    watch: InMemoryMetricReader,
    instrumentor: Any,
) -> int:
    """The ``pool`` mode: ``rounds`` times, ``tasks`` workers check a connection out of a pool
    that the main thread has emptied, so that every checkout waits (see the module docstring)."""
    from otel_lockwatch import name_lock

    pool: queue.LifoQueue[int] = queue.LifoQueue()  # created after instrument(): watched
    name_lock(pool, POOL_NAME)
    for connection in range(CONNECTIONS):
        pool.put(connection)
    tracer = tracer_provider.get_tracer("otel-lockwatch-e2e")
    task_traces: dict[str, str] = {}

    def worker(name: str) -> None:
        with tracer.start_as_current_span(name) as span:
            task_traces[name] = format(span.get_span_context().trace_id, "032x")
            connection = pool.get()
            time.sleep(POOL_HOLD_S)  # hold: the connection's round trip
            pool.put(connection)

    for round_ in range(args.rounds):
        if round_:
            time.sleep(POOL_PAUSE_S)  # pace: the rounds spread over the metrics' samples
        taken = [pool.get() for _ in range(CONNECTIONS)]  # the pool runs dry
        workers = [
            threading.Thread(target=worker, args=(f"task-{round_}.{i}",), name=f"worker-{i}")
            for i in range(args.tasks)
        ]
        for thread in workers:
            thread.start()
        _wait_blocked(watch, POOL_NAME, args.tasks)
        time.sleep(HOLD_S)  # hold: every worker is now blocked in its checkout
        for connection in taken:
            pool.put(connection)
        for thread in workers:
            thread.join()

    tracer_provider.shutdown()
    meter_provider.shutdown()
    instrumentor.uninstrument()
    print(json.dumps({"task_traces": task_traces}, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
