"""``ordered(*locks, key=id)``: locks of one class taken in one canonical order are known to be
ordered, and only those.

The workload is the transfer between two accounts, each with its own lock created at one site
(so one lock class): correct when both locks are taken in ``id()`` order, whichever account is
the source. Written by hand, the order check sees two locks of one class nested (recursive
locking); written with ``ordered``, it sees no edge between them.
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
        with second.lock:  # correct, but the order check cannot tell
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


def test_without_ordered_the_nesting_is_still_recursive_locking(watched):
    """The same transfer by hand (correct, id()-ordered) is reported as before: two locks of one
    class nested is recursive locking, since nothing says they are ordered."""
    a, _ = run_transfers(transfer_by_hand)
    name = a.lock._lockwatch_class.name
    assert edge_pairs() == {(name, name)}
    manifest = evaluate(pool_size=THREADS)
    assert manifest.verdict == Verdict.CYCLIC_ORDERING_DETECTED
    # The cycle does not size the pool: what the locks supported does (docs/sizing.md).
    assert manifest.recommended_pool_size == measured_size(manifest)


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
    accounts = sorted((Account(1), Account(1)), key=lambda account: id(account.lock))
    run_transfers(transfer)
    with accounts[0].lock:
        with pytest.raises(PotentialDeadlockError, match=r"^possible recursive locking: "):
            accounts[1].lock.acquire()
