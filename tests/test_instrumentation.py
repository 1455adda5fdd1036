"""The instrumentation of stdlib locks: semantics kept, telemetry exact, the host never broken."""

from __future__ import annotations

import _thread
import asyncio
import inspect
import os
import queue
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry import trace
from polling import until

from otel_lockwatch import LockwatchInstrumentor, _session, name_lock
from otel_lockwatch._session import OUTBOX, RECORDER
from otel_lockwatch.capture import _patches
from otel_lockwatch.capture._threading import LockProxy, RLockProxy
from otel_lockwatch.record import _recorder

ORIGINAL_LOCK = threading.Lock
ORIGINAL_RLOCK = threading.RLock
ORIGINAL_CONDITION_INIT = threading.Condition.__init__
ORIGINAL_SEM_ACQUIRE = threading.Semaphore.acquire
ORIGINAL_ASYNC_ACQUIRE = asyncio.Lock.acquire


def locks_of(snapshot: dict) -> dict:
    return snapshot["locks"]


def hold_until(lock, entered: threading.Event, release: threading.Event) -> threading.Thread:
    """A thread that takes `lock`, sets `entered`, and releases when `release` is set."""

    def run() -> None:
        with lock:
            entered.set()
            release.wait(10)

    t = threading.Thread(target=run, name="holder")
    t.start()
    assert entered.wait(10)
    return t


def line_of(function, text: str) -> int:
    """The line of ``function``'s source that holds ``text`` first."""
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


def mutex_waits(watched) -> list:
    """The ``lock.wait`` spans of mutex waits (not of hand-off waits: a test's own events)."""
    spans = watched.finished("lock.wait")
    return [s for s in spans if s.attributes.get("lockwatch.wait.kind") != "signal"]


def test_instrument_uninstrument():
    """instrument() patches every target; uninstrument() restores each exactly."""
    lock_before = threading.Lock()
    inst = LockwatchInstrumentor()
    inst.instrument(manifest=False)
    try:
        assert threading.Lock is not ORIGINAL_LOCK
        assert type(threading.Lock()) is LockProxy
        assert type(threading.RLock()) is RLockProxy
        assert type(lock_before) is not LockProxy
    finally:
        inst.uninstrument()
    assert threading.Lock is ORIGINAL_LOCK
    assert threading.RLock is ORIGINAL_RLOCK
    assert threading.Condition.__init__ is ORIGINAL_CONDITION_INIT
    assert threading.Semaphore.acquire is ORIGINAL_SEM_ACQUIRE
    assert asyncio.Lock.acquire is ORIGINAL_ASYNC_ACQUIRE
    assert type(threading.Lock()) is _thread.LockType


def test_every_patch_of_the_table_is_undone_exactly():
    """instrument() replaces the attribute of every entry of the patch table; uninstrument() puts
    back the very object that was there (or removes one that was not)."""
    absent = object()
    before = [vars(p.owner).get(p.name, absent) for p in _patches.PATCHES]
    inst = LockwatchInstrumentor()
    inst.instrument(manifest=False)
    try:
        during = [vars(p.owner).get(p.name, absent) for p in _patches.PATCHES]
        kept = zip(_patches.PATCHES, before, during, strict=True)
        assert [p for p, old, new in kept if new is old] == []
    finally:
        inst.uninstrument()
    after = [vars(p.owner).get(p.name, absent) for p in _patches.PATCHES]
    changed = [
        f"{p.owner.__name__}.{p.name}"
        for p, old, new in zip(_patches.PATCHES, before, after, strict=True)
        if new is not old
    ]
    assert changed == []
    assert _session.current() is None  # the session, and its patches, ended


def test_locks_of_opentelemetry_and_lockwatch_are_left_alone(watched):
    """The SDK creates a Lock per span: it must stay a plain lock, and no OTel class is recorded."""
    tracer = watched.tracer_provider.get_tracer("t")
    with tracer.start_as_current_span("task") as span:
        assert type(span._lock) is not LockProxy  # the SDK's own per-span lock
    assert not any(name.startswith("opentelemetry") for name in locks_of(RECORDER.snapshot()))


