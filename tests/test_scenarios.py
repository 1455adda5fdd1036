"""Real pools with known ground truth, through the real instrumentation, checked field by field."""

from __future__ import annotations

import asyncio
import json
import math
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from otel_lockwatch import (
    AsyncStripedSections,
    LockwatchInstrumentor,
    StripedSections,
    evaluate,
    load_manifest,
    name_lock,
)

HOLD_S = 0.002


def test_hot_global_lock_hammered_by_eight_workers(watched):
    """8 pool workers, 40 tasks each of 6 ms of work then a 2 ms hold of one global lock ->
    HOT_LOCK_DETECTED, and a pool of 5: each worker needs the lock a quarter of its working time.

    (The workers once met at a barrier before each hold instead of working: the barrier's wait,
    which lockwatch does not watch, counted as work, and it grew with the machine's load, by the
    time the barrier woke 8 threads on 2 cores: on the free-threaded build under load the lock
    sat idle between rounds and the sizing kept 8, once in a whole test leg and in 3 runs of 4
    beside busy processes, December 2026. Work of its own is what a pool's workers do.)"""
    lock = name_lock(threading.Lock(), "global_config")
    # A stall of the machine (or of this process: a full collection of the whole suite's heap)
    # during a hold lands on the waits of the workers queued behind it; with 40 tasks a worker
    # must be hit many times over to wait 5 times the median (starved, by definition).
    tasks = 40

    def work(_):
        for _ in range(tasks):
            time.sleep(3 * HOLD_S)  # work
            with lock:
                time.sleep(HOLD_S)  # hold

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(work, range(8)))
    manifest = evaluate()
    # What a failure shows: the figures the bounds below are about (this test failed twice in
    # whole pure-Python runs, December 2026, with nothing printed but its name).
    seen = {
        "verdict": manifest.verdict,
        "starvation": manifest.starvation_signatures,
        "throughput_pct": manifest.effective_throughput_pct,
        "recommended": manifest.recommended_pool_size,
        "sizing": manifest.sizing,
        "hold": manifest.hold_time_distribution.get("global_config"),
        "waits_ms": {name: lock["wait_ms_total"] for name, lock in manifest.locks.items()},
        "workers": sorted(manifest.to_dict()["workers"]),
    }
    # As a string: pytest shortens a dict message to a line, which cut off the figures wanted.
    said = json.dumps(seen, default=str, sort_keys=True)

    assert manifest.verdict == "HOT_LOCK_DETECTED", said
    assert manifest.nominal_pool_size == 8, said
    assert manifest.pool_size_source == "executor", said
    # u = 2 / (6 + 2): the lock supports 4 workers (sleeps overshoot alike inside and out, and
    # hand-offs add a little), and the recommendation adds 10 % to that, rounded up.
    sizing = manifest.sizing
    assert sizing["basis"] == "measured"
    assert sizing["bottlenecks"][0]["name"] == "global_config"
    assert manifest.recommended_pool_size == min(8, math.ceil(sizing["workers_supported"] * 1.1))
    assert 3 <= manifest.recommended_pool_size <= 7, said
    assert manifest.hot_lock_register[0]["lock"] == "global_config", said
    assert manifest.hot_lock_register[0]["wait_share_pct"] == 100.0, said
    dist = manifest.hold_time_distribution["global_config"]
    assert dist["count"] == 8 * tasks, said
    assert HOLD_S * 1000 <= dist["p50_ms"] <= HOLD_S * 1000 * 3, said  # sleep overshoots
    assert dist["p50_ms"] <= dist["p95_ms"] <= dist["max_ms"]
    assert manifest.starvation_signatures == [], said
    assert manifest.pre_deadlock_ordering_witness == [], said
    assert manifest.locks["global_config"]["acquisitions"] == 8 * tasks, said
    # The lock, saturated, serves the 8 in turn: a worker's task lasts 8 holds, 4 of them its
    # own work and hold, so it waits the other 4: 50 % (47-49 % in runs on 3.11 and 3.13t). Less
    # where each hand-off waits for a processor: 25 % in one run on the free-threaded build
    # beside three busy processes (the holds 2.8 ms there, the lock free between them while
    # the woken waiter waited to run).
    assert 10 < manifest.effective_throughput_pct < 75, said


