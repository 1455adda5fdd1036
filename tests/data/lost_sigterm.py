"""A SIGTERM whose handler the main thread never runs by itself.

``python lost_sigterm.py MANIFEST``: the main thread blocks for good on a semaphore; another
thread then marks SIGTERM as received (``_thread.interrupt_main``: the handler is due and the
wake-up fd written, but the blocked call is not interrupted), which is what a real SIGTERM
does when it arrives just before the main thread enters a blocking call (a terminated pool
worker about to wait on its queue's lock, which the parent holds for good). The process must
still end by the SIGTERM, with its manifest written.

``python lost_sigterm.py MANIFEST worker``: the same in a forked ``multiprocessing`` worker,
which has only the threads it started (and the emitter lockwatch starts there, which is what
sends the SIGTERM again); prints the worker's exit code, or that it was still running 30 s after
its SIGTERM.
"""

from __future__ import annotations

import _thread
import multiprocessing
import signal
import sys
import threading

from otel_lockwatch import LockwatchInstrumentor


def lose_a_sigterm() -> None:
    with threading.Lock():
        pass
    never = multiprocessing.get_context("spawn").Semaphore(0)
    # Half a second for the main thread to block; if it has not yet, the handler runs at its
    # next bytecode, and the test passes without proving anything (it cannot fail wrongly).
    threading.Timer(0.5, _thread.interrupt_main, (signal.SIGTERM,)).start()
    never.acquire()
    print("acquired a semaphore nobody released", flush=True)


def main() -> None:
    LockwatchInstrumentor().instrument(manifest_path=sys.argv[1], checkpoint_interval_s=0)
    if sys.argv[2:] != ["worker"]:
        lose_a_sigterm()
        return
    worker = multiprocessing.get_context("fork").Process(target=lose_a_sigterm)
    worker.start()
    worker.join(30)
    if worker.exitcode is None:
        worker.kill()
        worker.join()
        print("the worker was still running 30 s after its SIGTERM", flush=True)
    else:
        print(f"worker exit {worker.exitcode}", flush=True)


if __name__ == "__main__":
    main()
