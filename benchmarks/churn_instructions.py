"""Instructions a thread per acquisition costs, counted by callgrind (valgrind): deterministic
where the wall and CPU times of ``bench_locks.py --churn`` spread by 2x on a shared machine.

    python benchmarks/churn_instructions.py            the three rows (a few minutes)
    python benchmarks/churn_instructions.py --threads 1200 --base 200

Each row runs this file under ``valgrind --tool=callgrind`` twice, with ``--threads`` and with
``--base`` threads (each started, taking one lock once, joined), and prints the difference in
instructions divided by the difference in threads: what one more thread costs, start-up and
interpreter exit cancelled out. Rows: plain (nothing instrumented), and instrumented with the
outbox off (``manifest=False``, no exporter: the emitter's own work left out) where each thread
has a name of its own (each becomes its name's retired state) or where every thread is
``(other)`` (each folded into that name's retired state), the two cases of a thread per request
(``MAX_WORKERS`` names, then ``(other)``). The cyclic collector runs as in a program.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import threading


def run_threads(threads: int, mode: str) -> None:
    """The measured program: ``threads`` threads one after the other, each taking a lock once."""
    if mode != "plain":
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider

        from otel_lockwatch import LockwatchInstrumentor
        from otel_lockwatch.record import _recorder

        if mode == "other":
            _recorder.MAX_WORKERS = 1  # every thread after the first is "(other)"
        LockwatchInstrumentor().instrument(
            tracer_provider=TracerProvider(), meter_provider=MeterProvider(), manifest=False
        )
    lock = threading.Lock()

    def work() -> None:
        with lock:
            pass

    for _ in range(threads):
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()


def instructions(threads: int, mode: str) -> int:
    """What callgrind counts for the program with ``threads`` threads."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, __file__, "--run", str(threads), mode],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise RuntimeError(f"callgrind printed no count: {done.stderr[-500:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=700)
    parser.add_argument("--base", type=int, default=200)
    parser.add_argument("--run", nargs=2, metavar=("THREADS", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run_threads(int(args.run[0]), args.run[1])
        return
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not on the PATH (Debian: apt-get install valgrind)")
    if args.threads <= args.base:
        parser.error(f"--threads {args.threads} must exceed --base {args.base}")
    print(f"instructions per thread (callgrind, {args.threads} minus {args.base} threads)")
    rows = {}
    for mode, label in (
        ("plain", "plain"),
        ("named", "instrumented, a name each"),
        ("other", "instrumented, every thread (other)"),
    ):
        more, fewer = instructions(args.threads, mode), instructions(args.base, mode)
        rows[mode] = (more - fewer) / (args.threads - args.base)
        extra = "" if mode == "plain" else f"  (+{rows[mode] - rows['plain']:,.0f} over plain)"
        print(f"  {label:<40}{rows[mode]:>10,.0f}{extra}")


if __name__ == "__main__":
    main()
