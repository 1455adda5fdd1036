"""Benchmark: evaluate a snapshot of 10^4 lock classes x 64 workers (the goal: under a second).

Every lock is used by every worker (640 000 per-(worker, lock) entries), each lock carries a
wait and a hold histogram of a few hundred samples spread over many buckets, and a handful of
locks are hot or starve a worker, so every branch of the evaluation runs. The snapshot is built
once; the timed part is ``evaluate()`` (validation, hot locks, starvation, percentiles, the
manifest document), then separately the digest and the JSON text.

Run: ``python benchmarks/bench_evaluate.py [--locks N] [--workers N] [--repeat N]``.
"""

from __future__ import annotations

import argparse
import os
import random
import time

from otel_lockwatch.manifest._evaluate import evaluate
from otel_lockwatch.record._histogram import LogHistogram


def build_snapshot(n_locks: int, n_workers: int, seed: int = 1) -> dict:
    """A synthetic recorder snapshot with ``n_locks`` locks each used by ``n_workers`` workers."""
    rng = random.Random(seed)
    workers = [f"worker-{i}" for i in range(n_workers)]
    template_wait = LogHistogram(rng.randrange(0, 2_000_000) for _ in range(300))
    template_hold = LogHistogram(rng.randrange(1_000, 500_000) for _ in range(300))
    locks = {}
    worker_wait = dict.fromkeys(workers, 0)
    for i in range(n_locks):
        per_worker = {}
        for j, w in enumerate(workers):
            wait = rng.randrange(0, 10_000) if i % 1000 else 200_000 * (j + 1)
            if i % 2500 == 7 and j == 0:
                wait = 5_000_000_000  # a starved worker: 8 % of its 60 s
            per_worker[w] = {"acquisitions": 5, "contentions": 2, "wait_ns": wait, "hold_ns": 9_000}
            worker_wait[w] += wait
        locks[f"app/module_{i // 100}.py:{i}"] = {
            "kind": "threading.Lock",
            "acquisitions": 5 * n_workers,
            "contentions": 2 * n_workers,
            "skipped": 0,
            "timeouts": 0,
            "wait_ns": template_wait.copy(),
            "hold_ns": template_hold.copy(),
            "workers": per_worker,
        }
    return {
        "locks": locks,
        "workers": {w: {"observed_ns": 60 * 10**9, "wait_ns": worker_wait[w]} for w in workers},
        "lock_order": {"edges": [], "cycles": []},
        "blocking_under_lock": {},
        "sections": {"emitter": {"count": 256, "collision_waits": 12, "max_held": 16}},
        "pool": {"nominal": n_workers, "source": "executor"},
        "process": {"pid": 1, "service.name": "bench", "start": "", "end": ""},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--locks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    data = build_snapshot(args.locks, args.workers)
    best_eval = best_cpu = best_digest = best_json = float("inf")
    for _ in range(args.repeat):
        c0 = time.process_time()
        t0 = time.perf_counter()
        manifest = evaluate(data)
        t1 = time.perf_counter()
        best_cpu = min(best_cpu, time.process_time() - c0)
        _ = manifest.manifest_digest
        t2 = time.perf_counter()
        text = manifest.to_json()
        t3 = time.perf_counter()
        best_eval = min(best_eval, t1 - t0)
        best_digest = min(best_digest, t2 - t1)
        best_json = min(best_json, t3 - t2)
    print(
        f"evaluate(): {args.locks} lock classes x {args.workers} workers in {best_eval:.3f} s "
        f"wall, {best_cpu:.3f} s CPU (best of {args.repeat}; load average "
        f"{os.getloadavg()[0]:.1f}); verdict {manifest.verdict.value}, "
        f"{len(manifest.hot_lock_register)} hot, "
        f"{len(manifest.starvation_signatures)} starving"
    )
    print(f"digest: {best_digest:.3f} s; to_json(): {best_json:.3f} s, {len(text) / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
