"""AsyncStripedSections: the section array for asyncio tasks.

Each test runs its own event loop with ``asyncio.run``; tasks are synchronized with events and by
polling ``statistics()``, never by sleeping for a duration and hoping.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_lockwatch import (
    AsyncStripedSections,
    SectionReentryError,
    SectionStatistics,
    SectionTimeout,
    StripedSections,
)

DEADLINE = 10.0  # seconds: only ever reached when a test is failing

keys = st.one_of(st.text(max_size=40), st.binary(max_size=40), st.integers())


def run(main: Callable[[], Coroutine[Any, Any, Any]]) -> Any:
    async def bounded() -> Any:
        return await asyncio.wait_for(main(), DEADLINE)

    return asyncio.run(bounded())


async def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0)  # poll: let the other tasks run


def colliding_key(sections: AsyncStripedSections, key: str) -> str:
    target = sections.index(key)
    return next(f"other-{i}" for i in range(100_000) if sections.index(f"other-{i}") == target)


def distinct_key(sections: AsyncStripedSections, key: str) -> str:
    target = sections.index(key)
    return next(f"other-{i}" for i in range(100_000) if sections.index(f"other-{i}") != target)


@asynccontextmanager
async def held_elsewhere(sections: AsyncStripedSections, key: object) -> AsyncIterator[None]:
    """Hold ``key``'s section in another task for the duration of the block."""
    taken, done = asyncio.Event(), asyncio.Event()

    async def holder() -> None:
        async with sections.lock(key):  # type: ignore[arg-type]
            taken.set()
            await done.wait()  # hold

    task = asyncio.create_task(holder())
    await taken.wait()
    try:
        yield
    finally:
        done.set()
        await task


# -- construction and index --------------------------------------------------------------------


def test_defaults_and_repr() -> None:
    s = AsyncStripedSections()
    assert (s.count, s.name) == (256, "sections")
    assert repr(s) == "<AsyncStripedSections 'sections' 256 sections, 0 held>"
    one = AsyncStripedSections(1, name="one")
    assert repr(one) == "<AsyncStripedSections 'one' 1 section, 0 held>"


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"count": True}, TypeError, "count must be an int, got bool"),
        ({"count": 8.0}, TypeError, "count must be an int, got float"),
        ({"count": 0}, ValueError, "count must be a power of two, got 0"),
        ({"count": -8}, ValueError, "count must be a power of two, got -8"),
        ({"count": 100}, ValueError, "count must be a power of two, got 100"),
        ({"count": 1 << 33}, ValueError, r"count must be at most 2\*\*32, got 8589934592"),
        ({"name": ""}, ValueError, "name must be a non-empty str, got ''"),
        ({"name": b"x"}, TypeError, "name must be a non-empty str, got bytes"),
    ],
)
def test_constructor_errors(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=rf"^{message}$"):
        AsyncStripedSections(**kwargs)


@given(key=keys, log2=st.integers(min_value=0, max_value=12))
def test_index_matches_the_thread_variant(key: str | bytes | int, log2: int) -> None:
    """Same key, same count, same section, in range and stable: threads and tasks agree."""
    count = 1 << log2
    s = AsyncStripedSections(count)
    assert 0 <= s.index(key) < count
    assert s.index(key) == s.index(key) == StripedSections(count).index(key)


def test_go_vectors() -> None:
    s = AsyncStripedSections(1 << 16)
    assert s.index("") == 0x811C9DC5 & 0xFFFF
    assert s.index("a") == 0xE40C292C & 0xFFFF
    assert s.index("foobar") == 0xBF9CF968 & 0xFFFF