def test_starved_worker_on_a_lock_the_others_take_freely(watched):
    """One worker waits 50 ms on a lock three others take freely -> STARVATION_OBSERVED."""
    lock = name_lock(threading.Lock(), "stats_snapshot")
    held = threading.Event()
    victim_waiting = threading.Event()

    def holder():
        with lock:
            held.set()
            assert victim_waiting.wait(10)
            time.sleep(0.05)  # hold while the victim waits

    def victim():
        assert held.wait(10)
        victim_waiting.set()
        with lock:
            pass

    def free_taker():
        for _ in range(5):
            with lock:
                pass

    threads = [
        threading.Thread(target=holder, name="holder"),
        threading.Thread(target=victim, name="victim"),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    takers = [threading.Thread(target=free_taker, name=f"taker-{i}") for i in range(3)]
    for t in takers:  # one after the other: they never wait
        t.start()
        t.join()
    manifest = evaluate(pool_size=5)

    assert manifest.verdict == "STARVATION_OBSERVED"
    (sig,) = manifest.starvation_signatures
    assert (sig["worker"], sig["lock"]) == ("victim", "stats_snapshot")
    assert sig["wait_ms"] >= 40
    assert sig["median_wait_ms"] == 0
    # 17 acquisitions are too few to size the lock: the verdict's half of the pool applies.
    assert (manifest.recommended_pool_size, manifest.sizing["basis"]) == (2, "verdict")


def test_ab_ba_precursor_that_never_deadlocks(watched):
    """A->B in one worker, later B->A in another: nothing deadlocks, the cycle is the verdict."""
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")
    tracer = watched.tracer_provider.get_tracer("app")

    def forward():
        with tracer.start_as_current_span("forward"), a, b:
            pass

    def backward():
        with b, a:
            pass

    first = threading.Thread(target=forward, name="w1")
    first.start()
    first.join()
    second = threading.Thread(target=backward, name="w2")
    second.start()
    second.join()
    manifest = evaluate(pool_size=4)

    assert manifest.verdict == "CYCLIC_ORDERING_DETECTED"
    assert manifest.recommended_pool_size == 4  # nobody waited: no lock limits the pool
    (witness,) = manifest.pre_deadlock_ordering_witness
    assert witness["cycle"] == ["A", "B"]
    forward_edge, backward_edge = witness["edges"]
    assert (forward_edge["holding"], forward_edge["acquiring"], forward_edge["worker"]) == (
        "A",
        "B",
        "w1",
    )
    assert (backward_edge["holding"], backward_edge["acquiring"], backward_edge["worker"]) == (
        "B",
        "A",
        "w2",
    )
    assert forward_edge["sites"][0].startswith("test_scenarios:forward:")
    assert backward_edge["sites"][1].startswith("test_scenarios:backward:")
    assert forward_edge["trace_id"] is not None and backward_edge["trace_id"] is None


def test_well_partitioned_pool_keeps_its_size(watched):
    """Each worker its own lock (one class, one site), no waits -> LOW_CONTENTION, size kept."""

    def work(_):
        own = threading.Lock()
        for _ in range(50):
            with own:
                pass

    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(work, range(4)))
    manifest = evaluate()

    assert manifest.verdict == "LOW_CONTENTION"
    assert (manifest.nominal_pool_size, manifest.recommended_pool_size) == (4, 4)
    assert manifest.hot_lock_register == []
    ((name, lock),) = manifest.locks.items()
    assert name.startswith("test_scenarios:work:")
    assert (lock["acquisitions"], lock["contentions"]) == (200, 0)


def test_sections_every_entry_point_is_recorded(watched):
    """lock, try_lock, lock_many and acquire/release of an array all reach the recorder."""
    sections = StripedSections(16, name="emitter")
    with sections.lock("a"), sections.try_lock("a") as held:
        assert held is False  # the caller holds it: a try yields False, it never raises
    with sections.try_lock("b") as held:
        assert held
    with sections.lock_many(["x", "y", "z"]):
        pass
    assert sections.acquire("q")
    sections.release("q")
    manifest = evaluate()
    stats = manifest.locks["emitter"]
    distinct = len({sections.index(k) for k in "xyz"})
    assert stats["kind"] == "section"
    assert stats["acquisitions"] == 1 + 1 + distinct + 1
    assert stats["skipped"] == 1
    assert manifest.sections["emitter"]["count"] == 16
    assert manifest.sections["emitter"]["max_held"] == max(distinct, 1)
    assert manifest.pre_deadlock_ordering_witness == []  # lock_many's order is canonical


