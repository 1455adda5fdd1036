"""Instructions an uncontended acquisition and release cost, counted by callgrind (valgrind):
deterministic where ``bench_locks.py``'s nanoseconds move with the machine's load.

    python benchmarks/pair_instructions.py                 every row (a minute or two)
    python benchmarks/pair_instructions.py with nested     those rows
    python benchmarks/pair_instructions.py --iterations 50000

Each row runs this file twice under ``valgrind --tool=callgrind``, bare (nothing instrumented)
and instrumented (the process's own path: ``LOCKWATCH_DISABLE_EXTENSIONS=1`` for the pure-Python
one), each a loop in a function: 2,000 iterations first, then ``--iterations`` more between two
calls of ``os.getppid()``, at which callgrind dumps its counts (``--dump-before=getppid``), so
that only those are counted (start-up, imports and exit are left out), divided by their number.
The loop's own instructions are in both columns; the difference is lockwatch's. The emitter's
periodic tick is made an hour (it does work per unit of time, which callgrind's slowdown would
charge to the loop). To compare two builds, run this in each checkout.
"""

from __future__ import annotations

import argparse
import os
import shutil
import threading

from _callgrind import instrument_without_tick, marked_instructions

#: row -> the loop's body (L, M: Locks; R: an RLock)
STATEMENTS = {
    "with": "with L: pass",
    "pair": "L.acquire(); L.release()",
    "rlock": "with R: pass",
    "nested": "with L:\n            with M: pass",
}


def run_loop(mode: str, row: str, iterations: int) -> None:
    """The measured program: the row's statement in a loop, ``iterations`` times between two
    marks."""
    if mode == "instrumented":
        instrument_without_tick()  # (no periodic tick: see the module's doc)
    names = {"L": threading.Lock(), "M": threading.Lock(), "R": threading.RLock()}
    exec(f"def loop(n):\n    for _ in range(n):\n        {STATEMENTS[row]}\n", names)
    names["loop"](2000)
    os.getppid()  # callgrind dumps here: what came before
    names["loop"](iterations)
    os.getppid()  # and here: the measured iterations


def instructions(mode: str, row: str, iterations: int) -> float:
    """What callgrind counts per iteration of ``row``'s loop."""
    return marked_instructions(__file__, "--run", mode, row, str(iterations)) / iterations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="*", help=f"rows, of {', '.join(STATEMENTS)} (default: all)")
    parser.add_argument("--iterations", type=int, default=20000, help="iterations counted")
    parser.add_argument("--run", nargs=3, metavar=("MODE", "ROW", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_loop(args.run[0], args.run[1], int(args.run[2]))
        return
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not on the PATH (Debian: apt-get install valgrind)")
    for row in args.rows:
        if row not in STATEMENTS:
            parser.error(f"no row {row!r}: the rows are {', '.join(STATEMENTS)}")
    if args.iterations <= 0:
        parser.error(f"--iterations {args.iterations} must be positive")
    path = "Python" if os.environ.get("LOCKWATCH_DISABLE_EXTENSIONS") else "C (when built)"
    print(f"instructions per iteration (callgrind, {args.iterations:,} after 2,000; {path} path)")
    for row in args.rows or STATEMENTS:
        bare = instructions("bare", row, args.iterations)
        watched = instructions("instrumented", row, args.iterations)
        statement = " ".join(STATEMENTS[row].split())
        print(
            f"  {statement:<34}{bare:>8,.0f} bare{watched:>8,.0f} instrumented"
            f" (+{watched - bare:,.0f})"
        )


if __name__ == "__main__":
    main()