@pytest.mark.parametrize("key", [True, 2.5, None, [b"a"], memoryview(b"a")])
def test_bad_keys_everywhere(key: object) -> None:
    s = AsyncStripedSections(8)
    message = rf"^section keys must be str, bytes, bytearray or int, got {type(key).__name__}$"

    async def main() -> None:
        with pytest.raises(TypeError, match=message):
            await s.acquire(key)  # type: ignore[arg-type]
        for call in (s.index, s.release, s.lock, s.try_lock):
            with pytest.raises(TypeError, match=message):
                call(key)  # type: ignore[operator]
        with pytest.raises(TypeError, match=message):
            s.lock_many(["a", key])  # type: ignore[list-item]

    run(main)
    assert s.statistics().held == ()


def test_memory_is_bounded_by_count() -> None:
    s = AsyncStripedSections(16)

    async def main() -> None:
        for i in range(5_000):
            async with s.lock(f"entity-{i}"):
                pass

    run(main)
    assert [len(s._owners), len(s._keys), len(s._waiters)] == [16] * 3
    assert s._owners == [None] * 16 and s._keys == [None] * 16
    with pytest.raises(AttributeError):
        s.anything = 1  # type: ignore[attr-defined]


# -- acquire / release ----------------------------------------------------------------------------


def test_acquire_release_and_holder_bookkeeping() -> None:
    s = AsyncStripedSections(8, name="emitter")
    i = s.index("unit-7")

    async def main() -> None:
        assert await s.acquire("unit-7") is True
        assert s._owners[i] is asyncio.current_task()
        assert s._keys[i] == "unit-7"
        assert repr(s) == "<AsyncStripedSections 'emitter' 8 sections, 1 held>"
        s.release("unit-7")
        assert (s._owners[i], s._keys[i]) == (None, None)
        message = rf"^release of section {i} of 'emitter', which is not held$"
        with pytest.raises(RuntimeError, match=message):
            s.release("unit-7")

    run(main)


def test_release_from_another_task() -> None:
    s = AsyncStripedSections(8)

    async def main() -> None:
        await s.acquire("a")

        async def releaser() -> None:
            s.release("a")

        await asyncio.create_task(releaser())
        assert s.statistics().held == ()
        assert await s.acquire("a", blocking=False)
        s.release("a")

    run(main)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"blocking": False, "timeout": 1},
            ValueError,
            "can't specify a timeout for a non-blocking call, got timeout=1",
        ),
        ({"timeout": -1}, ValueError, "timeout must be a non-negative number or None, got -1"),
        (
            {"timeout": float("nan")},
            ValueError,
            "timeout must be a non-negative number or None, got nan",
        ),
        ({"timeout": "1"}, TypeError, "timeout must be a number, got str"),
    ],
)
def test_acquire_argument_errors(kwargs: dict, error: type, message: str) -> None:
    s = AsyncStripedSections(8)

    async def main() -> None:
        with pytest.raises(error, match=rf"^{message}$"):
            await s.acquire("a", **kwargs)

    run(main)
    assert s.statistics().held == ()


def test_non_blocking_and_timed_acquire_of_a_held_section() -> None:
    s = AsyncStripedSections(8)

    async def main() -> None:
        async with held_elsewhere(s, "a"):
            assert await s.acquire("a", blocking=False) is False
            assert await s.acquire(colliding_key(s, "a"), blocking=False) is False
            assert await s.acquire("a", timeout=0) is False
            t0 = time.monotonic()
            assert await s.acquire("a", timeout=0.05) is False
            assert time.monotonic() - t0 >= 0.04
            assert s.statistics().waiters == 0  # the expired waiter left the queue
        assert await s.acquire("a", blocking=False) is True
        s.release("a")

    run(main)


# -- lock / try_lock ------------------------------------------------------------------------------


def test_lock_binds_the_index_and_releases_on_exception() -> None:
    s = AsyncStripedSections(64)

    async def main() -> None:
        async with s.lock("unit-7") as index:
            assert index == s.index("unit-7")
            assert s.statistics().held == (index,)
        with pytest.raises(KeyError):
            async with s.lock("unit-7"):
                raise KeyError("boom")
        assert s.statistics().held == ()

    run(main)


