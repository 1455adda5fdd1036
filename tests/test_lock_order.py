"""Which acquisitions make lock-order edges, and the on-cycle policies, through the real
instrumentation: the rules of the lock-order graph's design notes (try-acquires, RLock re-entry,
Condition.wait, early releases, section arrays, the chain cache) and ``warn`` / ``ignore`` /
``raise``.

Every case runs real threads over real instrumented locks, one after another or synchronized
with events and barriers: an inversion is *visible* in a run where nothing deadlocks, which is
the point of a lock-order graph, so no test here needs two threads to race. Each rule is tested
both ways: the hazard is reported, the harmless look-alike is not.

Locks are named with ``name_lock`` where the test reads names; where a test reads creation-site
classes, each lock is created on its own line (lockdep's rule: one site, one class).
"""

# Nested `with` blocks are the subject here: one acquisition per line, so that each witness
# site names its own line.
# ruff: noqa: SIM117

from __future__ import annotations

import asyncio
import gc
import graphlib
import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_lockwatch import (
    AsyncStripedSections,
    LockwatchInstrumentor,
    PotentialDeadlockError,
    StripedSections,
    name_lock,
)
from otel_lockwatch._session import RECORDER
from otel_lockwatch.record._order import LockOrderGraph

JOIN_S = 10.0  # a thread that is not done by then is a failure, never a wait we rely on


def _markers() -> dict[str, int]:
    """Line numbers of the ``# @name`` markers in this file, so sites can be checked exactly."""
    with open(__file__, encoding="utf-8") as f:
        return {
            m.group(1): n
            for n, text in enumerate(f, start=1)
            for m in [re.search(r"# @([\w-]+)$", text.rstrip())]
            if m
        }


LINE = _markers()


def site(function: str, marker: str) -> str:
    """The ``module:function:line`` a witness names for the statement marked ``# @marker``."""
    return f"{__name__}:{function}:{LINE[marker]}"


def run(name: str, fn: Callable[[], Any]) -> None:
    """Run ``fn`` in a thread named ``name`` to completion; re-raise what it raised."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    t = threading.Thread(target=target, name=name)
    t.start()
    t.join(JOIN_S)
    assert not t.is_alive(), f"thread {name} did not finish"
    if errors:
        raise errors[0]


def start(name: str, fn: Callable[[], Any], errors: list[BaseException]) -> threading.Thread:
    """Start ``fn`` in a thread named ``name``; what it raises goes to ``errors``."""

    def target() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=target, name=name)
    t.start()
    return t


def edge_pairs() -> set[tuple[str, str]]:
    return {(w.holding, w.acquiring) for w in RECORDER.graph.edges()}


def cycle_locks() -> list[tuple[str, ...]]:
    return [c.locks for c in RECORDER.graph.cycles()]


def instrumented(on_cycle: str) -> LockwatchInstrumentor:
    """Instrument with an explicit policy (the ``watched`` fixture uses the default)."""
    from opentelemetry.test.test_base import TestBase

    tracer_provider, spans = TestBase.create_tracer_provider()
    RECORDER.reset()
    inst = LockwatchInstrumentor()
    inst.instrument(tracer_provider=tracer_provider, manifest=False, on_cycle=on_cycle)
    inst.lw_spans = spans  # type: ignore[attr-defined]
    inst.lw_tracer = tracer_provider.get_tracer("test")  # type: ignore[attr-defined]
    return inst


@pytest.fixture
def policy(request):
    """Instrumented with ``on_cycle=request.param``; uninstrumented after."""
    inst = instrumented(request.param)
    try:
        yield inst
    finally:
        inst.uninstrument()
        RECORDER.reset()


# -- inversions: reported, with their witnesses ----------------------------------------------


def test_two_thread_inversion_is_reported_with_witnesses(watched):
    """A -> B in w1, then B -> A in w2 (nothing deadlocks) is one cycle whose witnesses name the
    workers, both acquisition sites (the lines of this test), and the spans they ran in."""
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")
    tracer = watched.tracer_provider.get_tracer("test")
    ids: dict[str, Any] = {}

    def w1() -> None:
        with tracer.start_as_current_span("job-1") as span:
            ids["w1"] = span.get_span_context()
            with a:  # @w1-a
                with b:  # @w1-b
                    pass

    def w2() -> None:
        with tracer.start_as_current_span("job-2") as span:
            ids["w2"] = span.get_span_context()
            with b:  # @w2-b
                with a:  # @w2-a
                    pass

    run("w1", w1)
    assert edge_pairs() == {("A", "B")} and cycle_locks() == []
    run("w2", w2)

    [cycle] = RECORDER.graph.cycles()
    assert cycle.locks == ("A", "B")
    ab, ba = cycle.edges
    assert (ab.holding, ab.acquiring, ab.worker) == ("A", "B", "w1")
    assert ab.sites == (site("w1", "w1-a"), site("w1", "w1-b"))
    assert (ab.trace_id, ab.span_id) == (f"{ids['w1'].trace_id:032x}", f"{ids['w1'].span_id:016x}")
    assert (ba.holding, ba.acquiring, ba.worker) == ("B", "A", "w2")
    assert ba.sites == (site("w2", "w2-b"), site("w2", "w2-a"))
    assert (ba.trace_id, ba.span_id) == (f"{ids['w2'].trace_id:032x}", f"{ids['w2'].span_id:016x}")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ab.at)

    order = RECORDER.snapshot()["lock_order"]
    assert order["cycles"] == [cycle.to_json()]
    assert [(e["holding"], e["acquiring"]) for e in order["edges"]] == [("A", "B"), ("B", "A")]


def test_witness_outside_a_span_has_no_trace(watched):
    """No current span: the witness's trace_id and span_id are None."""
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")
    with a, b:
        pass
    [w] = RECORDER.graph.edges()
    assert (w.trace_id, w.span_id) == (None, None)