def test_an_exporters_own_pool_is_left_alone_where_a_users_is_watched(watched):
    """The OTLP/HTTP exporter (the package's dependency) makes a urllib3 pool nine frames below
    its own code, deeper than the callers probed; the SDK suppresses instrumentation around
    every export, and what is made or waited on there is not watched. The same library's pool
    made by the program is."""
    import urllib3
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    received = threading.Event()

    class Collector(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the http.server name)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.set()  # before the answer the exporter waits for
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    endpoint = f"http://127.0.0.1:{server.server_address[1]}/v1/traces"
    processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=10))
    watched.tracer_provider.add_span_processor(processor)
    try:
        with watched.tracer_provider.get_tracer("t").start_as_current_span("task"):
            pass
        assert processor.force_flush(10)
        assert received.is_set()  # the export happened, through the exporter's pool
        assert not any("urllib3" in name for name in locks_of(RECORDER.snapshot()))
        users = urllib3.PoolManager(maxsize=1, block=True)
        assert users.request("POST", endpoint, body=b"x").status == 200
    finally:
        processor.shutdown()  # before the server goes: no export is left to retry
        server.shutdown()
        server.server_close()
    assert any(name.startswith("urllib3.") for name in locks_of(RECORDER.snapshot()))


def test_lock_semantics_kept(watched):
    """Return values, exceptions, locked() and repr are those of the plain lock."""
    lock = threading.Lock()
    plain = ORIGINAL_LOCK()
    assert repr(lock).startswith("<unlocked _thread.lock object")
    assert lock.acquire() is True
    assert lock.locked() is True
    assert repr(lock).startswith("<locked _thread.lock object")
    assert lock.acquire(False) is False
    assert lock.acquire(timeout=0.01) is False
    lock.release()
    with pytest.raises(RuntimeError) as instrumented_error:
        lock.release()
    with pytest.raises(RuntimeError) as plain_error:
        plain.release()
    assert str(instrumented_error.value) == str(plain_error.value)
    with pytest.raises(ValueError) as instrumented_error:
        lock.acquire(False, 1)
    with pytest.raises(ValueError) as plain_error:
        plain.acquire(False, 1)
    assert str(instrumented_error.value) == str(plain_error.value)
    with pytest.raises(ValueError):
        lock.acquire(timeout=-5)
    assert lock.locked() is False


def test_rlock_reentry_and_ownership(watched):
    """Re-entry is immediate and adds no acquisition; _is_owned follows the owner."""
    rlock = name_lock(threading.RLock(), "r")
    with rlock:
        with rlock:
            assert rlock._is_owned()
        assert rlock._is_owned()
    assert not rlock._is_owned()
    with pytest.raises(RuntimeError):
        rlock.release()
    stats = locks_of(RECORDER.snapshot())["r"]
    assert stats["acquisitions"] == 1
    assert stats["hold_ns"].count == 1


def test_rlock_release_by_other_thread_raises(watched):
    rlock = threading.RLock()
    rlock.acquire()
    errors = []

    def other():
        try:
            rlock.release()
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert len(errors) == 1
    assert rlock._is_owned()
    rlock.release()


def test_exact_counts_across_threads(watched):
    """Every acquisition is counted: 4 threads x 500 -> 2000, in the recorder and the metric."""
    lock = name_lock(threading.Lock(), "counted")
    barrier = threading.Barrier(4)

    def work():
        barrier.wait()
        for _ in range(500):
            with lock:
                pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = locks_of(RECORDER.snapshot())["counted"]
    assert stats["acquisitions"] == 2000
    assert stats["hold_ns"].count == 2000
    assert stats["wait_ns"].count == 2000  # one sample per blocking attempt
    points = [
        p
        for p in watched.points("lockwatch.lock.acquisitions")
        if p.attributes["lockwatch.lock.name"] == "counted"
    ]
    assert [(p.attributes["lockwatch.outcome"], p.value) for p in points] == [("acquired", 2000)]
    contentions = [
        p
        for p in watched.points("lockwatch.lock.contentions")
        if p.attributes["lockwatch.lock.name"] == "counted"
    ]
    assert sum(p.value for p in contentions) == stats["contentions"]


