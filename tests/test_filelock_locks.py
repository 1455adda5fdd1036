"""filelock's ``FileLock`` and ``SoftFileLock``: real files, real threads and real processes.

A file lock is recorded as a Redis lock is, without a lease; it is re-entrant per object, so only
the outermost acquire and the release that unlocks the file count.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from otel_lockwatch import merge_manifests, name_lock
from otel_lockwatch._session import RECORDER
from otel_lockwatch.manifest._evaluate import evaluate

filelock = pytest.importorskip("filelock")

WORKER = Path(__file__).parent / "data" / "distributed_worker.py"
KINDS = [
    pytest.param(filelock.FileLock, "filelock.FileLock", id="FileLock"),
    pytest.param(filelock.SoftFileLock, "filelock.SoftFileLock", id="SoftFileLock"),
]


def manifest():
    return evaluate(RECORDER.snapshot()).to_dict()


@pytest.mark.parametrize(("make", "kind"), KINDS)
def test_reentrant_acquires_count_once(watched, tmp_path, make, kind):
    """Acquired three times by one thread: one acquisition, one hold (the release that unlocks
    the file); the class is the file name's template, never the directory."""
    lock = make(str(tmp_path / "cache-1234.lock"))
    with lock, lock:
        lock.acquire()
        lock.release()
    doc = manifest()
    entry = doc["locks"]["cache-*.lock"]
    assert entry["kind"] == kind
    assert (entry["acquisitions"], entry["hold_ns"]["count"]) == (1, 1)
    assert "lease" not in entry and entry["key_templates"] == ["cache-*.lock"]
    assert str(tmp_path) not in json.dumps(doc)
    assert RECORDER.thread_state().held == []


@pytest.mark.parametrize(("make", "kind"), KINDS)
def test_a_held_file_makes_a_try_skip_and_a_timeout_time_out(watched, tmp_path, make, kind):
    """A second object on the same file: ``blocking=False`` is a skipped try; a ``timeout`` that
    runs out is a contended, timed-out wait, and ``Timeout`` reaches the caller."""
    path = str(tmp_path / "job.lock")
    holder, other = make(path), make(path)
    held, done = threading.Event(), threading.Event()

    def hold():
        with holder:
            held.set()
            done.wait(10)

    t = threading.Thread(target=hold, name="holder")
    t.start()
    held.wait(10)
    with pytest.raises(filelock.Timeout):
        other.acquire(blocking=False)
    with pytest.raises(filelock.Timeout):
        other.acquire(timeout=0.05, poll_interval=0.01)
    done.set()
    t.join()
    entry = manifest()["locks"]["job.lock"]
    assert entry["skipped"] == 1 and entry["timeouts"] == 1 and entry["contentions"] == 1
    assert entry["acquisitions"] == 1
    assert entry["wait_ns"]["max"] >= 0.05e9


@pytest.mark.timeout(300)
@pytest.mark.parametrize("kind", ["flock", "soft"])
def test_processes_contending_on_one_file_merge_into_a_hot_lock(tmp_path, kind):
    """Four processes take one file lock in turn: their merged waits match what they measured
    around their contended ``acquire`` calls (within 10 %), and the path appears in no output.

    Only contended calls wait; an uncontended one costs its file operations (a soft lock's
    publish-and-sync takes milliseconds), which are not a wait. The contended calls are the
    longest ones: as many as the manifest counts contentions."""
    out = tmp_path / "out"
    out.mkdir()
    path = tmp_path / "shared" / "store-5f3a9c01.lock"
    path.parent.mkdir()
    n = 4
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), "file-hot", str(out), str(path), "10", "0.01", kind],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    for p in procs:  # the barrier: every worker is set up
        assert p.stdout.readline() == "ready\n"
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.close()
    for p in procs:
        assert p.wait(timeout=170) == 0
    merged = merge_manifests(sorted(out.glob("manifest.*.json"))).to_dict()
    entry = merged["locks"]["store-*.lock"]
    assert entry["acquisitions"] == n * 10 and entry["contentions"] > 0
    assert merged["hot_lock_register"][0]["lock"] == "store-*.lock"
    walls = sorted(
        w for p in out.glob("result.*.json") for w in json.loads(p.read_text())["walls_ns"]
    )
    contended = sum(walls[-entry["contentions"] :])
    assert entry["wait_ns"]["sum"] == pytest.approx(contended, rel=0.10)
    text = "".join(p.read_text() for p in out.iterdir()) + json.dumps(merged)
    assert str(path) not in text and "5f3a9c01" not in text


def holders(lock):
    """How many workers hold ``lock``'s class now, by their held stacks (the live gauge)."""
    cls = lock.__dict__["_lockwatch_class"]
    return RECORDER.live().get((cls.name, cls.kind), (0, 0))[1]


@pytest.mark.parametrize(("make", "kind"), KINDS)
def test_a_release_by_a_thread_not_holding_a_thread_local_lock_ends_no_hold(
    watched, tmp_path, make, kind
):
    """A thread-local file lock (filelock's default) held by one thread: another thread's
    ``release()`` releases nothing (filelock ignores it), and the holder's hold goes on until
    its own release. (Regression: the other thread's release ended the holder's hold.)"""
    lock = make(str(tmp_path / "job.lock"))
    lock.acquire()
    t = threading.Thread(target=lock.release, name="other")
    t.start()
    t.join()
    assert lock.is_locked and holders(lock) == 1
    lock.release()
    entry = manifest()["locks"]["job.lock"]
    assert (entry["acquisitions"], entry["hold_ns"]["count"]) == (1, 1)
    assert holders(lock) == 0


