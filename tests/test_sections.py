"""StripedSections: the section array for threads.

Threads are synchronized with events, barriers and by polling ``statistics()`` with a deadline,
never by sleeping and hoping.
"""

from __future__ import annotations

import _thread
import dataclasses
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given
from hypothesis import strategies as st

from otel_lockwatch import (
    SectionReentryError,
    SectionStatistics,
    SectionTimeout,
    StripedSections,
)
from otel_lockwatch.sections._fnv import fnv1a_32
from otel_lockwatch.sections._threaded import LOCKERS_SIZE

DEADLINE = 10.0  # seconds: only ever reached when a test is failing

keys = st.one_of(st.text(max_size=40), st.binary(max_size=40), st.integers())


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        time.sleep(0.001)  # ok: polling with a deadline


def colliding_key(sections: StripedSections, key: str) -> str:
    """Another key whose section is ``key``'s."""
    target = sections.index(key)
    return next(f"other-{i}" for i in range(100_000) if sections.index(f"other-{i}") == target)


def distinct_key(sections: StripedSections, key: str) -> str:
    """A key whose section is not ``key``'s."""
    target = sections.index(key)
    return next(f"other-{i}" for i in range(100_000) if sections.index(f"other-{i}") != target)


@contextmanager
def held_elsewhere(sections: StripedSections, key: object) -> Iterator[threading.Thread]:
    """Hold ``key``'s section in another thread for the duration of the block."""
    taken, done = threading.Event(), threading.Event()

    def holder() -> None:
        with sections.lock(key):  # type: ignore[arg-type]
            taken.set()
            done.wait(DEADLINE)  # hold

    thread = threading.Thread(target=holder)
    thread.start()
    assert taken.wait(DEADLINE)
    try:
        yield thread
    finally:
        done.set()
        thread.join(DEADLINE)
        assert not thread.is_alive()


