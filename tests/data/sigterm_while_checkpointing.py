"""A SIGTERM on a main thread inside the recorder while a checkpoint is being written.

``python sigterm_while_checkpointing.py MANIFEST``: the main thread holds the lock-order graph's
lock (as it does inside a snapshot or an order check) while another thread writes a checkpoint
(which reads the graph), then SIGTERM arrives. The handler writes the final manifest on the main
thread. Once, the checkpoint held the exporter's lock while it waited for the graph's, and the
handler waited for the exporter's lock: the process hung and SIGTERM could not end it. It must
end by the SIGTERM, with its manifest written.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time

from otel_lockwatch import LockwatchInstrumentor, _session
from otel_lockwatch._session import RECORDER


def main() -> None:
    LockwatchInstrumentor().instrument(manifest_path=sys.argv[1], checkpoint_interval_s=0)
    with threading.Lock():
        pass
    exporter = _session.current().exporter
    with RECORDER.graph._lock:  # the main thread inside the recorder
        checkpoint = threading.Thread(target=exporter.write, args=(False,), daemon=True)
        checkpoint.start()
        # Give the checkpoint the time to take whatever it takes before the graph's lock (the
        # exporter's lock, before the fix); it then blocks on the graph's lock.
        deadline = time.monotonic() + 1.0
        while not exporter._lock.locked() and time.monotonic() < deadline:
            time.sleep(0.01)  # ok: polling with a deadline
        os.kill(os.getpid(), signal.SIGTERM)  # handled here, the graph's lock held
        print("survived the SIGTERM", flush=True)


if __name__ == "__main__":
    main()