def test_async_sections_recorded_per_task(watched):
    sections = AsyncStripedSections(16, name="async-emitter")

    async def main():
        gate = asyncio.Event()

        async def holder():
            async with sections.lock("k"):
                gate.set()
                await asyncio.sleep(0.005)  # hold

        async def waiter():
            await gate.wait()
            async with sections.lock("k"):
                pass
            async with sections.try_lock("k") as held:
                assert held

        await asyncio.gather(
            asyncio.create_task(holder(), name="h"), asyncio.create_task(waiter(), name="w")
        )

    asyncio.run(main())
    stats = evaluate().locks["async-emitter"]
    assert (stats["acquisitions"], stats["contentions"]) == (3, 1)
    assert set(stats["workers"]) == {"task:h", "task:w"}


def test_manifest_span_and_file_at_provider_shutdown(tmp_path, make_watched):
    """At the tracer provider's shutdown the manifest is written and sent as a span with events."""
    path = tmp_path / "m.json"
    w = make_watched(manifest=True, manifest_path=str(path), checkpoint_interval_s=0)
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")
    with a, b:
        pass
    with b, a:
        pass
    w.tracer_provider.shutdown()
    manifest = load_manifest(path)
    assert manifest.verdict == "CYCLIC_ORDERING_DETECTED"
    (span,) = [s for s in w.spans.get_finished_spans() if s.name == "lockwatch.manifest"]
    assert span.attributes["lockwatch.verdict"] == "CYCLIC_ORDERING_DETECTED"
    assert span.attributes["lockwatch.manifest.digest"] == manifest.manifest_digest
    assert [e.name for e in span.events] == ["lockwatch.cycle"]
    assert list(span.events[0].attributes["lockwatch.cycle"]) == ["A", "B"]


@pytest.mark.parametrize("bad", ["0", "-5", "lots"])
def test_nonsense_threshold_refused(bad):
    with pytest.raises(ValueError, match=r"^hot_lock_threshold_pct must be"):
        LockwatchInstrumentor().instrument(hot_lock_threshold_pct=bad, manifest=False)
    LockwatchInstrumentor().uninstrument()


# ---------------------------------------------------------------------------------------------
# Pools whose checkout waits on a hand-off, not a mutex. They need the capture side to record
# hand-off waits (docs/pools.md); until it does, each test skips after running its workload.


def _needs_handoff_waits(doc: dict) -> None:
    if not any("signal_waits" in lock for lock in doc["locks"].values()):
        pytest.skip("the capture side records no hand-off waits yet")


def _two_slot_pool(kind: str):
    """``(checkout, checkin)`` of a pool of 2 slots built as ``kind``."""
    if kind == "semaphore":
        sem = threading.BoundedSemaphore(2)
        return (lambda: sem.acquire()), (lambda _slot: sem.release())
    if kind == "condition":
        cond, free = threading.Condition(), [0, 1]

        def checkout():
            with cond:
                cond.wait_for(lambda: free)
                return free.pop()

        def checkin(slot):
            with cond:
                free.append(slot)
                cond.notify()

        return checkout, checkin
    lifo: queue.LifoQueue[int] = queue.LifoQueue()
    # Filled by a thread of its own, not this one: the main thread's state, cleared by the
    # fixture's reset, counts its observed time from that reset, so its puts made it one of the
    # pool's workers, busy from the reset on (the instrumenting after it took 300 ms on 3.13t
    # beside busy processes: 4.6 workers supported).
    filling = threading.Thread(target=lambda: [lifo.put(slot) for slot in (0, 1)])
    filling.start()
    filling.join()
    return lifo.get, lifo.put


