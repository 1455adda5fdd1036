"""Re-entrant calls into lockwatch from signal handlers and finalizers: the program must end.

    python reentrancy_stress.py MODE SECONDS MANIFEST

MODE:
- ``signals``: the main thread evaluates and writes the manifest in a loop while SIGALRM fires
  every 0.5 ms; the handler creates locks and nests them (new lock-order edges, cycles);
  checkpoints run every 10 ms; a second thread nests 50 instrumented locks over and over.
- ``finalizers``: the same loop, while objects whose ``__del__`` nests instrumented locks are
  collected by the garbage collector at whatever point it runs (inside lockwatch's bookkeeping
  too).
- ``handler-evaluates``: the loop, with a lock-order graph of thousands of edges (so reading it
  takes a while), while SIGALRM fires every 10 ms and the handler evaluates the manifest itself,
  as the SIGTERM handler does: a handler that lands inside the main thread's own read of the
  recorder must not wait for a lock that thread holds.
- ``sigterm``: the loop and the nesting thread, until the parent sends SIGTERM: the process must
  end (by SIGTERM, with its manifest written).

It prints ``ready`` once the loop runs and, unless killed, ``done N`` at the end.
"""

from __future__ import annotations

import faulthandler
import gc
import random
import signal
import sys
import sysconfig
import threading
import time

from otel_lockwatch import LockwatchInstrumentor, evaluate, write_manifest

mode, seconds, manifest = sys.argv[1], float(sys.argv[2]), sys.argv[3]
# A run that hangs says where, on stderr, before the test's deadline ends it (a C thread's
# timer: no signal, no lock of this process).
faulthandler.dump_traceback_later(max(60.0, seconds + 30))
LockwatchInstrumentor().instrument(manifest_path=manifest, checkpoint_interval_s=0.01)

stop = threading.Event()
pool = [threading.Lock() for _ in range(8)]  # one class: created at one site
named = [threading.RLock() for _ in range(8)]


def make(i: int) -> threading.Lock:
    # Four creation sites: four classes, so nesting them makes edges (and cycles) to record.
    if i % 4 == 0:
        return threading.Lock()
    if i % 4 == 1:
        return threading.Lock()
    if i % 4 == 2:
        return threading.Lock()
    return threading.Lock()


depth = threading.local()


def nest_two(i: int) -> None:
    # A call nested in another on the same thread (a handler or a finalizer run inside one) takes
    # the next slot of `named` and `pool`: the slot of an outer call may be held, and a plain
    # Lock taken again by its holder is the program's own deadlock, not lockwatch's (it hung on
    # 3.10's pure path, whose longer held windows let eight handlers nest). Each thread takes the
    # slots in one increasing order, so threads cannot deadlock on them either.
    d = getattr(depth, "n", 0)
    if d == len(pool):
        return
    depth.n = d + 1
    try:
        a, b = make(i), make(i + 1)
        first, second = (a, b) if i % 2 else (b, a)
        with first, second:
            pass
        with named[d], pool[d]:
            pass
    finally:
        depth.n = d


def nester() -> None:
    locks = [threading.Lock() for _ in range(50)]
    while not stop.is_set():
        for lock in locks:
            lock.acquire()
        for lock in reversed(locks):
            lock.release()


class Finalized:
    counter = 0

    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it, at a point of its choosing

    def __del__(self) -> None:
        Finalized.counter += 1
        nest_two(Finalized.counter)


handled = 0


def on_alarm(signum: int, frame: object) -> None:
    global handled
    handled += 1
    nest_two(handled)


in_handler = False


def on_alarm_evaluate(signum: int, frame: object) -> None:
    # One evaluation at a time, as one SIGTERM is handled once: an alarm that lands inside the
    # handler's own evaluation returns at once (else the handlers would nest without end).
    global handled, in_handler
    if in_handler:
        return
    in_handler = True
    try:
        handled += 1
        evaluate()
    finally:
        in_handler = False


def many_edges(classes: int) -> None:
    """``classes`` lock classes (one creation site each), every ordered pair nested once."""
    code = "\n".join(f"def make{i}():\n    return threading.Lock()" for i in range(classes))
    space: dict = {"threading": threading}
    exec(compile(code, "many_sites", "exec"), space)
    locks = [space[f"make{i}"]() for i in range(classes)]
    for i, a in enumerate(locks):
        for b in locks[i + 1 :]:
            with a, b:
                pass


threading.Thread(target=nester, daemon=True).start()
if mode == "handler-evaluates":
    many_edges(40)
    signal.signal(signal.SIGALRM, on_alarm_evaluate)
    signal.setitimer(signal.ITIMER_REAL, 0.01, 0.01)  # an evaluation takes a few ms here
elif mode == "signals":
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
elif mode == "finalizers":
    # The free-threaded build also waits for a quarter of the long-lived objects (OpenTelemetry's
    # among them) unless the next generation's threshold is 0: no collection in a whole run there.
    gc.set_threshold(50, 0 if sysconfig.get_config_var("Py_GIL_DISABLED") else 5, 5)


def reentered() -> bool:
    """Whether anything has re-entered lockwatch yet (a run in which nothing did proves nothing)."""
    if mode == "finalizers":
        return Finalized.counter > 0
    return mode == "sigterm" or handled > 0


print("ready", flush=True)


deadline = time.monotonic() + seconds
# Past the deadline, a run in which nothing re-entered goes on until something has, up to ten
# times as long (a loaded free-threaded machine once ran a whole 3 s of finalizers with no
# collection at all: the test then had nothing to judge).
patience = deadline + 9 * seconds
rounds = 0
while time.monotonic() < deadline or (not reentered() and time.monotonic() < patience):
    rounds += 1
    evaluate()
    if rounds % 5 == 0:
        write_manifest()
    if mode == "finalizers":
        for _ in range(200):
            Finalized()
    nest_two(random.randrange(1000))
signal.setitimer(signal.ITIMER_REAL, 0, 0)
stop.set()
print("done", rounds, handled, Finalized.counter, flush=True)
