"""Multi-process pools: every child writes its own manifest, and the merge adds them up exactly.

The pools here are small (2-3 workers, a few iterations); workers start together on a
``multiprocessing.Barrier`` so that they contend on the shared lock, and the only sleeps are
holds inside critical sections. Each test names its start method explicitly.
"""

from __future__ import annotations

import json
import multiprocessing
import multiprocessing.pool
import multiprocessing.synchronize
import os
import pickle
import subprocess
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from otel_lockwatch import (
    LockwatchInstrumentor,
    merge_manifests,
    name_lock,
    write_manifest,
)
from otel_lockwatch._session import PROCESS, RECORDER
from otel_lockwatch.capture import _mp_locks, _multiprocess

METHODS = [
    m for m in ("fork", "spawn", "forkserver") if m in multiprocessing.get_all_start_methods()
]
# A hold long enough that the waits it causes (a hold or more per round, per worker) stay a
# material share (the 10 % of _sizing.SIZING_MIN_COST_PCT) of a child's observed time, which
# also holds its start and its exit: a child forked from a large process (the whole suite's)
# took ~300 ms to start and end, against ~20 ms of waiting with 2 ms holds; with 8 rounds of
# 10 ms, 42 ms of waiting in 443 ms observed (9.5 %: 3.15's whole suite beside another suite).
# 12 rounds of 20 ms: about 120 ms of waiting in 800 quiet, but 123 ms in 1.9 s in the
# free-threaded build's whole suite (load 4-6: its multiprocessing barrier's rounds took ~110 ms
# more each, idle time the share divides by). 6 rounds of 100 ms: each round's loser waits a hold
# in two holds and a barrier, over 15 % of the workers' time even then.
HOLD_S = 0.1
ITERATIONS = 6

ORIGINAL_SEMLOCK = {
    name: vars(multiprocessing.synchronize.SemLock)[name]
    for name in ("__init__", "__getstate__", "__setstate__", "__enter__", "__exit__")
}
ORIGINAL_PPE_INIT = ProcessPoolExecutor.__init__
ORIGINAL_POOL_INIT = multiprocessing.pool.Pool.__init__


# -- what the workers run (module level: spawn children import this module) -----------------------
_LOCK = None
_BARRIER = None


def _init(lock, barrier):
    global _LOCK, _BARRIER
    _LOCK, _BARRIER = lock, barrier


def _contend(n):
    for _ in range(n):
        # Every round starts together, so the workers contend in each: every round but the
        # winner's costs the others a hold or more of waiting (a quarter to a third of their
        # time), whatever the scheduler did with the processes' start.
        _BARRIER.wait(timeout=60)
        with _LOCK:
            time.sleep(HOLD_S)  # hold
    return os.getpid()


def _nest(first, second):
    with first, second:
        pass


def _idle():
    pass


def _is_instrumented(queue):
    queue.put(LockwatchInstrumentor().is_instrumented_by_opentelemetry)


# -- helpers --------------------------------------------------------------------------------------
@pytest.fixture
def mp_run(tmp_path):
    """Instrumented with the manifest at tmp_path/m.json (no checkpoints); undone after."""
    RECORDER.reset()
    inst = LockwatchInstrumentor()
    inst.instrument(manifest_path=str(tmp_path / "m.json"), checkpoint_interval_s=0)
    try:
        yield tmp_path
    finally:
        inst.uninstrument()
        RECORDER.reset()


def manifests(directory: Path) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(directory.glob("*.json"))}


def expected_files(pids) -> set[str]:
    return {"m.json"} | {f"m.{pid}.json" for pid in pids}


def check_pool_run(directory: Path, pids: set[int], workers: int) -> None:
    """The parent's and each child's manifest, merged: exact count, the hot lock, the pool size."""
    write_manifest()  # the parent's own
    files = manifests(directory)
    assert set(files) == expected_files(pids)  # one file per process: none overwrote another
    for pid in pids:
        child = files[f"m.{pid}.json"]
        assert child["process"]["pid"] == pid
        assert child["locks"]["shared"]["acquisitions"] == ITERATIONS
    merged = merge_manifests([directory / name for name in files]).to_dict()
    assert merged["locks"]["shared"]["acquisitions"] == workers * ITERATIONS
    assert merged["locks"]["shared"]["kind"] == "multiprocessing.Lock"
    assert [hot["lock"] for hot in merged["hot_lock_register"]] == ["shared"], (
        merged["workers"],
        merged["other_threads"],
        {name: lock["wait_ms_total"] for name, lock in merged["locks"].items()},
    )
    # The lock is hot; whether one worker also waited 5x the median (starvation, which outranks a
    # hot lock) depends on how the scheduler handed the lock around, so both verdicts are right.
    assert merged["verdict"] in ("HOT_LOCK_DETECTED", "STARVATION_OBSERVED")
    assert merged["nominal_pool_size"] == workers
    assert sorted(merged["process"]["pids"]) == sorted(pids | {os.getpid()})