def test_try_and_timeout_outcomes(watched):
    lock = name_lock(threading.Lock(), "outcomes")
    entered, release = threading.Event(), threading.Event()
    holder = hold_until(lock, entered, release)
    try:
        assert lock.acquire(False) is False
        assert lock.acquire(timeout=0.005) is False
    finally:
        release.set()
        holder.join()
    stats = locks_of(RECORDER.snapshot())["outcomes"]
    assert (stats["acquisitions"], stats["skipped"], stats["timeouts"], stats["contentions"]) == (
        1,
        1,
        1,
        1,
    )
    outcomes = {
        p.attributes["lockwatch.outcome"]: p.value
        for p in watched.points("lockwatch.lock.acquisitions")
        if p.attributes["lockwatch.lock.name"] == "outcomes"
    }
    assert outcomes == {"acquired": 1, "skipped": 1, "timed_out": 1}
    waits = [
        p
        for p in watched.points("lockwatch.lock.wait.duration")
        if p.attributes["lockwatch.lock.name"] == "outcomes"
    ]
    assert sum(p.count for p in waits) == 1
    assert waits[0].attributes["lockwatch.outcome"] == "timed_out"


def test_wait_span_is_child_of_task_span(watched):
    """A wait >= 1 ms is a lock.wait span with its true duration, parented to the current span."""
    lock = name_lock(threading.Lock(), "global_config")
    tracer = watched.tracer_provider.get_tracer("app")
    entered, release = threading.Event(), threading.Event()
    holder = hold_until(lock, entered, release)
    waiting = threading.Event()

    def task():
        with tracer.start_as_current_span("task"):
            waiting.set()
            with lock:  # the waiter's site
                pass

    worker = threading.Thread(target=task, name="worker-1")
    worker.start()
    assert waiting.wait(10)
    # Once the worker is blocked on the lock (lockwatch's own waiting count: a fixed pause
    # before the release once ended before the worker reached the lock, on a loaded machine),
    # let it wait well over the 1 ms threshold, then free the lock.
    until(
        lambda: RECORDER.live().get(("global_config", "threading.Lock"), (0, 0))[0] >= 1,
        "the worker never blocked on the lock",
    )
    time.sleep(0.02)  # hold: the holder keeps the lock while the worker waits
    release.set()
    holder.join()
    worker.join()
    (task_span,) = watched.finished("task")
    waits = mutex_waits(watched)  # (the test's own events' waits are hand-off waits)
    assert len(waits) == 1
    (wait,) = waits
    assert wait.parent is not None and wait.parent.span_id == task_span.context.span_id
    assert wait.context.trace_id == task_span.context.trace_id
    assert wait.attributes["lockwatch.lock.name"] == "global_config"
    assert wait.attributes["lockwatch.lock.kind"] == "threading.Lock"
    assert wait.attributes["thread.name"] == "worker-1"
    assert wait.attributes["code.function"] == "task"
    # Both sites, as the emitter names them from the code the lock path queued.
    assert wait.attributes["code.namespace"] == __name__
    assert wait.attributes["code.lineno"] == line_of(task, "with lock:  # the waiter's site")
    assert wait.attributes["lockwatch.holder.code.namespace"] == __name__
    assert wait.attributes["lockwatch.holder.code.function"] == "run"
    assert wait.attributes["lockwatch.holder.code.lineno"] == line_of(hold_until, "with lock:")
    assert wait.end_time - wait.start_time >= 10_000_000
    assert task_span.start_time <= wait.start_time <= wait.end_time <= task_span.end_time


def test_hold_span_over_threshold_only(watched):
    lock = name_lock(threading.Lock(), "held")
    tracer = watched.tracer_provider.get_tracer("app")
    with tracer.start_as_current_span("task") as task:
        with lock:
            time.sleep(0.015)  # hold: over the 10 ms span threshold
        with lock:
            pass  # well under it
    holds = watched.finished("lock.hold")
    assert len(holds) == 1
    assert holds[0].parent.span_id == task.get_span_context().span_id
    assert holds[0].end_time - holds[0].start_time >= 15_000_000