def test_lock_timeout_raises_section_timeout() -> None:
    s = AsyncStripedSections(8, name="emitter")
    i = s.index("a")

    async def main() -> None:
        async with held_elsewhere(s, "a"):
            message = rf"^section {i} of 'emitter' not acquired within 0.05 s$"
            with pytest.raises(SectionTimeout, match=message) as info:
                async with s.lock("a", timeout=0.05):
                    pytest.fail("entered a held section")  # pragma: no cover
            assert (info.value.index, info.value.timeout) == (i, 0.05)
            assert s.statistics().waiters == 0
        async with s.lock("a", timeout=0.05):  # free again, and the timed-out waiter is gone
            pass

    run(main)


def test_lock_timeout_errors() -> None:
    s = AsyncStripedSections(8)
    message = r"^timeout must be a non-negative number or None, got -0.5$"
    with pytest.raises(ValueError, match=message):
        s.lock("a", timeout=-0.5)
    with pytest.raises(ValueError, match=message):
        s.lock_many(["a"], timeout=-0.5)


def test_try_lock_free_and_held() -> None:
    s = AsyncStripedSections(8)

    async def main() -> None:
        async with s.try_lock("a") as held:
            assert held is True
        assert s.statistics().held == ()
        async with held_elsewhere(s, "a"):
            async with s.try_lock("a") as held:
                assert held is False
            assert s.statistics().held == (s.index("a"),)  # still the holder's

    run(main)


# -- mutual exclusion, fairness, cancellation -----------------------------------------------------


@pytest.mark.parametrize("count", [1, 4])
def test_mutual_exclusion(count: int) -> None:
    """Tasks that yield inside the section never overlap and lose no update."""
    s = AsyncStripedSections(count)
    n_tasks, rounds = 6, 200
    inside, overlaps, total = [0], [0], [0]
    key_of = ["unit-7"] * n_tasks if count > 1 else [f"unit-{t}" for t in range(n_tasks)]

    async def worker(t: int) -> None:
        for _ in range(rounds):
            async with s.lock(key_of[t]):
                inside[0] += 1
                overlaps[0] += inside[0] != 1
                value = total[0]
                await asyncio.sleep(0)  # hold: let every other task run
                total[0] = value + 1
                inside[0] -= 1

    async def main() -> None:
        await asyncio.gather(*(worker(t) for t in range(n_tasks)))

    run(main)
    assert overlaps[0] == 0
    assert total[0] == n_tasks * rounds
    assert s.statistics() == SectionStatistics("sections", count, (), 0)


def test_waiters_are_served_first_come_first_served() -> None:
    """Release hands the section to the longest waiter; a newcomer cannot barge in."""
    s = AsyncStripedSections(8)
    order: list[int] = []

    async def waiter(n: int) -> None:
        async with s.lock("a"):
            order.append(n)

    async def main() -> None:
        await s.acquire("a")
        tasks = []
        for n in range(5):
            tasks.append(asyncio.create_task(waiter(n)))
            await wait_until(lambda n=n: s.statistics().waiters == n + 1, f"waiter {n} queues")
        s.release("a")
        assert await s.acquire("a", blocking=False) is False  # handed off, not free
        await asyncio.gather(*tasks)

    run(main)
    assert order == [0, 1, 2, 3, 4]


def test_cancelled_waiter_leaks_nothing() -> None:
    """A waiter cancelled while queued leaves the queue; the section stays the holder's."""
    s = AsyncStripedSections(8)

    async def main() -> None:
        await s.acquire("a")
        task = asyncio.create_task(s.acquire("a"))
        await wait_until(lambda: s.statistics().waiters == 1, "the waiter queues")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert s.statistics().waiters == 0
        assert s._owners[s.index("a")] is asyncio.current_task()
        s.release("a")
        assert s.statistics() == SectionStatistics("sections", 8, (), 0)

    run(main)


