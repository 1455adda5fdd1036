"""The C fast path (``otel_lockwatch.capture._speedups``) against the pure-Python path it mirrors.

The pure-Python path is the reference: the core suites run against it too (in a subprocess with
``LOCKWATCH_DISABLE_EXTENSIONS=1``, since the path is chosen at import), and a workload that goes
through every entry point records the same thing on both paths.
"""

from __future__ import annotations

import _thread
import gc
import json
import os
import platform
import subprocess
import sys
import sysconfig
import threading
import time
import weakref
from pathlib import Path
from typing import Any

import pytest

from otel_lockwatch import StripedSections
from otel_lockwatch._session import OUTBOX, RECORDER
from otel_lockwatch.capture import _fast_path, _threading
from otel_lockwatch.capture._bookkeeping import HOLD_FIELDS, Hold
from otel_lockwatch.capture._sections import ARRAY_FIELDS, TRACK_FIELDS, ArrayTrack
from otel_lockwatch.record._handoff_stats import HANDOFF_FIELDS, HandoffStats
from otel_lockwatch.record._recorder import WORKER_FIELDS, WorkerState
from otel_lockwatch.record._stats import STATS_FIELDS, Stats
from otel_lockwatch.sections._threaded import StripedSections as _Sections

ROOT = Path(__file__).resolve().parent.parent
needs_c = pytest.mark.skipif(not _fast_path.SPEEDUPS, reason="the C extension is not in use")
# What the C path reads and writes: each class with its table of field names.
TABLES = (
    (WorkerState, WORKER_FIELDS),
    (Stats, STATS_FIELDS),
    (Hold, HOLD_FIELDS),
    (ArrayTrack, TRACK_FIELDS),
    (_Sections, ARRAY_FIELDS),
    (HandoffStats, HANDOFF_FIELDS),
)
_BUILDABLE = (  # setup.py builds the extension under these conditions (its _wanted())
    platform.python_implementation() == "CPython"
    and sys.version_info >= (3, 11)
    and sys.platform.startswith("linux")
)
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