@pytest.mark.parametrize(("make", "kind"), KINDS)
def test_a_shared_lock_entered_again_by_another_thread_is_one_hold(watched, tmp_path, make, kind):
    """``thread_local=False``: every thread shares the lock's one context, so a second thread's
    acquire while the first holds it is a re-entry (filelock does not wait): one acquisition,
    and one hold, which ends at the release that unlocks the file, whoever makes it."""
    lock = make(str(tmp_path / "shared.lock"), thread_local=False)
    entered, released = threading.Event(), threading.Event()

    def second():
        with lock:
            entered.set()
            released.wait(10)

    lock.acquire()
    t = threading.Thread(target=second, name="second")
    t.start()
    assert entered.wait(10)
    lock.release()  # the second thread's level keeps the file locked
    assert lock.is_locked and holders(lock) == 1
    released.set()
    t.join()
    assert not lock.is_locked
    entry = manifest()["locks"]["shared.lock"]
    assert (entry["acquisitions"], entry["hold_ns"]["count"], entry["contentions"]) == (1, 1, 0)
    assert holders(lock) == 0


@pytest.mark.parametrize(("make", "kind"), KINDS)
def test_a_forced_release_ends_the_hold_at_any_depth(watched, tmp_path, make, kind):
    """``release(force=True)`` three levels deep unlocks the file: the hold ends there, and the
    next acquire is an outermost one again."""
    lock = make(str(tmp_path / "deep.lock"))
    for _ in range(3):
        lock.acquire()
    lock.release(force=True)
    assert not lock.is_locked and holders(lock) == 0
    with lock:
        pass
    entry = manifest()["locks"]["deep.lock"]
    assert (entry["acquisitions"], entry["hold_ns"]["count"]) == (2, 2)


def test_an_uncontended_pair_never_asks_the_lock_whether_it_is_held(watched, tmp_path):
    """lockwatch answers re-entry from its own hold (filelock's ``is_locked`` costs more than
    the rest of the bookkeeping): an outermost pair and a nested one ask it only when the lock
    is already held through the object (the nested acquire)."""
    asked = []

    class Asking(filelock.FileLock):
        @property
        def is_locked(self):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("otel_lockwatch"):
                asked.append(caller)
            return super().is_locked

    lock = Asking(str(tmp_path / "asked.lock"))
    with lock:
        pass
    assert asked == []
    with lock, lock:
        pass
    assert len(asked) == 1
    assert manifest()["locks"]["asked.lock"]["acquisitions"] == 2


def test_a_hold_left_by_an_unwatched_release_is_forgotten_at_the_next_acquire(
    make_watched, tmp_path
):
    """Acquired while watched, released while not (the release was not seen): the next
    watched acquire finds the file unlocked, drops the stale hold from the held stack, and is
    an outermost acquisition with its own hold."""
    w = make_watched()
    lock = filelock.FileLock(str(tmp_path / "stale.lock"))
    lock.acquire()
    w.instrumentor.uninstrument()
    lock.release()
    w.instrumentor.instrument(manifest=False)
    with lock:
        assert holders(lock) == 1
    assert holders(lock) == 0
    entry = manifest()["locks"]["stale.lock"]
    assert (entry["acquisitions"], entry["hold_ns"]["count"]) == (2, 1)


@pytest.mark.parametrize(("make", "kind"), KINDS)
@pytest.mark.parametrize("default", ["timeout", "blocking"])
def test_a_default_set_after_the_lock_was_made_makes_with_a_try(
    watched, tmp_path, make, kind, default
):
    """``with lock:`` is told from a try by the lock's defaults, noted when it was made; one set
    later (``lock.timeout = 0``, ``lock.blocking = False``) is honored: on a held file, that
    ``with`` is a skipped try, not a timed-out wait."""
    if not isinstance(getattr(make, default, None), property):
        pytest.skip(f"this filelock has no {default} property")
    path = str(tmp_path / "tried.lock")
    holder, lock = make(path), make(path)
    setattr(lock, default, 0 if default == "timeout" else False)
    with holder, pytest.raises(filelock.Timeout), lock:
        pass
    entry = manifest()["locks"]["tried.lock"]
    assert (entry["skipped"], entry["timeouts"], entry["contentions"]) == (1, 0, 0)


def _close_descriptor_of(path):
    """Close this process's descriptor of ``path`` behind the lock's back: its release fails."""
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == path:
                os.close(int(fd))
                return
        except OSError:
            continue
    raise AssertionError(f"no descriptor of {path}")


def test_a_release_that_failed_ends_the_hold_as_a_release_failure(make_watched, tmp_path):
    """A ``FileLock`` whose descriptor was closed mid-hold: its release raises ``OSError``
    (filelock still says it is locked); the hold ends in lockwatch's books, counted as a release
    failure, and orders nothing after it: under ``on_cycle=raise`` another lock of its class is
    taken as without lockwatch. (Regression: the hold stayed on the held stack, and the next
    lock of the class raised ``PotentialDeadlockError``.)"""
    make_watched(on_cycle="raise")
    path = str(tmp_path / "broken-1.lock")
    lock = filelock.FileLock(path)
    lock.acquire()
    _close_descriptor_of(path)
    with pytest.raises(OSError):
        lock.release()
    assert RECORDER.thread_state().held == []
    with filelock.FileLock(str(tmp_path / "broken-2.lock")), name_lock(threading.Lock(), "cache"):
        pass
    doc = manifest()
    assert doc["release_failures"] == [{"lock": "broken-*.lock", "not_owned": 0, "lock_error": 1}]
    entry = doc["locks"]["broken-*.lock"]
    assert (entry["acquisitions"], entry["hold_ns"]["count"]) == (2, 2)
    edges = {(e["holding"], e["acquiring"]) for e in doc["lock_order"]["edges"]}
    assert edges == {("broken-*.lock", "cache")}
