"""One process of a fleet that takes distributed locks, instrumented, for the multi-process tests.

    python distributed_worker.py MODE OUT_DIR ARGS...

Every mode instruments with in-memory exporters, does its work, then writes into OUT_DIR (names
carry the pid): ``manifest.<pid>.json`` (``write_manifest``), ``spans.<pid>.json`` (every finished
span, OTLP-JSON-like), ``metrics.<pid>.json`` (the metric reader's data) and ``result.<pid>.json``
(what the worker measured itself: the wall-clock time of its ``acquire`` calls, in total and
each).

MODE:
- ``redis-hot PORT KEY ROUNDS HOLD_S``: waits at a barrier (a Redis list every worker pops once
  the parent pushes), then ROUNDS times takes ``Redis.lock(KEY)``, holds it HOLD_S seconds and
  releases it; measures the wall-clock time its ``acquire`` calls took.
- ``redis-abba PORT FIRST SECOND``: takes ``lock:FIRST:<pid>`` then, holding it,
  ``lock:SECOND:<pid>`` (keys of its own: the two processes never wait for each other, so they
  can never deadlock), once.
- ``file-hot PATH ROUNDS HOLD_S KIND``: prints ``ready`` and waits for a line on its standard
  input (the barrier); then ROUNDS times takes ``filelock.FileLock(PATH)`` (``KIND`` ``soft``:
  ``SoftFileLock``), holds it, releases it.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from opentelemetry.test.test_base import TestBase

from otel_lockwatch import LockwatchInstrumentor, _session, write_manifest

mode, out = sys.argv[1], Path(sys.argv[2])
args = sys.argv[3:]
tracer_provider, spans = TestBase.create_tracer_provider()
meter_provider, metrics = TestBase.create_meter_provider()
LockwatchInstrumentor().instrument(
    tracer_provider=tracer_provider, meter_provider=meter_provider, manifest=False
)
tracer = tracer_provider.get_tracer("distributed_worker")
pid = os.getpid()
result: dict[str, Any] = {"acquire_wall_ns": 0, "rounds": 0, "walls_ns": []}


def redis_lock(client, key, **kwargs):
    return client.lock(key, **kwargs)


if mode == "redis-hot":
    import redis

    port, key, rounds, hold_s = int(args[0]), args[1], int(args[2]), float(args[3])
    client = redis.Redis(port=port)
    lock = redis_lock(client, key, timeout=30, sleep=0.002)
    client.rpush("ready", pid)
    client.blpop(["go"], timeout=60)  # the barrier: every worker starts together
    for _ in range(rounds):
        with tracer.start_as_current_span("upsert"):
            t0 = time.perf_counter_ns()
            lock.acquire()
            result["acquire_wall_ns"] += time.perf_counter_ns() - t0
            time.sleep(hold_s)  # the work under the lock
            lock.release()
        result["rounds"] += 1
elif mode == "redis-abba":
    import redis

    port, first, second = int(args[0]), args[1], args[2]
    client = redis.Redis(port=port)
    with (
        tracer.start_as_current_span("move"),
        redis_lock(client, f"lock:{first}:{pid}", timeout=30),
        redis_lock(client, f"lock:{second}:{pid}", timeout=30),
    ):
        result["rounds"] += 1
elif mode == "file-hot":
    import filelock

    path, rounds, hold_s, kind = args[0], int(args[1]), float(args[2]), args[3]
    make = filelock.SoftFileLock if kind == "soft" else filelock.FileLock
    lock = make(path, poll_interval=0.002)
    print("ready", flush=True)
    sys.stdin.readline()  # the barrier: every worker starts together
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        lock.acquire()
        result["walls_ns"].append(time.perf_counter_ns() - t0)
        time.sleep(hold_s)  # hold: the work under the lock
        lock.release()
        result["rounds"] += 1
else:
    raise SystemExit(f"unknown mode {mode!r}")

_session.current().emitter.flush()
write_manifest(out / f"manifest.{pid}.json")
(out / f"spans.{pid}.json").write_text(
    "[" + ",".join(s.to_json() for s in spans.get_finished_spans()) + "]", encoding="utf-8"
)
data = metrics.get_metrics_data()
(out / f"metrics.{pid}.json").write_text(data.to_json() if data else "{}", encoding="utf-8")
(out / f"result.{pid}.json").write_text(json.dumps(result), encoding="utf-8")
