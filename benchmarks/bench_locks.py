"""What the instrumentation costs on the lock path, as ratios measured in one run.

Run: ``python benchmarks/bench_locks.py`` (add ``--quick`` for a short run, ``--memory`` for the
10^5 vs 10^7 acquisitions memory check). It measures the path in use: the C fast path when the
extension is built, the pure-Python path with ``LOCKWATCH_DISABLE_EXTENSIONS=1``. Every row is an
uncontended acquire+release pair (a ``with`` block), best of several repeats of the calling
thread's CPU time; the ratios divide rows of the same run, since this machine is shared and
noisy. Nothing here is a test: the figures go into the README.
"""

from __future__ import annotations

import argparse
import gc
import queue
import sys
import threading
import time
import timeit
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402

from otel_lockwatch import LockwatchInstrumentor, StripedSections  # noqa: E402
from otel_lockwatch.capture import _fast_path  # noqa: E402
from otel_lockwatch.record._recorder import RECORDER  # noqa: E402


class Discard(SpanExporter):
    """An exporter that keeps nothing: memory figures must not count exported spans."""

    def export(self, spans):
        return SpanExportResult.SUCCESS


def best_ns(fn, number: int, repeat: int) -> float:
    # The calling thread's CPU time, not wall time: other processes on this shared machine take
    # the cores away mid-run, and what the instrumentation costs is the CPU it burns.
    return (
        min(timeit.repeat(fn, number=number, repeat=repeat, timer=time.thread_time)) / number * 1e9
    )


def pair(lock):
    def run():
        with lock:
            pass

    return run


def section_pair(sections, key):
    def run():
        with sections.lock(key):
            pass

    return run


def queue_pair(q):
    def run():
        q.put(1)
        q.get()

    return run


def semaphore_pair(sem):
    def run():
        with sem:
            pass

    return run


def notify(cond):
    def run():
        with cond:
            cond.notify()

    return run


def nested(outer, inner):
    def run():
        with outer, inner:
            pass

    return run


def naive_baseline(tracer, wait_hist, hold_hist):
    """A naive instrumentation: a span and two histogram values per acquisition."""
    lock = (
        threading.Lock.__wrapped__() if hasattr(threading.Lock, "__wrapped__") else threading.Lock()
    )
    attrs = {"lock": "naive"}

    def run():
        t0 = time.perf_counter()
        with tracer.start_as_current_span("lock.hold", attributes=attrs):
            lock.acquire()
            t1 = time.perf_counter()
            wait_hist.record(t1 - t0, attrs)
            lock.release()
            hold_hist.record(time.perf_counter() - t1, attrs)

    return run


def slow_path_cost(number: int) -> float:
    """The work a contended acquisition adds beyond its wait: recording the wait, a 2 ms
    lock.wait span through a BatchSpanProcessor, the wait histogram. A synthetic wait."""
    from otel_lockwatch.capture._bookkeeping import current_context, record_wait
    from otel_lockwatch.capture._naming import lock_class
    from otel_lockwatch.record._recorder import Stats

    st = RECORDER.thread_state()
    cls = lock_class("bench-contended", "threading.Lock", "bench:slow:1")
    s = Stats()
    frame = sys._getframe()

    def run():
        ctx = current_context()
        t0 = time.perf_counter_ns()
        record_wait(st, s, cls, t0 - 2_000_000, t0, True, ctx, frame, None)

    from otel_lockwatch.record._outbox import OUTBOX
    from otel_lockwatch.telemetry._emitter import TELEMETRY

    TELEMETRY.flush()
    on_the_lock_path = best_ns(run, number, 3)
    # What the emitter thread then spends per record: a span and a histogram value.
    TELEMETRY._stop.set()  # pause the emitter thread: this thread drains instead, and is timed
    if TELEMETRY._emitter is not None:
        TELEMETRY._emitter.join()
    TELEMETRY.flush()
    for _ in range(number):
        run()
    queued = len(OUTBOX.queue)
    started = time.thread_time_ns()
    TELEMETRY.flush()
    in_the_emitter = (time.thread_time_ns() - started) / max(queued, 1)
    return on_the_lock_path, in_the_emitter