def test_no_entity_key_in_attributes(watched):
    """Section spans carry the index, never the key (an outsider must not choose cardinality)."""
    from otel_lockwatch import StripedSections

    sections = StripedSections(8, name="emitter")
    key = "entity-secret-42"
    idx = sections.index(key)
    entered, release = threading.Event(), threading.Event()

    def holder():
        with sections.lock(key):
            entered.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    assert entered.wait(10)
    waiter = threading.Thread(
        target=lambda: sections.lock(key).__enter__() or sections.release(key)
    )
    waiter.start()
    deadline = time.monotonic() + 10
    while sections.statistics().waiters == 0 and time.monotonic() < deadline:
        time.sleep(0.001)  # ok: polling with a deadline
    time.sleep(0.005)  # hold: keep the waiter blocked past the 1 ms threshold
    release.set()
    t.join()
    waiter.join()
    (wait,) = mutex_waits(watched)
    assert wait.attributes["lockwatch.section.index"] == idx
    assert wait.attributes["lockwatch.section.collision"] is False
    everything = [str(v) for s in watched.finished() for v in s.attributes.values()]
    everything += [
        str(v)
        for p in watched.points("lockwatch.lock.wait.duration")
        for v in p.attributes.values()
    ]
    assert not any(key in v for v in everything)


def test_error_inside_instrumentation_never_reaches_the_host(watched, monkeypatch, caplog):
    def broken(*args, **kwargs):
        raise ZeroDivisionError("lockwatch bug")

    # What files a wait (record._waits), after the lock path counted it.
    monkeypatch.setattr(RECORDER.waits, "queue_record", broken)  # (not yet warned: fresh session)
    before = OUTBOX.errors
    lock = threading.Lock()
    # Queues the standard library's C code provides (a watched event's blocked wait would call
    # the broken hook too, a number of times that depends on the schedule).
    entered: queue.SimpleQueue[int] = queue.SimpleQueue()
    release: queue.SimpleQueue[int] = queue.SimpleQueue()

    def hold() -> None:
        with lock:
            entered.put(1)
            release.get(timeout=10)

    holder = threading.Thread(target=hold, name="holder")
    holder.start()
    entered.get(timeout=10)
    assert lock.acquire(timeout=0.002) is False  # contended: the slow path calls the broken hook
    assert lock.acquire(timeout=0.002) is False
    release.put(1)
    holder.join()
    assert lock.acquire() is True
    lock.release()
    RECORDER.waits.file()
    assert OUTBOX.errors == before + 2
    assert sum("internal error" in r.getMessage() for r in caplog.records) == 1


def test_condition_wait_and_notify(watched):
    """A Condition's lock is watched; wait() releases it and re-acquires it."""
    cond = name_lock(threading.Condition(), "cond")
    ready = []

    def consumer():
        with cond:
            assert cond.wait_for(lambda: ready, timeout=10)

    t = threading.Thread(target=consumer)
    t.start()
    with cond:
        ready.append(1)
        cond.notify_all()
    t.join()
    assert type(cond._lock) is RLockProxy
    stats = locks_of(RECORDER.snapshot())
    assert (
        "cond" in stats
        or any(k.endswith("test_condition_wait_and_notify:" + str(0)) for k in stats)
        or stats
    )


def test_condition_over_plain_lock_does_not_try_acquire(watched):
    lock = name_lock(threading.Lock(), "cond-lock")
    cond = threading.Condition(lock)
    with cond:
        cond.notify()  # calls _is_owned: must not count a skipped try-acquire
    assert locks_of(RECORDER.snapshot())["cond-lock"]["skipped"] == 0


