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

from otel_lockwatch import merge_manifests
from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.record._recorder import RECORDER

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
