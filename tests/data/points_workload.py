"""Contended waits at known sites, each holder and waiter on a line of its own; writes the
manifest to argv[2] and prints the points it kept (sites and counts) as JSON.

argv[1] is the workload: ``a`` (three waits on ``alpha`` from ``wait_a`` while ``hold_a``
holds it), ``b`` (two on ``alpha`` from ``wait_b`` while ``hold_b`` holds it, one on an RLock
and one on a section array), or ``ab`` (both, in one process). Run by
tests/test_contention_points.py on the C path and on the pure-Python path
(LOCKWATCH_DISABLE_EXTENSIONS=1). Every wait is made certain with events and by polling the
waiter's ``waiting`` (the class it is blocked on): no sleep.
"""

from __future__ import annotations

import json
import sys
import threading
import time

from otel_lockwatch import LockwatchInstrumentor, StripedSections, name_lock
from otel_lockwatch._session import RECORDER


def _blocked(name: str) -> None:
    deadline = time.monotonic() + 30
    while not any(
        st.waiting is not None and st.waiting.name == name for st in list(RECORDER.states)
    ):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no worker blocked on {name}")


def contend(name: str, holder, waiter) -> None:
    """``holder(held, go)`` takes the lock, sets ``held``, waits for ``go``; ``waiter`` blocks on
    it meanwhile."""
    held, go = threading.Event(), threading.Event()
    h = threading.Thread(target=holder, args=(held, go), name="holder")
    h.start()
    held.wait()
    w = threading.Thread(target=waiter, name="waiter")
    w.start()
    _blocked(name)
    go.set()
    h.join()
    w.join()


def workload_a(alpha) -> None:
    def hold_a(held, go):
        with alpha:
            held.set()
            go.wait()

    def wait_a():
        with alpha:
            pass

    for _ in range(3):
        contend("alpha", hold_a, wait_a)


def workload_b(alpha, rlock, sections) -> None:
    def hold_b(held, go):
        with alpha:
            held.set()
            go.wait()

    def wait_b():
        with alpha:
            pass

    for _ in range(2):
        contend("alpha", hold_b, wait_b)

    def hold_r(held, go):
        with rlock:
            held.set()
            go.wait()

    def wait_r():
        with rlock:
            pass

    contend("beta", hold_r, wait_r)

    def hold_s(held, go):
        with sections.lock("k"):
            held.set()
            go.wait()

    def wait_s():
        with sections.lock("k"):
            pass

    contend("sections", hold_s, wait_s)


def main() -> None:
    which, path = sys.argv[1], sys.argv[2]
    LockwatchInstrumentor().instrument(manifest_path=path)
    alpha = name_lock(threading.Lock(), "alpha")
    rlock = name_lock(threading.RLock(), "beta")
    sections = StripedSections(4, name="sections")
    if "a" in which:
        workload_a(alpha)
    if "b" in which:
        workload_b(alpha, rlock, sections)
    data = RECORDER.snapshot()
    print(
        json.dumps(
            {
                name: {
                    "waiters": {s: h.count for s, h in lock["contention_points"].items()},
                    "holders": {s: r["count"] for s, r in lock["contending_points"].items()},
                }
                for name, lock in data["locks"].items()
                if "contention_points" in lock
            },
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
