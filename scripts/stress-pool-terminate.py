"""Terminate forked pool workers, many times over, and count the shutdowns that wait.

    python scripts/stress-pool-terminate.py plain|instrumented ROUNDS [--start-method fork]

Each round is the steps of CPython's ``test_crash_at_task_unpickle``
(``test.test_concurrent_futures.test_deadlock``): a ``ProcessPoolExecutor`` of 2 workers is
given a task whose unpickling crashes its worker, so the executor finds itself broken and
terminates the other worker (SIGTERM), often while that one is still being forked or is about
to block on its call queue. The shutdown that follows joins both. A shutdown still waiting after
``--patience`` seconds (2) is counted, and its workers are sent SIGABRT: with faulthandler
enabled (inherited through the fork), each writes its threads' stacks to stderr, which says
where it was.

Instrumented, lockwatch's SIGTERM handler is installed in the parent and inherited by every
worker: a SIGTERM that such a worker misses would leave it running, where the default action
ends it. Prints one line: the rounds, how many shutdowns waited, and the wall time.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import faulthandler
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path


def _crash() -> None:
    faulthandler.disable()
    faulthandler._sigsegv()


class CrashAtUnpickle:
    """Unpickled in a worker, it crashes that worker."""

    def __reduce__(self):
        return _crash, ()


def one_round(context: multiprocessing.context.BaseContext, patience: float) -> bool:
    """One round; True when its shutdown waited longer than ``patience``."""
    executor = ProcessPoolExecutor(max_workers=2, mp_context=context)
    result = executor.submit(id, CrashAtUnpickle())
    with contextlib.suppress(BrokenProcessPool):
        result.result(timeout=60)
    workers = list(executor._processes.values())  # noqa: SLF001 (who to dump if it waits)
    done = threading.Event()

    def shut_down() -> None:
        executor.shutdown(wait=True)
        done.set()

    threading.Thread(target=shut_down, daemon=True).start()
    if done.wait(patience):
        return False
    for worker in workers:
        if worker.exitcode is None:
            print(f"shutdown waiting for worker {worker.pid}: SIGABRT", file=sys.stderr, flush=True)
            os.kill(worker.pid, signal.SIGABRT)
    if not done.wait(60):
        raise SystemExit("the shutdown still waited 60 s after its workers were sent SIGABRT")
    return True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("plain", "instrumented"))
    parser.add_argument("rounds", type=int)
    parser.add_argument("--start-method", default="fork")
    parser.add_argument("--patience", type=float, default=2.0)
    args = parser.parse_args()
    if args.mode == "instrumented":
        from otel_lockwatch import LockwatchInstrumentor

        os.environ.setdefault("OTEL_TRACES_EXPORTER", "none")
        os.environ.setdefault("OTEL_METRICS_EXPORTER", "none")
        os.environ.setdefault("OTEL_LOGS_EXPORTER", "none")
        directory = tempfile.mkdtemp(prefix="stress-pool-terminate-")
        # Registered before instrument(), so run after lockwatch's own exit work (atexit runs
        # last-in first-out), which writes the manifest there: nothing is left behind.
        atexit.register(shutil.rmtree, directory, True)
        manifest = Path(directory) / "manifest.json"
        LockwatchInstrumentor().instrument(manifest_path=manifest, checkpoint_interval_s=0)
    faulthandler.enable(all_threads=True)
    context = multiprocessing.get_context(args.start_method)
    started = time.monotonic()
    waited = sum(one_round(context, args.patience) for _ in range(args.rounds))
    elapsed = time.monotonic() - started
    print(
        f"{args.mode} {args.start_method}: {args.rounds} rounds, {waited} shutdowns waited over "
        f"{args.patience:g} s, in {elapsed:.1f} s (Python {sys.version.split()[0]})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