class Worker(threading.Thread):
    """A daemon thread that keeps its target's exception for join() to raise."""

    def __init__(self, target: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self._work = target
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._work()
        except BaseException as exc:  # re-raised by join()
            self.error = exc


def start(target: Callable[[], object]) -> Worker:
    thread = Worker(target)
    thread.start()
    return thread


def join(*threads: threading.Thread) -> None:
    for thread in threads:
        thread.join(DEADLINE)
        assert not thread.is_alive(), f"{thread.name} is stuck"
        if isinstance(thread, Worker) and thread.error is not None:
            raise thread.error


def join_while_progressing(threads: Iterable[threading.Thread], progress: list[int]) -> None:
    """Join workers whose every blocking acquisition is bounded by DEADLINE (a deadlock raises
    SectionTimeout by then) for as long as they make progress (``progress``: their completed
    steps), not within one DEADLINE for all their steps, which a deadlock-free run on a loaded
    machine can exceed (the free-threaded 3.13's contended acquisitions yield the processor up
    to 40 times each, and each yield beside runnable threads gives it up for a scheduler slice).
    """
    threads = list(threads)
    for thread in threads:
        while True:
            before = sum(progress)
            thread.join(2 * DEADLINE)  # past one acquisition's DEADLINE: a deadlock raised by then
            if not thread.is_alive():
                break
            assert sum(progress) > before, f"no step completed in {2 * DEADLINE} s: {progress}"
    join(*threads)


# -- construction --------------------------------------------------------------------------------


def test_defaults() -> None:
    """256 sections named 'sections' unless told otherwise."""
    s = StripedSections()
    assert (s.count, s.name) == (256, "sections")
    assert repr(s) == "<StripedSections 'sections' 256 sections, 0 held>"


@pytest.mark.parametrize("count", [1, 2, 64, 256, 1 << 16])
def test_power_of_two_counts(count: int) -> None:
    s = StripedSections(count, name="emitter")
    assert s.count == count
    assert s.statistics() == SectionStatistics("emitter", count, (), 0)


@pytest.mark.parametrize(
    ("count", "message"),
    [
        (True, "count must be an int, got bool"),
        (256.0, "count must be an int, got float"),
        ("256", "count must be an int, got str"),
        (None, "count must be an int, got NoneType"),
    ],
)
def test_count_type_errors(count: object, message: str) -> None:
    with pytest.raises(TypeError, match=rf"^{message}$"):
        StripedSections(count)  # type: ignore[arg-type]


@pytest.mark.parametrize("count", [0, -1, -256, 3, 100, 255, 257])
def test_count_must_be_a_power_of_two(count: int) -> None:
    with pytest.raises(ValueError, match=rf"^count must be a power of two, got {count}$"):
        StripedSections(count)


def test_count_is_at_most_two_to_the_32() -> None:
    """The hash has 32 bits: sections beyond 2**32 could never be reached."""
    with pytest.raises(ValueError, match=r"^count must be at most 2\*\*32, got 8589934592$"):
        StripedSections(1 << 33)


def test_name_errors() -> None:
    with pytest.raises(ValueError, match=r"^name must be a non-empty str, got ''$"):
        StripedSections(name="")
    with pytest.raises(TypeError, match=r"^name must be a non-empty str, got int$"):
        StripedSections(name=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^StripedSections.__init__\(\) takes"):
        StripedSections(256, "emitter")  # type: ignore[misc]  # name is keyword-only


def test_raw_locks_are_not_threading_locks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sections never go through threading.Lock, which the instrumentation patches."""

    def refuse() -> None:
        raise AssertionError("threading.Lock was called")

    monkeypatch.setattr(threading, "Lock", refuse)
    s = StripedSections(4)
    assert all(type(lock) is _thread.LockType for lock in s._locks)
    with s.lock("a"):
        pass


def test_memory_is_bounded_by_count() -> None:
    """Many distinct keys leave the per-section state at count entries and nothing per key."""
    s = StripedSections(16)
    for i in range(20_000):
        with s.lock(f"entity-{i}"):
            pass
    assert [len(s._locks), len(s._owners), len(s._keys), len(s._waiting)] == [16] * 4
    assert s._owners == [None] * 16 and s._keys == [None] * 16
    assert len(s._lockers) <= LOCKERS_SIZE  # the shared lock() managers are bounded too
    with pytest.raises(AttributeError):
        s.anything = 1  # type: ignore[attr-defined]  # __slots__: no per-instance dict


def test_lock_managers_are_shared_only_when_immutable() -> None:
    """lock(str key) without a timeout hands out one shared manager per key (it has no state);
    with a timeout, or for another key type, a fresh one each time."""
    s = StripedSections(16)
    assert s.lock("a") is s.lock("a")
    assert s.lock("a") is not s.lock("b")
    assert s.lock("a", timeout=1) is not s.lock("a", timeout=1)
    assert s.lock(7) is not s.lock(7)
    shared = s.lock("a")
    with shared, pytest.raises(SectionReentryError), shared:  # the guard still fires
        pytest.fail("re-entered a section")  # pragma: no cover
    assert s.statistics().held == ()


# -- index -------------------------------------------------------------------------------------


def test_index_of_go_vectors() -> None:
    """index() is Go's New32a sum masked by count - 1."""
    for count in (1, 2, 256, 1 << 16):
        s = StripedSections(count)
        assert s.index("") == 0x811C9DC5 % count
        assert s.index("a") == 0xE40C292C % count
        assert s.index(b"foobar") == 0xBF9CF968 % count


@given(key=keys, log2=st.integers(min_value=0, max_value=12))
def test_index_stable_and_in_range(key: str | bytes | int, log2: int) -> None:
    """Any key maps into range(count), the same way every time and in every array."""
    count = 1 << log2
    a, b = StripedSections(count, name="a"), StripedSections(count, name="b")
    index = a.index(key)
    assert 0 <= index < count
    assert index == a.index(key) == b.index(key)
    assert index == a.index(key) & (count - 1)


@given(st.text(max_size=30))
def test_index_is_fnv_of_utf8(key: str) -> None:
    assert StripedSections(1024).index(key) == fnv1a_32(key.encode()) & 1023


@pytest.mark.parametrize("key", [True, 1.5, None, ["a"], memoryview(b"a")])
def test_bad_keys_everywhere(key: object) -> None:
    """Every entry point refuses a bad key, naming its type, and takes nothing."""
    s = StripedSections(8)
    name = type(key).__name__
    message = rf"^section keys must be str, bytes, bytearray or int, got {name}$"
    for call in (s.index, s.acquire, s.release, s.lock, s.try_lock):
        with pytest.raises(TypeError, match=message):
            call(key)  # type: ignore[operator]
    with pytest.raises(TypeError, match=message):
        s.lock_many(["ok", key])  # type: ignore[list-item]
    assert s.statistics().held == ()


# -- acquire / release ----------------------------------------------------------------------------


def test_acquire_release_and_holder_bookkeeping() -> None:
    """acquire records the owner thread and the key; release clears both."""
    s = StripedSections(8, name="emitter")
    i = s.index("unit-7")
    assert s.acquire("unit-7") is True
    assert s._owners[i] == threading.get_ident()
    assert s._keys[i] == "unit-7"
    assert s.statistics().held == (i,)
    assert repr(s) == "<StripedSections 'emitter' 8 sections, 1 held>"
    s.release("unit-7")
    assert (s._owners[i], s._keys[i]) == (None, None)
    assert s.statistics().held == ()


def test_release_not_held() -> None:
    s = StripedSections(8, name="emitter")
    message = rf"^release of section {s.index('unit-7')} of 'emitter', which is not held$"
    with pytest.raises(RuntimeError, match=message):
        s.release("unit-7")
    s.acquire("unit-7")
    s.release("unit-7")
    with pytest.raises(RuntimeError, match=message):
        s.release("unit-7")


def test_release_from_another_thread() -> None:
    """As with threading.Lock, any thread may release; the owner is cleared."""
    s = StripedSections(8)
    s.acquire("a")
    join(start(lambda: s.release("a")))
    i = s.index("a")
    assert (s._owners[i], s._keys[i]) == (None, None)
    assert s.acquire("a", blocking=False)  # and the caller may take it again
    s.release("a")


def test_non_blocking_acquire_of_a_section_held_elsewhere() -> None:
    s = StripedSections(8)
    with held_elsewhere(s, "a"):
        assert s.acquire("a", blocking=False) is False
        assert s.acquire(colliding_key(s, "a"), blocking=False) is False
        assert s.acquire(distinct_key(s, "a"), blocking=False) is True
        s.release(distinct_key(s, "a"))
    assert s.acquire("a", blocking=False) is True
    s.release("a")


def test_acquire_timeout_expires() -> None:
    s = StripedSections(8)
    with held_elsewhere(s, "a"):
        t0 = time.monotonic()
        assert s.acquire("a", timeout=0.05) is False
        assert time.monotonic() - t0 >= 0.04
        assert s.acquire("a", timeout=0) is False
    assert s.statistics() == SectionStatistics("sections", 8, (), 0)


def test_acquire_timeout_succeeds_when_released_in_time() -> None:
    s = StripedSections(8)
    s.acquire("a")
    result: list[bool] = []
    waiter = start(lambda: result.append(s.acquire("a", timeout=DEADLINE)))
    wait_until(lambda: s.statistics().waiters == 1, "the waiter blocks")
    s.release("a")
    join(waiter)
    assert result == [True]
    s.release("a")


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"blocking": False, "timeout": 1},
            ValueError,
            "can't specify a timeout for a non-blocking call, got timeout=1",
        ),
        ({"timeout": -2}, ValueError, "timeout must be a non-negative number or -1, got -2"),
        ({"timeout": -0.5}, ValueError, "timeout must be a non-negative number or -1, got -0.5"),
        (
            {"timeout": float("nan")},
            ValueError,
            "timeout must be a non-negative number or -1, got nan",
        ),
        ({"timeout": "1"}, TypeError, "timeout must be a number, got str"),
    ],
)
def test_acquire_argument_errors(kwargs: dict, error: type, message: str) -> None:
    s = StripedSections(8)
    with pytest.raises(error, match=rf"^{message}$"):
        s.acquire("a", **kwargs)
    assert s.statistics().held == ()