def test_three_lock_cycle_across_three_threads(watched):
    """A -> B (w1), B -> C (w2), C -> A (w3): no two workers are inverted, the three are; the
    cycle is reported when w3 closes it, with each worker's witness."""
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")
    c = name_lock(threading.Lock(), "C")

    def nest(outer: Any, inner: Any) -> Callable[[], None]:
        def body() -> None:
            with outer:
                with inner:
                    pass

        return body

    run("w1", nest(a, b))
    run("w2", nest(b, c))
    assert cycle_locks() == []
    run("w3", nest(c, a))
    [cycle] = RECORDER.graph.cycles()
    assert cycle.locks == ("A", "B", "C")
    assert [(e.holding, e.acquiring, e.worker) for e in cycle.edges] == [
        ("A", "B", "w1"),
        ("B", "C", "w2"),
        ("C", "A", "w3"),
    ]
    header = cycle.format().splitlines()[0]
    assert header == "possible circular locking dependency: A -> B -> C -> A"


def test_consistent_order_reports_nothing(watched):
    """Every worker takes A before B before C: edges, no cycle."""
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")
    c = name_lock(threading.Lock(), "C")

    def ordered() -> None:
        with a:
            with b:
                with c:
                    pass
        with b:
            with c:
                pass

    for name in ("w1", "w2", "w3"):
        run(name, ordered)
    assert edge_pairs() == {("A", "B"), ("A", "C"), ("B", "C")}
    assert cycle_locks() == []
    assert RECORDER.snapshot()["lock_order"]["cycles"] == []


def test_creation_site_classes(watched):
    """Unnamed locks are classed by creation site: two locks from two lines invert; the edge
    names both creation sites."""
    first = threading.Lock()  # @make-first
    second = threading.Lock()  # @make-second
    fn = "test_creation_site_classes"
    p, q = site(fn, "make-first"), site(fn, "make-second")

    def forward() -> None:
        with first:
            with second:
                pass

    def backward() -> None:
        with second:
            with first:
                pass

    run("w1", forward)
    run("w2", backward)
    assert edge_pairs() == {(p, q), (q, p)}
    assert cycle_locks() == [tuple(sorted((p, q)))]


# -- try-acquires ----------------------------------------------------------------------------


@pytest.mark.parametrize("tried_is_free", [True, False], ids=["try-succeeds", "try-fails"])
def test_try_acquire_inversion_adds_no_edge(watched, tried_is_free):
    """w1 orders A -> B; w2 holds B and *tries* A: a try cannot block, so no B -> A, no cycle,
    whether the try succeeds or finds A held by another thread."""
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")

    def w1() -> None:
        with a:
            with b:
                pass

    run("w1", w1)
    entered, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []
    holder = None
    if not tried_is_free:

        def hold_a() -> None:
            with a:
                entered.set()
                done.wait(JOIN_S)

        holder = start("holder", hold_a, errors)
        assert entered.wait(JOIN_S)

    def w2() -> None:
        with b:
            got = a.acquire(False)
            assert got is tried_is_free
            if got:
                a.release()

    try:
        run("w2", w2)
    finally:
        done.set()
        if holder is not None:
            holder.join(JOIN_S)
    assert not errors
    assert edge_pairs() == {("A", "B")}
    assert cycle_locks() == []


def test_lock_held_through_a_try_orders_the_next_blocking_acquire(watched):
    """w1 takes A with a try, then B blocking: A -> B is an edge (its holding site is the try);
    w2's B -> A then closes the cycle."""
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")

    def w1() -> None:
        assert a.acquire(blocking=False)  # @try-a
        try:
            with b:  # @try-then-b
                pass
        finally:
            a.release()

    def w2() -> None:
        with b:
            with a:
                pass

    run("w1", w1)
    assert RECORDER.graph.witness("A", "B").sites == (site("w1", "try-a"), site("w1", "try-then-b"))
    run("w2", w2)
    assert cycle_locks() == [("A", "B")]