def test_semaphores_counted(watched):
    sem = name_lock(threading.BoundedSemaphore(2), "slots")
    with sem, sem:
        assert sem.acquire(blocking=False) is False
    with pytest.raises(ValueError):
        sem.release()
    stats = locks_of(RECORDER.snapshot())["slots"]
    assert (stats["kind"], stats["acquisitions"], stats["skipped"]) == (
        "threading.BoundedSemaphore",
        2,
        1,
    )


def test_executor_sets_nominal_pool_size(watched):
    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(lambda x: x, range(3)))
    # No task took a watched lock: no worker was alive.
    assert RECORDER.snapshot()["pool"] == {"nominal": 6, "source": "executor", "peak_workers": 0}


def test_asyncio_lock_per_task(watched):
    async def main():
        lock = name_lock(asyncio.Lock(), "alock")
        sem = name_lock(asyncio.Semaphore(1), "asem")
        started = asyncio.Event()

        async def holder():
            async with lock:
                started.set()
                await asyncio.sleep(0.01)  # hold

        async def waiter():
            await started.wait()
            async with lock:
                pass
            async with sem:
                pass

        await asyncio.gather(
            asyncio.create_task(holder(), name="h"), asyncio.create_task(waiter(), name="w")
        )

    asyncio.run(main())
    snap = RECORDER.snapshot()
    alock = snap["locks"]["alock"]
    assert alock["kind"] == "asyncio.Lock"
    assert alock["acquisitions"] == 2
    assert alock["contentions"] == 1
    assert set(alock["workers"]) == {"task:h", "task:w"}
    assert snap["locks"]["asem"]["acquisitions"] == 1


def test_uninstrument_while_locks_are_held():
    """Locks held across uninstrument() release cleanly and keep working."""
    inst = LockwatchInstrumentor()
    inst.instrument(manifest=False)
    lock = threading.Lock()
    entered, release = threading.Event(), threading.Event()
    holder = hold_until(lock, entered, release)
    inst.uninstrument()
    release.set()
    holder.join()
    assert lock.acquire(timeout=1)
    lock.release()


def test_invalid_option_argument_raises_and_env_warns(monkeypatch, caplog):
    with pytest.raises(
        ValueError, match=r"^on_cycle must be one of warn, raise, ignore, got 'loud'$"
    ):
        LockwatchInstrumentor().instrument(on_cycle="loud", manifest=False)
    LockwatchInstrumentor().uninstrument()
    monkeypatch.setenv("OTEL_PYTHON_LOCKWATCH_WAIT_SPAN_THRESHOLD_MS", "soon")
    inst = LockwatchInstrumentor()
    inst.instrument(manifest=False)
    try:
        assert inst.options.wait_span_threshold_ms == 1.0
        assert (
            sum(
                "OTEL_PYTHON_LOCKWATCH_WAIT_SPAN_THRESHOLD_MS" in r.getMessage()
                for r in caplog.records
            )
            == 1
        )
    finally:
        inst.uninstrument()


def test_fork_child_is_consistent(watched, tmp_path):
    """After fork the child's instrumented locks work and its recording holds only its own work,
    in the child's own state, also for a thread that recorded before the fork (the lock path
    knows its state by then)."""
    lock = name_lock(threading.Lock(), "forked")
    for _ in range(3):  # the second and later acquisitions find this thread's state made
        with lock:
            pass
    before = RECORDER.tls.st
    out = tmp_path / "child.txt"
    pid = os.fork()
    if pid == 0:  # child
        try:
            for _ in range(2):
                with lock:
                    pass
            n = RECORDER.snapshot()["locks"]["forked"]["acquisitions"]
            out.write_text(f"{n} {RECORDER.tls.st is before}")
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WEXITSTATUS(status) == 0
    assert out.read_text() == "2 False"
    assert RECORDER.snapshot()["locks"]["forked"]["acquisitions"] == 3


