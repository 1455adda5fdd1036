"""The contract between the C fast path and the pure-Python path (``capture/_fast_path.py``).

The contract is written once, in ``_fast_path``'s docstring and its tables; this file holds each
implementation to it. Every check runs on both paths, each in a process of its own (the path is
chosen at import), and compares what that path shows with what the contract says, so the two
agree because each keeps the contract, not because they were compared with each other.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from otel_lockwatch.capture import _fast_path

ROOT = Path(__file__).resolve().parent.parent
PATHS = ["C", "Python"] if _fast_path.SPEEDUPS else ["Python"]

# What one path shows: its held-entry type's fields; the held stack seen by the raw lock's own
# acquire and release (a lock object of the test's, which the proxy calls as it calls a
# `_thread.lock`); and another thread's view of a worker blocked in a watched acquire.
OBSERVE = r"""
import json, sys, threading
from otel_lockwatch import LockwatchInstrumentor
from otel_lockwatch.capture import _fast_path
from otel_lockwatch._session import RECORDER

LockwatchInstrumentor().instrument(manifest=False)
proxy = threading.Lock()
seen = {}


def mine(state):
    # the entries of `proxy` on a held stack
    return [e for e in list(state.held) if e.lock is proxy]


class RawLock:
    # A lock the proxy takes as it takes a `_thread.lock`: it notes, when it is called, whether
    # the calling worker's held stack lists the proxy's hold yet.
    def __init__(self):
        self.real = threading._allocate_lock()
        self.blocked = threading.Event()

    def acquire(self, blocking=True, timeout=-1):
        state = RECORDER.thread_state()
        name = threading.current_thread().name
        seen.setdefault(name, []).append(("acquire", bool(blocking), len(mine(state))))
        if blocking:
            self.blocked.set()
        return self.real.acquire(blocking, timeout)

    def release(self):
        seen.setdefault(threading.current_thread().name, []).append(
            ("release", None, len(mine(RECORDER.thread_state())))
        )
        self.real.release()

    def locked(self):
        return self.real.locked()


raw = proxy._lw_lock = RawLock()
for _ in range(3):  # warm: the worker's state and statistics exist
    with proxy:
        pass
seen.clear()

# A hold: the entry on the stack, by name.
with proxy:
    (entry,) = mine(RECORDER.thread_state())
    fields = {
        "type_fields": list(type(entry).__match_args__),
        "lock_class": entry.lock_class is proxy._lockwatch_class,
        "frame": entry.frame is sys._getframe(),
        "lasti": isinstance(entry.lasti, int),
        "lock": entry.lock is proxy,
        "canonical": entry.canonical is False,
    }
after_release = len(mine(RECORDER.thread_state()))

# A failed try, then a wait seen from another thread.
hold_now, let_go, holder_in = threading.Event(), threading.Event(), threading.Event()
waiter_state, waiter_took = {}, threading.Event()


def holder():
    with proxy:
        holder_in.set()
        let_go.wait()


def waiter():
    waiter_state["state"] = RECORDER.thread_state()
    waiter_state["try"] = proxy.acquire(False)
    waiter_state["after_try"] = len(mine(RECORDER.thread_state()))
    proxy.acquire()
    waiter_state["after_wait"] = len(mine(RECORDER.thread_state()))
    waiter_took.set()
    proxy.release()


raw.blocked.clear()
h = threading.Thread(target=holder, name="holder")
h.start()
holder_in.wait()
raw.blocked.clear()
w = threading.Thread(target=waiter, name="waiter")
w.start()
raw.blocked.wait()  # the waiter is in the raw lock's blocking acquire
state = waiter_state["state"]
while_blocked = {
    "listed": len(mine(state)),
    "waiting": state.waiting is proxy._lockwatch_class,
}
let_go.set()
waiter_took.wait()
h.join()
w.join()
# The per-thread state, the per-class statistics and a lock's hold, as this path makes them.
from otel_lockwatch.capture._bookkeeping import HOLD_FIELDS
from otel_lockwatch.record._recorder import WORKER_FIELDS
from otel_lockwatch.record._stats import STATS_FIELDS