def test_section_try_lock_adds_no_edge(watched):
    """A section taken with try_lock under a held lock adds no edge to the section array."""
    a = name_lock(threading.Lock(), "A")
    sections = StripedSections(16, name="emitter")

    def w1() -> None:
        with sections.lock("k"):
            with a:
                pass

    def w2() -> None:
        with a:
            with sections.try_lock("k") as held:
                assert held

    run("w1", w1)
    run("w2", w2)
    assert edge_pairs() == {("emitter", "A")}
    assert cycle_locks() == []


# -- RLock re-entry --------------------------------------------------------------------------


def test_rlock_reentry_adds_nothing(watched):
    """Re-entering an RLock adds no self-edge, and re-entering it under another lock adds no
    edge back to it: the owner never waits for its own RLock."""
    r = name_lock(threading.RLock(), "R")
    a = name_lock(threading.Lock(), "A")

    def w1() -> None:
        with r:
            with r:
                pass
            with a:
                with r:  # re-entry while holding A: not A -> R
                    pass

    run("w1", w1)
    assert edge_pairs() == {("R", "A")}
    assert cycle_locks() == []


def test_rlock_inversion_is_reported(watched):
    """Two RLocks taken in opposite orders by two workers are a cycle like any other."""
    r1 = name_lock(threading.RLock(), "R1")
    r2 = name_lock(threading.RLock(), "R2")

    def forward() -> None:
        with r1, r1, r2:
            pass

    def backward() -> None:
        with r2, r1:
            pass

    run("w1", forward)
    run("w2", backward)
    assert cycle_locks() == [("R1", "R2")]


# -- Condition.wait --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["RLock", "Lock"])
def test_condition_wait_releases_its_lock(watched, kind):
    """w1 holds C and waits; meanwhile w2 takes A then C and notifies; after the wait w1 leaves C
    and takes A alone. While w1 waits its held stack is empty, and the only order is A -> C: a
    wait that kept C on w1's stack would fake C -> C at the re-acquire, or C -> A later."""
    c = name_lock(getattr(threading, kind)(), "C")
    a = name_lock(threading.Lock(), "A")
    cond = threading.Condition(c)
    waiting = threading.Event()
    ready: list[int] = []
    seen: dict[str, Any] = {}

    def w1() -> None:
        seen["w1"] = RECORDER.thread_state()
        with cond:
            waiting.set()
            assert cond.wait_for(lambda: ready, timeout=JOIN_S)
        with a:
            pass

    def w2() -> None:
        assert waiting.wait(JOIN_S)
        with a:
            with cond:  # granted only once w1 has released C inside wait()
                seen["held while waiting"] = [e.lock_class.name for e in seen["w1"].held]
                ready.append(1)
                cond.notify_all()

    errors: list[BaseException] = []
    t1 = start("w1", w1, errors)
    t2 = start("w2", w2, errors)
    t1.join(JOIN_S)
    t2.join(JOIN_S)
    assert not errors
    assert seen["held while waiting"] == []
    assert edge_pairs() == {("A", "C")}
    assert cycle_locks() == []
    assert not seen["w1"].held  # (a retired state: its stack an empty tuple)


def test_lock_taken_inside_a_condition_block_is_ordered(watched):
    """The other way: taking A while holding the Condition's lock (after the wait) is C -> A,
    which with another worker's A -> C is a cycle."""
    c = name_lock(threading.RLock(), "C")
    a = name_lock(threading.Lock(), "A")
    cond = threading.Condition(c)

    def w1() -> None:
        with cond:
            cond.wait(0)  # returns at once (timed out), holding C again
            with a:
                pass

    def w2() -> None:
        with a:
            with cond:
                pass

    run("w1", w1)
    run("w2", w2)
    assert edge_pairs() == {("C", "A"), ("A", "C")}
    assert cycle_locks() == [("A", "C")]


def test_rlock_and_condition_sites_name_the_caller(watched):
    """Regression (RLockProxy.acquire and threading.Condition were reported as the sites): the
    witness of an RLock or a Condition names the line of the caller's ``with``."""
    r = name_lock(threading.RLock(), "R")
    a = name_lock(threading.Lock(), "A")
    cond = threading.Condition(name_lock(threading.Lock(), "C"))

    def w1() -> None:
        with r:  # @site-r
            with a:  # @site-a-under-r
                pass
        with a:  # @site-a
            with cond:  # @site-cond
                pass

    run("w1", w1)
    assert RECORDER.graph.witness("R", "A").sites == (
        site("w1", "site-r"),
        site("w1", "site-a-under-r"),
    )
    assert RECORDER.graph.witness("A", "C").sites == (site("w1", "site-a"), site("w1", "site-cond"))