# -- naming ---------------------------------------------------------------------------------------
def test_child_manifest_path(monkeypatch):
    """The parent keeps its path; a child inserts .{pid} before the suffix unless {pid} is there."""
    monkeypatch.setattr(PROCESS, "child", False)  # the session's process state
    assert _multiprocess.manifest_path("out/m.json") == "out/m.json"
    monkeypatch.setattr(PROCESS, "child", True)
    assert _multiprocess.manifest_path("out/m.json") == os.path.join("out", "m.{pid}.json")
    assert _multiprocess.manifest_path("lockwatch-manifest.json") == "lockwatch-manifest.{pid}.json"
    assert _multiprocess.manifest_path("out/manifest") == os.path.join("out", "manifest.{pid}")
    assert _multiprocess.manifest_path("out/m-{pid}.json") == "out/m-{pid}.json"
    assert _multiprocess.manifest_path(Path("a.b.json")) == "a.b.{pid}.json"


def test_instrument_uninstrument(monkeypatch):
    """instrument() patches SemLock and the pools and sets the children's bootstrap; uninstrument()
    restores each exactly, gives watched locks their plain methods back, and cleans the env."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv(_multiprocess.CHILD_OPTIONS_ENV, raising=False)
    ctx = multiprocessing.get_context("spawn")
    before = ctx.Lock()
    inst = LockwatchInstrumentor()
    inst.instrument(manifest=False, pool_size=3)
    try:
        for name, original in ORIGINAL_SEMLOCK.items():
            assert vars(multiprocessing.synchronize.SemLock)[name] is not original
        assert ProcessPoolExecutor.__init__ is not ORIGINAL_PPE_INIT
        assert multiprocessing.pool.Pool.__init__ is not ORIGINAL_POOL_INIT
        assert os.environ["PYTHONPATH"] == _multiprocess.BOOTSTRAP_DIR
        assert Path(_multiprocess.BOOTSTRAP_DIR, "sitecustomize.py").is_file()
        options = json.loads(os.environ[_multiprocess.CHILD_OPTIONS_ENV])
        assert options["manifest"] is False and options["pool_size"] == 3
        assert os.path.isabs(options["manifest_path"])
        during = ctx.Lock()
        assert "_lw_track" in vars(during) and "_lw_track" not in vars(before)
    finally:
        inst.uninstrument()
    for name, original in ORIGINAL_SEMLOCK.items():
        assert vars(multiprocessing.synchronize.SemLock)[name] is original
    assert ProcessPoolExecutor.__init__ is ORIGINAL_PPE_INIT
    assert multiprocessing.pool.Pool.__init__ is ORIGINAL_POOL_INIT
    assert "PYTHONPATH" not in os.environ
    assert _multiprocess.CHILD_OPTIONS_ENV not in os.environ
    assert "_lw_track" not in vars(during)
    assert during.acquire.__self__ is during._semlock  # SemLock's own bound methods again


def test_no_bootstrap_under_opentelemetry_instrument(monkeypatch, tmp_path):
    """Under opentelemetry-instrument its sitecustomize instruments children: nothing is added."""
    auto = str(tmp_path / "opentelemetry" / "instrumentation" / "auto_instrumentation")
    monkeypatch.setenv("PYTHONPATH", auto)
    monkeypatch.delenv(_multiprocess.CHILD_OPTIONS_ENV, raising=False)
    inst = LockwatchInstrumentor()
    inst.instrument(manifest=False)
    try:
        assert os.environ["PYTHONPATH"] == auto
        assert _multiprocess.CHILD_OPTIONS_ENV not in os.environ
    finally:
        inst.uninstrument()
    assert os.environ["PYTHONPATH"] == auto


# -- the locks, in one process --------------------------------------------------------------------
def locks_of(data: dict) -> dict:
    return data["locks"]


@pytest.mark.parametrize("kind", ["Lock", "RLock", "Semaphore", "BoundedSemaphore"])
def test_multiprocessing_locks_named_by_site_and_counted(watched, kind):
    """A lock created by watched code is its creation site's class, with its kind; blocking, try
    and timed acquisitions and `with` are counted, a failed try is skipped."""
    ctx = multiprocessing.get_context("spawn")
    lock = getattr(ctx, kind)()  # the site: this line
    line = sys._getframe().f_lineno - 1
    site = f"{__name__}:test_multiprocessing_locks_named_by_site_and_counted:{line}"
    assert lock.acquire() is True
    lock.release()
    with lock:
        pass
    assert lock.acquire(True, 1.0) is True
    if kind == "RLock":
        assert lock.acquire(False) is True  # re-entry: immediate, counted once
        lock.release()
    lock.release()
    if kind != "RLock":  # an RLock is re-entrant for its owner: a try in another thread fails
        with lock:
            assert lock.acquire(False) is False
    else:
        with lock:
            result = []
            t = threading.Thread(target=lambda: result.append(lock.acquire(False)))
            t.start()
            t.join()
            assert result == [False]
    data = locks_of(RECORDER.snapshot())
    assert data[site]["kind"] == f"multiprocessing.{kind}"
    assert data[site]["acquisitions"] == 4
    assert data[site]["skipped"] == 1


def test_multiprocessing_lock_semantics_kept(watched):
    """Results and exceptions are the lock's own: over-release, a non-owner releasing an RLock,
    a timed-out acquire (counted as a timeout)."""
    ctx = multiprocessing.get_context("spawn")
    lock = name_lock(ctx.Lock(), "plain")
    with pytest.raises(ValueError, match=r"^semaphore or lock released too many times$"):
        lock.release()
    rlock = ctx.RLock()
    with pytest.raises(
        AssertionError, match=r"^attempt to release recursive lock not owned by thread$"
    ):
        rlock.release()
    bounded = ctx.BoundedSemaphore(1)
    with pytest.raises(ValueError, match=r"^semaphore or lock released too many times$"):
        bounded.release()
    with lock:
        result = []
        t = threading.Thread(target=lambda: result.append(lock.acquire(True, 0.01)))
        t.start()
        t.join()
    assert result == [False]
    data = locks_of(RECORDER.snapshot())["plain"]
    assert (data["acquisitions"], data["timeouts"], data["contentions"]) == (1, 1, 1)
    assert repr(lock) == "<Lock(owner=None)>"  # the class's own repr


def test_multiprocessing_lock_order(watched):
    """Nesting a multiprocessing.Lock with a threading.Lock both ways is a lock-order cycle."""
    ctx = multiprocessing.get_context("spawn")
    a = name_lock(ctx.Lock(), "mp_a")
    b = name_lock(threading.Lock(), "th_b")
    _nest(a, b)
    _nest(b, a)
    data = RECORDER.snapshot()
    assert data["locks"]["mp_a"]["acquisitions"] == 2
    cycles = [sorted(c["cycle"]) for c in data["lock_order"]["cycles"]]
    assert cycles == [["mp_a", "th_b"]]


def test_internal_locks_of_multiprocessing_are_not_watched(watched):
    """A Condition's, an Event's or a Queue's locks belong to multiprocessing: never watched."""
    ctx = multiprocessing.get_context("spawn")
    cond = ctx.Condition()
    event = ctx.Event()
    queue = ctx.Queue()
    with cond:
        cond.notify_all()
    event.set()
    queue.put(1)
    assert queue.get(timeout=10) == 1
    queue.close()
    queue.join_thread()
    assert "_lw_track" not in vars(cond._lock)
    assert not any(
        v["kind"].startswith("multiprocessing") for v in locks_of(RECORDER.snapshot()).values()
    )


