"""What watching events and futures costs when nobody waits on them, as ratios of one run.

Run: ``python benchmarks/bench_events.py`` (``--quick`` for a short run). A pool may make an
event or a future per request (httpcore's sync pool an ``Event`` per queued request, aiohttp's
connector a future per waiter), and most are set before anyone waits: creating one and setting
it is a hot path of its own. Each path runs in a process of its own (the path is chosen at
import): the C fast path and the pure-Python path (``LOCKWATCH_DISABLE_EXTENSIONS=1``). Each row
is a statement timed in ``timeit``'s loop on the thread's CPU time, best of interleaved rounds, bare
(instrumentation off) and instrumented in the same process, so each ratio divides by its own
baseline:

- ``threading.Event()`` then ``set()``;
- ``asyncio.Event()`` then ``set()``;
- ``loop.create_future()`` then ``set_result()``;
- ``concurrent.futures.Future()`` then ``set_result()``.

The statements run in a module of their own (``bench_events``), which is watched code: what
they make would be watched when a wait on it blocked. Each process then checks that: one
blocked wait on each kind, made at the same statement, must be recorded as a hand-off wait, or the
run fails (a row that measured objects nobody watches would prove nothing).

Nothing here is a test: the figures go into docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from otel_lockwatch import LockwatchInstrumentor  # noqa: E402
from otel_lockwatch.capture import _fast_path  # noqa: E402
from otel_lockwatch.record._recorder import RECORDER  # noqa: E402

#: Each row: (its name, the statement, the kind of what it makes).
ROWS = (
    ("threading.Event() + set()", "E = threading.Event(); E.set()", "threading.Event"),
    ("asyncio.Event() + set()", "E = asyncio.Event(); E.set()", "asyncio.Event"),
    ("loop.create_future() + set_result()", "F = loop.create_future(); F.set_result(1)", None),
    ("Future() + set_result()", "F = Future(); F.set_result(1)", None),
)


def namespace(loop: asyncio.AbstractEventLoop) -> dict:
    """The statements' globals: a module of their own, watched code."""
    return {
        "__name__": "bench_events",
        "asyncio": asyncio,
        "threading": threading,
        "Future": concurrent.futures.Future,
        "loop": loop,
    }


# timeit's loop, compiled under this file's name: what the statement makes is made by code of a
# real file, as a library's is (code of no file, "<timeit-src>", takes the long way each time).
_LOOP = """
def _timed(_it, _timer):
    _t0 = _timer()
    for _i in _it:
        {stmt}
    return _timer() - _t0
"""


def stmt_ns(stmt: str, names: dict, number: int) -> float:
    space = dict(names)
    exec(compile(_LOOP.format(stmt=stmt), __file__, "exec"), space)  # noqa: S102
    return space["_timed"](itertools.repeat(None, number), time.thread_time) / number * 1e9


def blocked_waits(names: dict) -> set[str]:
    """One blocked wait on what each row makes (created by the row's kind of statement, each on a
    line of its own: one class name each), set by another thread or task: the kinds the
    recorder then holds."""
    exec("E = threading.Event()", names)  # noqa: S102 (the row's statement, as timed)
    event = names["E"]
    setter = threading.Timer(0.01, event.set)
    setter.start()
    event.wait()
    setter.join()
    exec("\nF = Future()", names)  # noqa: S102
    future = names["F"]
    setter = threading.Timer(0.01, future.set_result, (1,))
    setter.start()
    future.result()
    setter.join()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        names["loop"] = loop
        exec("\n\nE = asyncio.Event()\n\nF = loop.create_future()", names)  # noqa: S102
        loop.call_later(0.01, names["E"].set)
        await names["E"].wait()
        loop.call_later(0.01, names["F"].set_result, 1)
        await names["F"]

    asyncio.run(main())
    return {lock["kind"] for lock in RECORDER.snapshot()["locks"].values()}


def measure(args: argparse.Namespace) -> dict:
    number, rounds = (20_000, 3) if args.quick else (100_000, 7)
    loop = asyncio.new_event_loop()
    names = namespace(loop)
    instrumentor = LockwatchInstrumentor()
    rows: dict[str, list[float]] = {name: [float("inf"), float("inf")] for name, _, _ in ROWS}
    for _ in range(rounds):
        for name, stmt, _ in ROWS:
            rows[name][0] = min(rows[name][0], stmt_ns(stmt, names, number))
        instrumentor.instrument(manifest=False)
        try:
            for name, stmt, _ in ROWS:
                rows[name][1] = min(rows[name][1], stmt_ns(stmt, names, number))
        finally:
            instrumentor.uninstrument()
    loop.close()
    RECORDER.reset()
    instrumentor.instrument(manifest=False)
    try:
        kinds = blocked_waits(namespace(loop))
    finally:
        instrumentor.uninstrument()
    expected = {"threading.Event", "asyncio.Event", "asyncio.Future", "concurrent.futures.Future"}
    if not expected <= kinds:
        raise SystemExit(f"a blocked wait went unrecorded: recorded {sorted(kinds)}")
    return {
        "path": "C" if _fast_path.SPEEDUPS else "Python",
        "python": sys.version.split()[0],
        "rows": rows,
    }


def child(env: dict[str, str], argv: list[str]) -> dict:
    done = subprocess.run(
        [sys.executable, *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr or done.stdout)
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(results: list[dict]) -> None:
    print(
        f"otel-lockwatch event and future benchmark; Python {results[0]['python']}; "
        "one run, interleaved rounds"
    )
    print("(each ratio: against the bare baseline measured in the same process)\n")
    header = "".join(f"  {r['path'] + ' path: bare':>18}  {'instrumented':>19}" for r in results)
    print(f"{'ns per statement, nobody waiting':<38}{header}")
    for name, _, _ in ROWS:
        line = f"{name:<38}"
        for r in results:
            bare, watched = r["rows"][name]
            line += f"  {bare:18.0f}  {watched:9.0f} ({watched / bare:5.2f}x)"
        print(line)
    print("\nevery kind's blocked wait, made at the same statement, was recorded on each path")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args)))
        return
    argv = [str(Path(__file__).resolve()), "--child", *["--quick"] * args.quick]
    results = []
    if _fast_path.SPEEDUPS:
        results.append(child({}, argv))
    results.append(child({"LOCKWATCH_DISABLE_EXTENSIONS": "1"}, argv))
    report(results)


if __name__ == "__main__":
    main()