def test_waiter_cancelled_after_hand_off_passes_the_section_on() -> None:
    """Regression guard: a waiter handed the section, then cancelled before it resumes, must
    pass the section to the next waiter instead of keeping it forever."""
    s = AsyncStripedSections(8)
    got: list[str] = []

    async def waiter(name: str) -> None:
        async with s.lock("a"):
            got.append(name)

    async def main() -> None:
        await s.acquire("a")
        first = asyncio.create_task(waiter("first"))
        await wait_until(lambda: s.statistics().waiters == 1, "first queues")
        second = asyncio.create_task(waiter("second"))
        await wait_until(lambda: s.statistics().waiters == 2, "second queues")
        s.release("a")  # hands the section to `first`...
        assert s._owners[s.index("a")] is first
        first.cancel()  # ...which is cancelled before it runs again
        with pytest.raises(asyncio.CancelledError):
            await first
        await second
        assert s.statistics() == SectionStatistics("sections", 8, (), 0)

    run(main)
    assert got == ["second"]


def test_lock_many_cancelled_midway_releases_what_it_took() -> None:
    s = AsyncStripedSections(64)

    async def main() -> None:
        low, high = sorted(["a", distinct_key(s, "a")], key=s.index)
        async with held_elsewhere(s, high):

            async def taker() -> None:
                async with s.lock_many([low, high]):
                    pass  # pragma: no cover

            task = asyncio.create_task(taker())
            await wait_until(lambda: s.statistics().waiters == 1, "lock_many waits for high")
            assert s.index(low) in s.statistics().held
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert s.statistics().held == (s.index(high),)
        assert s.statistics() == SectionStatistics("sections", 64, (), 0)

    run(main)


# -- the reentry guard ----------------------------------------------------------------------------


def test_reentry_same_and_colliding_key_raise_at_once() -> None:
    s = AsyncStripedSections(16, name="emitter")
    i = s.index("a")
    message = (
        rf"^section {i} of 'emitter' is already held by the caller; "
        r"acquiring it again would deadlock$"
    )

    async def main() -> None:
        async with s.lock("a"):
            for key in ("a", colliding_key(s, "a")):
                with pytest.raises(SectionReentryError, match=message):
                    async with s.lock(key, timeout=DEADLINE):  # at once, not after the timeout
                        pass  # pragma: no cover
                with pytest.raises(SectionReentryError, match=message):
                    await s.acquire(key)
                assert await s.acquire(key, blocking=False) is False
                async with s.try_lock(key) as held:
                    assert held is False
            with pytest.raises(SectionReentryError, match=message):
                async with s.lock_many([distinct_key(s, "a"), "a"]):
                    pass  # pragma: no cover
            assert s.statistics().held == (i,)
        assert s.statistics().held == ()

    run(main)


def test_reentry_guard_is_per_task() -> None:
    """Another task blocking on the section waits; it does not raise."""
    s = AsyncStripedSections(8)

    async def main() -> None:
        async with s.lock("a"):
            other = asyncio.create_task(s.acquire("a", timeout=DEADLINE))
            await wait_until(lambda: s.statistics().waiters == 1, "the other task waits")
        assert await other is True
        s.release("a")

    run(main)


# -- lock_many ------------------------------------------------------------------------------------


class Recording(AsyncStripedSections):
    __slots__ = ("calls",)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls: list[tuple] = []

    async def _acquire(self, index, key, blocking=True, timeout=None, canonical=False):  # type: ignore[no-untyped-def]
        self.calls.append(("acquire", index, key, blocking, canonical))
        return await super()._acquire(index, key, blocking, timeout, canonical)

    def _release(self, index):  # type: ignore[no-untyped-def]
        self.calls.append(("release", index))
        super()._release(index)


