"""Does following the manifest's recommended pool size keep the throughput? (docs/sizing.md)

Six workloads of known shape, each run by ``n`` workers for a fixed time, counting tasks:

=============  ===========================================================================
mutex          2 ms of work, then 1 ms inside one ``threading.Lock``
two-locks      4 ms of work, 1 ms inside lock A, 1 ms inside lock B
sqlalchemy     SQLAlchemy ``QueuePool(pool_size=2)`` over SQLite: 5 ms out, 5 ms holding a
               connection
semaphore      ``threading.BoundedSemaphore(3)``: 3 ms out, 6 ms holding it
asyncio        ``asyncio.Semaphore(2)`` on one loop, a task per worker: 5 ms out, 5 ms held
io             10 ms of I/O (a sleep), no shared lock
=============  ===========================================================================

For each workload the benchmark

1. sweeps it uninstrumented at 1 to 8, 12 and 16 workers (twice, the better run of each kept)
   and finds the **knee**: the fewest workers that reach 90 % of the best throughput of the
   sweep;
2. runs it instrumented at 16 workers and reads the manifest's recommended size ``R``;
3. runs it uninstrumented at ``R`` (the throughput a successor that follows the advice gets),
   and instrumented at ``R`` (what the successor's own manifest then recommends).

and checks what issue #25 asks: ``throughput(R) >= 0.9 x throughput(16)``, ``R <= max(knee + 1,
1.5 x knee)``, and the run at ``R`` recommends at least the knee. Every run is a process of its
own (``--child``), so instrumented and plain runs start alike. Not a timed test: the figures
move with the machine's load; the table in docs/sizing.md is one run, as printed.

    python benchmarks/bench_sizing.py [--seconds 1.5] [--workloads mutex,io]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

SWEEP = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)
SWEEP_PASSES = 2
NOMINAL = 16
WORKLOADS = ("mutex", "two-locks", "sqlalchemy", "semaphore", "asyncio", "io")
MS = 0.001


def _thread_workload(name: str, tmp: str) -> Callable[[], None]:
    """One task of a thread workload (its locks made now: after instrument() when watched)."""
    if name == "mutex":
        lock = threading.Lock()

        def task() -> None:
            time.sleep(2 * MS)
            with lock:
                time.sleep(1 * MS)

    elif name == "two-locks":
        a, b = threading.Lock(), threading.Lock()

        def task() -> None:
            time.sleep(4 * MS)
            with a:
                time.sleep(1 * MS)
            with b:
                time.sleep(1 * MS)

    elif name == "sqlalchemy":
        import sqlalchemy
        from sqlalchemy.pool import QueuePool

        engine = sqlalchemy.create_engine(
            f"sqlite:///{tmp}/pool.sqlite",
            poolclass=QueuePool,
            pool_size=2,
            max_overflow=0,
            pool_timeout=60,
        )
        query = sqlalchemy.text("select 1")
        with engine.connect() as conn:  # the dialect's one-off initialization, done first
            conn.execute(query)

        def task() -> None:
            time.sleep(5 * MS)
            with engine.connect() as conn:
                conn.execute(query)
                time.sleep(5 * MS)

    elif name == "semaphore":
        sem = threading.BoundedSemaphore(3)

        def task() -> None:
            time.sleep(3 * MS)
            with sem:
                time.sleep(6 * MS)

    elif name == "io":

        def task() -> None:
            time.sleep(10 * MS)

    else:
        raise ValueError(f"unknown workload {name!r}")
    return task


def _run_threads(task: Callable[[], None], workers: int, seconds: float) -> int:
    barrier = threading.Barrier(workers + 1)
    counts = [0] * workers
    stop = [0.0]

    def work(i: int) -> None:
        barrier.wait()
        n = 0
        while time.monotonic() < stop[0]:
            task()
            n += 1
        counts[i] = n

    threads = [threading.Thread(target=work, args=(i,), name=f"w{i:02d}") for i in range(workers)]
    for t in threads:
        t.start()
    stop[0] = time.monotonic() + seconds
    barrier.wait()
    for t in threads:
        t.join()
    return sum(counts)


def _run_asyncio(workers: int, seconds: float) -> int:
    import asyncio

    async def main() -> int:
        sem = asyncio.Semaphore(2)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        counts = [0] * workers

        async def work(i: int) -> None:
            while loop.time() < deadline:
                await asyncio.sleep(5 * MS)
                async with sem:
                    await asyncio.sleep(5 * MS)
                counts[i] += 1

        await asyncio.gather(*(work(i) for i in range(workers)))
        return sum(counts)

    return asyncio.run(main())


def child(workload: str, workers: int, seconds: float, watched: bool) -> dict:
    """One run in this process: tasks per second, and the manifest's sizing when watched."""
    if watched:
        from otel_lockwatch import LockwatchInstrumentor

        LockwatchInstrumentor().instrument(manifest=False)
    with tempfile.TemporaryDirectory() as tmp:
        if workload == "asyncio":
            tasks = _run_asyncio(workers, seconds)
        else:
            tasks = _run_threads(_thread_workload(workload, tmp), workers, seconds)
    out: dict = {"throughput": tasks / seconds}
    if watched:
        from otel_lockwatch import evaluate
        from otel_lockwatch._session import RECORDER

        m = evaluate(RECORDER.snapshot(), pool_size=workers).to_dict()
        out.update(
            recommended=m["recommended_pool_size"],
            verdict=m["verdict"],
            effective=m["effective_throughput_pct"],
            sizing=m["sizing"],
        )
    return out