# -- released before the next acquire --------------------------------------------------------


def test_released_lock_leaves_no_edge(watched):
    """A released before B is taken (and B before A in another worker): no edge at all."""
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")

    def w1() -> None:
        with a:
            pass
        with b:
            pass

    def w2() -> None:
        b.acquire()
        b.release()
        a.acquire()
        a.release()

    run("w1", w1)
    run("w2", w2)
    assert edge_pairs() == set()
    assert RECORDER.snapshot()["lock_order"] == {"edges": [], "cycles": []}


def test_out_of_order_release_keeps_the_right_locks_held(watched):
    """Releasing the outer lock first leaves only the inner one held: taking C then orders
    B -> C, not A -> C."""
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")
    c = name_lock(threading.Lock(), "C")

    def w1() -> None:
        a.acquire()
        b.acquire()
        a.release()
        with c:
            pass
        b.release()

    run("w1", w1)
    assert edge_pairs() == {("A", "B"), ("B", "C")}


# -- held locks that are gone, reinitialised or handed over ---------------------------------
def _acquire_a_local_lock() -> None:
    local = name_lock(threading.Lock(), "Returned")
    local.acquire()  # returns holding it: only this (returned) frame refers to it


def _acquire_a_lock_a_closure_keeps() -> None:
    # CPython's test_timeout: returns holding a lock that a local function's cell also holds.
    captured = name_lock(threading.Lock(), "Captured")
    captured.acquire()

    def release() -> None:
        captured.release()

    assert release.__closure__


def _acquire_a_lock_a_closure_keeps_and_returns() -> Callable[[], None]:
    kept = name_lock(threading.Lock(), "Returned closure")
    kept.acquire()

    def release() -> None:
        kept.release()

    return release


class _SelfReferring:
    def __init__(self, name: str) -> None:
        self.me = self  # a reference cycle: only the collector frees it
        self.lock = name_lock(threading.Lock(), name)


def _take(lock: Any) -> None:
    lock.acquire()  # returns holding it: its frame and the garbage cycle refer to it


def test_lock_dropped_while_held_orders_nothing(watched, caplog):
    """Regression: a lock dropped while held stayed on the held stack and ordered every later
    acquisition of its thread (CPython's test_threading ended CYCLIC_ORDERING_DETECTED). The
    order check takes it off the stack, counts it and warns once per lock class."""

    def w1() -> None:
        for _ in range(2):
            dropped = name_lock(threading.Lock(), "Dropped")
            dropped.acquire()
            del dropped
            _acquire_a_local_lock()
            _acquire_a_lock_a_closure_keeps()
            release = _acquire_a_lock_a_closure_keeps_and_returns()
            a = name_lock(threading.Lock(), "A")
            b = name_lock(threading.Lock(), "B")
            with a:
                with b:
                    pass
            release()
        assert RECORDER.thread_state().held == []

    with caplog.at_level(logging.WARNING, logger="otel_lockwatch"):
        run("w1", w1)
    # The lock whose closure was returned can still be released: it orders A and B.
    assert edge_pairs() == {("A", "B"), ("Returned closure", "A"), ("Returned closure", "B")}
    assert RECORDER.held_locks_freed == {"Dropped": 2, "Returned": 2, "Captured": 2}
    messages = [r.getMessage() for r in caplog.records if "held lock freed" in r.getMessage()]
    assert [m.split(" (")[0] for m in messages] == [
        "otel-lockwatch: held lock freed: Dropped",
        "otel-lockwatch: held lock freed: Returned",
        "otel-lockwatch: held lock freed: Captured",
    ]
    assert messages[0].endswith("'w1') is gone while held; it orders no later acquisition")


def test_held_lock_still_reachable_still_orders(watched):
    """Only a lock nobody can reach is gone: one kept in a container, reachable through a weak
    reference, a closure's cell or a suspended generator, a local of a running frame, or an
    object alive elsewhere (taken by a function that returned), can still be released, so it
    still orders what follows."""
    import weakref

    kept = [name_lock(threading.Lock(), "Kept")]

    def suspended() -> Any:
        gen_lock = name_lock(threading.Lock(), "Generator")
        gen_lock.acquire()
        yield
        gen_lock.release()

    def w1() -> None:
        kept[0].acquire()
        weak = name_lock(threading.Lock(), "Weak")
        ref = weakref.ref(weak)
        weak.acquire()
        del weak
        cell = name_lock(threading.Lock(), "Cell")

        def release_cell() -> None:
            cell.release()

        cell.acquire()
        gen = suspended()
        next(gen)
        running = name_lock(threading.Lock(), "Running")
        running.acquire()
        resource = _SelfReferring("Helper")  # taken by a function that returned: still alive
        _take(resource.lock)
        a = name_lock(threading.Lock(), "A")
        with a:
            pass
        resource.lock.release()
        running.release()
        next(gen, None)
        release_cell()
        ref().release()  # type: ignore[union-attr]
        kept[0].release()
        assert RECORDER.thread_state().held == []

    run("w1", w1)
    holders = {"Kept", "Weak", "Cell", "Generator", "Running", "Helper"}
    assert {h for h, acquired in edge_pairs() if acquired == "A"} == holders
    assert RECORDER.held_locks_freed == {}