def test_an_ended_threads_state_is_released(watched):
    """A thread that ended keeps nothing alive: once the recorder drops its state (here: reset),
    the state goes (the lock path keeps no reference to an ended thread's state)."""
    import gc
    import weakref

    lock = threading.Lock()
    refs = []

    def work():
        for _ in range(3):
            with lock:
                pass
        refs.append(weakref.ref(RECORDER.tls.st))

    for _ in range(4):
        t = threading.Thread(target=work)
        t.start()
        t.join()
    RECORDER.reset()  # the ended threads' states leave the recorder
    for _ in range(3):  # a thread that starts recording releases what ended threads left
        t = threading.Thread(target=work)
        t.start()
        t.join()
    gc.collect()
    assert [r() for r in refs[:4]] == [None] * 4


def test_current_span_untouched(watched):
    """The instrumentation never changes the current span (its spans are made after the fact)."""
    tracer = watched.tracer_provider.get_tracer("app")
    lock = threading.Lock()
    with tracer.start_as_current_span("task") as span, lock:
        assert trace.get_current_span() is span


def test_stuck_exporter_never_blocks_a_lock_path():
    """An exporter that hangs holds up lockwatch's emitter thread, never a lock's caller."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

    unstick = threading.Event()
    exporting = threading.Event()

    class Stuck(SpanExporter):
        def export(self, spans):
            exporting.set()
            unstick.wait(30)
            return SpanExportResult.SUCCESS

    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Stuck()))
    inst = LockwatchInstrumentor()
    RECORDER.reset()
    # Every contended wait becomes a span (threshold 0): a wait cut short because this thread was
    # descheduled past the timer still makes one.
    inst.instrument(tracer_provider=provider, manifest=False, wait_span_threshold_ms=0)
    try:
        lock = threading.Lock()
        contended = 0
        for _ in range(50):  # until 3 acquisitions had to wait (the timer may fire first)
            entered, release = threading.Event(), threading.Event()
            holder = hold_until(lock, entered, release)
            timer = threading.Timer(0.005, release.set)
            timer.start()
            started = time.monotonic()
            assert lock.acquire(timeout=10)  # waits ~5 ms: a lock.wait span is queued
            lock.release()
            holder.join()
            assert time.monotonic() - started < 5
            contended = locks_of(RECORDER.snapshot())[lock._lockwatch_class.name]["contentions"]
            if contended:
                assert exporting.wait(10)  # the emitter is stuck in export from the first span
            if contended == 3:
                break
        assert contended == 3
        assert not unstick.is_set()
    finally:
        unstick.set()
        inst.uninstrument()
        provider.shutdown()


def test_module_level_and_lookalike_modules_are_watched(watched, tmp_path, monkeypatch):
    """A lock created at import time is watched, and so is one made in a module whose name merely
    starts like an excluded package's (``asyncio_pool``); ``logging``'s is not."""
    import importlib
    import logging

    (tmp_path / "asyncio_pool.py").write_text("import threading\nCONFIG = threading.Lock()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("asyncio_pool")
    try:
        assert type(module.CONFIG) is LockProxy
        assert module.CONFIG._lockwatch_class.name == "asyncio_pool:<module>:2"
    finally:
        sys.modules.pop("asyncio_pool", None)
    handler = logging.StreamHandler()
    assert type(handler.lock) is not RLockProxy


def test_spans_started_under_a_held_lock_are_counted(watched):
    """Blocking work inside a critical section: each span started under a lock counts against it."""
    from otel_lockwatch import HeldLockSpanProcessor

    tracer = watched.tracer_provider.get_tracer("app")
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")
    (processor,) = [
        p
        for p in watched.tracer_provider._active_span_processor._span_processors
        if isinstance(p, HeldLockSpanProcessor)
    ]
    with tracer.start_as_current_span("outside"), a:
        with tracer.start_as_current_span("http.get"):
            pass
        with tracer.start_as_current_span("http.get"):
            pass
        with b:
            assert processor.held_locks() == ["A", "B"]
            with tracer.start_as_current_span("db.query"):
                pass
    assert processor.held_locks() == []
    assert processor.graph is RECORDER.graph
    assert RECORDER.snapshot()["blocking_under_lock"] == {
        "A": {"http.get": 2, "db.query": 1},
        "B": {"db.query": 1},
    }


@pytest.mark.parametrize("factory", ["Lock", "RLock"])
def test_copy_and_pickle_refused_as_for_the_plain_lock(watched, factory):
    import copy
    import pickle

    watched_lock = getattr(threading, factory)()
    plain = {"Lock": ORIGINAL_LOCK, "RLock": ORIGINAL_RLOCK}[factory]()
    for operation in (copy.copy, copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError) as plain_error:
            operation(plain)
        with pytest.raises(TypeError) as watched_error:
            operation(watched_lock)
        assert str(watched_error.value) == str(plain_error.value)


def test_ended_workers_are_folded_so_memory_follows_the_live_ones(watched):
    """A process that starts thread after thread keeps one state per live worker plus one per
    worker name, and loses no count: ended threads' statistics are folded, not dropped."""
    lock = name_lock(threading.Lock(), "churn")

    def work():
        for _ in range(3):
            with lock:
                pass

    for _ in range(600):  # more than the compaction threshold (256)
        t = threading.Thread(target=work, name="short-lived")
        t.start()
        t.join()
    assert len(RECORDER.states) < 300
    snap = RECORDER.snapshot()
    assert snap["locks"]["churn"]["acquisitions"] == 1800
    assert snap["locks"]["churn"]["hold_ns"].count == 1800
    assert snap["locks"]["churn"]["workers"]["short-lived"]["acquisitions"] == 1800
    assert snap["workers"]["short-lived"]["observed_ns"] > 0