def test_pickled_lock_carries_its_class():
    """A watched lock's pickled state unpickles as the plain state and names the lock's class:
    an uninstrumented child still gets a plain lock."""
    state = ("handle", 1, 1, "/mp-abc")
    tagged = _mp_locks.TaggedState(state, "shared", "site")
    restored = pickle.loads(pickle.dumps(tagged))
    assert restored == state and type(restored) is tuple
    assert _mp_locks.RECEIVED["/mp-abc"] == ("shared", "site")


def test_pool_sizes_are_nominal(watched):
    """ProcessPoolExecutor's max_workers and multiprocessing.Pool's processes are the pool size."""
    with multiprocessing.pool.ThreadPool(3):
        pass
    assert (RECORDER.pool_size, RECORDER.pool_source) == (3, "executor")
    ProcessPoolExecutor(max_workers=5, mp_context=multiprocessing.get_context("spawn")).shutdown()
    assert RECORDER.pool_size == 5


# -- pools across processes -----------------------------------------------------------------------
@pytest.mark.parametrize("method", METHODS)
def test_process_pool_executor_merged_exactly(mp_run, method):
    """Workers of a ProcessPoolExecutor contend on a multiprocessing.Lock made by the parent: each
    writes its own manifest, and the merge counts exactly what they did, finds that lock hot, and
    keeps max_workers as the nominal size."""
    ctx = multiprocessing.get_context(method)
    workers = 2
    lock = name_lock(ctx.Lock(), "shared")
    barrier = ctx.Barrier(workers)
    with ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_init, initargs=(lock, barrier)
    ) as ex:
        pids = set(ex.map(_contend, [ITERATIONS] * workers))
    assert len(pids) == workers
    check_pool_run(mp_run, pids, workers)