def _env(pure: bool) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("LOCKWATCH_DISABLE_EXTENSIONS", None)
    if pure:
        env["LOCKWATCH_DISABLE_EXTENSIONS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def test_extension_is_in_use_where_it_builds():
    """Where setup.py builds the extension (CPython 3.11+ on Linux), CI fails without it: the
    README's figures are those of the C path, and a silent fallback would hide a broken build."""
    if not _BUILDABLE or os.environ.get("LOCKWATCH_DISABLE_EXTENSIONS"):
        pytest.skip("the extension is not built on this interpreter, or is turned off")
    if not _fast_path.SPEEDUPS and os.environ.get("CI", "").lower() != "true":
        pytest.skip("the extension is not built here (a failure under CI=true)")
    assert _fast_path.SPEEDUPS, "otel_lockwatch.capture._speedups did not build or does not import"
    assert _threading.LockProxy.__mro__[1] is _fast_path.speedups.LockBase
    assert _threading.RLockProxy.__mro__[1] is _fast_path.speedups.RLockBase


def test_disable_variable_selects_the_python_path():
    """``LOCKWATCH_DISABLE_EXTENSIONS=1`` gives the pure-Python path (read at import)."""
    code = (
        "from otel_lockwatch.capture import _fast_path, _threading; "
        "print(_fast_path.SPEEDUPS, _threading.LockProxy.__mro__[1])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=_env(True), capture_output=True, text=True, check=True
    ).stdout.split(None, 1)
    assert out[0] == "False"
    assert "PyLockBase" in out[1]


@needs_c
def test_every_slot_is_read_at_its_offset():
    """The C path reads the fields it names, each one of its class's table (in any order: C
    addresses none by its position), at their slot's offset; a retyped slot would silently fall
    back to the (slower, still correct) generic lookup."""
    slots = _fast_path.speedups.direct_slots()
    assert [name for name, direct in slots.items() if not direct] == []
    for cls, fields in TABLES:
        read = [key.split(".", 1)[1] for key in slots if key.split(".", 1)[0] == cls.__name__]
        assert read, f"the C path reads nothing of {cls.__name__}"
        assert set(read) <= set(fields), set(read) - set(fields)
    assert len(slots) == sum(
        len([k for k in slots if k.startswith(cls.__name__ + ".")]) for cls, _ in TABLES
    )


def test_tables_are_the_slots():
    """Each table is its class's ``__slots__`` (the names the C path is given are the fields the
    class has), and a Python lock proxy keeps its hold under the same names as a section's."""
    for cls, fields in (*TABLES[:4], TABLES[5]):
        assert [n for n in cls.__slots__ if n != "__weakref__"] == list(fields)
    assert set(HOLD_FIELDS) <= set(_threading.PyLockBase.__slots__)


@needs_c
def test_c_proxies_keep_the_hold_under_the_table_names():
    """The C ``LockBase`` names its hold's members from ``HOLD_FIELDS`` (given at setup): the
    Python code reads and writes a C proxy's hold as a Python one's."""
    base = _fast_path.speedups.LockBase
    for name in HOLD_FIELDS:
        assert type(vars(base)[name]).__name__ == "member_descriptor", name
    lock = _threading.LockProxy.watch(_thread.allocate_lock(), None)
    holder, _entry, _stats, start_ns, _context = HOLD_FIELDS  # read by the table's names
    assert getattr(lock, holder) is None
    setattr(lock, start_ns, 12)
    assert getattr(lock, start_ns) == 12


@needs_c
def test_c_stats_are_read_and_merged_under_the_table_names(watched):
    """On the C path a worker's Stats keeps the counters the uncontended path writes as C
    integers (``StatsBase``, named from ``STATS_FIELDS``): Python reads, writes and merges them
    under the same names, and reading the hold histogram gives every hold, those still pending
    in C included, whichever buckets they fell in."""
    from otel_lockwatch.capture._fast_path import new_stats

    base = _fast_path.speedups.StatsBase
    assert base in type(new_stats()).__mro__
    owned = [name for name in STATS_FIELDS if name in vars(base)]
    assert owned == list(STATS_FIELDS[: len(owned)]) and len(owned) >= 7
    lock = threading.Lock()
    for n in range(3000):
        with lock:
            sum(range(n % 64 * 16))  # holds of many lengths: more buckets than 16 pending entries
    (s,) = [s for cls, s in RECORDER.thread_state().stats.items() if cls is lock._lockwatch_class]
    assert type(s).__mro__[1] is base
    assert s.acquisitions == 3000 and s.try_acquisitions == 0 and s.skipped == 0
    assert sum(s.hold_histogram.values()) == 3000
    assert 0 < s.hold_min_ns <= s.hold_max_ns <= s.hold_total_ns
    with lock:
        pass
    assert sum(s.hold_histogram.values()) == 3001  # read again: the new hold is in
    other = new_stats()
    other.acquisitions = 5
    other.hold_histogram = {3: 2}
    other.hold_total_ns = 6
    s.merge(other)
    assert s.acquisitions == 3006 and s.hold_histogram[3] >= 2
    assert sum(s.hold_histogram.values()) == 3003


@needs_c
def test_c_hold_histogram_holds_no_more_memory_for_more_holds(make_watched):
    """The C path counts a hold's bucket in the worker's fixed array (every hold under 34 s), made
    past its first few acquisitions (whose holds go to the dict): holds of lengths not seen
    before add no memory, and reading the histogram gives them all."""
    import tracemalloc

    make_watched(hold_metric_floor_ms=1000, hold_span_threshold_ms=1000)  # no hold goes on
    lock = threading.Lock()
    for _ in range(5):  # past the first few: the array is made
        with lock:
            pass
    (s,) = [s for cls, s in RECORDER.thread_state().stats.items() if cls is lock._lockwatch_class]
    snapshots: list[Any] = [None, None]

    def snapshot() -> None:
        gc.collect()
        snapshots[snapshots.index(None)] = tracemalloc.take_snapshot()

    def hold(*phases: Any) -> None:  # one frame throughout (a held-stack entry keeps its frame)
        for phase in phases:
            if callable(phase):
                phase()
                continue
            for n in phase:
                with lock:
                    sum(range(n))
            n = 0  # noqa: PLW2901 (no int of the last length left in the frame)

    tracemalloc.start()
    try:  # 200 holds of ~100 ns to ~80 us (under the metric floor) between the snapshots
        hold(range(1), snapshot, range(0, 8192, 41), snapshot)
    finally:
        tracemalloc.stop()
    before, after = snapshots
    # what the C path allocates is charged to the Python line that runs it: hold()'s (the
    # emitter thread's first sample, say, is charged to its own code). Not snapshot()'s lines:
    # its gc.collect() runs the finalizers of whatever garbage the tests before this one left,
    # which keep what they make (in a whole run on 3.15: one 32-byte block more at the second
    # collection, charged to the gc.collect() line, none to a hold).
    lines = sorted({line for _, _, line in hold.__code__.co_lines() if line is not None})
    here = [tracemalloc.Filter(True, __file__, line) for line in lines]
    grown = after.filter_traces(here).compare_to(before.filter_traces(here), "lineno")
    assert sum(d.size_diff for d in grown) <= 0, [str(d) for d in grown[:3]]
    buckets = s.hold_histogram
    assert sum(buckets.values()) == 6 + 200 and len(buckets) > 16  # more than 16 lengths
    # (the 16 pending entries it had before held up to 16 buckets without a dict entry)


@needs_c
@pytest.mark.skipif(
    FREE_THREADED,
    reason="the free-threaded build never reuses an entry: a waiter may be reading the hold's "
    "_lw_entry while its reference count is 1 (_speedups.c's header)",
)
def test_a_locks_entry_serves_again_from_a_new_frame(watched):
    """A task is a new frame each time: the lock's held-stack entry, referred to by nothing else
    once released, is used again with the new frame set in it (no tuple made per acquisition),
    and always names the frame that holds the lock now."""
    lock = threading.Lock()
    seen: list[tuple[int, bool]] = []

    def task() -> None:
        with lock:
            entry = RECORDER.thread_state().held[-1]
            seen.append((id(entry), entry[1] is sys._getframe() and entry[3] is lock))
            del entry

    for _ in range(3):
        task()
    assert [named for _, named in seen] == [True] * 3
    assert len({entry for entry, _ in seen}) == 1, seen


def _try_on_another_thread(lock: object) -> bool:
    """``lock.acquire(False)`` from another thread (which then ends, holding what it took)."""
    taken: list[bool] = []
    other = threading.Thread(target=lambda: taken.append(lock.acquire(False)))  # type: ignore[attr-defined]
    other.start()
    other.join()
    return taken[0]


@needs_c
def test_a_raw_locks_try_runs_without_its_method_where_its_layout_is_known(watched):
    """On 3.11 and 3.12 the C path takes a ``_thread.lock`` or ``RLock`` without calling its
    ``acquire`` (whose argument parsing cost as much as the rest of it), once the lock's layout
    is checked at import; the lock is then in the state its own acquire leaves: held (by this
    thread, once, for an RLock), refused to another try, released by its own ``release``."""
    if sys.version_info < (3, 13):
        assert _fast_path.speedups.raw_lock_layout() == (True, True)
    lock = threading.Lock()
    for blocking in (True, False):
        assert lock.acquire(blocking)
        assert lock.locked() and lock._lw_lock.locked()
        assert not lock._lw_lock.acquire(False)
        lock.release()  # the raw lock's own release, which checks that it is held
        assert not lock.locked()
        with pytest.raises(RuntimeError):
            lock._lw_lock.release()
    rlock = threading.RLock()
    for blocking in (True, False):
        assert rlock.acquire(blocking)
        assert rlock._is_owned() and rlock._recursion_count() == 1
        with rlock:  # the owner's re-entry
            assert rlock._recursion_count() == 2
        assert not _try_on_another_thread(rlock._lw_lock)
        rlock.release()
        assert not rlock._is_owned() and rlock._recursion_count() == 0
        with pytest.raises(RuntimeError):
            rlock._lw_lock.release()
    assert RECORDER.thread_state().held == []


@needs_c
def test_c_clock_is_perf_counter_ns():
    """The C path's timestamps mix with the Python slow path's: it must be the same clock."""
    for _ in range(100):
        before = time.perf_counter_ns()
        c = _fast_path.speedups.now_ns()
        after = time.perf_counter_ns()
        assert before <= c <= after


@needs_c
def test_section_methods_bind_and_unwrap_like_functions(watched):
    """The instrumented ``_acquire`` / ``_release`` bind as methods, look like the originals,
    and ``uninstrument()`` puts the originals back."""
    acquire = _Sections.__dict__["_acquire"]
    release = _Sections.__dict__["_release"]
    assert type(acquire).__name__ == "SectionAcquire"
    assert type(release).__name__ == "SectionRelease"
    original = acquire.__wrapped__
    assert acquire.__name__ == "_acquire"
    assert acquire.__doc__ == original.__doc__
    sections = StripedSections(8, name="bound")
    assert sections._acquire(3, "k") is True
    assert sections._owners[3] == threading.get_ident()
    sections._release(3)
    assert sections._owners[3] is None
    watched.instrumentor.uninstrument()
    try:
        assert _Sections.__dict__["_acquire"] is original
        assert _Sections.__dict__["_release"] is release.__wrapped__
    finally:
        watched.instrumentor.instrument(
            tracer_provider=watched.tracer_provider,
            meter_provider=watched.meter_provider,
            manifest=False,
        )


@needs_c
def test_a_subclass_takes_the_generic_path_and_is_recorded(watched):
    """Offsets are used for the exact classes only: a subclass of ``StripedSections`` (another
    layout) is read through ordinary attribute access, and recorded the same."""

    class Mine(StripedSections):
        __slots__ = ("extra",)

    mine = Mine(16, name="mine")
    for _ in range(5):
        with mine.lock("k"):
            pass
    assert mine.try_lock("k").__enter__()
    mine.release("k")
    snap = RECORDER.snapshot()["locks"]["mine"]
    assert snap["acquisitions"] == 6


@needs_c
def test_a_bookkeeping_error_is_counted_never_raised(watched, caplog):
    """An error inside the C bookkeeping, after the lock is taken or released, goes to
    OUTBOX.failed; the host sees the lock's own result."""
    lock = threading.Lock()
    with lock:
        pass
    st = RECORDER.thread_state()
    (stats,) = [s for cls, s in st.stats.items() if cls is lock._lockwatch_class]
    before = OUTBOX.errors
    stats.hold_histogram = None  # the release's histogram update now fails
    with lock:
        pass
    assert not lock.locked()
    assert OUTBOX.errors == before + 1
    stats.hold_histogram = {}
    with lock:
        assert lock.locked()
    assert not lock.locked()
    assert st.held == []


@needs_c
def test_proxies_are_collected_and_weakly_referenced(watched):
    """LockBase is a GC type with weak references: a dropped lock, even one whose held-stack
    entry (which refers to a frame) made a cycle, is freed."""
    refs = []
    for _ in range(10):
        lock = threading.Lock()
        with lock:
            pass
        refs.append(weakref.ref(lock))
        del lock
    gc.collect()
    assert [r for r in refs if r() is not None] == []


def test_both_paths_record_the_same():
    """Every entry point, run once on each path: the same counts, holds, skips, errors raised to
    the caller, held stacks, and lock-order witnesses (with the same acquisition sites)."""
    script = ROOT / "tests" / "data" / "speedups_workload.py"
    runs = {}
    for pure in (False, True):
        proc = subprocess.run(
            [sys.executable, str(script)],
            env=_env(pure),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0, proc.stderr
        runs[pure] = json.loads(proc.stdout)
    assert runs[True]["speedups"] is False
    if not _fast_path.SPEEDUPS:
        pytest.skip("the C extension is not in use: nothing to compare")
    assert runs[False]["speedups"] is True
    c, python = dict(runs[False]), dict(runs[True])
    c.pop("speedups")
    python.pop("speedups")
    # The hand-off paths' common calls run in C (the same records as the Python wrappers').
    assert c.pop("handoff_paths") == ["SemaphoreAcquire", "SemaphoreRelease", "ConditionNotify"]
    assert python.pop("handoff_paths") == ["function", "function", "function"]
    assert c["handoffs"]["sem"]["pool"]["checkouts"] > 20
    assert c == python
    assert c["errors"] == 0
    assert c["held"] == []


# The suites that pin down the lock path's behaviour, and the manifest reader's and the merge's
# (which have a C fast path of their own, ``record/_merge_speedups.c``): run again on the reference
# path, one subprocess each (so that pytest-xdist spreads them over its workers).
PURE_RERUN_SUITES = [
    "tests/test_instrumentation.py",
    "tests/test_lock_conformance.py",
    "tests/test_lock_order.py",
    "tests/test_ordered.py",
    "tests/test_sections.py",
    "tests/test_async_sections.py",
    "tests/test_scenarios.py",
    "tests/test_live_gauges.py",
    "tests/test_hostile.py",
    "tests/test_merge.py",
    "tests/test_histogram.py",
]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("suite", PURE_RERUN_SUITES)
def test_core_suites_pass_on_the_pure_python_path(suite):
    """Each suite of PURE_RERUN_SUITES passes on the pure-Python path too (the rest of this run
    tests the C path wherever it is built)."""
    if os.environ.get("LOCKWATCH_DISABLE_EXTENSIONS") or not _fast_path.SPEEDUPS:
        pytest.skip("this whole run is on the pure-Python path already")
    # The pure-Python leg of this same run (scripts/test-pythons.sh says which tests it runs)
    # covers those it runs: only the rest run here.
    twin = os.environ.get("LOCKWATCH_PURE_LEG_TESTS", "").split()
    if twin == ["all"] or suite in twin:
        pytest.skip(f"this run's pure-Python leg runs {suite}")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-x", suite],
        cwd=ROOT,
        env=_env(True),
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout


@needs_c
def test_a_subinterpreter_runs_the_c_path_on_its_own_state():
    """The extension keeps its state in its module (no file-level state): a subinterpreter
    (mod_wsgi runs several) imports a module of its own and runs the C path on it, recording in
    its own recorder, and the main interpreter's path is untouched.

    3.12's ``_xxsubinterpreters.create()`` makes an isolated interpreter (a GIL of its own), which
    refuses a module that does not declare per-interpreter GIL support; the extension does not
    (its hot path relies on the one GIL it runs under), so there the subinterpreter runs the
    Python path, recording the same."""
    subinterpreters = pytest.importorskip("_xxsubinterpreters")
    c_path = sys.version_info[:2] != (3, 12)
    interp = subinterpreters.create()
    try:
        subinterpreters.run_string(
            interp,
            "import _thread\n"
            "from otel_lockwatch.capture import _fast_path, _threading\n"
            "from otel_lockwatch.capture._naming import lock_class\n"
            "from otel_lockwatch._session import RECORDER\n"
            f"assert _fast_path.SPEEDUPS is {c_path}, _fast_path.SPEEDUPS\n"
            "base = getattr(_fast_path.speedups, 'LockBase', None)\n"
            f"assert (_threading.LockProxy.__mro__[1] is base) is {c_path}\n"
            "cls = lock_class('sub:site', 'threading.Lock', 'sub:site')\n"
            "lock = _threading.LockProxy.watch(_thread.allocate_lock(), cls)\n"
            "for _ in range(5):\n"
            "    with lock:\n"
            "        assert [e.lock for e in RECORDER.thread_state().held] == [lock]\n"
            "assert RECORDER.thread_state().stats[cls].acquisitions == 5\n",
        )
    finally:
        subinterpreters.destroy(interp)
    assert _fast_path.SPEEDUPS
    from otel_lockwatch.capture._naming import lock_class

    cls = lock_class("main:site", "threading.Lock", "main:site")
    lock = _threading.LockProxy.watch(_thread.allocate_lock(), cls)
    with lock:
        assert [e.lock for e in RECORDER.thread_state().held][-1:] == [lock]


@needs_c
def test_a_new_thread_is_registered_and_ended_without_lockwatchs_python(watched):
    """A thread's first acquisition registers its state from C (the registration of
    ``Recorder.new_thread_state`` on the recorder's tables) and goes on in C, and its end (its
    locals cleared) does ``Recorder._thread_ended``'s common case in C: no Python function of
    lockwatch's runs for either (the thread's ``Thread.name`` is read), where both used to be
    Python: the cost a thread per request pays (docs/performance.md, thread churn)."""
    called: list[str] = []
    lock = threading.Lock()

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call" and "otel_lockwatch" in frame.f_code.co_filename:
            called.append(frame.f_code.co_qualname)

    def work() -> None:
        sys.setprofile(profile)
        try:
            with lock:
                pass
        finally:
            sys.setprofile(None)
        seen.append((RECORDER.tls.st, type(RECORDER.tls.alive)))

    seen: list[Any] = []
    worker = threading.Thread(target=work, name="registered-in-c")
    worker.start()
    worker.join()
    assert called == []
    ((state, end_type),) = seen
    assert end_type is _fast_path.speedups.ThreadEnd
    assert state.worker == "registered-in-c" and state.thread() is None  # retired at its end
    # Its end was the C ThreadEnd's (no Python __del__): the state it retired is the name's one.
    assert [s for s in RECORDER.states if s.worker == "registered-in-c"] == [state]
    assert [s.acquisitions for s in state.stats.values()] == [1]


@needs_c
def test_c_stats_are_made_and_merged_as_the_python_stats_are():
    """A C path's new ``Stats`` is made whole in C (no Python ``__init__``): every field of the
    table reads as a Python ``Stats()``'s. Merging one into another (the owned counters and the
    holds in one C call, ``add_owned``) gives what the Python ``Stats.merge`` gives for the same
    values: sums, minimums (``NO_SAMPLE`` left alone), maximums, the histograms' buckets."""
    from otel_lockwatch.capture._fast_path import new_stats

    made, plain = new_stats(), Stats()
    assert {name: getattr(made, name) for name in STATS_FIELDS} == {
        name: getattr(plain, name) for name in STATS_FIELDS
    }
    assert made.wait_histogram is not new_stats().wait_histogram  # a dict of its own

    def filled(stats: Any, salt: int) -> Any:
        stats.acquisitions, stats.try_acquisitions, stats.skipped = 7 + salt, 2, 1 + salt
        stats.hold_total_ns, stats.hold_max_ns = 900 + salt, 500 - salt
        stats.hold_histogram = {4: 2 + salt, 30: 1}
        if salt:  # the other keeps no wait sample: its minimum stays NO_SAMPLE
            stats.contentions, stats.timeouts, stats.wait_total_ns = 3, 1, 40
            stats.wait_min_ns, stats.wait_max_ns, stats.hold_min_ns = 5, 30, 100
            stats.wait_histogram = {6: 3}
        else:
            stats.hold_min_ns = 120
        stats.collisions = salt
        return stats

    c_side, py_side = filled(new_stats(), 0), filled(Stats(), 0)
    c_side.merge(filled(new_stats(), 3))
    py_side.merge(filled(Stats(), 3))
    assert {name: getattr(c_side, name) for name in STATS_FIELDS} == {
        name: getattr(py_side, name) for name in STATS_FIELDS
    }
    assert c_side.hold_min_ns == 100 and c_side.wait_min_ns == 5 and c_side.acquisitions == 17


@needs_c
def test_c_stats_first_holds_are_the_dicts_and_read_as_every_hold(watched):
    """A worker's first few holds go to its hold histogram's dict (no fixed array made for a
    thread that takes a lock once), later ones to the array; the histogram reads every hold
    either way, and a merge adds them whichever side has the array."""
    lock = threading.Lock()
    for n in range(1, 9):
        with lock:
            pass
        (s,) = [
            s for cls, s in RECORDER.thread_state().stats.items() if cls is lock._lockwatch_class
        ]
        assert sum(s.hold_histogram.values()) == n
    from otel_lockwatch.capture._fast_path import new_stats

    once, many = new_stats(), new_stats()
    once.hold_histogram = {2: 1}
    many.merge(s)  # the array's holds into a Stats with none yet
    many.merge(once)
    assert sum(many.hold_histogram.values()) == 9 and many.hold_histogram[2] >= 1
    once.merge(many)
    assert sum(once.hold_histogram.values()) == 10


@needs_c
def test_c_stats_merge_adds_the_hold_histograms_as_their_dicts_add(watched):
    """An ended thread's ``Stats`` is folded into its name's retired one: on the C path the hold
    histograms add bucket by bucket in C (``add_holds``), to what adding their dicts gives,
    the buckets its counters keep and those beyond them alike."""
    lock = threading.Lock()
    made: list[Any] = []

    def work(holds: int) -> None:
        for _ in range(holds):
            with lock:
                pass
        made.append(RECORDER.thread_state().stats[lock._lockwatch_class])

    for holds in (5, 3):
        worker = threading.Thread(target=work, args=(holds,))
        worker.start()
        worker.join()
    mine, theirs = made
    theirs.hold_histogram = {**theirs.hold_histogram, 700: 4}  # past the C counters' buckets
    expected = dict(mine.hold_histogram)
    for bucket, count in theirs.hold_histogram.items():
        expected[bucket] = expected.get(bucket, 0) + count
    assert mine.add_holds(mine) is False  # not with itself
    mine.merge(theirs)
    assert mine.hold_histogram == expected
    assert sum(expected.values()) == 12


@needs_c
def test_the_c_fold_folds_as_the_python_fold_does():
    """An ended worker's fold into a retired state (``record._retired.fold``) runs its common
    case in C (``_speedups.fold``: C Stats without contended waits, no spans, no hand-offs):
    the same retired time, counters and holds as the Python fold. Anything else it leaves
    unchanged, for the Python fold (False)."""
    from otel_lockwatch.capture._fast_path import new_stats
    from otel_lockwatch.record import _retired

    def state(*holds: int, waited: bool = False, other_class: bool = False) -> WorkerState:
        st = WorkerState("w")
        st.first, st.last, st.retired = 100, 100 + 10 * len(holds), 7
        for cls in ("a", "b") if other_class else ("a",):
            s = new_stats()
            s.acquisitions = s.hold_total_ns = 0
            for ns in holds:
                s.acquisitions += 1
                s.hold_total_ns += ns
                s.hold_min_ns, s.hold_max_ns = min(s.hold_min_ns, ns), max(s.hold_max_ns, ns)
            s.hold_histogram = {ns.bit_length(): len(holds)} if holds else {}
            if waited:
                s.contentions, s.wait_histogram = 1, {3: 1}
            st.stats[cls] = s  # type: ignore[index]
        return st

    def view(st: WorkerState) -> Any:
        return st.retired, {
            cls: (s.acquisitions, s.hold_total_ns, s.hold_min_ns, s.hold_max_ns, s.hold_histogram)
            for cls, s in st.stats.items()
        }

    for other in (state(5), state(5, 70, other_class=True), state()):
        into_c, into_py = state(3, 9), state(3, 9)
        assert _fast_path.speedups.fold(into_c, other) is True
        _retired.fold(into_py, other)  # (no common case given: the Python fold alone)
        assert view(into_c) == view(into_py)
        assert into_c.retired == 7 + (other.last - other.first) + 7  # its own, theirs, their folded
    waited, into = state(5, waited=True), state(3)
    before = view(into)
    assert _fast_path.speedups.fold(into, waited) is False
    assert view(into) == before
    spans = state(5)
    spans.spans[("lock", "span")] = 1
    assert _fast_path.speedups.fold(into, spans) is False
    assert view(into) == before
