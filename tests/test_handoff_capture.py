"""The capture side of hand-off waits: conditions, queues and semaphores record what the
evaluation reads (``signal_waits``, ``pool``, ``role``, ``peak_workers``), and behave as before."""

from __future__ import annotations

import asyncio
import http.cookiejar
import linecache
import os
import queue
import subprocess
import sys
import threading
import time

import pytest
from polling import until

from otel_lockwatch import LockwatchInstrumentor, name_lock
from otel_lockwatch._session import RECORDER

ORIGINALS = {
    "queue.Queue.__init__": queue.Queue.__init__,
    "threading.Condition.wait": threading.Condition.wait,
    "threading.Condition.notify": threading.Condition.notify,
    "asyncio.Condition.__init__": asyncio.Condition.__init__,
    "asyncio.Semaphore.release": asyncio.Semaphore.release,
    "asyncio.BoundedSemaphore.__init__": asyncio.BoundedSemaphore.__init__,
}


def _current() -> dict[str, object]:
    return {
        "queue.Queue.__init__": queue.Queue.__init__,
        "threading.Condition.wait": threading.Condition.wait,
        "threading.Condition.notify": threading.Condition.notify,
        "asyncio.Condition.__init__": asyncio.Condition.__init__,
        "asyncio.Semaphore.release": asyncio.Semaphore.release,
        "asyncio.BoundedSemaphore.__init__": asyncio.BoundedSemaphore.__init__,
    }


def _locks() -> dict:
    return RECORDER.snapshot()["locks"]


def _thread(target, name: str) -> threading.Thread:
    t = threading.Thread(target=target, name=name)
    t.start()
    return t


def test_instrument_uninstrument():
    """The queue, condition and semaphore targets are patched, and restored exactly."""
    inst = LockwatchInstrumentor()
    inst.instrument(manifest=False)
    try:
        patched = _current()
        assert patched["queue.Queue.__init__"] is not ORIGINALS["queue.Queue.__init__"]
        assert patched["asyncio.Semaphore.release"] is not ORIGINALS["asyncio.Semaphore.release"]
        # Conditions and queues are watched one by one (at creation): their methods are left
        # alone on the class.
        assert patched["threading.Condition.wait"] is ORIGINALS["threading.Condition.wait"]
    finally:
        inst.uninstrument()
    assert _current() == ORIGINALS


# -- conditions ------------------------------------------------------------------------------
def _reacquiring(thread: threading.Thread) -> bool:
    """Whether ``thread`` runs ``Condition.wait``'s re-acquire of the lock (its wait is over)."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None and not (
        frame.f_code.co_name == "wait" and frame.f_code.co_filename == threading.__file__
    ):
        frame = frame.f_back
    return frame is not None and "_acquire_restore(" in linecache.getline(
        frame.f_code.co_filename, frame.f_lineno
    )


def test_condition_wait_ends_at_the_wake_up_not_the_reacquire(watched):
    """The hand-off wait runs to the notify; the re-acquire behind the notifier's long hold is a
    mutex wait of the same class, counted once.

    The notifier holds the condition 200 ms after the waiter has woken: once lockwatch counts it
    blocked on the re-acquire. The hand-off wait ends at that wake-up, however long the waiter
    took to run after the notify on a loaded machine (it once took 330 ms there, beside the
    200 ms hold that a fixed bound assumed it would not reach)."""
    cond = name_lock(threading.Condition(), "cond")
    ready: list[int] = []

    def waiter():
        with cond:
            assert cond.wait_for(lambda: ready, timeout=10)

    before_ns = time.perf_counter_ns()  # the waiter's wait begins after this
    t = _thread(waiter, "waiter")
    until(lambda: cond._waiters)
    with cond:
        ready.append(1)
        cond.notify()
        # (The live gauge counts the waiter as waiting on the class in its hand-off wait as on
        # the re-acquire: its frame tells them apart.)
        until(lambda: _reacquiring(t), "the waiter never reached the re-acquire")
        woken_by_ns = time.perf_counter_ns()  # woken, and at the re-acquire, by now
        time.sleep(0.2)  # hold: the woken waiter re-acquires behind it
    t.join()
    lock = _locks()["cond"]
    waits = lock["signal_waits"]
    assert (waits["count"], waits["timeouts"]) == (1, 0)
    assert waits["workers"]["waiter"]["waits"] == 1
    # Ended at the wake-up, before the waiter blocked on the re-acquire: not 200 ms later.
    assert waits["workers"]["waiter"]["wait_ns"] <= woken_by_ns - before_ns
    assert waits["workers"]["MainThread"] == {"waits": 0, "wait_ns": 0, "signals": 1}
    assert lock["workers"]["waiter"]["wait_ns"] >= 150_000_000  # the re-acquire: a mutex wait
    assert "pool" not in lock  # a bare condition knows no capacity


def test_condition_timeouts_and_notify_all_counted(watched):
    cond = name_lock(threading.Condition(), "cond")
    with cond:
        assert cond.wait_for(lambda: False, timeout=0.005) is False
        assert cond.wait(0.001) is False
        cond.notify_all()  # one give, though notify_all calls notify
        cond.notify(3)
    waits = _locks()["cond"]["signal_waits"]
    assert waits["timeouts"] == waits["count"] >= 2
    assert waits["workers"]["MainThread"]["signals"] == 2


def test_condition_wait_unheld_raises_and_records_nothing(watched):
    cond = name_lock(threading.Condition(), "cond")
    with pytest.raises(RuntimeError, match=r"^cannot wait on un-acquired lock$"):
        cond.wait(0.01)
    assert "signal_waits" not in _locks().get("cond", {})


def test_condition_over_a_given_lock_is_a_class_of_its_own(watched):
    """``Condition(lock)``: the condition's hand-off waits are its class's, the lock's mutex
    waits the lock's; naming the condition renames it (and not the lock)."""
    lock = name_lock(threading.Lock(), "mutex")
    cond = name_lock(threading.Condition(lock), "not_empty")
    with cond:
        cond.wait(0.001)
    locks = _locks()
    assert locks["not_empty"]["kind"] == "threading.Condition"
    assert locks["not_empty"]["signal_waits"]["count"] == 1
    assert locks["mutex"]["acquisitions"] == 2 and "signal_waits" not in locks["mutex"]