# -- lock / try_lock ------------------------------------------------------------------------------


def test_lock_binds_the_index_and_releases() -> None:
    s = StripedSections(64)
    with s.lock("unit-7") as index:
        assert index == s.index("unit-7")
        assert s.statistics().held == (index,)
    assert s.statistics().held == ()


def test_lock_releases_on_exception() -> None:
    s = StripedSections(8)
    with pytest.raises(KeyError), s.lock("a"):
        raise KeyError("boom")
    assert s.statistics().held == ()


def test_lock_timeout_raises_section_timeout() -> None:
    """lock(timeout=...) bounds the wait, which Go's mutex cannot, and names section and timeout."""
    s = StripedSections(8, name="emitter")
    i = s.index("a")
    with held_elsewhere(s, "a"):
        message = rf"^section {i} of 'emitter' not acquired within 0.05 s$"
        with pytest.raises(SectionTimeout, match=message) as info, s.lock("a", timeout=0.05):
            pytest.fail("entered a held section")  # pragma: no cover
        assert (info.value.name, info.value.index, info.value.timeout) == ("emitter", i, 0.05)
        assert isinstance(info.value, TimeoutError)
        with pytest.raises(SectionTimeout), s.lock(colliding_key(s, "a"), timeout=0):
            pass  # pragma: no cover


