"""How many workers should the next pool spawn? The manifest's sizing on a real pool.

Sixteen workers fetch orders: each task is 5 ms of work of its own (parsing, a sleep stands in
for it), then 5 ms holding one of a SQLAlchemy ``QueuePool``'s 2 connections. Two connections
held half of each task's time serve four workers; the other twelve wait. lockwatch watches the
pool's checkout waits, finds the pool the bottleneck, and derives how many workers it supports.

Run it: ``python examples/sizing_example.py [--workers 16] [--seconds 3]``: it writes
``sizing-manifest.json`` and prints its report (docs/sizing.md shows one run).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

from otel_lockwatch import LockwatchInstrumentor, evaluate
from otel_lockwatch.cli._report_text import render_text
from otel_lockwatch.manifest._io import dump_manifest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--manifest", default="sizing-manifest.json")
    args = parser.parse_args()

    LockwatchInstrumentor().instrument(manifest=False)  # before the pool is built

    import sqlalchemy
    from sqlalchemy.pool import QueuePool

    with tempfile.TemporaryDirectory() as tmp:
        engine = sqlalchemy.create_engine(
            f"sqlite:///{tmp}/orders.sqlite", poolclass=QueuePool, pool_size=2, max_overflow=0
        )
        query = sqlalchemy.text("select 1")
        with engine.connect() as conn:  # the dialect's one-off initialization
            conn.execute(query)
        stop = time.monotonic() + args.seconds
        start = threading.Barrier(args.workers)
        done = [0] * args.workers

        def worker(i: int) -> None:
            start.wait()
            while time.monotonic() < stop:
                time.sleep(0.005)  # the task's own work
                with engine.connect() as conn:
                    conn.execute(query)
                    time.sleep(0.005)  # the rest of the transaction
                done[i] += 1

        threads = [
            threading.Thread(target=worker, args=(i,), name=f"worker-{i:02d}")
            for i in range(args.workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        engine.dispose()

    manifest = evaluate(pool_size=args.workers)
    dump_manifest(manifest, args.manifest)
    print(f"{sum(done) / args.seconds:.0f} tasks/s with {args.workers} workers")
    print(render_text(manifest.to_dict(), source=args.manifest, width=100))


if __name__ == "__main__":
    main()