stats = _fast_path.new_stats()
worker = RECORDER.thread_state()
fields_of = {
    "stats": [name for name in STATS_FIELDS if hasattr(stats, name)],
    "worker": [name for name in WORKER_FIELDS if hasattr(worker, name)],
    "hold": [name for name in HOLD_FIELDS if hasattr(proxy, name)],
}
c_reads = _fast_path.speedups.direct_slots() if _fast_path.SPEEDUPS else {}

# The slow paths' events: the C path's types, and the receivers given exactly the contract's
# fields (an object with those attributes and no others).
from types import SimpleNamespace
from otel_lockwatch.capture import _bookkeeping
from otel_lockwatch.capture._switched_out import window_event

events = {}
if _fast_path.SPEEDUPS:
    events["Acquisition"] = list(_fast_path.speedups.Acquisition.__match_args__)
    events["Release"] = list(_fast_path.speedups.Release.__match_args__)
free = threading._allocate_lock()
acquisition = dict.fromkeys(_fast_path.ACQUISITION_FIELDS)
acquisition.update(
    worker=RECORDER.thread_state(), stats=_fast_path.new_stats(),
    lock_class=proxy._lockwatch_class, frame=sys._getframe(), lock=free, hold=proxy,
    canonical=False, timeout=-1,
)
received = {
    "order": _bookkeeping.check_order_event(SimpleNamespace(**acquisition)),
    "wait": window_event(SimpleNamespace(**acquisition)),  # before the C path's own wait
}
free.release()
release = dict.fromkeys(_fast_path.RELEASE_FIELDS)
release.update(worker=RECORDER.thread_state(), entry=entry, start_ns=0, end_ns=1)
received["hold"] = _bookkeeping.record_hold_event(SimpleNamespace(**release))
print(json.dumps({
    "events": events,
    "received": received,
    "c": _fast_path.SPEEDUPS,
    "fields_of": fields_of,
    "c_reads": c_reads,
    "contract_fields": list(_fast_path.HELD_ENTRY_FIELDS),
    "entry": fields,
    "after_release": after_release,
    "seen_by_raw_lock": seen,
    "waiter": {k: v for k, v in waiter_state.items() if k != "state"},
    "while_blocked": while_blocked,
}))
"""


def _observe(path: str) -> dict:
    env = dict(os.environ)
    env.pop("LOCKWATCH_DISABLE_EXTENSIONS", None)
    if path == "Python":
        env["LOCKWATCH_DISABLE_EXTENSIONS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    for var in ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_LOGS_EXPORTER"):
        env[var] = "none"
    done = subprocess.run(
        [sys.executable, "-c", OBSERVE], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    got: dict = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["c"] is (path == "C")
    return got


@pytest.fixture(scope="module", params=PATHS)
def observed(request: pytest.FixtureRequest) -> dict:
    return _observe(request.param)


def test_held_entries_have_the_contracts_fields(observed: dict) -> None:
    """A held-stack entry is the path's ``HeldEntry``, whose fields are the contract's, in its
    order, each holding what the contract says."""
    assert observed["entry"]["type_fields"] == list(_fast_path.HELD_ENTRY_FIELDS)
    assert observed["contract_fields"] == list(_fast_path.HELD_ENTRY_FIELDS)
    assert all(observed["entry"][name] for name in _fast_path.HELD_ENTRY_FIELDS)


def test_the_entry_is_pushed_once_the_lock_is_taken(observed: dict) -> None:
    """The push point: the raw lock's acquire never finds the hold on the caller's stack (not for
    the acquisition, not for a try that fails, not for the wait that follows); its release does
    (the entry is popped after it); the stack lists the hold once acquire returned, and not
    after the release."""
    assert observed["seen_by_raw_lock"]["MainThread"] == [
        ["acquire", False, 0],  # the try of the `with` (the C path and the Python path alike)
        ["release", None, 1],
    ]
    assert observed["seen_by_raw_lock"]["waiter"] == [
        ["acquire", False, 0],  # proxy.acquire(False): the try fails
        ["acquire", False, 0],  # proxy.acquire(): its try fails too...
        ["acquire", True, 0],  # ...then it waits
        ["release", None, 1],
    ]
    assert observed["after_release"] == 0
    assert observed["waiter"] == {"try": False, "after_try": 0, "after_wait": 1}


def test_a_blocked_worker_is_waiting_and_holds_nothing_for_it(observed: dict) -> None:
    """Seen from another thread while a worker blocks in a watched acquire: its ``waiting`` is
    the lock's class and its held stack does not list the lock (the live gauges count it as a
    waiter, not a holder)."""
    assert observed["while_blocked"] == {"listed": 0, "waiting": True}


def test_state_statistics_and_holds_have_the_tables_fields(observed: dict) -> None:
    """The per-thread state, a worker's statistics for a class (on the C path, a ``StatsBase``
    whose counters are C integers) and a lock's hold have every field of their tables, by name;
    and every field the C path reads is one of its class's table, read at its slot's offset."""
    from otel_lockwatch.capture._bookkeeping import HOLD_FIELDS
    from otel_lockwatch.capture._sections import ARRAY_FIELDS, TRACK_FIELDS
    from otel_lockwatch.record._handoff_stats import HANDOFF_FIELDS
    from otel_lockwatch.record._recorder import WORKER_FIELDS
    from otel_lockwatch.record._stats import STATS_FIELDS

    assert observed["fields_of"] == {
        "stats": list(STATS_FIELDS),
        "worker": list(WORKER_FIELDS),
        "hold": list(HOLD_FIELDS),
    }
    tables = {
        "WorkerState": WORKER_FIELDS,
        "Stats": STATS_FIELDS,
        "Hold": HOLD_FIELDS,
        "ArrayTrack": TRACK_FIELDS,
        "StripedSections": ARRAY_FIELDS,
        "HandoffStats": HANDOFF_FIELDS,
    }
    for key, direct in observed["c_reads"].items():
        cls, name = key.split(".", 1)
        assert name in tables[cls], key
        assert direct, key
    assert bool(observed["c_reads"]) is observed["c"]


# What may be declared `static` at file level in the C file: CPython's declaration tables (which
# its API takes as non-const pointers), constants, and functions. Anything else is state.
_DECLARATIONS = (
    "PyMethodDef",
    "PyMemberDef",
    "PyGetSetDef",
    "PyType_Slot",
    "PyType_Spec",
    "PyModuleDef_Slot",
    "struct PyModuleDef",
)


def test_the_c_file_keeps_no_state_at_file_level() -> None:
    """Every mutable thing the C path keeps is in its module's state (PEP 489), so that a
    subinterpreter, and the free-threaded build, get state of their own: no file-level variable
    that is not a constant or one of CPython's declaration tables, and no thread-local."""
    source = (ROOT / "otel_lockwatch" / "capture" / "_speedups.c").read_text()
    offenders = []
    for line in source.splitlines():
        if line.lstrip().startswith(("/*", "*")):
            continue  # a comment
        if "__thread" in line or "thread_local" in line:
            offenders.append(line)
        if not line.startswith("static ") or line.startswith("static const "):
            continue
        declared = line[len("static ") :]
        if not any(mark in declared for mark in ";=["):
            continue  # a function's return type (its name and parameters on the next line)
        if not declared.startswith(_DECLARATIONS):
            offenders.append(line)
    assert offenders == []


def test_slow_paths_take_one_event_with_the_contracts_fields(observed: dict) -> None:
    """The C path calls each slow path with one event (``Acquisition``, ``Release``) whose
    fields are the contract's, in its order; the receivers read no other field."""
    if observed["c"]:
        assert observed["events"] == {
            "Acquisition": list(_fast_path.ACQUISITION_FIELDS),
            "Release": list(_fast_path.RELEASE_FIELDS),
        }
    assert observed["received"] == {"order": None, "wait": True, "hold": None}