@pytest.mark.parametrize(
    ("timeout", "error", "message"),
    [
        (-1, ValueError, "timeout must be a non-negative number or None, got -1"),
        ("soon", TypeError, "timeout must be a number, got str"),
    ],
)
def test_lock_timeout_errors(timeout: object, error: type, message: str) -> None:
    s = StripedSections(8)
    with pytest.raises(error, match=rf"^{message}$"):
        s.lock("a", timeout=timeout)  # type: ignore[arg-type]
    with pytest.raises(error, match=rf"^{message}$"):
        s.lock_many(["a"], timeout=timeout)  # type: ignore[arg-type]


def test_try_lock_free_and_held() -> None:
    """try_lock binds True and releases on exit; on a held section it binds False, never
    blocks, and does not release the other thread's section on exit."""
    s = StripedSections(8)
    with s.try_lock("a") as held:
        assert held is True
        assert s.statistics().held == (s.index("a"),)
    assert s.statistics().held == ()
    with held_elsewhere(s, "a"):
        with s.try_lock("a") as held:
            assert held is False
        assert s.statistics().held == (s.index("a"),)  # still the holder's
        with s.try_lock(colliding_key(s, "a")) as held:
            assert held is False


# -- mutual exclusion ---------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 4])
def test_mutual_exclusion(count: int) -> None:
    """Threads started together on one key (or on colliding keys, count=1) never overlap, and a
    read-modify-write that yields in the middle loses no update."""
    s = StripedSections(count)
    n_threads, rounds = 6, 300
    barrier = threading.Barrier(n_threads)
    inside = [0]
    overlaps = [0]
    total = [0]
    key_of = ["unit-7"] * n_threads if count > 1 else [f"unit-{t}" for t in range(n_threads)]

    def worker(t: int) -> None:
        barrier.wait(DEADLINE)
        for _ in range(rounds):
            with s.lock(key_of[t]):
                inside[0] += 1
                if inside[0] != 1:
                    overlaps[0] += 1
                value = total[0]
                time.sleep(0)  # hold: invite a thread switch between read and write
                total[0] = value + 1
                inside[0] -= 1

    join(*[start(lambda t=t: worker(t)) for t in range(n_threads)])
    assert overlaps[0] == 0
    assert total[0] == n_threads * rounds
    assert s.statistics() == SectionStatistics("sections", count, (), 0)


def test_distinct_sections_do_not_exclude_each_other() -> None:
    """Two keys in different sections are held at once by two threads."""
    s = StripedSections(64)
    other = distinct_key(s, "a")
    with held_elsewhere(s, "a"), s.lock(other, timeout=DEADLINE):
        assert set(s.statistics().held) == {s.index("a"), s.index(other)}


def test_waiters_are_counted() -> None:
    """statistics().waiters counts threads blocked on a section, until they get it."""
    s = StripedSections(8)
    s.acquire("a")
    entered = threading.Event()

    def waiter() -> None:
        with s.lock("a"):
            entered.set()

    threads = [start(waiter), start(waiter)]
    wait_until(lambda: s.statistics().waiters == 2, "both waiters block")
    assert not entered.is_set()
    s.release("a")
    join(*threads)
    assert s.statistics() == SectionStatistics("sections", 8, (), 0)


# -- the reentry guard -------------------------------------------------------------------------


