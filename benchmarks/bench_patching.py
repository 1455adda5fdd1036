"""What the way a patch is installed costs: a plain function set on the class (``setattr``)
against a wrapt ``FunctionWrapper`` (``wrapt.wrap_function_wrapper``), per patch target.

Run: ``python benchmarks/bench_patching.py`` (``--quick`` for a short run). For every target of
lockwatch's patch table it times one operation that goes through the target, in one process, in
interleaved rounds, on the calling thread's CPU time (best round):

- **bare**: the attribute as the library has it;
- **setattr**: replaced by a plain function that only forwards (``def f(self, *a, **k): return
  original(self, *a, **k)``), set on the owner as ``_patches`` sets the hot path's;
- **wrapt**: replaced by ``wrapt.wrap_function_wrapper(owner, name, w)`` with a wrapper that only
  forwards (``w(wrapped, instance, args, kwargs): return wrapped(*args, **kwargs)``), removed by
  ``wrapt.unwrap_object``.

Neither replacement records anything: the figures are the cost of the mechanism alone, the floor
under any instrumentation installed that way. lockwatch is not instrumented here. Nothing here is
a test: the figures go into docs/ARCHITECTURE.md ("How the patches are installed").
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import multiprocessing
import multiprocessing.synchronize as _sync
import os
import queue
import sys
import tempfile
import threading
import time
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import wrapt

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otel_lockwatch import AsyncStripedSections, StripedSections  # noqa: E402

LOOP = asyncio.new_event_loop()


def forward_setattr(owner: Any, name: str) -> Callable[[], None]:
    """Replace ``owner.name`` by a plain forwarding function; returns the undo."""
    original = vars(owner)[name]
    if isinstance(owner, type):

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            return original(self, *args, **kwargs)

        replacement: Any = method
    else:

        def function(*args: Any, **kwargs: Any) -> Any:
            return original(*args, **kwargs)

        replacement = function
    setattr(owner, name, replacement)
    return lambda: setattr(owner, name, original)


def _forward(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
    return wrapped(*args, **kwargs)


def forward_wrapt(owner: Any, name: str) -> Callable[[], None]:
    """Wrap ``owner.name`` with a forwarding wrapt wrapper; returns the undo."""
    handle = wrapt.wrap_function_wrapper(owner, name, _forward)
    return lambda: wrapt.unwrap_object(owner, name, handle)


def sync(op: Callable[[], Any]) -> Callable[[int], float]:
    def run(number: int) -> float:
        return timeit.timeit(op, number=number, timer=time.thread_time)

    return run


def in_loop(make: Callable[[], Any]) -> Callable[[int], float]:
    """``make()`` is a coroutine function of one iteration, awaited ``number`` times in a loop."""

    async def loop(number: int) -> float:
        step = make()
        t0 = time.thread_time()
        for _ in range(number):
            await step()
        return time.thread_time() - t0

    return lambda number: LOOP.run_until_complete(loop(number))


def targets(tmp: str) -> list[tuple[str, list[tuple[Any, str]], Callable[[int], float]]]:
    sections = StripedSections(64, name="bench")
    sem = threading.Semaphore(4)
    event = threading.Event()
    done = concurrent.futures.Future()
    done.set_result(1)
    mp_lock = multiprocessing.Lock()

    def async_lock() -> Any:
        lock = asyncio.Lock()

        async def step() -> None:
            async with lock:
                pass

        return step

    def async_sections() -> Any:
        array = AsyncStripedSections(64, name="bench-async")

        async def step() -> None:
            async with array.lock("k"):
                pass

        return step

    def async_sem() -> Any:
        sem = asyncio.Semaphore(4)

        async def step() -> None:
            async with sem:
                pass

        return step

    def async_event() -> Any:
        event = asyncio.Event()
        event.set()

        async def step() -> None:
            await event.wait()

        return step

    def semaphore_pair() -> None:
        with sem:
            pass

    def section_pair() -> None:
        with sections.lock("k"):
            pass

    def event_pair() -> None:
        event.set()
        event.wait()

    def mp_pair() -> None:
        with mp_lock:
            pass

    def file_pair() -> None:
        with lock_file:
            pass

    import filelock

    lock_file = filelock.FileLock(os.path.join(tmp, "bench.lock"))
    sem_lock = asyncio.locks.Semaphore
    return [
        # kept on setattr (the C path's callables, or the hot path)
        ("threading.Lock()", [(threading, "Lock")], sync(lambda: threading.Lock())),
        ("threading.RLock()", [(threading, "RLock")], sync(lambda: threading.RLock())),
        ("threading.Condition()", [(threading.Condition, "__init__")], sync(threading.Condition)),
        ("threading.Semaphore()", [(threading.Semaphore, "__init__")], sync(threading.Semaphore)),
        (
            "with Semaphore: pass",
            [(threading.Semaphore, "__enter__"), (threading.Semaphore, "release")],
            sync(semaphore_pair),
        ),
        (
            "section pair (with s.lock(k))",
            [(StripedSections, "_acquire"), (StripedSections, "_release")],
            sync(section_pair),
        ),
        ("threading.Event()", [(threading.Event, "__init__")], sync(threading.Event)),
        (
            "Event set(); wait()",
            [(threading.Event, "set"), (threading.Event, "wait")],
            sync(event_pair),
        ),
        ("Future()", [(concurrent.futures.Future, "__init__")], sync(concurrent.futures.Future)),
        (
            "futures.wait([done])",
            [(concurrent.futures, "wait")],
            sync(lambda: concurrent.futures.wait([done])),
        ),
        ("queue.Queue()", [(queue.Queue, "__init__")], sync(queue.Queue)),
        (
            "async with Semaphore",
            [(sem_lock, "acquire"), (sem_lock, "release")],
            in_loop(async_sem),
        ),
        ("await Event.wait()", [(asyncio.locks.Event, "wait")], in_loop(async_event)),
        # routed through wrapt
        (
            "async with asyncio.Lock",
            [(asyncio.locks.Lock, "acquire"), (asyncio.locks.Lock, "release")],
            in_loop(async_lock),
        ),
        ("asyncio.Lock()", [(asyncio.locks.Lock, "__init__")], sync(asyncio.Lock)),
        (
            "async section pair",
            [(AsyncStripedSections, "_acquire"), (AsyncStripedSections, "_release")],
            in_loop(async_sections),
        ),
        (
            "with multiprocessing.Lock",
            [(_sync.SemLock, "__enter__"), (_sync.SemLock, "__exit__")],
            sync(mp_pair),
        ),
        ("multiprocessing.Lock()", [(_sync.SemLock, "__init__")], sync(multiprocessing.Lock)),
        (
            "ProcessPoolExecutor(2).shutdown()",
            [(concurrent.futures.ProcessPoolExecutor, "__init__")],
            sync(lambda: concurrent.futures.ProcessPoolExecutor(2).shutdown()),
        ),
        (
            "with FileLock (flock)",
            [(filelock.BaseFileLock, "acquire"), (filelock.UnixFileLock, "_acquire")],
            sync(file_pair),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    quick = parser.parse_args().quick
    rounds = 3 if quick else 7
    print(f"patch mechanism A/B; Python {sys.version.split()[0]}; wrapt {wrapt.__version__}")
    print(f"ns per operation, best of {rounds} interleaved rounds (thread CPU time)\n")
    print(f"{'operation':34} {'bare':>8} {'setattr':>15} {'wrapt':>15} {'wrapt-setattr':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for label, attrs, run in targets(tmp):
            number = 200 if "FileLock" in label or "Pool" in label else 20_000
            if quick:
                number //= 4
            best = {"bare": float("inf"), "setattr": float("inf"), "wrapt": float("inf")}
            run(number // 10)  # warm up
            for _ in range(rounds):
                for how, patch in (
                    ("bare", None),
                    ("setattr", forward_setattr),
                    ("wrapt", forward_wrapt),
                ):
                    undo = [patch(owner, name) for owner, name in attrs] if patch else []
                    try:
                        best[how] = min(best[how], run(number) / number * 1e9)
                    finally:
                        for u in reversed(undo):
                            u()
            bare, plain, wrapped = best["bare"], best["setattr"], best["wrapt"]
            print(
                f"{label:34} {bare:8.0f} {plain:8.0f} ({plain / bare:4.2f}x)"
                f" {wrapped:8.0f} ({wrapped / bare:4.2f}x) {wrapped - plain:+12.0f}"
            )


if __name__ == "__main__":
    main()
