"""A SIGTERM that lands inside lockwatch's own exit work on the main thread.

``python sigterm_in_exit_work.py close|stop MANIFEST``: records one lock, then ends its
instrumentation as a pool worker's finalizer (``close``) or ``uninstrument()`` (``stop``) does,
with the exporter's stop event replaced by one that signals the process *while holding its
condition's lock*: the handler then runs at the next bytecode, exactly where ``Pool.terminate()``
once landed a SIGTERM on a worker's final write (the handler's own ``close()`` waited forever for
that lock). The process must end by the SIGTERM, with the manifest written.
"""

from __future__ import annotations

import os
import signal
import sys
import threading

from otel_lockwatch import LockwatchInstrumentor, _session


class SignalInsideSet(threading.Event):
    def set(self) -> None:
        with self._cond:
            os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode: lock held
            self._flag = True
            self._cond.notify_all()


def main() -> None:
    mode, manifest = sys.argv[1], sys.argv[2]
    instrumentor = LockwatchInstrumentor()
    instrumentor.instrument(manifest_path=manifest, checkpoint_interval_s=0)
    with threading.Lock():
        pass
    exporter = _session.current().exporter
    exporter._stop = SignalInsideSet()
    if mode == "close":
        exporter.close()
    else:
        instrumentor.uninstrument()
    print("survived the SIGTERM", flush=True)


if __name__ == "__main__":
    main()
