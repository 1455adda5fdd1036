"""Instructions a thread per acquisition costs, counted by callgrind (valgrind): deterministic
where the wall and CPU times of ``bench_locks.py --churn`` spread by 2x on a shared machine.

    python benchmarks/churn_instructions.py            the three rows (a minute or two)
    python benchmarks/churn_instructions.py --threads 1000 --base 200

Each row runs this file once under ``valgrind --tool=callgrind``: ``--base`` threads first
(each started, taking one lock once, joined), then ``--threads`` more, the instructions of those
alone counted (callgrind dumps its counts at each ``os.getppid()``, which marks the part's
bounds) and divided by their number: start-up, imports and interpreter exit are left out (an
import's instructions vary by millions from run to run, which two whole runs' difference
divided by 500 threads turned into several thousand per thread). Rows: plain (nothing
instrumented), and instrumented with the outbox off (``manifest=False``, no exporter) where each
thread has a name of its own (each becomes its name's retired state) or where every thread is
``(other)`` (each folded into that name's retired state), the two cases of a thread per request
(``MAX_WORKERS`` names, then ``(other)``). The emitter's own work is left out: its periodic
tick (every ``Telemetry.INTERVAL_S``, made an hour here) does work per unit of time, which
under callgrind's 50-100x slowdown would be charged to each thread that much more than in a
real run (it sampled the timeline over every state, ~8k instructions per thread here). The
cyclic collector runs as in a program.
"""

from __future__ import annotations

import argparse
import os
import shutil
import threading

from _callgrind import instrument_without_tick, marked_instructions


def run_threads(base: int, threads: int, mode: str) -> None:
    """The measured program: ``base`` threads, then (between two marks) ``threads`` threads, one
    after the other, each taking a lock once."""
    if mode != "plain":
        from otel_lockwatch.record import _recorder

        if mode == "other":
            _recorder.MAX_WORKERS = 1  # every thread after the first is "(other)"
        instrument_without_tick()  # (no periodic tick: see the module's doc)
    lock = threading.Lock()

    def work() -> None:
        with lock:
            pass

    def run(n: int) -> None:
        for _ in range(n):
            thread = threading.Thread(target=work)
            thread.start()
            thread.join()

    run(base)
    os.getppid()  # callgrind dumps here: what came before
    run(threads)
    os.getppid()  # and here: the measured threads


def instructions(base: int, threads: int, mode: str) -> int:
    """What callgrind counts for ``threads`` threads after ``base`` ones."""
    return marked_instructions(__file__, "--run", str(base), str(threads), mode)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=500, help="threads counted")
    parser.add_argument("--base", type=int, default=200, help="threads before them")
    parser.add_argument(
        "--run", nargs=3, metavar=("BASE", "THREADS", "MODE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.run:
        run_threads(int(args.run[0]), int(args.run[1]), args.run[2])
        return
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not on the PATH (Debian: apt-get install valgrind)")
    if args.threads <= 0:
        parser.error(f"--threads {args.threads} must be positive")
    print(f"instructions per thread (callgrind, {args.threads} threads after {args.base})")
    rows = {}
    for mode, label in (
        ("plain", "plain"),
        ("named", "instrumented, a name each"),
        ("other", "instrumented, every thread (other)"),
    ):
        rows[mode] = instructions(args.base, args.threads, mode) / args.threads
        extra = "" if mode == "plain" else f"  (+{rows[mode] - rows['plain']:,.0f} over plain)"
        print(f"  {label:<40}{rows[mode]:>10,.0f}{extra}")


if __name__ == "__main__":
    main()
