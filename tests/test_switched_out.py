"""The pure-Python path's wait behind a holder switched out inside lockwatch's own code
(``capture._switched_out``): it yields to that holder instead of blocking, and records no wait;
a holder in the program's own code is waited for, and recorded, as always.

Each scenario runs in a subprocess on the pure-Python path (the path is chosen at import). The
holder is put inside the window by taking the proxy's raw lock directly (a hold whose notes are
not made yet), or stopped in the program's code on an Event; the waiter's progress is watched
through its frames, never through sleeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCENARIOS = r"""
import json, sys, threading
from otel_lockwatch import LockwatchInstrumentor
from otel_lockwatch.capture import _bookkeeping, _fast_path, _switched_out
from otel_lockwatch.record._recorder import RECORDER

LockwatchInstrumentor().instrument(manifest=False)
assert not _fast_path.SPEEDUPS
_switched_out.WINDOW_POLLS = 10**9  # the test decides when the holder leaves the window
frames = sys._current_frames
out = {}


def in_code(thread, code):
    # Whether `thread` is running `code` (anywhere on its stack).
    f = frames().get(thread.ident)
    while f is not None:
        if f.f_code is code:
            return True
        f = f.f_back
    return False


def until(predicate):
    tick = threading.Event()
    for _ in range(20_000):
        if predicate():
            return
        tick.wait(0.001)
    raise AssertionError("timed out")


def stats(lock):
    data = RECORDER.snapshot()["locks"][lock._lockwatch_class.name]
    return {k: data[k] for k in ("acquisitions", "contentions", "timeouts")}


def waiter(lock, result, **kw):
    result.append(lock.acquire(**kw))
    if result[-1]:
        lock.release()


# 1. The holder took the raw lock and has not noted its hold yet: the waiter yields, then gets
#    the lock without a recorded wait once the holder lets go.
RECORDER.reset()
lock = threading.Lock()
lock._lw_lock.acquire()
out["none_in_window"] = _switched_out.in_window(lock)
got = []
t = threading.Thread(target=waiter, args=(lock, got))
t.start()
until(lambda: in_code(t, _switched_out.window_wait.__code__))
lock._lw_lock.release()
t.join(30)
out["yielded"] = {"got": got, "yields": RECORDER.window_yields, **stats(lock)}

# 2. The same, with a timeout: the waiter gives up on time, and that is a recorded timeout.
RECORDER.reset()
lock = threading.Lock()
lock._lw_lock.acquire()
got = []
t = threading.Thread(target=waiter, args=(lock, got), kwargs={"timeout": 0.05})
t.start()
t.join(30)
lock._lw_lock.release()
out["timed_out"] = {"got": got, "yields": RECORDER.window_yields, **stats(lock)}

# 3. The holder is in the program's own code: a wait of the program's, blocked and recorded.
RECORDER.reset()
lock = threading.Lock()
inside, leave = threading.Event(), threading.Event()


def holder():
    with lock:
        inside.set()
        leave.wait(30)


h = threading.Thread(target=holder)
h.start()
inside.wait(30)
out["user_in_window"] = _switched_out.in_window(lock)
got = []
t = threading.Thread(target=waiter, args=(lock, got))
t.start()
until(lambda: in_code(t, _bookkeeping.timed_wait.__code__))
leave.set()
h.join(30)
t.join(30)
out["program_wait"] = {"got": got, "yields": RECORDER.window_yields, **stats(lock)}

# 4. A frame of the proxy's own __exit__ on this lock is its release; a user frame is not.
seen = {}


def profile(frame, event, arg):
    if event == "call" and frame.f_code.co_name == "__exit__" and "exit" not in seen:
        seen["exit"] = frame
        seen["exit_self"] = _switched_out.releasing(frame, lock)
        seen["exit_other"] = _switched_out.releasing(frame, threading.Lock())
        seen["user"] = _switched_out.releasing(frame.f_back, lock)


lock = threading.Lock()
sys.setprofile(profile)
with lock:
    pass
sys.setprofile(None)
out["releasing"] = [seen["exit_self"], seen["exit_other"], seen["user"]]
print(json.dumps(out))
"""


def _run(code: str) -> dict:
    env = dict(os.environ)
    env["LOCKWATCH_DISABLE_EXTENSIONS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for var in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER"):
        env[var] = "none"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def scenarios() -> dict:
    return _run(SCENARIOS)


def test_a_holder_before_its_notes_is_in_the_window(scenarios):
    assert scenarios["none_in_window"] is True


def test_the_waiter_yields_to_a_holder_in_the_window_and_records_no_wait(scenarios):
    """The acquisition is counted; it is no contention (the raw lock would not have waited)."""
    assert scenarios["yielded"] == {
        "got": [True],
        "yields": 1,
        "acquisitions": 1,
        "contentions": 0,
        "timeouts": 0,
    }


def test_a_timeout_holds_while_yielding(scenarios):
    """A holder that never leaves the window: the waiter returns False at its timeout, recorded
    as a wait that timed out."""
    assert scenarios["timed_out"] == {
        "got": [False],
        "yields": 0,
        "acquisitions": 0,
        "contentions": 1,
        "timeouts": 1,
    }


def test_a_holder_in_the_program_s_code_is_waited_for_and_recorded(scenarios):
    assert scenarios["user_in_window"] is False
    assert scenarios["program_wait"] == {
        "got": [True],
        "yields": 0,
        "acquisitions": 2,
        "contentions": 1,
        "timeouts": 0,
    }


def test_the_release_of_this_very_lock_is_the_window(scenarios):
    """The proxy's ``__exit__`` frame on the lock waited for is; on another lock, or the
    program's frame around it, is not."""
    assert scenarios["releasing"] == [True, False, False]