def test_naming_a_condition_renames_its_own_lock(watched):
    cond = name_lock(threading.Condition(), "slots")
    with cond:
        cond.notify()
    locks = _locks()
    assert set(locks) == {"slots"}
    assert locks["slots"]["acquisitions"] == 1
    assert locks["slots"]["signal_waits"]["workers"]["MainThread"]["signals"] == 1


def test_unwatched_conditions_and_queues_are_untouched():
    """An Event's condition, a queue's, those created before instrument(): no hook at all; a
    watched queue's conditions only time its waits (they are no classes of their own)."""
    before: queue.Queue[int] = queue.Queue()
    inst = LockwatchInstrumentor()
    inst.instrument(manifest=False)
    try:
        event = threading.Event()
        q: queue.Queue[int] = queue.Queue()
        for cond in (event._cond, before.not_empty):
            assert not {"wait", "notify", "_lockwatch_class"} & set(vars(cond))
        assert not {"_get", "_put", "_lockwatch_class"} & set(vars(before))
        for cond in (q.not_empty, q.not_full):
            assert not {"notify", "_lockwatch_class"} & set(vars(cond))
        assert {"_get", "_put", "_lockwatch_class"} <= set(vars(q))
        assert {"wait", "notify", "_lockwatch_class"} <= set(vars(threading.Condition()))
    finally:
        inst.uninstrument()
        RECORDER.reset()


def test_asyncio_condition(watched):
    async def main():
        cond = name_lock(asyncio.Condition(), "acond")
        ready: list[int] = []

        async def waiter():
            async with cond:
                await cond.wait_for(lambda: ready)

        task = asyncio.create_task(waiter(), name="w")
        while not cond._waiters:
            await asyncio.sleep(0)
        async with cond:
            ready.append(1)
            cond.notify_all()
        await task

    asyncio.run(main())
    lock = _locks()["acond"]
    assert lock["kind"] == "asyncio.Condition"
    workers = lock["signal_waits"]["workers"]
    assert workers["task:w"]["waits"] >= 1 and workers["task:w"]["signals"] == 0
    assert sum(w["signals"] for w in workers.values()) == 1


# -- queues ----------------------------------------------------------------------------------
def test_a_queue_is_one_class_named_where_it_was_created(watched):
    q: queue.LifoQueue[int] = queue.LifoQueue()
    line = sys._getframe().f_lineno - 1
    q.put(1)
    assert q.get() == 1
    assert type(q.mutex) is not type(threading.Lock())  # its mutex: not watched
    locks = _locks()
    name = f"test_handoff_capture:test_a_queue_is_one_class_named_where_it_was_created:{line}"
    assert set(locks) == {name}
    assert locks[name]["kind"] == "queue.LifoQueue"
    assert locks[name].get("role") is None  # built by the test itself