def test_lock_many_ascending_distinct_reverse_release() -> None:
    s = Recording(16)
    ks = ["zeta", "alpha", colliding_key(s, "alpha"), "mid", 42, b"bytes"]
    expected = sorted({s.index(k) for k in ks})

    async def main() -> None:
        async with s.lock_many(ks) as indices:
            assert indices == tuple(expected)
            assert s.statistics().held == tuple(expected)
        async with s.lock_many([]) as none:
            assert none == ()

    run(main)
    acquires = [c for c in s.calls if c[0] == "acquire"]
    assert [c[1] for c in acquires] == expected
    assert all(c[3] is True and c[4] is True for c in acquires)
    assert [c[1] for c in s.calls if c[0] == "release"] == expected[::-1]
    with pytest.raises(TypeError, match=r"^lock_many takes an iterable of keys, got str$"):
        s.lock_many("abc")  # type: ignore[arg-type]


def test_lock_many_timeout_releases_what_it_took() -> None:
    s = AsyncStripedSections(64, name="emitter")
    low, high = sorted(["a", distinct_key(s, "a")], key=s.index)

    async def main() -> None:
        async with held_elsewhere(s, high):
            message = rf"^section {s.index(high)} of 'emitter' not acquired within 0.05 s$"
            with pytest.raises(SectionTimeout, match=message):
                async with s.lock_many([high, low], timeout=0.05):
                    pass  # pragma: no cover
            assert s.statistics().held == (s.index(high),)
            assert s.statistics().waiters == 0

    run(main)


def test_lock_many_against_reversed_lock_many() -> None:
    """Two tasks taking the same sections in opposite key orders, yielding while they hold
    them, never deadlock (a deadlock would surface as SectionTimeout)."""
    s = AsyncStripedSections(32)
    ks = [f"unit-{i}" for i in range(12)]
    done = [0, 0]

    async def worker(t: int, order: list[str]) -> None:
        for _ in range(300):
            async with s.lock_many(order, timeout=DEADLINE):
                await asyncio.sleep(0)  # hold
                done[t] += 1

    async def main() -> None:
        await asyncio.gather(worker(0, ks), worker(1, ks[::-1]))

    run(main)
    assert done == [300, 300]
    assert s.statistics().held == ()


# -- contract, statistics, loops ------------------------------------------------------------------


def test_every_entry_point_goes_through_the_patch_points() -> None:
    s = Recording(8)
    i = s.index("a")

    async def main() -> None:
        await s.acquire("a")
        s.release("a")
        async with s.lock("a"):
            pass
        async with s.try_lock("a"):
            pass
        async with s.lock_many(["a"]):
            pass

    run(main)
    assert s.calls == [
        ("acquire", i, "a", True, False),
        ("release", i),
        ("acquire", i, "a", True, False),
        ("release", i),
        ("acquire", i, "a", False, False),
        ("release", i),
        ("acquire", i, "a", True, True),
        ("release", i),
    ]


def test_patching_the_class_covers_existing_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    s = AsyncStripedSections(8)
    seen: list[str] = []
    original_acquire = AsyncStripedSections._acquire
    original_release = AsyncStripedSections._release

    async def _acquire(self, index, key, blocking=True, timeout=None, canonical=False):  # type: ignore[no-untyped-def]
        seen.append(f"acquire {key}")
        return await original_acquire(self, index, key, blocking, timeout, canonical)

    def _release(self, index):  # type: ignore[no-untyped-def]
        seen.append("release")
        original_release(self, index)

    monkeypatch.setattr(AsyncStripedSections, "_acquire", _acquire)
    monkeypatch.setattr(AsyncStripedSections, "_release", _release)

    async def main() -> None:
        async with s.lock("x"):
            pass

    run(main)
    assert seen == ["acquire x", "release"]


def test_statistics_is_a_frozen_snapshot() -> None:
    s = AsyncStripedSections(4, name="emitter")

    async def main() -> SectionStatistics:
        async with s.lock_many(["a", "b", "c"]) as indices:
            stats = s.statistics()
            assert stats.held == indices
            return stats

    stats = run(main)
    assert s.statistics().held == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.waiters = 3  # type: ignore[misc]