def test_worker_names_are_capped(watched, monkeypatch):
    """Past MAX_WORKERS distinct names, later workers are '(other)': bounded cardinality."""
    import otel_lockwatch.record._recorder as recorder_module

    monkeypatch.setattr(
        recorder_module, "MAX_WORKERS", len({s.worker for s in RECORDER.states}) + 3
    )
    lock = threading.Lock()

    def work():
        with lock:
            pass

    for i in range(6):
        t = threading.Thread(target=work, name=f"w{i}")
        t.start()
        t.join()
    workers = RECORDER.snapshot()["workers"]
    assert {"w0", "w1", "w2", "(other)"} <= set(workers)
    assert not {"w3", "w4", "w5"} & set(workers)


def test_foreign_threads_are_not_registered_with_threading(watched):
    """A thread that ``threading`` does not know (started by ``_thread`` or by C) is recorded as a
    worker without registering a ``_DummyThread`` (which would stay in ``threading.enumerate()``,
    for good on 3.10), and its state is folded away once it ends, like an ended Thread's."""
    lock = threading.Lock()
    before = set(threading.enumerate())
    done = threading.Event()
    states = []

    def foreign() -> None:
        with lock:
            pass
        states.append(RECORDER.tls.st)
        done.set()

    _thread.start_new_thread(foreign, ())
    assert done.wait(10)
    # No thread registered since (a count would also see an earlier test's thread end meanwhile).
    assert set(threading.enumerate()) <= before
    (state,) = states
    assert state.worker.startswith("Dummy-")
    assert locks_of(RECORDER.snapshot())[lock._lockwatch_class.name]["acquisitions"] == 1
    deadline = time.monotonic() + 10
    while state.alive() and time.monotonic() < deadline:  # the thread's locals go at its end
        time.sleep(0.01)  # polling with a deadline: ok
    assert not state.alive()