def test_reentry_same_key_raises_at_once() -> None:
    """A blocking re-acquire of one's own section raises instead of deadlocking."""
    s = StripedSections(8, name="emitter")
    i = s.index("a")
    message = (
        rf"^section {i} of 'emitter' is already held by the caller; "
        r"acquiring it again would deadlock$"
    )
    with s.lock("a"):
        # a broken guard would fail with SectionTimeout, not hang
        with pytest.raises(SectionReentryError, match=message) as info, s.lock("a", timeout=1):
            pass  # pragma: no cover
        assert (info.value.name, info.value.index) == ("emitter", i)
        assert isinstance(info.value, RuntimeError)
        with pytest.raises(SectionReentryError, match=message):
            s.lock("a", timeout=DEADLINE).__enter__()  # raises at once, not after the timeout
        with pytest.raises(SectionReentryError, match=message):
            s.acquire("a", timeout=1)
        with pytest.raises(SectionReentryError, match=message):
            s.acquire("a")
        assert s.acquire("a", blocking=False) is False
        with s.try_lock("a") as held:
            assert held is False
        assert s.statistics().held == (i,)  # still held, once
    assert s.statistics().held == ()


def test_reentry_colliding_key_raises() -> None:
    """The guard is per section: a different key that collides into a held section raises too."""
    s = StripedSections(16)
    other = colliding_key(s, "a")
    with s.lock("a"):
        with pytest.raises(SectionReentryError), s.lock(other, timeout=1):
            pass  # pragma: no cover
        with s.try_lock(other) as held:
            assert held is False
        with s.lock(distinct_key(s, "a")):  # another section is fine
            pass


def test_reentry_guard_is_per_thread() -> None:
    """Another thread blocking on the section waits, it does not raise."""
    s = StripedSections(8)
    got: list[object] = []
    with s.lock("a"):
        waiter = start(lambda: got.append(s.acquire("a", timeout=DEADLINE)))
        wait_until(lambda: s.statistics().waiters == 1, "the other thread waits")
    join(waiter)
    assert got == [True]
    s.release("a")


# -- lock_many ------------------------------------------------------------------------------------


class Recording(StripedSections):
    """Records every call to the two patch points."""

    __slots__ = ("calls",)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.calls: list[tuple] = []

    def _acquire(self, index, key, blocking=True, timeout=-1, canonical=False):  # type: ignore[no-untyped-def]
        self.calls.append(("acquire", index, key, blocking, canonical))
        return super()._acquire(index, key, blocking, timeout, canonical)

    def _release(self, index):  # type: ignore[no-untyped-def]
        self.calls.append(("release", index))
        super()._release(index)


def test_lock_many_ascending_distinct_reverse_release() -> None:
    """Distinct sections, ascending, canonical=True; colliding keys count once; reverse release."""
    s = Recording(16)
    ks = ["zeta", "alpha", colliding_key(s, "alpha"), "mid", 42, b"bytes"]
    expected = sorted({s.index(k) for k in ks})
    with s.lock_many(ks) as indices:
        assert indices == tuple(expected)
        assert s.statistics().held == tuple(expected)
    acquires = [c for c in s.calls if c[0] == "acquire"]
    releases = [c[1] for c in s.calls if c[0] == "release"]
    assert [c[1] for c in acquires] == expected
    assert all(c[3] is True and c[4] is True for c in acquires)  # blocking, canonical
    assert releases == expected[::-1]
    first_key = next(k for k in ks if s.index(k) == s.index("alpha"))
    assert acquires[expected.index(s.index("alpha"))][2] == first_key  # a section's first key
    assert s.statistics().held == ()


def test_lock_many_empty_and_bad_keys() -> None:
    s = StripedSections(8)
    with s.lock_many([]) as indices:
        assert indices == ()
    for single in ("abc", b"abc", bytearray(b"abc"), 5):
        message = rf"^lock_many takes an iterable of keys, got {type(single).__name__}$"
        with pytest.raises(TypeError, match=message):
            s.lock_many(single)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^lock_many takes an iterable of keys, got NoneType$"):
        s.lock_many(None)  # type: ignore[arg-type]


def test_lock_many_timeout_releases_what_it_took() -> None:
    """A timeout on a later section releases the earlier ones and names the section."""
    s = StripedSections(64, name="emitter")
    a, b = sorted(["a", distinct_key(s, "a")], key=s.index)
    with held_elsewhere(s, b):
        message = rf"^section {s.index(b)} of 'emitter' not acquired within 0.05 s$"
        with pytest.raises(SectionTimeout, match=message), s.lock_many([b, a], timeout=0.05):
            pass  # pragma: no cover
        assert s.statistics().held == (s.index(b),)  # a was released
        assert s.acquire(a, blocking=False)
        s.release(a)