def test_lock_kept_by_a_reference_cycle_is_gone_before_a_cycle_is_reported(watched, caplog):
    """A held lock that only cyclic garbage keeps orders as held until the collector runs; an
    edge from it that would close a cycle runs the collector first, and is not added."""

    def w1() -> None:
        gc.disable()  # the collector must not run on its own here
        try:
            first = _SelfReferring("Cyclic")
            _take(first.lock)
            del first
            a = name_lock(threading.Lock(), "A")
            with a:  # an edge that closes no cycle: added (the lock is not known to be gone)
                pass
            second = _SelfReferring("Cyclic")
            with second.lock:  # Cyclic -> Cyclic would close a cycle: collected first
                pass
        finally:
            gc.enable()
        assert RECORDER.thread_state().held == []

    run("w1", w1)
    assert edge_pairs() == {("Cyclic", "A")}
    assert cycle_locks() == []
    assert RECORDER.held_locks_freed == {"Cyclic": 1}


@pytest.mark.parametrize("kind", ["Lock", "RLock"])
def test_reinitialised_held_lock_leaves_the_held_stack(watched, kind):
    """``_at_fork_reinit()`` on a held lock frees it without a release: its entry goes too, and
    the lock is then taken and released as usual."""

    def w1() -> None:
        reinit = name_lock(getattr(threading, kind)(), "Reinit")
        reinit.acquire()
        reinit._at_fork_reinit()
        assert RECORDER.thread_state().held == []
        a = name_lock(threading.Lock(), "A")
        with a:
            with reinit:
                pass
        assert RECORDER.thread_state().held == []

    run("w1", w1)
    assert edge_pairs() == {("A", "Reinit")}
    assert RECORDER.held_locks_freed == {}


def test_lock_waited_on_by_its_holder_is_no_recursive_locking(watched):
    """A thread that waits on the lock it holds (a lock as a binary semaphore, released by
    another thread: CPython's test_foreign_thread and test_reacquire; or a timed wait on it:
    test_state_after_timeout) orders nothing; two locks of one class held at once in both
    address orders are still recursive locking."""
    handed = name_lock(threading.Lock(), "Handed")
    taken = threading.Event()

    def waiter() -> None:
        handed.acquire()
        assert not handed.acquire(timeout=0.01)
        taken.set()
        # until the main thread releases it
        handed.acquire()  # @handed-over
        handed.release()

    errors: list[BaseException] = []
    t = start("waiter", waiter, errors)
    assert taken.wait(JOIN_S)
    deadline = time.monotonic() + JOIN_S
    while _line_of(t, waiter) != LINE["handed-over"] and time.monotonic() < deadline:
        time.sleep(0.001)  # ok: polling the waiter's line, with a deadline
    handed.release()
    t.join(JOIN_S)
    assert not t.is_alive() and not errors
    assert edge_pairs() == set()
    same = [name_lock(threading.Lock(), "Same") for _ in range(2)]

    def nest(first: Any, second: Any) -> None:
        with first:
            with second:
                pass

    run("w2", lambda: nest(*same))
    run("w2", lambda: nest(*same[::-1]))
    assert edge_pairs() == {("Same", "Same")}


def _line_of(thread: threading.Thread, function: Callable[..., Any]) -> int | None:
    """The line ``thread`` is at in ``function``, if ``function`` is on its stack."""
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None and frame.f_code is not function.__code__:
        frame = frame.f_back
    return None if frame is None else frame.f_lineno


# -- section arrays --------------------------------------------------------------------------


def two_keys(sections: StripedSections | AsyncStripedSections) -> tuple[str, str]:
    """Two keys in different sections, the first with the higher index."""
    keys = [f"key-{i}" for i in range(64)]
    hi = max(keys, key=sections.index)
    lo = min(keys, key=sections.index)
    assert sections.index(hi) > sections.index(lo)
    return hi, lo


def test_nested_sections_of_one_array_are_recursive_locking(watched):
    """Two sections of one array nested with lock() are a self-cycle on the array's name (two
    workers with reversed or colliding keys deadlock), reported as recursive locking."""
    sections = StripedSections(16, name="emitter")
    hi, lo = two_keys(sections)

    def w1() -> None:
        with sections.lock(lo):  # @sec-outer
            with sections.lock(hi):  # @sec-inner
                pass

    run("w1", w1)
    [cycle] = RECORDER.graph.cycles()
    assert cycle.locks == ("emitter",)
    [w] = cycle.edges
    assert (w.holding, w.acquiring, w.worker) == ("emitter", "emitter", "w1")
    assert w.sites == (site("w1", "sec-outer"), site("w1", "sec-inner"))
    assert cycle.format().splitlines()[0].startswith("possible recursive locking: emitter (")


