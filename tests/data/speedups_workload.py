"""Every entry point of the lock path (and of the hand-off paths: semaphores, queues, a condition's
notify), once; prints what the recorder kept, as JSON.

Run by tests/test_speedups.py on the C path and on the pure-Python path
(LOCKWATCH_DISABLE_EXTENSIONS=1); the two outputs must be equal. Single-threaded except for the
try-acquires of a held lock, so that the counts are deterministic.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.trace import TracerProvider

from otel_lockwatch import (
    AsyncStripedSections,
    LockwatchInstrumentor,
    StripedSections,
    _session,
    name_lock,
)
from otel_lockwatch._session import OUTBOX, RECORDER
from otel_lockwatch.capture import _fast_path

raised: list[str] = []


def expect_error(fn, *args, **kwargs):
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the type and message are what is compared
        raised.append(f"{type(exc).__name__}: {exc}")
    else:
        raised.append("no error")


def in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()), name="other")
    t.start()
    t.join()
    return out[0]


def main() -> None:
    instrumentor = LockwatchInstrumentor()
    instrumentor.instrument(
        tracer_provider=TracerProvider(), meter_provider=MeterProvider(), manifest=False
    )
    a = name_lock(threading.Lock(), "a")
    b = name_lock(threading.Lock(), "b")
    r = name_lock(threading.RLock(), "r")
    cond = threading.Condition()
    sections = name_lock(StripedSections(16, name="sections"), "sections")

    for _ in range(50):
        with a:
            pass
    assert a.acquire() and not a.acquire(False)
    a.release()
    assert a.acquire(True) and in_thread(lambda: a.acquire(blocking=False)) is False
    a.release()
    assert a.acquire(blocking=True, timeout=-1)
    a.release()
    assert a.acquire(timeout=-1.0)
    a.release()
    assert a.acquire(True, 0.5)  # a timeout: the Python path on both
    a.release()
    assert a.acquire(timeout=0) and not a.acquire(timeout=0.001)  # times out
    a.release()
    assert a.acquire_lock()
    a.release_lock()
    assert a.acquire(0)
    a.release()
    expect_error(a.acquire, 1, 2, 3)
    expect_error(a.acquire, bogus=1)
    expect_error(a.acquire, True, timeout="soon")
    expect_error(a.acquire, False, 1)
    expect_error(a.release)  # not held
    expect_error(a.__exit__, None, None)

    with a:  # noqa: SIM117 - nested on two lines: the edge a -> b, with two sites
        with b:
            pass
    with b:
        pass
    with r:  # noqa: SIM117 - re-entry, then a nested acquisition, each on its line
        with r:
            with a:
                pass
    with cond:
        cond.wait(0)
        cond.notify_all()
    assert r.acquire() and r.acquire(blocking=False) and r.acquire(timeout=0.1)
    in_thread(lambda: expect_error(r.release))  # not the owner
    assert in_thread(lambda: r.acquire(False)) is False
    nested = threading.Condition(r)
    nested.wait(0)  # depth 3 released and restored
    for _ in range(3):
        r.release()
    expect_error(r.release)  # not held
    expect_error(r.__exit__)

    for i in range(30):
        with sections.lock(f"k{i % 5}"):
            pass
    with sections.try_lock("k1") as held:
        assert held
        assert in_thread(lambda: sections.acquire("k1", blocking=False)) is False
    with sections.lock_many(["k1", "k2", "k3"]):  # noqa: SIM117 - two sites
        with b:  # sections -> b
            pass
    assert sections.acquire("k7", timeout=0.25)
    sections.release("k7")
    with sections.lock("k8"):
        expect_error(sections.acquire, "k8")  # re-entry
    expect_error(sections.release, "k9")  # not held

    # The hand-off paths: a semaphore's checkouts and checkins, a queue's, a condition's notify.
    sem = name_lock(threading.BoundedSemaphore(2), "sem")
    for _ in range(20):
        with sem:
            pass
    assert sem.acquire() and sem.acquire(blocking=False) and not sem.acquire(False)
    assert not sem.acquire(timeout=0.001)  # no permit: the Python path on both, times out
    assert in_thread(lambda: sem.acquire(blocking=False)) is False
    sem.release()
    sem.release()
    expect_error(sem.release)  # released too often: no checkin
    expect_error(sem.release, 1, 2)
    assert sem.acquire(True, None)
    sem.release(1)
    plain = name_lock(threading.Semaphore(0), "plain")
    plain.release(3)
    assert plain.acquire() and plain.acquire(blocking=True)
    jobs: queue.Queue[int] = name_lock(queue.Queue(), "jobs")
    for i in range(5):
        jobs.put(i)
    while not jobs.empty():
        jobs.get()
    notified = threading.Condition(name_lock(threading.Lock(), "notified.lock"))
    name_lock(notified, "notified")
    expect_error(notified.notify)  # not held: notified nothing
    with notified:
        notified.notify()
        notified.notify(2)
        notified.notify_all()
    expect_error(notified.notify, 1, 2)
    with notified:
        notified.notify(0)
        expect_error(notified.notify, -1)  # an odd n: the C path leaves it to the original
        expect_error(notified.notify, "one")

    class Counting(threading.Condition):
        calls = 0

        def notify(self, n=1):
            Counting.calls += 1
            super().notify(n)

    overridden = name_lock(Counting(), "overridden")
    with overridden:
        overridden.notify()  # the subclass's notify runs (the C path never skips it)
    raised.append(f"Counting.notify ran {Counting.calls} time(s)")

    async def tasks():
        asections = AsyncStripedSections(8, name="async")
        for _ in range(10):
            async with asections.lock("x"):
                pass

    asyncio.run(tasks())

    _session.current().emitter.flush()
    snapshot = RECORDER.snapshot()
    locks = {
        name: {
            "acquisitions": lock["acquisitions"],
            "contentions": lock["contentions"],
            "skipped": lock["skipped"],
            "timeouts": lock["timeouts"],
            "holds": lock["hold_ns"].count,
        }
        for name, lock in sorted(snapshot["locks"].items())
    }
    handoffs = {
        name: {
            "signal_waits": {
                k: v for k, v in lock["signal_waits"].items() if k not in ("wait_ns", "workers")
            }
            | {"workers": {w: t["signals"] for w, t in lock["signal_waits"]["workers"].items()}},
            "pool": {k: v for k, v in lock.get("pool", {}).items() if k != "hold_ns"}
            | {"holds": lock["pool"]["hold_ns"].count if "pool" in lock else None},
        }
        for name, lock in sorted(snapshot["locks"].items())
        if "signal_waits" in lock or "pool" in lock
    }
    edges = sorted(
        (w.holding, w.acquiring, w.worker, list(w.sites)) for w in RECORDER.graph.edges()
    )
    held = [e.lock_class.name for st in RECORDER.states for e in st.held]
    print(
        json.dumps(
            {
                "speedups": _fast_path.SPEEDUPS,
                "locks": locks,
                "handoffs": handoffs,
                "handoff_paths": [
                    type(threading.Semaphore.acquire).__name__,
                    type(threading.BoundedSemaphore.release).__name__,
                    type(notified.notify).__name__,
                ],
                "edges": edges,
                "raised": raised,
                "held": held,
                "errors": OUTBOX.errors,
            },
            sort_keys=True,
        )
    )
    instrumentor.uninstrument()


if __name__ == "__main__":
    main()