# Made at import, before any test instruments: unwatched, so a worker's observed time starts at
# its first checkout. (A watched barrier made its wait part of the observed time, which a loaded
# machine stretched: 4 workers supported instead of about 2, on 3.12 in CI.)
_EIGHT_AT_ONCE = threading.Barrier(8)


@pytest.mark.parametrize("kind", ["semaphore", "condition", "lifo_queue"])
def test_an_exhausted_two_slot_pool_is_a_hot_lock(watched, kind):
    """8 pool workers, 20 checkouts of 4 ms each, 2 slots: whatever the pool is built from, it is
    the hot lock, and the report says its capacity supports about 2 workers.

    (With 5 checkouts each, a loaded machine's barrier, waking its 8 threads one by one, let the
    first ones run their checkouts before the last woke: 5 waits in all, 5 slots needed, on
    3.13t beside busy processes.)"""
    checkout, checkin = _two_slot_pool(kind)
    barrier = _EIGHT_AT_ONCE
    barrier.reset()  # (broken, had an earlier run failed half-way)

    def work(_):
        barrier.wait()  # all at once: the pool runs dry
        for _ in range(20):
            slot = checkout()
            time.sleep(0.004)  # hold: the query
            checkin(slot)

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(work, range(8)))
    manifest = evaluate()
    doc = manifest.to_dict()
    _needs_handoff_waits(doc)
    # What a failure shows: the pool's entry, the sizing and every worker's times.
    said = json.dumps(
        {key: doc.get(key) for key in ("resource_pools", "sizing", "workers", "verdict")},
        default=str,
        sort_keys=True,
    )

    assert manifest.verdict in ("HOT_LOCK_DETECTED", "STARVATION_OBSERVED"), said
    (pool_entry,) = doc["resource_pools"]
    assert manifest.hot_lock_register[0]["lock"] == pool_entry["name"], said
    assert pool_entry["hot"] and pool_entry["waits"]["count"] > 0, said
    if kind != "condition":  # a bare condition knows no capacity
        assert (pool_entry["capacity"], pool_entry["in_use_peak"]) == (2, 2), said
        assert pool_entry["workers_supported"] <= 3, said
        assert pool_entry["capacity_needed"] >= 6, said
    assert manifest.effective_throughput_pct < 50, said


def test_a_producer_and_idle_consumers_are_low_contention(watched):
    """Three consumers waiting for work on a queue one producer fills: no contention, the waits
    are idle ones."""
    jobs: queue.Queue[int | None] = queue.Queue()
    done = []

    def consumer():
        while (job := jobs.get()) is not None:
            done.append(job)

    consumers = [threading.Thread(target=consumer, name=f"consumer-{i}") for i in range(3)]
    for t in consumers:
        t.start()
    for job in range(20):
        time.sleep(0.002)  # the producer's own work between two jobs
        jobs.put(job)
    for _ in consumers:
        jobs.put(None)
    for t in consumers:
        t.join()
    assert sorted(done) == list(range(20))
    manifest = evaluate()
    doc = manifest.to_dict()
    _needs_handoff_waits(doc)

    assert manifest.verdict == "LOW_CONTENTION"
    assert manifest.starvation_signatures == [] and doc["resource_pools"] == []
    assert [w["worker"] for w in doc["idle_waits"][0]["workers"]] != []


def test_ten_batches_of_four_threads_are_a_pool_of_four(watched):
    """No executor, no setting: the nominal size is the most workers alive at once."""
    lock = name_lock(threading.Lock(), "batch_lock")
    barrier = threading.Barrier(4)

    def work():
        with lock:
            pass
        # The four of a batch run side by side: without this, a thread that takes its three locks
        # within one switch interval is gone before the next one of its batch starts.
        barrier.wait()
        for _ in range(2):
            with lock:
                pass

    for batch in range(10):
        threads = [threading.Thread(target=work, name=f"b{batch}-{i}") for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    manifest = evaluate()
    if "peak_workers" not in manifest.pool:
        pytest.skip("the capture side records no peak_workers yet")
    assert manifest.pool["peak_workers"] == 4
    assert (manifest.nominal_pool_size, manifest.pool_size_source) == (
        manifest.pool["peak_workers"],
        "peak_workers",
    )