def test_two_queues_at_two_sites_are_two_classes(watched):
    first: queue.Queue[int] = queue.Queue()
    second: queue.PriorityQueue[int] = queue.PriorityQueue()
    for q in (first, second):
        q.put(1)
        q.get()
    kinds = sorted(lock["kind"] for lock in _locks().values())
    assert kinds == ["queue.PriorityQueue", "queue.Queue"]


def test_get_waits_are_idle_for_a_consumer_and_put_is_the_give(watched):
    """A consumer that waits on an empty queue and never puts: its waits are hand-off waits with
    no gives (idle); the producer's puts are its gives."""
    jobs: queue.Queue[int] = name_lock(queue.Queue(), "jobs")
    got: list[int] = []
    consumer = _thread(lambda: got.append(jobs.get()), "consumer")
    until(lambda: jobs.not_empty._waiters)
    jobs.put(7)
    consumer.join()
    lock = _locks()["jobs"]
    waits = lock["signal_waits"]
    assert got == [7] and waits["count"] == 1
    assert waits["workers"]["consumer"]["waits"] == 1
    assert waits["workers"]["consumer"]["signals"] == 0
    assert waits["workers"]["MainThread"] == {"waits": 0, "wait_ns": 0, "signals": 1}
    assert lock["pool"]["checkouts"] == 1


def test_a_put_wait_on_a_full_queue_is_ended_by_gets(watched):
    """A producer blocked by a bounded queue and never taking from it waits idle; a worker
    that waited to put and also gets gives by its gets."""
    q: queue.Queue[int] = name_lock(queue.Queue(maxsize=1), "bounded")
    q.put(0)
    producer = _thread(lambda: q.put(1), "producer")
    until(lambda: q.not_full._waiters)
    assert q.get() == 0
    producer.join()
    workers = _locks()["bounded"]["signal_waits"]["workers"]
    assert workers["producer"]["waits"] == 1 and workers["producer"]["signals"] == 0
    assert workers["MainThread"]["waits"] == 0


def test_queue_timeouts_counted(watched):
    q: queue.Queue[int] = name_lock(queue.Queue(maxsize=1), "q")
    with pytest.raises(queue.Empty):
        q.get(timeout=0.001)
    q.put(1)
    with pytest.raises(queue.Full):
        q.put(2, timeout=0.001)
    waits = _locks()["q"]["signal_waits"]
    assert (waits["count"], waits["timeouts"]) == (2, 2)


def test_queue_pool_fields(watched):
    """A LifoQueue of 2 connections, both checked out at once: capacity 2, 2 in use at the
    peak, 2 checkouts each held until its checkin."""
    pool: queue.LifoQueue[int] = name_lock(queue.LifoQueue(), "pool")
    for conn in (0, 1):
        pool.put(conn)
    a, b = pool.get(), pool.get()
    time.sleep(0.002)  # hold
    pool.put(b)
    pool.put(a)
    entry = _locks()["pool"]["pool"]
    assert (entry["capacity"], entry["in_use_peak"], entry["checkouts"]) == (2, 2, 2)
    assert entry["hold_ns"].count == 2 and entry["hold_ns"].min >= 2_000_000


def test_queue_semantics_kept(watched):
    q: queue.Queue[int] = queue.Queue(maxsize=1)
    with pytest.raises(queue.Empty):
        q.get(block=False)
    with pytest.raises(queue.Empty):
        q.get_nowait()
    q.put(1)
    with pytest.raises(ValueError, match=r"^'timeout' must be a non-negative number$"):
        q.get(timeout=-1)  # refused even though an item is there, as the queue does
    with pytest.raises(queue.Full):
        q.put_nowait(2)
    assert q.get(timeout=1) == 1
    (lock,) = _locks().values()
    assert lock["signal_waits"]["count"] == 0  # nothing waited
    simple: queue.SimpleQueue[int] = queue.SimpleQueue()  # C: not patched, not watched
    simple.put(1)
    assert simple.get() == 1


def test_a_queue_subclass_overriding_get(watched):
    class Counting(queue.Queue):
        calls = 0

        def get(self, block=True, timeout=None):
            Counting.calls += 1
            return super().get(block, timeout)

    q = name_lock(Counting(), "counting")
    waiter = _thread(q.get, "waiter")
    until(lambda: q.not_empty._waiters)
    q.put(1)
    waiter.join()
    assert Counting.calls == 1  # the subclass's code ran once
    assert _locks()["counting"]["signal_waits"]["workers"]["waiter"]["waits"] == 1