def run(workload: str, workers: int, seconds: float, watched: bool) -> dict:
    env = dict(os.environ, OTEL_TRACES_EXPORTER="none", OTEL_METRICS_EXPORTER="none")
    env["OTEL_LOGS_EXPORTER"] = "none"
    args = [sys.executable, __file__, "--child", workload, str(workers), str(seconds)]
    if watched:
        args.append("--watched")
    proc = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{workload} at {workers} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench(workload: str, seconds: float) -> dict:
    # Two passes over the sweep, the better of each kept: a shared machine's noise only ever
    # lowers a run's throughput.
    sweep = dict.fromkeys(SWEEP, 0.0)
    for _ in range(SWEEP_PASSES):
        for n in SWEEP:
            sweep[n] = max(sweep[n], run(workload, n, seconds, False)["throughput"])
    best = max(sweep.values())
    knee = min(n for n in SWEEP if sweep[n] >= 0.9 * best)
    at16 = run(workload, NOMINAL, seconds, True)
    r = at16["recommended"]
    plain_r = sweep.get(r) or run(workload, r, seconds, False)["throughput"]
    at_r = run(workload, r, seconds, True)
    kept = plain_r / sweep[NOMINAL]
    checks = {
        "kept >= 0.9": kept >= 0.9,
        "R <= max(knee+1, 1.5 knee)": r <= max(knee + 1, math.floor(1.5 * knee)),
        "run at R recommends >= knee": at_r["recommended"] >= knee,
    }
    return {
        "workload": workload,
        "sweep": {n: round(x, 1) for n, x in sweep.items()},
        "knee": knee,
        "at16": at16,
        "R": r,
        "kept": kept,
        "at_R": at_r,
        "checks": checks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=1.5, help="each run's length")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--child", nargs=3, metavar=("WORKLOAD", "N", "SECONDS"), help=argparse.SUPPRESS
    )
    parser.add_argument("--watched", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        workload, n, s = args.child
        print(json.dumps(child(workload, int(n), float(s), args.watched)))
        return 0
    results = []
    print(
        f"{'workload':<11} {'knee':>4} {'R at 16':>7} {'basis':<9} {'supports':>8} "
        f"{'kept':>6} {'R at R':>6}  sweep (tasks/s at 1-8 12 16)"
    )
    ok = True
    for workload in args.workloads.split(","):
        r = bench(workload, args.seconds)
        results.append(r)
        sizing = r["at16"]["sizing"]
        supports = sizing["workers_supported"]
        print(
            f"{workload:<11} {r['knee']:>4} {r['R']:>7} {sizing['basis']:<9} "
            f"{'-' if supports is None else format(supports, '.2f'):>8} "
            f"{r['kept']:>6.2f} {r['at_R']['recommended']:>6}  "
            + " ".join(f"{x:.0f}" for x in r["sweep"].values())
        )
        for check, passed in r["checks"].items():
            if not passed:
                ok = False
                print(f"  {workload}: FAILED {check}")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    print("all checks passed" if ok else "some checks failed")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