def memory_check(small: int, large: int) -> tuple[int, int]:
    from otel_lockwatch.telemetry._emitter import TELEMETRY

    TELEMETRY.flush()
    lock = threading.Lock()
    run = pair(lock)
    for _ in range(small):
        run()
    gc.collect()
    tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    for _ in range(small):
        run()
    gc.collect()
    after_small, _ = tracemalloc.get_traced_memory()
    for _ in range(large - small):
        run()
    gc.collect()
    after_large, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return after_small - base, after_large - base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument(
        "--memory", action="store_true", help="also compare memory after 1e5 and 1e7 acquisitions"
    )
    args = parser.parse_args()
    number, rounds = (30_000, 5) if args.quick else (50_000, 15)

    key = "entity-00000042"
    raw_lock = threading.Lock()
    raw_outer = threading.Lock()
    raw_inner = threading.Lock()
    raw_queue: queue.Queue[int] = queue.Queue()  # created before instrumenting: never watched
    raw_semaphore = threading.BoundedSemaphore(2)
    raw_condition = threading.Condition()
    sections = StripedSections(256, name="emitter")
    sections.index(key)

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Discard()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    instrumentor = LockwatchInstrumentor()

    def instrument() -> None:
        instrumentor.instrument(
            tracer_provider=tracer_provider, meter_provider=meter_provider, manifest=False
        )

    RECORDER.reset()
    instrument()
    lock = threading.Lock()  # proxies: they stay instrumented objects across uninstrument()
    rlock = threading.RLock()
    outer = threading.Lock()
    inner = threading.Lock()
    watched_queue: queue.Queue[int] = queue.Queue()
    semaphore = threading.BoundedSemaphore(2)
    condition = threading.Condition()
    tracer = tracer_provider.get_tracer("naive")
    meter = meter_provider.get_meter("naive")
    naive = naive_baseline(
        tracer, meter.create_histogram("naive.wait"), meter.create_histogram("naive.hold")
    )
    instrumentor.uninstrument()

    plain = {
        "raw threading.Lock": pair(raw_lock),
        "raw nested Lock pair": nested(raw_outer, raw_inner),
        "section, uninstrumented": section_pair(sections, key),
        "raw queue.Queue put+get": queue_pair(raw_queue),
        "raw BoundedSemaphore acquire+release": semaphore_pair(raw_semaphore),
        "raw Condition: with cond: notify()": notify(raw_condition),
    }
    watched = {
        "section, instrumented": section_pair(
            sections, key
        ),  # the same array: the class is patched
        "instrumented threading.Lock": pair(lock),
        "instrumented threading.RLock": pair(rlock),
        "instrumented nested Lock pair (order check)": nested(outer, inner),
        "unwatched queue.Queue put+get, instrumented": queue_pair(raw_queue),
        "watched queue.Queue put+get": queue_pair(watched_queue),
        "watched BoundedSemaphore acquire+release": semaphore_pair(semaphore),
        "watched Condition: with cond: notify()": notify(condition),
    }
    # Rows are measured in interleaved rounds (the instrumentation switched on and off each round),
    # so that every row sees the same machine; each row keeps its best round.
    rows: dict[str, float] = {name: float("inf") for name in [*plain, *watched]}
    rows["naive span + 2 histograms per acquisition"] = float("inf")
    for _ in range(rounds):
        for name, fn in plain.items():
            rows[name] = min(rows[name], best_ns(fn, number, 1))
        instrument()
        try:
            for name, fn in watched.items():
                rows[name] = min(rows[name], best_ns(fn, number, 1))
            rows["naive span + 2 histograms per acquisition"] = min(
                rows["naive span + 2 histograms per acquisition"],
                best_ns(naive, max(number // 50, 500), 1),
            )
        finally:
            instrumentor.uninstrument()
    instrument()
    try:
        memory = memory_check(10**5, 10**7) if args.memory else None
        contended_extra = slow_path_cost(2000)
    finally:
        instrumentor.uninstrument()
        tracer_provider.shutdown()

    raw = rows["raw threading.Lock"]
    width = max(len(k) for k in rows)
    path = "C (_speedups)" if _fast_path.SPEEDUPS else "pure Python"
    print(f"lock path: {path}; Python {sys.version.split()[0]}")
    print(f"{'uncontended acquire+release (with block)':<{width}}  {'ns':>8}  {'x raw Lock':>10}")
    for name, ns in rows.items():
        print(f"{name:<{width}}  {ns:8.0f}  {ns / raw:10.2f}")
    print()
    lock = rows["instrumented threading.Lock"]
    lock_ratio = lock / raw
    section_ratio = rows["section, instrumented"] / rows["section, uninstrumented"]
    check = rows["instrumented nested Lock pair (order check)"] - 2 * lock
    naive_ratio = rows["naive span + 2 histograms per acquisition"] / lock
    waiting, emitting = contended_extra[0] / 1000, contended_extra[1] / 1000
    print(f"instrumented Lock / raw Lock:               {lock_ratio:.2f}x (target <= 6)")
    print(f"instrumented section / uninstrumented:      {section_ratio:.2f}x (target <= 2.5)")
    print(f"the order check of a nested acquisition (nested pair - 2 single pairs): {check:.0f} ns")
    print(f"naive baseline / instrumented Lock:         {naive_ratio:.1f}x")
    unwatched_queue = (
        rows["unwatched queue.Queue put+get, instrumented"] / rows["raw queue.Queue put+get"]
    )
    print(f"unwatched queue, instrumented / raw:        {unwatched_queue:.2f}x (target 1.0)")
    for watched_row, raw_row in (
        ("watched queue.Queue put+get", "raw queue.Queue put+get"),
        ("watched BoundedSemaphore acquire+release", "raw BoundedSemaphore acquire+release"),
        ("watched Condition: with cond: notify()", "raw Condition: with cond: notify()"),
    ):
        ratio = rows[watched_row] / rows[raw_row]
        print(f"{watched_row} / raw: {ratio:.2f}x")
    print(
        f"contended acquisition, added to its wait on the waiting thread: {waiting:.1f} us "
        "(target <= 20 us)"
    )
    print(f"  then, on the emitter thread, its span and histogram value: {emitting:.1f} us")
    if memory is not None:
        small, large = memory
        print(
            f"memory held by the recorder after 1e5 acquisitions: {small} B; after 1e7: {large} B"
        )


if __name__ == "__main__":
    main()
