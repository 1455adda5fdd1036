"""``ordered(*locks, key=id)``: locks of one class taken in one canonical order are known to be
ordered, and only those.

The workload is the transfer between two accounts, each with its own lock created at one site
(so one lock class): correct when both locks are taken in ``id()`` order, whichever account is
the source. Written with ``ordered``, the order check sees no edge between them. Written by hand
in ``id()`` order, it sees two locks of one class nested, always in one address order, which it
takes as ordered (``record._nesting``); by hand in the accounts' order (source
first), both address orders, and recursive locking.
"""

# Nested `with` blocks are the subject here: one acquisition per line.
# ruff: noqa: SIM117

from __future__ import annotations

import math
import threading
from typing import Any

import pytest

import otel_lockwatch
from otel_lockwatch import PotentialDeadlockError, Verdict, evaluate, name_lock, ordered
from otel_lockwatch._session import RECORDER

THREADS = 8
TRANSFERS = 200
JOIN_S = 30.0


class Account:
    def __init__(self, balance: int) -> None:
        self.balance = balance
        self.lock = threading.Lock()  # one site: every account's lock is of one class


def transfer(src: Account, dst: Account, amount: int) -> None:
    with ordered(src.lock, dst.lock):
        src.balance -= amount
        dst.balance += amount


def transfer_by_hand(src: Account, dst: Account, amount: int) -> None:
    first, second = sorted((src, dst), key=lambda account: id(account.lock))
    with first.lock:
        with second.lock:  # correct: always in one address order
            src.balance -= amount
            dst.balance += amount


def transfer_source_first(src: Account, dst: Account, amount: int) -> None:
    with src.lock:
        with dst.lock:  # a -> b and b -> a: deadlocks when two of them meet
            src.balance -= amount
            dst.balance += amount


def run_transfers(move: Any) -> tuple[Account, Account]:
    """``move`` from 8 threads, half of them a -> b and half b -> a, started together."""
    a, b = Account(10_000), Account(10_000)
    start = threading.Barrier(THREADS)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            start.wait(JOIN_S)
            src, dst = (a, b) if n % 2 else (b, a)
            for _ in range(TRANSFERS):
                move(src, dst, 1)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,), name=f"w{n}") for n in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads)
    if errors:
        raise errors[0]
    assert a.balance + b.balance == 20_000
    return a, b


def edge_pairs() -> set[tuple[str, str]]:
    return {(w.holding, w.acquiring) for w in RECORDER.graph.edges()}


def test_ordered_is_exported():
    assert "ordered" in otel_lockwatch.__all__
    assert otel_lockwatch.ordered is ordered


def measured_size(manifest) -> int:
    """The recommended size the manifest's own sizing gives: the tightest bottleneck's workers
    plus 10 %, rounded up, at most the pool; the pool when nothing limited it; the verdict's
    fraction when the run measured too little."""
    sizing = manifest.sizing
    if sizing["basis"] == "verdict":
        return {
            Verdict.CYCLIC_ORDERING_DETECTED: THREADS // 2,
            Verdict.STARVATION_OBSERVED: THREADS // 2,
            Verdict.HOT_LOCK_DETECTED: THREADS * 3 // 4,
        }.get(manifest.verdict, THREADS)
    if not sizing["bottlenecks"]:
        return THREADS
    return min(THREADS, math.ceil(sizing["workers_supported"] * 1.1 - 1e-9))


@pytest.mark.parametrize("on_cycle", ["warn", "raise"])
def test_ordered_transfer_from_both_sides_is_no_cycle(make_watched, on_cycle):
    """The transfer written with ``ordered``, from 8 threads in both directions: no edge, no
    cycle, no PotentialDeadlockError under ``raise``, and a verdict from contention alone."""
    make_watched(on_cycle=on_cycle, pool_size=THREADS)
    a, _ = run_transfers(transfer)
    assert edge_pairs() == set()
    manifest = evaluate()
    assert manifest.pre_deadlock_ordering_witness == []
    assert manifest.verdict != Verdict.CYCLIC_ORDERING_DETECTED
    account_lock = a.lock._lockwatch_class.name
    stats = manifest.locks[account_lock]
    assert stats["acquisitions"] == 2 * THREADS * TRANSFERS
    if manifest.verdict == Verdict.LOW_CONTENTION:
        assert manifest.hot_lock_register == []
    assert manifest.recommended_pool_size == measured_size(manifest)


@pytest.mark.parametrize("on_cycle", ["warn", "raise"])
def test_by_hand_in_id_order_the_nesting_is_ordered(make_watched, on_cycle):
    """The same transfer by hand, in ``id()`` order from both sides: every nesting of the class
    takes its two locks in one address order, so no edge, no cycle, nothing raised."""
    make_watched(on_cycle=on_cycle, pool_size=THREADS)
    run_transfers(transfer_by_hand)
    assert edge_pairs() == set()
    assert RECORDER.graph.cycles() == []
    assert evaluate(pool_size=THREADS).verdict != Verdict.CYCLIC_ORDERING_DETECTED


def test_source_first_by_hand_is_recursive_locking(watched):
    """The transfer that takes the source's lock first, from both sides (it can deadlock): the
    class is nested in both address orders, recursive locking, reported with the first witness
    of each order."""
    a, b = Account(1), Account(1)
    low, high = sorted((a, b), key=lambda account: id(account.lock))
    transfer_source_first(low, high, 1)
    assert edge_pairs() == set()  # one address order so far
    transfer_source_first(high, low, 1)
    name = a.lock._lockwatch_class.name
    assert edge_pairs() == {(name, name)}
    [cycle] = RECORDER.graph.cycles()
    assert cycle.locks == (name,)
    manifest = evaluate(pool_size=THREADS)
    assert manifest.verdict == Verdict.CYCLIC_ORDERING_DETECTED
    # The cycle does not size the pool: what the locks supported does (docs/sizing.md).
    assert manifest.recommended_pool_size == measured_size(manifest)