@pytest.mark.parametrize(
    ("method", "ending"), [("fork", "close"), ("fork", "terminate"), ("spawn", "terminate")]
)
def test_multiprocessing_pool_merged_exactly(mp_run, method, ending):
    """The same with multiprocessing.Pool, whether its workers end normally (close/join: the
    finalizer writes) or are terminated (`with`: SIGTERM writes, even mid-way through the
    finalizer's own write, which regressed into a deadlock)."""
    ctx = multiprocessing.get_context(method)
    workers = 3
    lock = name_lock(ctx.Lock(), "shared")
    barrier = ctx.Barrier(workers)
    pool = ctx.Pool(workers, _init, (lock, barrier))
    try:
        pids = set(pool.map(_contend, [ITERATIONS] * workers, chunksize=1))
    finally:
        if ending == "close":
            pool.close()
            pool.join()
        else:
            pool.terminate()
            pool.join()
    assert len(pids) == workers
    check_pool_run(mp_run, pids, workers)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_cross_process_cycle_only_in_the_merge(mp_run, method):
    """One child takes A then B, a later one B then A: no manifest has a cycle but the merge."""
    ctx = multiprocessing.get_context(method)
    a = name_lock(ctx.Lock(), "A")
    b = name_lock(ctx.RLock(), "B")
    pids = []
    for first, second in ((a, b), (b, a)):  # sequenced: never a deadlock
        p = ctx.Process(target=_nest, args=(first, second))
        p.start()
        p.join(60)
        assert p.exitcode == 0
        pids.append(p.pid)
    write_manifest()
    files = manifests(mp_run)
    assert set(files) == expected_files(pids)
    for pid in pids:
        assert files[f"m.{pid}.json"]["pre_deadlock_ordering_witness"] == []
        assert len(files[f"m.{pid}.json"]["lock_order"]["edges"]) == 1
    merged = merge_manifests([mp_run / name for name in files]).to_dict()
    assert merged["verdict"] == "CYCLIC_ORDERING_DETECTED"
    [cycle] = merged["pre_deadlock_ordering_witness"]
    assert sorted(cycle["cycle"]) == ["A", "B"]
    assert sorted(e["worker"] for e in cycle["edges"]) == sorted(
        f"{pid}/MainThread" for pid in pids
    )


def test_idle_child_writes_nothing(mp_run):
    """A child that took no lock writes no manifest (the parent's is the only file)."""
    p = multiprocessing.get_context("fork").Process(target=_idle)
    p.start()
    p.join(60)
    assert p.exitcode == 0
    write_manifest()
    assert set(manifests(mp_run)) == {"m.json"}


FORKING_SCRIPT = """
import multiprocessing, os, sys, time
from otel_lockwatch import LockwatchInstrumentor, name_lock
LockwatchInstrumentor().instrument(manifest_path=sys.argv[1], checkpoint_interval_s=0)
lock = name_lock(multiprocessing.get_context("fork").Lock(), "shared")
pid = os.fork()
for _ in range(3 if pid == 0 else 2):
    with lock:
        time.sleep(0.001)  # hold
if pid:
    _, status = os.waitpid(pid, 0)
    print(pid, os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_plain_fork_child_writes_its_own_file(tmp_path):
    """An os.fork() child that exits normally writes m.<pid>.json through the inherited atexit
    hook, with its own acquisitions only; the parent keeps m.json."""
    script = tmp_path / "forking.py"
    script.write_text(FORKING_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "m.json")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    child, code = map(int, out.split())
    assert code == 0
    files = manifests(tmp_path)
    assert set(files) == {"m.json", f"m.{child}.json"}
    assert files[f"m.{child}.json"]["locks"]["shared"]["acquisitions"] == 3
    assert files["m.json"]["locks"]["shared"]["acquisitions"] == 2


FORK_WHILE_NAMING_SCRIPT = """
import _thread, os, sys, threading
from otel_lockwatch import LockwatchInstrumentor
from otel_lockwatch.record import _lock_class
LockwatchInstrumentor().instrument(manifest_path=sys.argv[1], checkpoint_interval_s=0)
# The script's own hand-shakes are raw locks, which lockwatch does not watch: a watched
# Event's wait names its class once it returns, under the very lock held here (a wait that
# blocked first waited for it for ever: the free-threaded build, one run in two).
inside, leave = _thread.allocate_lock(), _thread.allocate_lock()
inside.acquire()
leave.acquire()

