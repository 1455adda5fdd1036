"""The emitter: what it makes of the outbox's records, and how it shares the interpreter."""

from __future__ import annotations

import collections
import sys
import sysconfig
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from otel_lockwatch import name_lock
from otel_lockwatch._session import OUTBOX, RECORDER
from otel_lockwatch.capture._naming import site_of
from otel_lockwatch.record._sites import code_attributes, code_site
from otel_lockwatch.telemetry._emitter import Telemetry, site_attributes


def test_drain_yields_the_interpreter_once_a_slice(monkeypatch):
    """The emitter thread lets the interpreter lock go for a pause once a slice of records is
    spent (a holder waiting for it waits a slice at most), not after each record (a record made
    right after other threads ran costs about twice the CPU); it does not pause with a backlog
    (it catches up), nor at all when a flush drains."""
    clock = [0]
    emitted: list[int] = []
    yields: list[tuple[int, float]] = []

    class Counted(Telemetry):  # a session's emitter, not enabled: its drain alone
        SLICE_NS = 100_000
        SLICE_PAUSE_S = 50e-6
        BACKLOG = 6

        def emit(self, *record):  # each record takes 40 us of the clock
            clock[0] += 40_000
            emitted.append(record[0])

    telemetry = Counted(clock=lambda: clock[0], pause=lambda s: yields.append((len(emitted), s)))
    monkeypatch.setattr(OUTBOX, "queue", collections.deque((i,) for i in range(12)))
    telemetry.drain(yielding=True)
    assert emitted == list(range(12))  # every record, in order
    # past 100 us: after the third record of each slice; a pause once fewer than 6 are queued
    assert yields == [(3, 0.0), (6, 0.0), (9, 50e-6), (12, 50e-6)]

    OUTBOX.queue.extend((i,) for i in range(12))
    del emitted[:], yields[:]
    telemetry.drain()  # a flush: on the caller's thread, which wants it done
    assert emitted == list(range(12)) and yields == []


def test_a_flush_returns_after_the_record_the_emitter_thread_is_emitting(monkeypatch):
    """A flush on another thread than the emitter's returns only once every record queued before
    it is emitted, the one the emitter thread has taken and is emitting included (what a test's
    read of the metrics, or the exit's export, relies on)."""
    entered, release, flushed = threading.Event(), threading.Event(), threading.Event()
    emitted: list[int] = []

    class Blocking(Telemetry):  # a session's emitter, not enabled: its drain alone
        def emit(self, *record):
            if threading.current_thread().name == "emitter":
                entered.set()
                release.wait(30)
            emitted.append(record[0])

    telemetry = Blocking()
    monkeypatch.setattr(OUTBOX, "queue", collections.deque([(1,)]))
    emitter = threading.Thread(target=telemetry.drain, args=(True,), name="emitter")
    emitter.start()
    assert entered.wait(30)  # the emitter thread has taken the record, and is emitting it
    flusher = threading.Thread(target=lambda: (telemetry.drain(), flushed.set()))
    flusher.start()
    try:
        assert not flushed.wait(0.2), "the flush returned before the record was emitted"
    finally:
        release.set()
        emitter.join(30)
        flusher.join(30)
    assert flushed.is_set() and emitted == [1]


def test_site_attributes_name_the_sites_as_the_lock_path_did():
    """The lock path queues code, not text; the emitter's attributes are those the lock path
    made before: the waiter's frame as ``site_of`` names it, the holder's acquisition as
    ``code_site`` does, a text as it is."""
    frame = sys._getframe()
    # (on one line: the frame's line is where it is now)
    waiter, text = (frame.f_globals["__name__"], frame.f_code, frame.f_lasti), site_of(frame)
    assert site_attributes(waiter) == code_attributes(text)
    assert (
        site_attributes(waiter)["code.function"]
        == "test_site_attributes_name_the_sites_as_the_lock_path_did"
    )
    holder = (frame.f_code, frame.f_lasti)
    assert site_attributes(holder, "lockwatch.holder.") == code_attributes(
        code_site(*holder), "lockwatch.holder."
    )
    assert site_attributes("app.pool:checkout:12") == {
        "code.namespace": "app.pool",
        "code.function": "checkout",
        "code.lineno": 12,
    }


def test_every_contended_wait_and_hold_is_emitted(watched):
    """Under contention (8 workers on one lock, each hold over the metric floor) the emitter
    makes a histogram value of every wait that blocked and every hold at or above the floor, and a
    span of every wait of 1 ms or more: counted against the recorder's own counts."""
    lock = name_lock(threading.Lock(), "emitted")
    start = threading.Barrier(8)
    dropped = OUTBOX.dropped

    def task(i):
        if i < 8:
            start.wait()  # all eight contend from the first task on
        with lock:
            time.sleep(0.0005)  # hold: over the 0.1 ms metric floor

    with ThreadPoolExecutor(max_workers=8) as executor:
        list(executor.map(task, range(200)))
    data = RECORDER.snapshot()["locks"]["emitted"]
    assert data["contentions"] > 0

    def point(metric):
        (p,) = [
            p for p in watched.points(metric) if p.attributes["lockwatch.lock.name"] == "emitted"
        ]
        return p

    waited = point("lockwatch.lock.wait.duration")
    assert waited.count == data["contentions"]
    assert point("lockwatch.lock.hold.duration").count == data["acquisitions"] == 200
    # A span of every wait of 1 ms or more: the waits the histogram has past its 1 ms bound.
    over_1ms = sum(waited.bucket_counts[list(waited.explicit_bounds).index(1e-3) + 1 :])
    waits = [
        s for s in watched.finished("lock.wait") if s.attributes["lockwatch.lock.name"] == "emitted"
    ]
    assert len(waits) == over_1ms > 0
    assert all(s.attributes["code.function"] == "task" for s in waits)
    holders = [s.attributes.get("lockwatch.holder.code.function") for s in waits]
    assert set(holders) <= {"task", None}
    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        assert None not in holders
    else:  # threads run at once: the holder at a waiter's failed try may have released, and the
        # next one not yet published its hold, when the waiter looks (1 to 5 in 75 to 200 here)
        assert holders.count("task") >= 0.9 * len(holders), holders
    assert OUTBOX.dropped == dropped