def test_lock_many_reentry_releases_what_it_took() -> None:
    """lock_many over a section the caller holds raises the reentry error; only it stays held."""
    s = StripedSections(64)
    low, high = sorted(["a", distinct_key(s, "a")], key=s.index)
    with s.lock(high):
        with pytest.raises(SectionReentryError), s.lock_many([low, high]):
            pass  # pragma: no cover
        assert s.statistics().held == (s.index(high),)


class Yielding(StripedSections):
    """Invites a thread switch before each acquisition, so lock_many calls interleave."""

    __slots__ = ()

    def _acquire(self, index, key, blocking=True, timeout=-1, canonical=False):  # type: ignore[no-untyped-def]
        time.sleep(0)  # ok: yields the GIL between one lock_many's sections (not a wait)
        return super()._acquire(index, key, blocking, timeout, canonical)


def test_lock_many_against_reversed_lock_many() -> None:
    """Two threads taking the same sections with their keys in opposite orders never deadlock
    (a deadlock would surface as SectionTimeout, not as a hang; once on the free-threaded
    3.13.5, 400 rounds took longer than one DEADLINE: ``join_while_progressing``)."""
    s = Yielding(32)
    ks = [f"unit-{i}" for i in range(12)]
    assert len({s.index(k) for k in ks}) > 3
    rounds = 400
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []
    done = [0, 0]

    def worker(t: int, order: list[str]) -> None:
        try:
            barrier.wait(DEADLINE)
            for _ in range(rounds):
                with s.lock_many(order, timeout=DEADLINE):
                    done[t] += 1
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    join_while_progressing((start(lambda: worker(0, ks)), start(lambda: worker(1, ks[::-1]))), done)
    assert errors == []
    assert done == [rounds, rounds]
    assert s.statistics().held == ()


# -- the contract with the instrumentation --------------------------------------------------------


def test_every_entry_point_goes_through_the_patch_points() -> None:
    s = Recording(8)
    i = s.index("a")
    s.acquire("a")
    s.release("a")
    with s.lock("a"):
        pass
    with s.try_lock("a"):
        pass
    with s.lock_many(["a"]):
        pass
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
    """The instrumentor replaces _acquire/_release on the class: arrays made before see it."""
    s = StripedSections(8)
    seen: list[str] = []
    original_acquire, original_release = StripedSections._acquire, StripedSections._release

    def _acquire(self, index, key, blocking=True, timeout=-1, canonical=False):  # type: ignore[no-untyped-def]
        seen.append(f"acquire {key}")
        return original_acquire(self, index, key, blocking, timeout, canonical)

    def _release(self, index):  # type: ignore[no-untyped-def]
        seen.append("release")
        original_release(self, index)

    monkeypatch.setattr(StripedSections, "_acquire", _acquire)
    monkeypatch.setattr(StripedSections, "_release", _release)
    y = distinct_key(s, "x")
    with s.lock("x"), s.try_lock(y):
        pass
    assert seen == ["acquire x", f"acquire {y}", "release", "release"]


# -- statistics and repr --------------------------------------------------------------------------


def test_statistics_is_a_frozen_snapshot() -> None:
    s = StripedSections(4, name="emitter")
    with s.lock_many(["a", "b", "c"]) as indices:
        stats = s.statistics()
    assert stats == SectionStatistics("emitter", 4, indices, 0)
    assert s.statistics().held == ()  # the snapshot did not follow
    with pytest.raises(dataclasses.FrozenInstanceError):
        stats.held = ()  # type: ignore[misc]


def test_repr_shows_live_state() -> None:
    s = StripedSections(256, name="emitter")
    ks = [f"unit-{i}" for i in range(40)]
    chosen: dict[int, str] = {}
    for k in ks:
        chosen.setdefault(s.index(k), k)
    three = list(chosen.values())[:3]
    with s.lock_many(three):
        assert repr(s) == "<StripedSections 'emitter' 256 sections, 3 held>"
    assert repr(StripedSections(1, name="one")) == "<StripedSections 'one' 1 section, 0 held>"


# -- the stale-publish race that sections prevent, scaled down ------------------------------------


class Subscriber:
    """Receives (entity, version) in transport order and notes any regression."""

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()  # send() commits the message's position
        self.last: dict[str, int] = {}
        self.received: list[tuple[str, int]] = []
        self.regressions: list[tuple[str, int, int]] = []

    def send(self, entity: str, version: int) -> None:
        with self._lock:
            previous = self.last.get(entity, -1)
            if version < previous:
                self.regressions.append((entity, previous, version))
            else:
                self.last[entity] = version
            self.received.append((entity, version))