# -- semaphores ------------------------------------------------------------------------------
def test_a_semaphore_wait_is_a_handoff_wait_and_its_permits_a_pool(watched):
    sem = name_lock(threading.BoundedSemaphore(1), "slots")
    sem.acquire()
    t = _thread(lambda: (sem.acquire(), sem.release()), "second")
    until(lambda: sem._cond._waiters)
    time.sleep(0.002)  # hold
    sem.release()
    t.join()
    with pytest.raises(ValueError):
        sem.release()
    lock = _locks()["slots"]
    assert (lock["acquisitions"], lock["contentions"], lock["wait_ns"].sum) == (2, 0, 0)
    waits = lock["signal_waits"]
    assert waits["count"] == 1 and waits["workers"]["second"]["signals"] == 1
    pool = lock["pool"]
    assert (pool["capacity"], pool["in_use_peak"], pool["checkouts"]) == (1, 1, 2)
    assert pool["hold_ns"].count == 2


def test_a_semaphore_timeout_is_counted(watched):
    sem = name_lock(threading.Semaphore(0), "empty")
    assert sem.acquire(timeout=0.001) is False
    lock = _locks()["empty"]
    assert lock["signal_waits"]["timeouts"] == 1
    assert lock["pool"]["capacity"] == 0 and lock["pool"]["checkouts"] == 0


def test_asyncio_semaphores(watched):
    async def main():
        sem = name_lock(asyncio.BoundedSemaphore(1), "asem")

        async def user():
            async with sem:
                await asyncio.sleep(0.002)  # hold

        await asyncio.gather(*(asyncio.create_task(user(), name=f"u{i}") for i in range(3)))

    asyncio.run(main())
    lock = _locks()["asem"]
    assert lock["kind"] == "asyncio.BoundedSemaphore"
    assert lock["acquisitions"] == 3 and lock["contentions"] == 0
    assert lock["signal_waits"]["count"] == 2
    assert all(w["signals"] == 1 for w in lock["signal_waits"]["workers"].values())
    assert (lock["pool"]["capacity"], lock["pool"]["checkouts"]) == (1, 3)


# -- live gauges ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["queue", "semaphore", "condition"])
def test_workers_blocked_on_a_pool_are_waiting_in_the_live_gauges(watched, kind):
    """Three threads blocked on an empty pool count as waiting on its class while they block,
    and no longer once they got a slot."""
    if kind == "queue":
        pool: queue.Queue[int] = name_lock(queue.Queue(), "pool")
        take, give = pool.get, (lambda: pool.put(1))
    elif kind == "semaphore":
        sem = name_lock(threading.Semaphore(0), "pool")
        take, give = sem.acquire, sem.release
    else:
        cond = name_lock(threading.Condition(), "pool")
        slots: list[int] = []

        def take():
            with cond:
                cond.wait_for(lambda: slots)
                slots.pop()

        def give():
            with cond:
                slots.append(1)
                cond.notify()

    threads = [_thread(take, f"taker-{i}") for i in range(3)]
    until(lambda: RECORDER.live().get(("pool", _locks_kind(kind)), (0, 0))[0] == 3)
    for _ in threads:
        give()
    for t in threads:
        t.join()
    assert RECORDER.live()[("pool", _locks_kind(kind))][0] == 0


def _locks_kind(kind: str) -> str:
    return {
        "queue": "queue.Queue",
        "semaphore": "threading.Semaphore",
        "condition": "threading.Condition",
    }[kind]


# -- spans -----------------------------------------------------------------------------------
def test_a_long_handoff_wait_is_a_lock_wait_span_under_the_task(watched):
    tracer = watched.tracer_provider.get_tracer("t")
    q: queue.Queue[int] = name_lock(queue.Queue(), "jobs")

    def consumer():
        with tracer.start_as_current_span("consume"):
            q.get()

    t = _thread(consumer, "consumer")
    until(lambda: q.not_empty._waiters)
    time.sleep(0.005)  # the wait lasts past the 1 ms span threshold
    q.put(1)
    t.join()
    (span,) = watched.finished("lock.wait")
    (parent,) = watched.finished("consume")
    assert span.attributes["lockwatch.wait.kind"] == "signal"
    assert span.attributes["lockwatch.lock.name"] == "jobs"
    assert span.parent.span_id == parent.context.span_id


