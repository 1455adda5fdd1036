"""Running a call with a deadline: on a helper thread, which the caller waits for at most so long.

lockwatch's exit work (the final flush, the SDK's processors shut down) may block for as long as
an exporter retries a collector that is down, and the process must still leave in time, so each
step runs on a helper thread the caller waits for with a timeout (:func:`run_bounded`).

A helper thread cannot always be started: CPython 3.12 refuses any new thread once the
interpreter is shutting down, atexit handlers included (gh-113964; 3.13 allows it again), and a
process at its thread limit refuses one at any time. So three *standby* threads, started with
the exit hooks (:meth:`Standby.ensure`), wait idle and run the calls a refused thread would have
run, still within the caller's deadline. Three, because at most two exit steps may be stuck at
once, each in an exporter retrying a collector that is down (the final flush of the manifest's
log record, then a span processor's shutdown), and the step that ends their retries (that
exporter's shutdown) needs a thread of its own: with two, it waited in the queue behind them,
and the SDK's own exit hooks then waited out the exporter's timeout (7-8 s past the work with
a 1 s budget). Only with no standby does a call run on its caller, without a deadline.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from .._session import OUTBOX, PROCESS

__all__ = ["Standby", "run_bounded", "standby"]

#: How long a bounded call's caller waits, once the call has returned, for its helper thread's
#: end (:func:`run_bounded`): microseconds normally.
HELPER_END_GRACE_S = 1.0


class Standby:
    """Idle daemon threads, :data:`THREADS` per process, that run the calls handed to them
    (each by the first thread free). The process's one is :func:`standby`."""

    THREADS = 3

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._pid = 0

    def ensure(self) -> None:
        """Start the threads, unless this process has them.

        A forked child has none (threads do not survive a fork), and none are started for it:
        a program's child sees only the threads it started (CPython's own fork tests count
        them). Its exit work starts helper threads as usual; only a child leaving through
        atexit on 3.12 runs those steps on its exiting thread, without the deadline.
        """
        if self.ready():
            return
        calls: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        threads = [
            threading.Thread(
                target=self._serve, args=(calls,), name="otel-lockwatch-standby", daemon=True
            )
            for _ in range(self.THREADS)
        ]
        try:
            for thread in threads:
                thread.start()
        except RuntimeError as exc:  # no thread now either: calls run on their caller
            OUTBOX.failed(exc)
            return
        self._calls, self._threads, self._pid = calls, threads, os.getpid()

    def ready(self) -> bool:
        return self._pid == os.getpid() and any(t.is_alive() for t in self._threads)

    def submit(self, call: Callable[[], None]) -> bool:
        """Hand ``call`` to the threads; False when this process has none."""
        if not self.ready():
            return False
        self._calls.put(call)
        return True

    @staticmethod
    def _serve(calls: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            calls.get()()  # each call catches its own errors (run_bounded's run)


def standby() -> Standby:
    """The process's standby threads (``_session.PROCESS.standby``), made on first use."""
    threads: Standby = PROCESS.part("standby", Standby)
    return threads


def run_bounded(fn: Callable[[], Any], timeout_s: float, name: str) -> bool:
    """Run ``fn`` on a daemon thread named ``name`` and wait at most ``timeout_s`` for it.

    An exception in ``fn`` is counted (``OUTBOX.failed``), never raised. When no thread can be
    started, the standby thread runs it; when there is none, the caller does, unbounded.

    Returns:
        True when ``fn`` returned (or raised) in time. The helper's end (its thread-locals
        cleared) is then waited for too, within the deadline and at most
        :data:`HELPER_END_GRACE_S`.
    """
    done = threading.Event()

    def run() -> None:
        try:
            fn()
        except Exception as exc:  # the SDK's trouble, not the host's
            OUTBOX.failed(exc)
        finally:
            done.set()

    budget_s = max(0.0, timeout_s)
    deadline = time.monotonic() + budget_s
    helper = threading.Thread(target=run, name=name, daemon=True)
    try:
        helper.start()
    except RuntimeError:  # the interpreter starts no thread now (shutting down on 3.12, limits)
        if not standby().submit(run):
            run()
        return done.wait(budget_s)
    if not done.wait(budget_s):
        return False
    # Then the helper's end, within what is left of the deadline and at most
    # HELPER_END_GRACE_S: a thread's end runs lockwatch's thread-end hook
    # (``record._peak.ThreadEnd``) as its thread-locals are cleared, and on the free-threaded
    # build a helper still ending while the caller went on to the interpreter's finalization
    # could hang it (the hook suspends the thread-locals' critical section, a second ending
    # thread is handed it and never let back in, and the finalization waits for it: the demo's
    # exit hung so 4 times in 40 on a loaded machine). The grace bounds the one case where the
    # end could wait on the caller: a caller holding a recorder lock (a signal handler that
    # interrupted the recorder), whose helper's hook would wait for it.
    helper.join(max(0.0, min(deadline - time.monotonic(), HELPER_END_GRACE_S)))
    return True
