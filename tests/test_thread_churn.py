"""A thread per request: what a short-lived thread leaves behind once it has ended.

A thread's state leaves the recorder's table when the thread ends (its locals are cleared, before
``join()`` returns): the first of a name becomes the name's retired state, later ones are folded
into it a batch at a time (``FOLD_BATCH``), not at a later compaction. The recorder keeps one
state per worker name and at most a batch of ended ones, whatever the number of threads that
ran, and counts each of their acquisitions.
Functional checks only: the cost is measured by benchmarks/bench_locks.py (its thread-churn row).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest

from otel_lockwatch._session import RECORDER
from otel_lockwatch.record import _recorder
from otel_lockwatch.record._peak import PeakWorkers, ThreadEnd
from otel_lockwatch.record._recorder import FOLD_BATCH


def _run(target, name: str) -> None:
    t = threading.Thread(target=target, name=name)
    t.start()
    t.join()


def _states_named(name: str) -> list:
    return [state for state in RECORDER.states if state.worker == name]


def test_ended_threads_states_are_folded_a_batch_at_a_time(watched):
    lock = threading.Lock()
    seen = []

    def work():
        with lock:
            pass
        seen.append(RECORDER.thread_state())

    _run(work, "request")
    (retired,) = _states_named("request")
    assert retired is seen[0] and not retired.alive()  # the name's first: retired in place
    assert not retired.held and not retired.chain  # what only a live worker uses is gone
    observed = retired.last - retired.first
    assert observed > 0 and retired.retired == 0
    for _ in range(FOLD_BATCH - 1):
        _run(work, "request")
    assert _states_named("request") == seen  # the ended ones wait for a batch
    assert RECORDER.snapshot()["locks"][lock._lockwatch_class.name]["acquisitions"] == FOLD_BATCH
    _run(work, "request")
    # The batch is folded: into a new retired state, in place of all (none of them is changed,
    # so that a reader holding them counts each once: record/_retired.py).
    (merged,) = _states_named("request")
    assert all(state not in seen for state in RECORDER.states)
    assert merged.last - merged.first == observed and not merged.alive()
    assert merged.retired == sum(state.last_event_ns() - state.first for state in seen[1:]) > 0
    (stats,) = merged.stats.values()
    assert stats.acquisitions == FOLD_BATCH + 1
    assert [s.acquisitions for s in retired.stats.values()] == [1]  # the old one, unchanged
    data = RECORDER.snapshot()
    assert data["workers"]["request"]["observed_ns"] == observed + merged.retired


def test_a_thread_per_request_keeps_one_state_per_name(watched):
    lock = threading.Lock()

    def work():
        with lock:
            pass

    for _ in range(300):  # more than a compaction's threshold (256 states)
        _run(work, "request")
    # its retired state, and the ended ones since the last batch
    assert len(_states_named("request")) == 1 + (300 - 1) % FOLD_BATCH
    data = RECORDER.snapshot()
    name = lock._lockwatch_class.name
    assert data["locks"][name]["acquisitions"] == 300
    assert data["workers"]["request"]["observed_ns"] > 0
    assert data["pool"]["peak_workers"] == 1  # one at a time


def test_retired_states_do_not_count_toward_a_compaction(watched, monkeypatch):
    """A compaction folds the ended workers' states that were not folded at their end; it
    leaves the retired states (one a name, ``MAX_WORKERS`` + 1 at most) as they are, so they do
    not count toward its threshold (256 states): 300 threads of distinct names, each retired at
    its end, run none (each compaction walked every retired state before)."""
    compactions = []
    compacted = _recorder.compacted
    monkeypatch.setattr(
        _recorder, "compacted", lambda *args: (compactions.append(1), compacted(*args))[1]
    )
    lock = threading.Lock()

    def work():
        with lock:
            pass

    for i in range(300):
        _run(work, f"name-{i}")
    named = [state for state in RECORDER.states if state.worker.startswith("name-")]
    assert len(named) == 300 and all(state.thread() is None for state in named)  # retired
    assert compactions == []
    assert RECORDER.snapshot()["locks"][lock._lockwatch_class.name]["acquisitions"] == 300


def test_a_thread_that_ends_holding_a_lock_keeps_its_state(watched):
    lock = threading.Lock()
    seen = []

    def work():
        lock.acquire()
        seen.append(RECORDER.thread_state())

    _run(work, "holder")
    (state,) = _states_named("holder")
    assert state is seen[0] and state.held  # its hold is still there to report
    lock.release()


def test_threads_alive_together_are_counted_once_each(watched):
    lock = threading.Lock()
    inside = threading.Barrier(4)

    def work():
        with lock:
            pass
        inside.wait()

    threads = [threading.Thread(target=work, name="pooled") for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # One state for the name, or more: a thread that ends while another has the recorder (its
    # fold, without the GIL at the same moment) leaves its state to the next compaction.
    states = _states_named("pooled")
    assert 1 <= len(states) <= 4
    assert sum(s.acquisitions for state in states for s in state.stats.values()) == 4
    assert RECORDER.snapshot()["locks"][lock._lockwatch_class.name]["acquisitions"] == 4
    assert RECORDER.snapshot()["pool"]["peak_workers"] == 4


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_fork_while_another_thread_has_the_recorder_does_not_hang_the_child():
    """The child clears the other threads' locals (their end) before its fork handlers give the
    recorder a new lock: a thread that had the recorder's lock at the fork is gone, and the fold
    of its state is skipped rather than waited for."""
    script = textwrap.dedent(
        """
        import os, threading
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        from otel_lockwatch import LockwatchInstrumentor
        from otel_lockwatch._session import RECORDER
        # Made before instrumenting, so never watched: the thread that holds the recorder's
        # own lock waits on one, and a watched wait would come back for that lock.
        inside, leave = threading.Event(), threading.Event()
        LockwatchInstrumentor().instrument(
            tracer_provider=TracerProvider(), meter_provider=MeterProvider(), manifest=False
        )
        lock = threading.Lock()
        def other():
            with lock:
                pass
            with RECORDER.exclusive():
                inside.set()
                leave.wait()
        t = threading.Thread(target=other)
        t.start()
        inside.wait()
        pid = os.fork()
        if pid == 0:
            with lock:
                pass
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        leave.set()
        t.join()
        print(os.waitstatus_to_exitcode(status))
        """
    )
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.stdout.split() == ["0"], done.stderr[-2000:]


class _Worker:
    """A worker state as the peak reads one: its statistics, and whether it is alive."""

    def __init__(self, recorded: bool, alive: bool = True) -> None:
        self.stats = {"lock": 1} if recorded else {}
        self.is_alive = alive

    def alive(self) -> bool:
        return self.is_alive


def test_the_peak_counts_the_workers_alive_that_recorded_at_each_end():
    """An end counts the live workers that recorded (the ending one too) and those kept from the
    last reset that recorded and are still alive; a worker that recorded nothing, or a kept one
    that has ended, is not counted, whether or not the count could pass the peak."""
    peak = PeakWorkers()
    peak.reset([_Worker(True, alive=False), _Worker(True), _Worker(False)])
    first, second, idle = _Worker(True), _Worker(True), _Worker(False)
    ends = [(worker, peak.started(worker)) for worker in (first, second, idle)]
    peak.ended(*ends[0])  # first, second and the kept one alive that recorded
    assert peak.peak() == 3
    peak.ended(*ends[1])  # second and the kept one: under the peak
    peak.ended(*ends[2])
    assert peak.peak() == 3
    peak.reset([])
    late = _Worker(False)
    ended = (late, peak.started(late))
    late.stats = {"lock": 1}  # it records after its start: counted at its end
    peak.ended(*ended)
    assert peak.peak() == 1


# A thread per request on one path, what it leaves in the recorder's tables printed as JSON:
# names past MAX_WORKERS (so "(other)"), ended states past FOLD_BATCH (so folds), threads alive
# together (the peak), one that ends holding a lock, one that registers and records nothing.
_CHURN_SCRIPT = textwrap.dedent(
    """
    import json, threading
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.trace import TracerProvider
    from otel_lockwatch import LockwatchInstrumentor
    from otel_lockwatch._session import RECORDER
    from otel_lockwatch.capture import _fast_path
    from otel_lockwatch.record import _recorder

    _recorder.MAX_WORKERS, _recorder.FOLD_BATCH = 6, 4  # read at each registration and end
    LockwatchInstrumentor().instrument(
        tracer_provider=TracerProvider(), meter_provider=MeterProvider(), manifest=False
    )
    lock, other = threading.Lock(), threading.RLock()
    together = threading.Barrier(3)
    kinds = []

    def run(target, name):
        t = threading.Thread(target=target, name=name)
        t.start()
        t.join()

    def once():
        with lock:
            pass
        end = type(RECORDER.tls.alive)
        kinds.append(f"{end.__module__}.{end.__qualname__}")

    def twice():
        with lock:
            with other:
                pass
        with lock:
            pass

    def pooled():
        with lock:
            pass
        together.wait()

    def nothing():
        RECORDER.thread_state()  # a state, and nothing recorded

    for i in range(23):
        run(once if i % 3 else twice, f"request-{i % 9}")
    run(nothing, "idle")
    pool = [threading.Thread(target=pooled, name=f"pooled-{i}") for i in range(3)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    for i in range(2):
        run(once, "late")
    run(lambda: lock.acquire(), "holder")
    states = [
        {
            "worker": s.worker,
            "retired": s.thread() is None,
            "folded": s.retired > 0,
            "held": len(s.held),
            "acquisitions": sorted(x.acquisitions for x in s.stats.values()),
        }
        for s in RECORDER.states
        if s.worker != "otel-lockwatch-emitter"
    ]
    lock.release()
    data = RECORDER.snapshot()
    print(json.dumps({
        "c": _fast_path.SPEEDUPS,
        "kinds": sorted(set(kinds)),
        "states": states,
        "names": sorted(RECORDER._names - {"otel-lockwatch-emitter"}),
        "retired": sorted(RECORDER._retired),
        "ended": [s.worker for s in RECORDER._ended],
        "peak": data["pool"]["peak_workers"],
        "locks": {name: v["acquisitions"] for name, v in sorted(data["locks"].items())},
        "workers": sorted(data["workers"]),
    }))
    """
)


def test_the_c_path_registers_and_ends_threads_as_the_python_path_does():
    """The C path registers a thread and ends it itself (``_speedups.c``, a thread's
    registration and end); the Python path (``Recorder.new_thread_state``, ``ThreadEnd``) is
    the reference. The same threads, run on each: the same worker names ("(other)" past
    ``MAX_WORKERS``), the same states left (retired in place, folded a batch at a time, the
    ended ones waiting for a batch, the one ended holding a lock), the same peak and counts."""
    runs = {}
    for pure in (False, True):
        env = dict(os.environ, LOCKWATCH_DISABLE_EXTENSIONS="1" if pure else "")
        done = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", _CHURN_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        runs[pure] = json.loads(done.stdout)
    c, python = runs[False], runs[True]
    assert python.pop("c") is False
    assert python.pop("kinds") == ["otel_lockwatch.record._peak.ThreadEnd"]
    if not c.pop("c"):
        pytest.skip("the C extension is not in use: nothing to compare")
    # the C path's own end (no Python __del__); the first "(other)" is Python's (its warning)
    assert c.pop("kinds") == [
        "otel_lockwatch.capture._speedups.ThreadEnd",
        "otel_lockwatch.record._peak.ThreadEnd",
    ]
    assert c == python
    assert "(other)" in c["names"] and c["ended"] and c["peak"] == 3
    assert any(s["folded"] for s in c["states"])
    assert [s["held"] for s in c["states"] if s["held"]] == [1]  # the holder's (an "(other)")


def test_a_thread_s_end_counts_nothing_while_the_interpreter_finalizes(monkeypatch):
    """While the interpreter finalizes (the main thread's locals are freed then) a thread's end
    calls nothing: the count's lock may be held by a thread that can never run again (the
    free-threaded build parks one that tries to, forever), and the main thread waited for it,
    a hang at exit (an inner pytest run of the xdist plugin test, 3.13t, December 2026). The C
    ThreadEnd checks the same with Py_IsFinalizing, which a test cannot set."""
    calls = []
    end = ThreadEnd((lambda state, generation: calls.append((state, generation)), "s", 1))
    monkeypatch.setattr(sys, "is_finalizing", lambda: True)
    del end
    assert calls == []
    monkeypatch.setattr(sys, "is_finalizing", lambda: False)
    end = ThreadEnd((lambda state, generation: calls.append((state, generation)), "s", 2))
    del end
    assert calls == [("s", 2)]