def test_one_array_serves_successive_event_loops() -> None:
    """Nothing binds the array to a loop: contention works in one asyncio.run, then another."""
    s = AsyncStripedSections(4)

    async def contend() -> None:
        async with held_elsewhere(s, "a"):
            waiter = asyncio.create_task(s.acquire("a", timeout=DEADLINE))
            await wait_until(lambda: s.statistics().waiters == 1, "the waiter queues")
        assert await waiter
        s.release("a")

    run(contend)
    run(contend)
    assert s.statistics().held == ()


# -- the stale-publish race that sections prevent, scaled down ------------------------------------


class Subscriber:
    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.received: list[tuple[str, int]] = []
        self.regressions: list[tuple[str, int, int]] = []

    def send(self, entity: str, version: int) -> None:
        previous = self.last.get(entity, -1)
        if version < previous:
            self.regressions.append((entity, previous, version))
        else:
            self.last[entity] = version
        self.received.append((entity, version))


async def forced_interleaving(sections: AsyncStripedSections | None) -> list[tuple[str, int]]:
    """The sweep loads OLD, the state changes to NEW, the event path publishes, then the sweep
    sends what it loaded; ``None`` runs it with nothing serializing."""
    store = {"unit-7": 1}
    subscriber = Subscriber()
    loaded, event_sent = asyncio.Event(), asyncio.Event()

    @asynccontextmanager
    async def maybe(cm: Any) -> AsyncIterator[None]:
        if sections is None:
            yield
        else:
            async with cm:
                yield

    async def sweep() -> None:
        async with maybe(sections and sections.try_lock("unit-7")):
            version = store["unit-7"]
            loaded.set()
            await wait_until(
                lambda: (
                    event_sent.is_set()
                    or (sections is not None and sections.statistics().waiters == 1)
                ),
                "the event path publishes or waits",
            )
            subscriber.send("unit-7", version)

    async def event() -> None:
        await loaded.wait()
        store["unit-7"] = 2
        async with maybe(sections and sections.lock("unit-7")):
            subscriber.send("unit-7", store["unit-7"])
        event_sent.set()

    await asyncio.gather(sweep(), event())
    return subscriber.received


def test_stale_sweep_without_sections_regresses() -> None:
    assert run(lambda: forced_interleaving(None)) == [("unit-7", 2), ("unit-7", 1)]


def test_stale_sweep_with_sections_converges() -> None:
    received = run(lambda: forced_interleaving(AsyncStripedSections(16)))
    assert received == [("unit-7", 1), ("unit-7", 2)]


def test_event_path_and_periodic_sweep_never_regress() -> None:
    """Event tasks publish under lock(), a sweep task under try_lock(), over 8 entities in 4
    sections; no entity's view regresses and every entity converges on its latest state."""
    sections = AsyncStripedSections(4, name="emitter")
    entities = [f"unit-{i}" for i in range(8)]
    store = dict.fromkeys(entities, 0)
    subscriber = Subscriber()
    swept = {"published": 0, "skipped": 0}

    async def publish(entity: str) -> None:
        version = store[entity]  # load
        await asyncio.sleep(0)  # hold: let the other path run between load and send
        subscriber.send(entity, version)

    async def event_path(t: int) -> None:
        for n in range(200):
            entity = entities[(t * 7 + n * 3) % len(entities)]
            store[entity] += 1
            async with sections.lock(entity, timeout=DEADLINE):
                await publish(entity)

    async def periodic_sweep(stop: asyncio.Event) -> None:
        while not stop.is_set():
            for entity in entities:
                async with sections.try_lock(entity) as held:
                    if not held:
                        swept["skipped"] += 1
                        continue
                    await publish(entity)
                    swept["published"] += 1
            await asyncio.sleep(0)

    async def main() -> None:
        stop = asyncio.Event()
        sweeper = asyncio.create_task(periodic_sweep(stop))
        await asyncio.gather(*(event_path(t) for t in range(3)))
        stop.set()
        await sweeper

    run(main)
    assert subscriber.regressions == []
    assert sum(store.values()) == 600
    assert subscriber.last == store
    assert swept["published"] > 0 and swept["skipped"] > 0
    assert sections.statistics().held == ()