def test_a_snapshot_while_an_ended_worker_is_folded_counts_it_once(watched, monkeypatch):
    """A thread of a name that an ended thread had is folded into that name's retired state (a
    batch of one here: at its end). Regression: the recorder took the ended thread's state out,
    then folded it in, so a snapshot between the two counted its acquisitions nowhere (one after
    the fold that still held the state, twice; the timeline sampled from such totals passed
    them). The fold here stops while it reads the ended thread's statistics: a snapshot then
    counts each of the two threads' acquisitions once."""
    monkeypatch.setattr(_recorder, "FOLD_BATCH", 1)
    lock = name_lock(threading.Lock(), "folded")
    reading, go = threading.Event(), threading.Event()
    folding: list[int] = []  # the thread whose fold stops

    class StopsTheFold(dict):  # its statistics, read by its own thread at its end: the fold
        def items(self):  # type: ignore[override]
            if _thread.get_ident() in folding:
                reading.set()
                go.wait(10)
            return super().items()

    def take() -> None:
        with lock:
            pass

    def take_then_stop_the_fold() -> None:
        take()
        state = RECORDER.thread_state()
        state.stats = StopsTheFold(state.stats)
        folding.append(_thread.get_ident())

    first = threading.Thread(target=take, name="same")
    first.start()
    first.join()  # its state is the name's retired state now
    second = threading.Thread(target=take_then_stop_the_fold, name="same")
    second.start()
    try:
        assert reading.wait(10)
        during = locks_of(RECORDER.snapshot())["folded"]["acquisitions"]
    finally:
        go.set()
        second.join()
    assert during == 2
    assert locks_of(RECORDER.snapshot())["folded"]["acquisitions"] == 2
    assert len([s for s in RECORDER.states if s.worker == "same"]) == 1  # folded all the same


@pytest.mark.parametrize("factory", ["Lock", "RLock"])
def test_proxies_have_the_names_of_the_lock_they_wrap(watched, factory):
    """``hasattr`` answers for a watched lock as for a plain one: an RLock proxy has no
    ``acquire_lock`` (nor ``locked`` before 3.14) just because a Lock proxy has."""
    names = [
        "acquire", "release", "locked", "acquire_lock", "release_lock", "locked_lock",
        "_is_owned", "_recursion_count", "_release_save", "_acquire_restore", "_at_fork_reinit",
    ]  # fmt: skip
    plain = ORIGINAL_LOCK() if factory == "Lock" else ORIGINAL_RLOCK()
    watched_lock = getattr(threading, factory)()
    assert type(watched_lock) in (LockProxy, RLockProxy)
    assert {n: hasattr(watched_lock, n) for n in names} == {n: hasattr(plain, n) for n in names}


def test_an_instrument_after_an_uninstrument_has_its_own_emitter(make_watched):
    """uninstrument() stops the session's emitter; an instrument() right after, while that thread
    may still be alive on its way out, has an emitter of its own, running (a process-wide
    emitter reused the old thread, which then ended, and nothing was emitted again: the
    stuck-exporter test failed that way under load)."""
    first = make_watched()
    old = first.session.emitter
    assert old.running
    first.instrumentor.uninstrument()
    assert not old.running
    second = make_watched()
    assert second.session.emitter is not old
    assert second.session.emitter.running and not old.running


def test_a_lock_type_is_replaced_by_a_type(watched):
    """From Python 3.13 ``threading.Lock`` is the lock's type: its replacement is a class, so
    that ``threading.Lock | None`` is a union and ``isinstance`` holds for plain locks and
    proxies alike, while calling it still makes a watched lock (named where it was called).
    Before 3.13 a stand-in type whose call makes a plain lock plays ``_thread.lock``."""
    import _thread
    import types

    from otel_lockwatch.capture import _threading

    if sys.version_info >= (3, 13):
        original: type = _thread.LockType
    else:

        class original:  # type: ignore[no-redef]
            def __new__(cls) -> object:
                return _thread.allocate_lock()

    Lock = _threading.proxy_factory(original, "threading.Lock", _threading.LockProxy)
    assert isinstance(Lock, type) and Lock.__name__ == "Lock" and Lock.__wrapped__ is original
    assert isinstance(Lock | None, types.UnionType)
    line = sys._getframe().f_lineno + 1
    lock = Lock()
    assert type(lock) is _threading.LockProxy
    assert lock._lockwatch_class.name.endswith(f":test_a_lock_type_is_replaced_by_a_type:{line}")
    assert isinstance(lock, Lock) and issubclass(_threading.LockProxy, Lock)
    assert not isinstance(object(), Lock)
    if sys.version_info >= (3, 13):
        assert isinstance(_thread.allocate_lock(), Lock)
    with lock:
        assert lock.locked()
    with pytest.raises(TypeError, match="is not an acceptable base type"):

        class Mine(Lock):  # type: ignore[misc, valid-type]
            pass