def test_both_address_orders_are_named_in_the_report(make_watched, caplog):
    """The warning names the nesting that closed the cycle and the first one the other way."""
    make_watched(on_cycle="warn")
    a, b = Account(1), Account(1)
    low, high = sorted((a, b), key=lambda account: id(account.lock))
    with caplog.at_level("WARNING", logger="otel_lockwatch"):
        transfer_source_first(low, high, 1)
        transfer_source_first(high, low, 1)
    [report] = [r.getMessage() for r in caplog.records if "recursive locking" in r.getMessage()]
    lines = report.splitlines()
    assert lines[0].startswith("otel-lockwatch: possible recursive locking: ")
    assert len(lines) == 3
    assert lines[2].startswith("  in the other address order before: ")
    assert "transfer_source_first" in lines[1] and "transfer_source_first" in lines[2]


def test_ordered_locks_still_order_what_is_around_them(watched):
    """A lock held before the call orders each of its locks, and each of them orders what is
    taken inside the block; the sites are the caller's lines."""
    outer = name_lock(threading.Lock(), "Outer")
    first = name_lock(threading.Lock(), "First")
    second = name_lock(threading.RLock(), "Second")
    inner = name_lock(threading.Lock(), "Inner")
    with outer:
        with ordered(second, first) as taken:
            assert set(taken) == {first, second}
            with inner:
                pass
    assert edge_pairs() == {
        ("Outer", "First"),
        ("Outer", "Second"),
        ("Outer", "Inner"),
        ("First", "Inner"),
        ("Second", "Inner"),
    }
    witness = RECORDER.graph.witness("Outer", "First")
    assert witness is not None
    assert witness.sites[1].startswith(f"{__name__}:test_ordered_locks_still_order_what_is_around_")
    assert RECORDER.thread_state().held == []


def test_ordered_takes_in_key_order_and_releases_in_reverse():
    """Works on any lock, watched or not: ascending ``key``, a lock given twice taken once,
    released in reverse; an error midway releases what was taken."""
    log: list[str] = []

    class Logged:
        def __init__(self, name: str) -> None:
            self.name = name

        def acquire(self) -> bool:
            if self.name == "boom":
                raise OSError("boom")
            log.append(f"+{self.name}")
            return True

        def release(self) -> None:
            log.append(f"-{self.name}")

    b, a, c = Logged("b"), Logged("a"), Logged("c")
    held = ordered(b, a, c, b, key=lambda lock: lock.name)
    assert repr(held) == "<ordered 3 locks, 0 held>"
    with held as taken:
        assert taken == (a, b, c)
        assert repr(held) == "<ordered 3 locks, 3 held>"
        with pytest.raises(RuntimeError, match=r"^this ordered\(\) already holds its locks$"):
            held.__enter__()
    assert log == ["+a", "+b", "+c", "-c", "-b", "-a"]
    log.clear()
    with pytest.raises(OSError, match=r"^boom$"):
        with ordered(a, Logged("boom"), c, key=lambda lock: lock.name):
            pass
    assert log == ["+a", "-a"]


def test_ordered_refuses_what_is_not_a_lock():
    with pytest.raises(TypeError, match=r"^ordered\(\) takes locks, got int$"):
        ordered(threading.Lock(), 3)


def test_ordered_under_raise_leaves_other_inversions_alone(make_watched):
    """Only the locks of one call are exempt: the same two account locks nested by hand in the
    other order are still refused under ``raise``."""
    make_watched(on_cycle="raise")
    low, high = sorted((Account(1), Account(1)), key=lambda account: id(account.lock))
    run_transfers(transfer)
    with low.lock:
        with high.lock:  # by hand, one address order: ordered so far
            pass
    with high.lock:
        with pytest.raises(PotentialDeadlockError, match=r"^possible recursive locking: "):
            low.lock.acquire()


def test_multidicts_pair_lock_is_ordered_from_both_sides(make_watched):
    """A real library's address-ordered pair: the pure-Python multidict (the implementation it
    falls back to where it has no C extension, the free-threaded build among them) takes
    ``self._lock`` and the other dict's ``RLock`` in ``id()`` order in ``update``. Two threads
    updating each dict from the other nest the two locks, one address order every time: no
    cycle, nothing refused under ``raise``."""
    from multidict._multidict_py import MultiDict  # (the pure-Python one, whatever is built)

    make_watched(on_cycle="raise")
    a, b = MultiDict(a=1), MultiDict(b=2)
    assert a._lock._lockwatch_class is b._lock._lockwatch_class  # one class: multidict's site
    start = threading.Barrier(2)
    errors: list[BaseException] = []

    def update(dst: Any, src: Any) -> None:
        try:
            start.wait(JOIN_S)
            for _ in range(TRANSFERS):
                dst.update(src)
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    threads = [  # (daemons: a pair left held by a refusal must not keep the run from ending)
        threading.Thread(target=update, args=(a, b), daemon=True),
        threading.Thread(target=update, args=(b, a), daemon=True),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads)
    assert errors == []
    assert dict(a) == dict(b) == {"a": 1, "b": 2}
    name = a._lock._lockwatch_class.name
    assert name.startswith("multidict._multidict_py:")
    assert RECORDER.graph.nestings.order(name) is not None  # the pair was nested, and seen
    assert edge_pairs() == set()
    assert RECORDER.graph.cycles() == []