# -- names -----------------------------------------------------------------------------------
def test_a_lock_the_stdlib_makes_is_named_by_the_user_frame_with_its_role(watched):
    jar = http.cookiejar.CookieJar()  # its __init__ creates the lock
    line = sys._getframe().f_lineno - 1
    jar.clear_expired_cookies()
    name = f"test_handoff_capture:test_a_lock_the_stdlib_makes_is_named_by_the_user_frame_with_its_role:{line}"  # noqa: E501
    lock = _locks()[name]
    # Before 3.11 a code object has no qualified name: the role is module.function.
    qualified = sys.version_info >= (3, 11)
    assert lock["role"] == f"http.cookiejar.{'CookieJar.' if qualified else ''}__init__"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="columns need co_positions (3.11+)")
def test_two_locks_on_one_line_are_two_classes(watched):
    a, b = threading.Lock(), threading.Lock()
    line = sys._getframe().f_lineno - 1
    c = threading.Lock()
    for _ in range(2):  # one line, one column: one class
        d = threading.Lock()
    for lock in (a, b, c, d):
        with lock:
            pass
    site = "test_handoff_capture:test_two_locks_on_one_line_are_two_classes"
    names = sorted(_locks())
    column = names[1].rsplit(":col", 1)[1]
    assert names == [
        f"{site}:{line}",
        f"{site}:{line}:col{column}",
        f"{site}:{line + 2}",
        f"{site}:{line + 4}",
    ]
    assert int(column) > 0


# -- workers ---------------------------------------------------------------------------------
def test_peak_workers_counts_tasks_alive_at_once(watched):
    """Five tasks alive together, then three one after the other: the peak is six (the five
    and the main task, a worker from the moment it sets the events they wait on)."""

    async def main():
        lock = asyncio.Lock()
        gate = asyncio.Event()
        all_in = asyncio.Event()
        entered = []

        async def worker(wait: bool):
            async with lock:
                pass
            entered.append(1)
            if len(entered) == 5:
                all_in.set()
            if wait:
                await gate.wait()

        tasks = [asyncio.create_task(worker(True)) for _ in range(5)]
        await all_in.wait()  # all five took the lock and are alive
        gate.set()
        await asyncio.gather(*tasks)
        for _ in range(3):  # three more, one after the other
            await asyncio.create_task(worker(False))

    asyncio.run(main())
    assert RECORDER.snapshot()["pool"]["peak_workers"] == 6


def test_peak_workers_counts_threads_alive_at_once(watched):
    """Three threads that meet at a barrier, then ten one after the other: the peak is three."""
    lock = threading.Lock()
    barrier = threading.Barrier(3)

    def work(meet: bool):
        with lock:
            pass
        if meet:
            barrier.wait()

    threads = [_thread(lambda: work(True), f"t{i}") for i in range(3)]
    for t in threads:
        t.join()
    for i in range(10):
        _thread(lambda: work(False), f"later{i}").join()
    assert RECORDER.snapshot()["pool"]["peak_workers"] == 3


def test_reset_forgets_handoff_waits(watched):
    q: queue.Queue[int] = queue.Queue()
    q.put(1)
    q.get()
    assert _locks()
    RECORDER.reset()
    assert _locks() == {}
    assert RECORDER.snapshot()["pool"]["peak_workers"] == 0


_NO_DICT_SCRIPT = """
import gc, queue, threading
from otel_lockwatch import LockwatchInstrumentor
from otel_lockwatch._session import RECORDER
LockwatchInstrumentor().instrument(manifest=False)
cond, sem, q = threading.Condition(), threading.BoundedSemaphore(2), queue.Queue()
with cond:
    cond.notify()
    cond.wait(0)
with sem:
    pass
assert sem.acquire(timeout=0.001) and sem.acquire(blocking=False)
assert not sem.acquire(timeout=0.001)  # a wait: the Python wrapper
sem.release(2)
q.put(1)
q.get()
try:
    q.get(timeout=0.001)
except queue.Empty:
    pass
assert "signal_waits" in RECORDER.snapshot()["locks"][cond._lockwatch_class.name]
print([type(o).__name__ for o in (cond, sem, q)
       if any(isinstance(r, dict) for r in gc.get_referents(o))])
"""


@pytest.mark.parametrize("pure", [False, True])
def test_watching_never_makes_the_instance_dict(pure):
    """Reading a watched object's ``__dict__`` would make its dictionary, after which every
    attribute access of the object, the standard library's own code included, is slower (a
    `with cond:` by ~70 ns). The hooks read attributes instead. (A fresh interpreter: earlier
    objects of a class with other attributes can make CPython give up sharing its keys.)"""
    env = dict(os.environ)
    env.pop("LOCKWATCH_DISABLE_EXTENSIONS", None)
    if pure:
        env["LOCKWATCH_DISABLE_EXTENSIONS"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", _NO_DICT_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert out.strip() == "[]"
