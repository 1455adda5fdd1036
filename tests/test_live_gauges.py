"""The live gauges ``lockwatch.lock.waiting`` and ``lockwatch.lock.holders``: who is blocked on,
and who holds, each lock class at the moment a metric reader collects.

Each test builds a pile-up it controls (a holder that keeps the lock until told, waiters that
block behind it), polls the in-memory metric reader until the gauge shows it (a deadline, no
sleep), then lets go and reads the gauges back to 0. The last test does the same while the
demo's own workload runs: its ``global_config`` is waited on by several publishers at once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest

from otel_lockwatch import StripedSections, name_lock
from otel_lockwatch.cli._demo import load_workload

DEADLINE_S = 20.0


def _gauges(watched, lock: str) -> tuple[int | None, int | None]:
    """(waiting, holders) of the lock class ``lock`` as the reader collects them now."""
    data = watched.metrics.get_metrics_data()
    found: dict[str, int] = {}
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name in ("lockwatch.lock.waiting", "lockwatch.lock.holders"):
                    for p in m.data.data_points:
                        if p.attributes.get("lockwatch.lock.name") == lock:
                            assert set(p.attributes) == {
                                "lockwatch.lock.name",
                                "lockwatch.lock.kind",
                            }, p.attributes
                            found[m.name] = p.value
    return found.get("lockwatch.lock.waiting"), found.get("lockwatch.lock.holders")


def _until(watched, lock: str, done: Callable[[int | None, int | None], bool]) -> tuple:
    deadline = time.monotonic() + DEADLINE_S
    seen = _gauges(watched, lock)
    while not done(*seen):
        assert time.monotonic() < deadline, f"gauges of {lock} stayed at {seen}"
        time.sleep(0.005)  # ok: polling the gauges, with a deadline
        seen = _gauges(watched, lock)
    return seen


def test_threads_blocked_on_a_lock_are_waiting_and_its_owner_holds(watched):
    """Three threads blocked behind a held lock read waiting 3, holders 1; once it is released
    and they are done, both read 0 (not a stale last value)."""
    lock = name_lock(threading.Lock(), "pile")
    lock.acquire()
    threads = [threading.Thread(target=lambda: lock.acquire() and lock.release()) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        assert _until(watched, "pile", lambda w, h: w == 3) == (3, 1)
    finally:
        lock.release()
        for t in threads:
            t.join()
    assert _gauges(watched, "pile") == (0, 0)


def test_a_worker_holding_two_sections_of_an_array_holds_it_once(watched):
    """Holders count workers, not locks: two sections held by one thread are one holder; a thread
    blocked on a held section is waiting on the array's class."""
    sections = StripedSections(8, name="parts")
    keys = ["a"] + [k for k in "bcdefghij" if sections.index(k) != sections.index("a")][:1]
    for key in keys:
        assert sections.acquire(key)

    def wait_for_a() -> None:
        assert sections.acquire("a")
        sections.release("a")

    blocked = threading.Thread(target=wait_for_a)
    try:
        assert _gauges(watched, "parts") == (0, 1)
        blocked.start()
        assert _until(watched, "parts", lambda w, h: w == 1) == (1, 1)
    finally:
        for key in keys:
            sections.release(key)
        blocked.join()
    assert _gauges(watched, "parts") == (0, 0)


def test_asyncio_tasks_blocked_on_a_lock_are_waiting(watched):
    """Tasks are workers too: two tasks queued on an ``asyncio.Lock`` read waiting 2."""

    async def main() -> tuple:
        lock = name_lock(asyncio.Lock(), "alock")
        await lock.acquire()

        async def take() -> None:
            async with lock:
                pass

        tasks = [asyncio.create_task(take()) for _ in range(2)]
        deadline = time.monotonic() + DEADLINE_S
        while _gauges(watched, "alock")[0] != 2:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.001)
        during = _gauges(watched, "alock")
        lock.release()
        await asyncio.gather(*tasks)
        return during

    assert asyncio.run(main()) == (2, 1)
    assert _gauges(watched, "alock") == (0, 0)


def test_the_demo_workload_piles_up_on_global_config_then_reads_0(watched):
    """While the demo's workload runs, more than one publisher is blocked on ``global_config``
    at some collection; after the run, its waiting gauge reads 0."""
    workload = load_workload()
    box: dict = {}
    pools: list = []
    runner = threading.Thread(target=workload.run_into, args=(box, 8, 2.0, pools.append))
    runner.start()
    try:
        waiting, _ = _until(watched, "global_config", lambda w, h: (w or 0) > 1)
        assert waiting > 1
    finally:
        runner.join()
    assert "error" not in box, box.get("error")
    assert _gauges(watched, "global_config") == (0, 0)


@pytest.mark.parametrize("name", ["lockwatch.lock.waiting", "lockwatch.lock.holders"])
def test_the_gauges_describe_themselves(watched, name):
    name_lock(threading.Lock(), "described").acquire()
    data = watched.metrics.get_metrics_data()
    (metric,) = [
        m
        for rm in data.resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == name
    ]
    assert metric.unit == "{worker}"
    assert "right now" in metric.description