class NoSections:
    """A stand-in that excludes nothing: the race the sections exist to prevent."""

    @contextmanager
    def lock(self, key: str, *, timeout: float | None = None) -> Iterator[None]:
        yield

    @contextmanager
    def try_lock(self, key: str) -> Iterator[bool]:
        yield True

    def statistics(self) -> SectionStatistics:
        return SectionStatistics("none", 1, (), 0)


def run_interleaving(sections: StripedSections | NoSections) -> list[tuple[str, int]]:
    """The stale publish, forced: the sweep loads OLD, the state changes to NEW, the event path
    publishes, then the sweep sends what it loaded."""
    store = {"unit-7": 1}
    subscriber = Subscriber()
    loaded, event_sent = threading.Event(), threading.Event()

    def sweep() -> None:
        with sections.try_lock("unit-7") as held:
            assert held
            version = store["unit-7"]  # load OLD
            loaded.set()
            # hold until the event path has either published or is blocked on the section
            wait_until(
                lambda: event_sent.is_set() or sections.statistics().waiters == 1,
                "the event path publishes or waits",
            )
            subscriber.send("unit-7", version)

    def event() -> None:
        assert loaded.wait(DEADLINE)
        store["unit-7"] = 2  # the state changes: OLD -> NEW
        with sections.lock("unit-7"):
            subscriber.send("unit-7", store["unit-7"])
        event_sent.set()

    join(start(sweep), start(event))
    return subscriber.received


def test_stale_sweep_without_sections_regresses() -> None:
    """The control: with nothing serializing, the subscriber sees NEW then OLD."""
    assert run_interleaving(NoSections()) == [("unit-7", 2), ("unit-7", 1)]


def test_stale_sweep_with_sections_converges() -> None:
    """With the section held from load to send, the subscriber sees OLD then NEW."""
    assert run_interleaving(StripedSections(16)) == [("unit-7", 1), ("unit-7", 2)]


def test_event_path_and_periodic_sweep_never_regress() -> None:
    """Event paths publish under lock(), a sweep under try_lock(), over the same entities
    (8 entities in 4 sections, so some collide); no entity's view ever regresses, every event
    is published, and the sweep gets to publish too: it sweeps until it has, and the events
    are out (beside a loaded machine's other threads, the 3 event paths on the free-threaded
    build were done before it ran at all in 8 runs of about 1,540), so a sweep that never
    publishes is a sweeper stuck at the join."""
    sections = StripedSections(4, name="emitter")
    entities = [f"unit-{i}" for i in range(8)]
    store = dict.fromkeys(entities, 0)
    store_lock = _thread.allocate_lock()
    subscriber = Subscriber()
    n_event_threads, events_each = 3, 300
    barrier = threading.Barrier(n_event_threads + 1)
    stop = threading.Event()
    swept = {"published": 0, "skipped": 0}
    events = [0] * n_event_threads

    def publish(entity: str) -> None:
        version = store[entity]  # load
        time.sleep(0)  # hold: let the other path run between load and send
        subscriber.send(entity, version)  # decide, send, record

    def event_path(t: int) -> None:
        barrier.wait(DEADLINE)
        for n in range(events_each):
            entity = entities[(t * 7 + n * 3) % len(entities)]
            with store_lock:
                store[entity] += 1  # the state changes...
            with sections.lock(entity, timeout=DEADLINE):  # ...and the event must go out
                publish(entity)
            events[t] += 1

    def periodic_sweep() -> None:
        barrier.wait(DEADLINE)
        while not (stop.is_set() and swept["published"]):
            for entity in entities:
                with sections.try_lock(entity) as held:
                    if not held:
                        swept["skipped"] += 1  # a later sweep re-reads fresher state
                        continue
                    publish(entity)
                    swept["published"] += 1

    sweeper = start(periodic_sweep)
    join_while_progressing(
        [start(lambda t=t: event_path(t)) for t in range(n_event_threads)], events
    )
    stop.set()
    join(sweeper)
    assert subscriber.regressions == []
    assert sum(store.values()) == n_event_threads * events_each
    assert subscriber.last == store  # every entity converged on its latest state
    assert sections.statistics().held == ()
