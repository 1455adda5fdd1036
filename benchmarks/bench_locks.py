"""What the instrumentation costs on the lock path, as ratios measured in one run.

Run: ``python benchmarks/bench_locks.py`` (``--quick`` for a short run, ``--memory`` for the
10^5 vs 10^7 acquisitions memory check, ``--ddtrace-python PY`` for an interpreter that has
ddtrace, when this one has not). It runs each path in a process of its own (the path is chosen
at import): the C fast path, the pure-Python path (``LOCKWATCH_DISABLE_EXTENSIONS=1``), and
ddtrace's lock profiler at 1 % and 100 % capture when ddtrace is importable. Every figure is
divided by its own bare baseline, measured in the same process in interleaved rounds (this
machine is shared and noisy):

- uncontended pairs, timed by ``timeit`` on a statement (no function call per pair: a bare
  ``L.acquire(); L.release()`` is the baseline, not a ``with`` block inside a closure), on the
  thread's CPU time, best round;
- the 8-thread convoy: 8 threads x 50,000 ``with L: n += 1`` on one lock (wall time, and the
  contentions and verdict recorded: the program has no contention of its own);
- the pool: 16 workers, 40,000 tasks taking 3 locks each (wall time);
- thread churn: 2,000 threads started one after the other, each taking one lock once (a thread
  per request, as ``ThreadingHTTPServer`` runs), in us per thread (wall, and the process's CPU),
  plain and instrumented in alternate rounds (``--churn`` runs these rows alone, ``--rounds`` of
  each);
- contended throughput: 16 workers on one lock held 1 ms per task, and on two locks held
  together (nested) 1 ms per task, in tasks per second; each round runs a row plain and
  instrumented back to back (which goes first alternates), and the ratio is the median of the
  rounds' ratios (``--rounds``, 9; ``--contended`` runs these rows alone); with the emitter
  thread's CPU per record and the load average at the end;
- memory held after 10^5 and 10^7 acquisitions (``--memory``).

Nothing here is a test: the figures go into docs/performance.md.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import queue
import subprocess
import sys
import threading
import time
import timeit
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402

from otel_lockwatch import LockwatchInstrumentor, StripedSections  # noqa: E402
from otel_lockwatch._session import RECORDER  # noqa: E402
from otel_lockwatch.capture import _fast_path  # noqa: E402
from otel_lockwatch.manifest._evaluate import evaluate  # noqa: E402


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
    from otel_lockwatch.record._stats import Stats

    st = RECORDER.thread_state()
    cls = lock_class("bench-contended", "threading.Lock", "bench:slow:1")
    s = Stats()
    frame = sys._getframe()

    def run():
        ctx = current_context()
        t0 = time.perf_counter_ns()
        record_wait(st, s, cls, t0 - 2_000_000, t0, True, ctx, frame, None)

    from otel_lockwatch import _session
    from otel_lockwatch._session import OUTBOX

    emitter = _session.current().emitter
    emitter.flush()
    on_the_lock_path = best_ns(run, number, 3)
    # What the emitter thread then spends per record: a span and a histogram value.
    emitter._stop.set()  # pause the emitter thread: this thread drains instead, and is timed
    if emitter._emitter is not None:
        emitter._emitter.join()
    emitter.flush()
    for _ in range(number):
        run()
    # (a wait is counted on the lock path and filed later: the recorder's unfiled waits, each
    # one record of the outbox once filed, which the flush does first)
    queued = len(RECORDER.waits.queue) + len(OUTBOX.queue)
    started = time.thread_time_ns()
    emitter.flush()
    in_the_emitter = (time.thread_time_ns() - started) / max(queued, 1)
    return on_the_lock_path, in_the_emitter


def memory_check(small: int, large: int) -> tuple[int, int]:
    from otel_lockwatch import _session

    _session.current().emitter.flush()
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


def stmt_ns(stmt: str, names: dict, number: int) -> float:
    """One round of ``stmt`` (a statement, not a call: timeit's own loop is the only overhead),
    in ns of the thread's CPU time per execution."""
    return timeit.Timer(stmt, globals=names, timer=time.thread_time).timeit(number) / number * 1e9


PAIR = "L.acquire(); L.release()"
WITH = "with L: pass"
SECTION = "with S.lock(K): pass"


def convoy(lock, threads: int = 8, each: int = 50_000) -> float:
    """``threads`` threads, each ``each`` times ``with lock: n += 1``; wall time in seconds."""
    box = [0]
    start = threading.Barrier(threads + 1)

    def work():
        start.wait()
        for _ in range(each):
            with lock:
                box[0] += 1

    workers = [threading.Thread(target=work) for _ in range(threads)]
    for t in workers:
        t.start()
    t0 = time.perf_counter()
    start.wait()
    for t in workers:
        t.join()
    return time.perf_counter() - t0


class Forwarding:
    """A lock wrapped in Python that only forwards (``__enter__`` acquires, ``__exit__``
    releases): the floor of any pure-Python instrumentation of ``with L:``, timed nothing."""

    __slots__ = ("_lock",)

    def __init__(self, lock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc) -> None:
        self._lock.release()


def pool(tasks: int = 40_000, workers: int = 16) -> float:
    """A pool of ``workers`` running ``tasks`` tasks that take 3 locks each (a shard of 8, a
    ledger, a stats lock), all created here (watched when instrumented); wall time in s."""
    shards = [threading.Lock() for _ in range(8)]
    ledger = threading.Lock()
    stats = threading.Lock()
    totals = [0] * 8
    count = [0]

    def task(i):
        with shards[i & 7]:
            totals[i & 7] += i
        with ledger:
            count[0] += 1
        with stats:
            pass

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as executor:
        for _ in executor.map(task, range(tasks), chunksize=64):
            pass
    return time.perf_counter() - t0


def churn(lock, threads: int = 2000) -> tuple[float, float]:
    """``threads`` threads, one after the other, each taking ``lock`` once: (wall, process CPU)
    in us per thread."""

    def work():
        with lock:
            pass

    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(threads):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    return (
        (time.perf_counter() - wall) / threads * 1e6,
        (time.process_time() - cpu) / threads * 1e6,
    )


def contended(locks: list, tasks: int = 400, workers: int = 16) -> float:
    """``workers`` workers running ``tasks`` tasks, each holding every lock of ``locks`` (nested)
    for 1 ms: tasks per second."""
    outer, inner = locks[0], locks[-1]

    def task(_):
        with outer:
            if inner is outer:
                time.sleep(0.001)
            else:
                with inner:
                    time.sleep(0.001)

    with ThreadPoolExecutor(max_workers=workers) as executor:
        list(executor.map(task, range(workers)))  # the workers exist before the clock starts
        t0 = time.perf_counter()
        list(executor.map(task, range(tasks)))
        return tasks / (time.perf_counter() - t0)


def churn_rounds(instrument, uninstrument, rounds: int) -> dict:
    """The thread-churn rows: plain and instrumented alternating."""
    runs: dict[str, list] = {"churn": [[], []]}
    for _ in range(rounds):
        for watched in (False, True):
            if watched:
                RECORDER.reset()
                instrument()
            try:
                runs["churn"][watched].append(churn(threading.Lock()))
            finally:
                if watched:
                    uninstrument()
    return runs


def contention_rounds(instrument, uninstrument, rounds: int) -> dict:
    """The contended-throughput rows: each round runs a row plain and instrumented back to back
    (which goes first alternates from round to round), so that the load of a shared machine
    hits both sides of each ratio alike. Also the emitter thread's CPU per record in its
    periodic drains, and how many records it made there."""
    from otel_lockwatch.telemetry._emitter import Telemetry  # a session's emitter: its class

    # Each row's locks, made per run (two classes: the column tells two on one line apart).
    rows = {
        "one lock": lambda: [threading.Lock()],
        "two locks": lambda: [threading.Lock(), threading.Lock()],
    }
    runs: dict[str, list] = {row: [[], []] for row in rows}
    emitted = [0, 0]  # records, ns of the emitter's CPU
    made = [0]  # records made, on any thread
    drain, emit = Telemetry.drain, Telemetry.emit

    def counted_emit(self, *record) -> None:
        made[0] += 1
        emit(self, *record)

    def timed_drain(self, yielding: bool = False) -> None:
        started, before = time.thread_time_ns(), made[0]
        drain(self, yielding)
        if yielding:  # the emitter thread's periodic drains
            emitted[0] += made[0] - before
            emitted[1] += time.thread_time_ns() - started

    Telemetry.drain, Telemetry.emit = timed_drain, counted_emit  # type: ignore[method-assign]
    try:
        for i in range(rounds):
            for row, make in rows.items():
                for watched in (False, True) if i % 2 == 0 else (True, False):
                    if watched:
                        RECORDER.reset()
                        instrument()
                    try:
                        runs[row][watched].append(contended(make()))
                    finally:
                        if watched:
                            uninstrument()
    finally:
        Telemetry.drain, Telemetry.emit = drain, emit  # type: ignore[method-assign]
    runs["emitter_us_per_record"] = emitted[1] / 1000 / max(emitted[0], 1)
    runs["emitter_records"] = emitted[0]
    return runs


def measure_contention(args: argparse.Namespace) -> dict:
    """Only the contended-throughput rows (``--contended``), or only the thread-churn rows
    (``--churn``), on the path this process runs."""
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Discard()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    instrumentor = LockwatchInstrumentor()

    def instrument() -> None:
        instrumentor.instrument(
            tracer_provider=tracer_provider, meter_provider=meter_provider, manifest=False
        )

    rounds = churn_rounds if args.churn else contention_rounds
    try:
        runs = rounds(instrument, instrumentor.uninstrument, args.rounds)
    finally:
        tracer_provider.shutdown()
    return {
        "path": "C" if _fast_path.SPEEDUPS else "Python",
        "python": sys.version.split()[0],
        "churn": runs,
        "load": os.getloadavg(),
    }


def measure(args: argparse.Namespace) -> dict:
    """Everything measured on the path this process runs: lockwatch's rows against the bare
    ones, and the rows the docs quote (order check, queues, the naive instrumentation)."""
    number, rounds = (50_000, 3) if args.quick else (200_000, 7)
    heavy_rounds = 1 if args.quick else 3
    key = "entity-00000042"
    raw_lock = threading.Lock()
    raw_rlock = threading.RLock()
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

    # Each row: (statement, its names); the bare rows run with the instrumentation off.
    plain = {
        "bare L.acquire(); L.release()": (PAIR, {"L": raw_lock}),
        "bare with L: pass": (WITH, {"L": raw_lock}),
        "bare RLock acquire(); release()": (PAIR, {"L": raw_rlock}),
        "bare nested pair": ("with A, B: pass", {"A": raw_outer, "B": raw_inner}),
        "section pair, uninstrumented": (SECTION, {"S": sections, "K": key}),
        "bare queue.Queue put+get": ("Q.put(1); Q.get()", {"Q": raw_queue}),
        "bare BoundedSemaphore with": (WITH, {"L": raw_semaphore}),
        "bare Condition: with c: c.notify()": ("with C: C.notify()", {"C": raw_condition}),
    }
    watched = {
        "L.acquire(); L.release()": (PAIR, {"L": lock}),
        "with L: pass": (WITH, {"L": lock}),
        "RLock acquire(); release()": (PAIR, {"L": rlock}),
        "nested pair (order check)": ("with A, B: pass", {"A": outer, "B": inner}),
        "section pair, instrumented": (SECTION, {"S": sections, "K": key}),
        "unwatched queue.Queue put+get": ("Q.put(1); Q.get()", {"Q": raw_queue}),
        "watched queue.Queue put+get": ("Q.put(1); Q.get()", {"Q": watched_queue}),
        "watched BoundedSemaphore with": (WITH, {"L": semaphore}),
        "watched Condition: with c: c.notify()": ("with C: C.notify()", {"C": condition}),
    }
    rows: dict[str, float] = {name: float("inf") for name in [*plain, *watched]}
    rows["naive span + 2 histograms per pair"] = float("inf")
    for _ in range(rounds):
        for name, (stmt, names) in plain.items():
            rows[name] = min(rows[name], stmt_ns(stmt, names, number))
        instrument()
        try:
            for name, (stmt, names) in watched.items():
                rows[name] = min(rows[name], stmt_ns(stmt, names, number))
            rows["naive span + 2 histograms per pair"] = min(
                rows["naive span + 2 histograms per pair"],
                best_ns(naive, max(number // 100, 500), 1),
            )
        finally:
            instrumentor.uninstrument()

    # The convoy and the pool: bare and instrumented in alternate rounds, best wall time; the
    # instrumented convoy's recording is that of its last round.
    walls = {"convoy": [float("inf"), float("inf")], "pool": [float("inf"), float("inf")]}
    walls["forwarding"] = [float("inf")]
    recorded: dict = {}
    for _ in range(heavy_rounds):
        walls["convoy"][0] = min(walls["convoy"][0], convoy(threading.Lock()))
        walls["forwarding"][0] = min(walls["forwarding"][0], convoy(Forwarding(threading.Lock())))
        walls["pool"][0] = min(walls["pool"][0], pool())
        RECORDER.reset()
        instrument()
        try:
            watched_lock = threading.Lock()
            name = watched_lock._lockwatch_class.name
            walls["convoy"][1] = min(walls["convoy"][1], convoy(watched_lock))
            data = RECORDER.snapshot()
            stats = data["locks"][name]
            recorded = {
                "acquisitions": stats["acquisitions"],
                "contentions": stats["contentions"],
                "verdict": str(evaluate(data).verdict),
                "window_yields": RECORDER.window_yields,
            }
            walls["pool"][1] = min(walls["pool"][1], pool())
        finally:
            instrumentor.uninstrument()

    churned = churn_rounds(instrument, instrumentor.uninstrument, 2 if args.quick else 5)
    churned.update(contention_rounds(instrument, instrumentor.uninstrument, args.rounds))
    instrument()
    try:
        memory = memory_check(10**5, 10**7) if args.memory else None
        contended_extra = slow_path_cost(2000)
    finally:
        instrumentor.uninstrument()
        tracer_provider.shutdown()
    return {
        "path": "C" if _fast_path.SPEEDUPS else "Python",
        "python": sys.version.split()[0],
        "rows": rows,
        "walls": walls,
        "convoy": recorded,
        "churn": churned,
        "load": os.getloadavg(),
        "memory": memory,
        "slow_path_us": [contended_extra[0] / 1000, contended_extra[1] / 1000],
    }


DDTRACE = r"""
import json, sys, threading, time, timeit
PAIR, WITH, number, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, sys.argv[5])
from benchmarks.bench_locks import convoy
from ddtrace.profiling.collector import threading as dd_threading
import ddtrace

def ns(stmt, names):
    return timeit.Timer(stmt, globals=names, timer=time.thread_time).timeit(number) / number * 1e9

raw = threading.Lock()
out = {"version": ddtrace.__version__}
for pct in (1, 100):
    rows = {"pair": [float("inf")] * 2, "with": [float("inf")] * 2, "convoy": [float("inf")] * 2}
    for _ in range(rounds):
        rows["pair"][0] = min(rows["pair"][0], ns(PAIR, {"L": raw}))
        rows["with"][0] = min(rows["with"][0], ns(WITH, {"L": raw}))
        rows["convoy"][0] = min(rows["convoy"][0], convoy(threading.Lock()))
        collector = dd_threading.ThreadingLockCollector(capture_pct=pct)
        collector.start()
        try:
            lock = threading.Lock()
            rows["pair"][1] = min(rows["pair"][1], ns(PAIR, {"L": lock}))
            rows["with"][1] = min(rows["with"][1], ns(WITH, {"L": lock}))
            rows["convoy"][1] = min(rows["convoy"][1], convoy(threading.Lock()))
        finally:
            collector.stop()
    out[str(pct)] = rows
print(json.dumps(out))
"""


def child(env_extra: dict[str, str], argv: list[str], python: str = sys.executable) -> dict:
    """Run this benchmark's ``--child`` in a process of its own (the path is chosen at import)."""
    env = dict(os.environ)
    env.pop("LOCKWATCH_DISABLE_EXTENSIONS", None)
    env.update(env_extra)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for var in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER"):
        env[var] = "none"
    done = subprocess.run(
        [python, *argv], env=env, capture_output=True, text=True, check=False, cwd=ROOT
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:2])} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def ddtrace_python(given: str | None) -> str | None:
    """An interpreter that imports ddtrace: ``given``, or this one, else None."""
    for python in filter(None, [given, sys.executable]):
        ok = subprocess.run(
            [python, "-c", "import ddtrace.profiling.collector.threading"],
            capture_output=True,
            check=False,
        )
        if ok.returncode == 0:
            return python
    return None


def report_churn(paths: list[dict]) -> None:
    """The thread-churn rows: best and median us per thread, wall and process CPU, of each side
    (``churn``'s rounds alternate plain and instrumented), and the load average at the end."""
    print(f"\n{'thread churn: 2,000 threads x one lock once':<52}{'plain':>14}{'instrumented':>16}")
    for r in paths:
        plain, watched = r["churn"]["churn"]
        for i, what in ((0, "wall"), (1, "CPU")):
            p = sorted(x[i] for x in plain)
            w = sorted(x[i] for x in watched)
            print(
                f"  {r['path']} path, us per thread ({what}), best / median".ljust(52)
                + f"{p[0]:6.1f} / {p[len(p) // 2]:5.1f}  {w[0]:6.1f} / {w[len(w) // 2]:5.1f}"
                + f"  ({w[0] - p[0]:+.1f} / {w[len(w) // 2] - p[len(p) // 2]:+.1f} us)"
            )
        load = " / ".join(f"{x:.1f}" for x in r["load"])
        print(f"  {r['path']} path: {len(plain)} rounds each; load average at the end {load}")


def report_contention(paths: list[dict]) -> None:
    """The contended-throughput rows: best tasks/s of each side, the median of the rounds'
    ratios and their range, the emitter's CPU per record, and the load average at the end."""
    print(f"\n{'16 workers x 1 ms under the lock, tasks/s':<52}{'plain':>14}{'instrumented':>16}")
    for r in paths:
        for row in ("one lock", "two locks"):
            plain, watched = r["churn"][row]
            ratios = sorted(w / p for p, w in zip(plain, watched, strict=True))
            print(
                f"  {r['path']} path, {row} (best)".ljust(52)
                + f"{max(plain):14.0f}{max(watched):16.0f}"
                + f"  ratio {ratios[len(ratios) // 2]:.3f} (median of {len(ratios)} rounds,"
                + f" {ratios[0]:.3f}-{ratios[-1]:.3f})"
            )
        print(
            f"  {r['path']} path: the emitter made {r['churn']['emitter_records']:,} records, "
            f"{r['churn']['emitter_us_per_record']:.1f} us of its CPU each; load average at the "
            f"end {r['load'][0]:.1f} / {r['load'][1]:.1f} / {r['load'][2]:.1f} (1 / 5 / 15 min)"
        )


def report(results: dict[str, dict], dd: dict | None) -> None:
    """The table: each figure and its ratio to its own bare baseline."""
    c, py = results.get("C"), results["Python"]
    print(f"otel-lockwatch lock benchmark; Python {py['python']}; one run, interleaved rounds")
    print("(each ratio: against the bare baseline measured in the same process)")
    paths = [r for r in (c, py) if r is not None]
    header = "".join(f"  {r['path'] + ' path':>20}" for r in paths)
    if dd is not None:
        header += f"  {'ddtrace 1 %':>16}  {'ddtrace 100 %':>16}"
    print(f"\n{'uncontended, ns per pair':<40}{'bare':>8}{header}")
    pairs = (
        ("L.acquire(); L.release()", "bare L.acquire(); L.release()", "pair"),
        ("with L: pass", "bare with L: pass", "with"),
        ("RLock acquire(); release()", "bare RLock acquire(); release()", None),
        ("section pair, instrumented", "section pair, uninstrumented", None),
        ("nested pair (order check)", "bare nested pair", None),
        ("watched BoundedSemaphore with", "bare BoundedSemaphore with", None),
        ("watched queue.Queue put+get", "bare queue.Queue put+get", None),
        ("unwatched queue.Queue put+get", "bare queue.Queue put+get", None),
        ("watched Condition: with c: c.notify()", "bare Condition: with c: c.notify()", None),
        ("naive span + 2 histograms per pair", "bare with L: pass", None),
    )
    for name, base, dd_row in pairs:
        line = f"{name:<40}{paths[0]['rows'][base]:8.0f}"  # each path's ratio: its own base
        for r in paths:
            v, b = r["rows"][name], r["rows"][base]
            line += f"  {v:9.0f} ({v / b:5.1f}x)"
        if dd is not None and dd_row is not None:
            for pct in ("1", "100"):
                b, v = dd[pct][dd_row]
                line += f"  {v:7.0f} ({v / b:5.1f}x)"
        print(line)
    print(f"\n{'8 threads x 50,000 with L: n += 1':<40}{'bare s':>8}")
    line = f"{'  wall time':<40}{paths[0]['walls']['convoy'][0]:8.3f}"
    for r in paths:
        b, v = r["walls"]["convoy"]
        line += f"  {v:9.3f} ({v / b:5.1f}x)"
    if dd is not None:
        for pct in ("1", "100"):
            b, v = dd[pct]["convoy"]
            line += f"  {v:7.3f} ({v / b:5.1f}x)"
    print(line)
    floor = paths[0]["walls"]["forwarding"][0]
    print(
        f"  a Python __enter__ / __exit__ that only forwards: {floor:.3f} s "
        f"({floor / paths[0]['walls']['convoy'][0]:.1f}x; no bookkeeping, and a convoy at times)"
    )
    for r in paths:
        rec = r["convoy"]
        share = 100 * rec["contentions"] / max(rec["acquisitions"], 1)
        print(
            f"  {r['path']} path recorded: {rec['acquisitions']:,} acquisitions, "
            f"{rec['contentions']:,} contentions ({share:.2f} %), {rec['verdict']}; "
            f"{rec['window_yields']:,} acquisitions yielded to a holder in lockwatch's window"
        )
    print(f"\n{'pool: 16 workers, 40,000 tasks x 3 locks':<40}{'bare s':>8}")
    line = f"{'  wall time':<40}{paths[0]['walls']['pool'][0]:8.3f}"
    for r in paths:
        b, v = r["walls"]["pool"]
        line += f"  {v:9.3f} ({v / b:5.2f}x)"
    print(line)
    report_churn(paths)
    report_contention(paths)
    print()
    for r in paths:
        waiting, emitting = r["slow_path_us"]
        print(
            f"{r['path']} path: a contended acquisition adds {waiting:.1f} us on the waiting "
            f"thread, then {emitting:.1f} us on the emitter thread"
        )
        if r["memory"] is not None:
            small, large = r["memory"]
            print(
                f"{r['path']} path: memory held after 1e5 acquisitions: {small} B; "
                f"after 1e7: {large} B"
            )
    if dd is not None:
        print(f"ddtrace {dd['version']} (ThreadingLockCollector, capture_pct 1 and 100)")
    else:
        print("ddtrace: not importable here (pip install '.[bench]', or --ddtrace-python)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument(
        "--memory", action="store_true", help="also compare memory after 1e5 and 1e7 acquisitions"
    )
    parser.add_argument("--ddtrace-python", help="an interpreter that has ddtrace")
    parser.add_argument(
        "--contended", action="store_true", help="only the contended-throughput rows"
    )
    parser.add_argument("--churn", action="store_true", help="only the thread-churn rows")
    parser.add_argument(
        "--rounds",
        type=int,
        default=9,
        help="contended (or --churn) rounds, each: plain and instrumented",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        alone = args.contended or args.churn
        print(json.dumps(measure_contention(args) if alone else measure(args)))
        return
    argv = [str(Path(__file__).resolve()), "--child", "--rounds", str(args.rounds)]
    argv += ["--quick"] * args.quick + ["--memory"] * args.memory
    argv += ["--contended"] * args.contended + ["--churn"] * args.churn
    results = {}
    if _fast_path.SPEEDUPS:
        results["C"] = child({}, argv)
    results["Python"] = child({"LOCKWATCH_DISABLE_EXTENSIONS": "1"}, argv)
    if args.churn:
        print(f"otel-lockwatch thread churn; Python {results['Python']['python']}")
        report_churn([r for r in (results.get("C"), results["Python"]) if r is not None])
        return
    if args.contended:
        print(f"otel-lockwatch contended throughput; Python {results['Python']['python']}")
        report_contention([r for r in (results.get("C"), results["Python"]) if r is not None])
        return
    python = ddtrace_python(args.ddtrace_python)
    dd = None
    if python is not None:
        number, rounds = ("50000", "1") if args.quick else ("200000", "3")
        dd = child({}, ["-c", DDTRACE, PAIR, WITH, number, rounds, str(ROOT)], python)
    report(results, dd)


if __name__ == "__main__":
    main()