def naming():  # another thread inside the class table's critical section at the fork
    with _lock_class._classes_lock:
        inside.release()
        leave.acquire()

threading.Thread(target=naming, daemon=True).start()
inside.acquire()
pid = os.fork()
if pid == 0:
    with threading.Lock():  # a new creation site: a new class, under the class table's lock
        pass
    os._exit(0)
leave.release()
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_fork_while_another_thread_names_a_lock(tmp_path):
    """A lock held by another thread of the parent at the fork would stay held in the child
    forever: the class table's lock is made afresh in the child, which names new locks."""
    script = tmp_path / "forking.py"
    script.write_text(FORK_WHILE_NAMING_SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "m.json")],
        capture_output=True,
        text=True,
        timeout=60,  # a hang ends here, as a failure
        check=True,
    ).stdout
    assert out.split() == ["0"]


# -- the bootstrap --------------------------------------------------------------------------------
def test_spawn_child_is_instrumented(mp_run):
    """A spawn child instruments itself at startup (the bootstrap sitecustomize)."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.SimpleQueue()
    p = ctx.Process(target=_is_instrumented, args=(queue,))
    p.start()
    assert queue.get() is True
    p.join(60)


def test_bootstrap_leaves_plain_subprocesses_alone_and_chains(mp_run, tmp_path):
    """`python script.py` and a plain `python -c` are not instrumented; another sitecustomize on
    the path still runs."""
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text(
        "import os\nos.environ['OTHER_SITECUSTOMIZE_RAN'] = '1'\n"
    )
    script = tmp_path / "script.py"
    script.write_text(
        "import os, sys\n"
        "print('otel_lockwatch' in sys.modules, os.environ.get('OTHER_SITECUSTOMIZE_RAN'),"
        " sys.modules['sitecustomize'].__file__)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(other)])
    for argv in ([sys.executable, str(script)], [sys.executable, "-c", script.read_text()]):
        out = subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=60, check=True
        ).stdout
        assert out.split() == ["False", "1", str(other / "sitecustomize.py")]


# -- multiprocessing's managers -------------------------------------------------------------------
MANAGER_SCRIPT = """
import multiprocessing, sys
from otel_lockwatch import LockwatchInstrumentor

if __name__ == "__main__":
    LockwatchInstrumentor().instrument(manifest=False)
    import multiprocessing.managers  # its registry takes the patched threading.Lock and RLock
    with multiprocessing.get_context(sys.argv[1]).Manager() as manager:
        shared, lock, rlock = manager.dict(), manager.Lock(), manager.RLock()
        with lock, rlock, rlock:
            shared["through"] = "the manager"
        print(dict(shared))
"""


def test_patched_factories_pickle_as_the_originals(mp_run):
    """Regression: the patched ``threading.Lock`` / ``RLock`` could not be pickled (a spawn or
    forkserver Manager pickles its registry, which holds them); each now pickles by reference to
    the attribute it replaced, and unpickles as that attribute."""
    for name in ("Lock", "RLock"):
        factory = getattr(threading, name)
        assert factory.__wrapped__ is not factory  # patched
        assert pickle.loads(pickle.dumps(factory)) is factory
        assert f"threading\n{name}".encode() in pickle.dumps(factory, protocol=0)
    init = threading.Condition.__init__
    assert pickle.loads(pickle.dumps(init)) is init


@pytest.mark.parametrize("method", METHODS)
def test_manager_after_instrument(tmp_path, method):
    """``Manager()`` started after ``instrument()`` works under each start method: a dict and
    locks through the manager."""
    script = tmp_path / "manager_app.py"
    script.write_text(MANAGER_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
    root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, str(script), method],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "{'through': 'the manager'}"