def test_async_section_sites_name_the_caller(watched):
    """The witness of an asyncio section array names the caller's lines, through lock(),
    lock_many() and acquire() alike, never a line of the array's own module: the instrumentation
    skips the frames of the module that defines AsyncStripedSections."""
    inbox = AsyncStripedSections(16, name="inbox")
    outbox = AsyncStripedSections(16, name="outbox")
    hi, lo = two_keys(inbox)

    async def w1() -> None:
        async with inbox.lock(lo):  # @async-outer
            async with inbox.lock_many([hi]):  # @async-inner
                pass

    async def w2() -> None:
        await outbox.acquire(lo)  # @async-acquire-outer
        try:
            assert await outbox.acquire(hi)  # @async-acquire-inner
            outbox.release(hi)
        finally:
            outbox.release(lo)

    async def main() -> None:
        await asyncio.create_task(w1(), name="w1")
        await asyncio.create_task(w2(), name="w2")

    asyncio.run(main())
    witnesses = {w.holding: w for w in RECORDER.graph.edges()}
    assert witnesses.keys() == {"inbox", "outbox"}
    assert witnesses["inbox"].worker == "task:w1"
    assert witnesses["inbox"].sites == (site("w1", "async-outer"), site("w1", "async-inner"))
    assert witnesses["outbox"].sites == (
        site("w2", "async-acquire-outer"),
        site("w2", "async-acquire-inner"),
    )


def test_lock_many_is_canonical(watched):
    """lock_many over the same keys, given in opposite orders by two workers, adds no edge."""
    sections = StripedSections(16, name="emitter")
    hi, lo = two_keys(sections)

    def forward() -> None:
        with sections.lock_many([lo, hi]):
            pass

    def backward() -> None:
        with sections.lock_many([hi, lo]):
            pass

    run("w1", forward)
    run("w2", backward)
    assert edge_pairs() == set()
    assert cycle_locks() == []


def test_nested_lock_many_calls_are_recursive_locking(watched):
    """Regression (every section held from any lock_many call was exempt): lock_many is
    canonical within one call only. A second lock_many nested in a first one over the same array
    is recursive locking (w1: {x} then {y}, w2: {y} then {x} deadlock)."""
    sections = StripedSections(16, name="emitter")
    hi, lo = two_keys(sections)

    def w1() -> None:
        with sections.lock_many([lo]):  # @many-outer
            with sections.lock_many([hi]):  # @many-inner
                pass

    run("w1", w1)
    [cycle] = RECORDER.graph.cycles()
    assert cycle.locks == ("emitter",)
    assert cycle.edges[0].sites == (site("w1", "many-outer"), site("w1", "many-inner"))


def test_lock_many_under_another_lock_is_ordered(watched):
    """lock_many is canonical among its own sections only: under lock A it is A -> emitter,
    and a section held while taking A is emitter -> A, a cycle."""
    a = name_lock(threading.Lock(), "A")
    sections = StripedSections(16, name="emitter")
    hi, lo = two_keys(sections)

    def w1() -> None:
        with a:
            with sections.lock_many([hi, lo]):
                pass

    def w2() -> None:
        with sections.lock(lo):
            with a:
                pass

    run("w1", w1)
    assert edge_pairs() == {("A", "emitter")}
    run("w2", w2)
    assert cycle_locks() == [("A", "emitter")]


# -- the chain cache -------------------------------------------------------------------------


def test_repeated_nesting_hits_the_chain_cache(watched, monkeypatch):
    """The second and later A -> B nestings of a worker do not call graph.add_edge; a new
    worker has its own cache and asks once."""
    calls: list[tuple[str, str]] = []
    original = LockOrderGraph.add_edge

    def counting(self: LockOrderGraph, holding: str, acquiring: str, witness: Any) -> Any:
        calls.append((holding, acquiring))
        return original(self, holding, acquiring, witness)

    monkeypatch.setattr(LockOrderGraph, "add_edge", counting)
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")

    def nest_many() -> None:
        for _ in range(50):
            with a:
                with b:
                    pass

    run("w1", nest_many)
    assert calls == [("A", "B")]
    run("w2", nest_many)
    assert calls == [("A", "B"), ("A", "B")]
    assert len(RECORDER.graph) == 1


# -- policies --------------------------------------------------------------------------------


def lockwatch_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "otel_lockwatch"]


def invert(a: Any, b: Any, worker: str) -> None:
    """Run ``with a: with b:`` in a thread named ``worker``."""

    def body() -> None:
        with a:
            with b:
                pass

    run(worker, body)


@pytest.mark.parametrize("policy", ["warn"], indirect=True)
def test_warn_logs_once_per_distinct_cycle_and_adds_a_span_event(policy, caplog):
    """warn: one log record per distinct cycle (a repeat by another worker adds none), and a
    ``lockwatch.potential_deadlock`` event on the span current at the closing acquisition."""
    caplog.set_level(logging.WARNING, logger="otel_lockwatch")
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")
    c = name_lock(threading.Lock(), "C")
    d = name_lock(threading.Lock(), "D")
    tracer = policy.lw_tracer

    invert(a, b, "w1")
    assert lockwatch_records(caplog) == []

    def w2() -> None:
        with tracer.start_as_current_span("job-2"):
            with b:
                with a:
                    pass

    run("w2", w2)
    invert(b, a, "w3")  # the same cycle again, from a fresh chain cache
    invert(a, b, "w4")
    records = lockwatch_records(caplog)
    assert len(records) == 1
    assert records[0].levelno == logging.WARNING
    assert records[0].getMessage().splitlines()[0] == (
        "otel-lockwatch: possible circular locking dependency: A -> B -> A"
    )
    [span] = [s for s in policy.lw_spans.get_finished_spans() if s.name == "job-2"]
    [event] = [e for e in span.events if e.name == "lockwatch.potential_deadlock"]
    assert tuple(event.attributes["lockwatch.cycle"]) == ("A", "B")
    assert event.attributes["lockwatch.report"] == RECORDER.graph.cycles()[0].format()

    invert(c, d, "w5")
    invert(d, c, "w6")  # a second, distinct cycle: a second record
    assert [r.getMessage().splitlines()[0] for r in lockwatch_records(caplog)] == [
        "otel-lockwatch: possible circular locking dependency: A -> B -> A",
        "otel-lockwatch: possible circular locking dependency: C -> D -> C",
    ]


@pytest.mark.parametrize("policy", ["ignore"], indirect=True)
def test_ignore_records_the_cycle_silently(policy, caplog):
    """ignore: the cycle is in the graph and the snapshot, nothing is logged, no span event."""
    caplog.set_level(logging.DEBUG, logger="otel_lockwatch")
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")
    tracer = policy.lw_tracer
    invert(a, b, "w1")

    def w2() -> None:
        with tracer.start_as_current_span("job-2"):
            with b:
                with a:
                    pass

    run("w2", w2)
    assert cycle_locks() == [("A", "B")]
    assert [c["cycle"] for c in RECORDER.snapshot()["lock_order"]["cycles"]] == [["A", "B"]]
    assert lockwatch_records(caplog) == []
    [span] = [s for s in policy.lw_spans.get_finished_spans() if s.name == "job-2"]
    assert list(span.events) == []


@pytest.mark.parametrize("policy", ["raise"], indirect=True)
def test_raise_refuses_before_blocking_and_leaves_the_lock_alone(policy):
    """raise: w2 holds B and asks for A, which another thread holds; the acquisition that would
    close A -> B -> A raises PotentialDeadlockError at once (it does not wait for the holder),
    A stays held by its holder only, and every later attempt is refused too. The refused edge
    and its cycle are kept for the manifest."""
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")
    invert(a, b, "w1")

    entered, done = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def hold_a() -> None:
        with a:
            entered.set()
            done.wait(JOIN_S)  # a broken policy would block on A until this times out

    holder = start("holder", hold_a, errors)
    assert entered.wait(JOIN_S)
    caught: list[PotentialDeadlockError] = []
    seen: dict[str, Any] = {}

    def w2() -> None:
        with b:
            for _ in range(2):
                with pytest.raises(PotentialDeadlockError) as info:
                    a.acquire()
                caught.append(info.value)
            seen["held"] = [e.lock_class.name for e in RECORDER.thread_state().held]
            seen["A locked, holder alive"] = (a.locked(), holder.is_alive())

    try:
        run("w2", w2)
    finally:
        done.set()
        holder.join(JOIN_S)
    assert not errors
    assert seen["held"] == ["B"]
    assert seen["A locked, holder alive"] == (True, True)
    assert not a.locked()  # released by its holder; w2 never got it
    first, second = caught
    assert first.cycle == second.cycle == ("A", "B")
    assert re.fullmatch(
        r"possible circular locking dependency: A -> B -> A\n"
        r"  A -> B: worker 'w1' held A \(acquired at [\w.]+:body:\d+\) and acquired B "
        r"\(at [\w.]+:body:\d+\), \S+Z\n"
        r"  B -> A: worker 'w2' held B \(acquired at [\w.]+:w2:\d+\) and acquired A "
        r"\(at [\w.]+:w2:\d+\), \S+Z",
        str(first),
    )
    with pytest.raises(
        PotentialDeadlockError, match=r"^possible circular locking dependency: A -> B -> A\n"
    ):
        raise second
    assert first.report == str(first)
    assert edge_pairs() == {("A", "B"), ("B", "A")}
    assert cycle_locks() == [("A", "B")]


@pytest.mark.parametrize("policy", ["raise"], indirect=True)
def test_raise_lets_consistent_orders_through(policy):
    """raise refuses only the acquisition that closes a cycle."""
    a = name_lock(threading.Lock(), "A")
    b = name_lock(threading.Lock(), "B")
    invert(a, b, "w1")
    invert(a, b, "w2")
    assert cycle_locks() == []


@pytest.mark.parametrize("policy", ["raise"], indirect=True)
def test_raise_on_nested_sections(policy):
    """raise also refuses the second lock() of one array; lock_many over both keys goes through."""
    sections = StripedSections(16, name="emitter")
    hi, lo = two_keys(sections)

    def nested() -> None:
        with sections.lock(lo):
            refused = r"^possible recursive locking: emitter \("
            with pytest.raises(PotentialDeadlockError, match=refused):
                with sections.lock(hi):
                    pass
            assert sections.statistics().held == (sections.index(lo),)

    def canonical() -> None:
        with sections.lock_many([hi, lo]):
            pass

    run("w1", canonical)
    run("w2", nested)
    assert sections.statistics().held == ()


# -- property: the live verdict equals an offline check --------------------------------------

# One step of a worker: (op, lock index). op: "take" (blocking), "try", "drop" (release the
# held lock at position index % len(held)).
STEP = st.tuples(st.sampled_from(["take", "take", "take", "try", "drop"]), st.integers(0, 3))
WORKERS = st.lists(st.lists(STEP, min_size=2, max_size=6), min_size=2, max_size=4)


def model_edges(
    workers: list[list[tuple[str, int]]], reentrant: list[bool]
) -> set[tuple[int, int]]:
    """The edges the rules imply, workers run one after another (so every try succeeds)."""
    edges: set[tuple[int, int]] = set()
    for steps in workers:
        held: list[int] = []
        for op, i in steps:
            if op == "drop":
                if held:
                    held.pop(i % len(held))
            elif i in held:
                if reentrant[i]:
                    held.append(i)  # re-entry: no edge, one more level to release
            else:
                if op == "take":
                    edges.update((h, i) for h in held)
                held.append(i)
    return edges


def has_cycle(edges: set[tuple[int, int]]) -> bool:
    sorter: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
    for h, i in edges:
        sorter.add(i, h)
    try:
        sorter.prepare()
    except graphlib.CycleError:
        return True
    return False


def test_live_cycles_match_an_offline_check():
    """Over random per-worker sequences of blocking takes, try-acquires, re-entries and
    out-of-order releases on four real locks, run worker by worker in real threads, the graph's
    edges are the ones the rules imply and it reports a cycle exactly when graphlib finds one."""
    inst = LockwatchInstrumentor()
    inst.instrument(manifest=False, on_cycle="ignore")
    try:
        locks = [
            threading.Lock(),
            threading.Lock(),
            threading.RLock(),
            threading.RLock(),
        ]
        names = [lock._lockwatch_class.name for lock in locks]
        assert len(set(names)) == 4  # one line each: four classes
        reentrant = [False, False, True, True]

        def perform(steps: list[tuple[str, int]]) -> None:
            held: list[int] = []
            for op, i in steps:
                if op == "drop":
                    if held:
                        locks[held.pop(i % len(held))].release()
                elif i in held and not reentrant[i]:
                    continue  # a blocking re-take of a held Lock would hang; a try would fail
                elif op == "take":
                    locks[i].acquire()
                    held.append(i)
                else:
                    assert locks[i].acquire(blocking=False)
                    held.append(i)
            for i in reversed(held):
                locks[i].release()

        @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(WORKERS)
        def check(workers: list[list[tuple[str, int]]]) -> None:
            RECORDER.reset()
            for n, steps in enumerate(workers):
                run(f"w{n}", lambda steps=steps: perform(steps))
            expected = model_edges(workers, reentrant)
            assert edge_pairs() == {(names[h], names[i]) for h, i in expected}
            assert bool(RECORDER.graph.cycles()) == has_cycle(expected)

        check()
    finally:
        inst.uninstrument()
        RECORDER.reset()


def test_property_strategy_reaches_cycles():
    """The property above is not vacuous: its model finds cycles for some inputs."""
    plain = [False] * 4
    assert has_cycle(model_edges([[("take", 0), ("take", 1)], [("take", 1), ("take", 0)]], plain))
    released = [("take", 0), ("drop", 0), ("take", 1)]
    assert not has_cycle(model_edges([released, [("take", 1), ("try", 0)]], plain))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
