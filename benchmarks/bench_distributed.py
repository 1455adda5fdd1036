"""What watching a distributed lock costs, next to the operation it wraps.

Run: ``python benchmarks/bench_distributed.py`` (``--quick`` for a short run). It starts Debian's
``redis-server`` on a free loopback port (as the tests do) and times uncontended acquire+release
pairs (a ``with`` block) of a redis-py ``Lock`` (``SET NX PX`` and the release script: two round
trips), a ``filelock.FileLock`` (open, ``flock``, unlock, close) and a ``SoftFileLock``, plain
(not instrumented) and watched, in alternating rounds so that both see the same machine.

- **pair**: the plain pair's median wall time: the round trips or file operations wrapped;
- **lockwatch**: the extra CPU time of the calling thread per watched pair: the least over the
  rounds of watched minus the least of plain (the least is the run least disturbed by the other
  processes of a shared machine). For redis-py the round trips are stubbed out for this figure
  (redis-py's own Python stays), so that the network's jitter, far larger than the figure, does
  not drown it. For filelock, whose own Python and system calls cost ~200 us of CPU per pair with
  a jitter of tens of microseconds, the figure is lockwatch's wrappers around a stand-in with the
  surface they touch and no file behind it, whose every property the wrappers read (the
  defaults ``blocking`` and ``timeout``, ``is_locked``) asks a real lock first, so that it costs
  what the real lock's does, and whose ``with`` runs through filelock's own ``__enter__`` and
  ``__exit__``, as the real lock's does;
- **share**: lockwatch over pair, the figure the budget (5 %) is about.

Watched rounds put every hold into the hold histogram (``hold_metric_floor_ms=0``: a Redis or
file lock is held longer than the default floor, so that is the common case); the emitter's work
for them (another thread) is not in the figure. Nothing here is a test: the figures go into
docs/distributed.md.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import filelock  # noqa: E402
import redis  # noqa: E402
import redis.lock  # noqa: E402
from servers import redis_server  # noqa: E402

from otel_lockwatch import LockwatchInstrumentor  # noqa: E402
from otel_lockwatch._session import RECORDER  # noqa: E402
from otel_lockwatch.capture import _filelock  # noqa: E402
from otel_lockwatch.capture._patches import PatchWrapper  # noqa: E402


def wall_ns(lock: object, n: int) -> float:
    """The median wall time of ``n`` pairs."""
    walls = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        with lock:  # type: ignore[attr-defined]
            pass
        walls.append(time.perf_counter_ns() - t0)
    return statistics.median(walls)


def cpu_ns(lock: object, n: int) -> float:
    """The calling thread's CPU time per pair over ``n`` pairs."""
    c0 = time.thread_time_ns()
    for _ in range(n):
        with lock:  # type: ignore[attr-defined]
            pass
    return (time.thread_time_ns() - c0) / n


def extra_cpu_ns(make: Callable[[], object], n: int, rounds: int) -> float:
    """The least CPU per watched pair minus the least per plain pair, over alternating rounds."""
    inst = LockwatchInstrumentor()
    best = {False: math.inf, True: math.inf}
    for _ in range(rounds):
        for watched in (False, True):
            if watched:
                inst.instrument(manifest=False, hold_metric_floor_ms=0)
            try:
                lock = make()
                cpu_ns(lock, max(1, n // 10))  # warm up: connections, scripts, caches
                best[watched] = min(best[watched], cpu_ns(lock, n))
            finally:
                if watched:
                    inst.uninstrument()
                    RECORDER.reset()
    return best[True] - best[False]


class _NoRoundTrip:
    """redis-py's ``Lock`` with its two round trips replaced by no-ops, for as long as it is
    entered: what remains of a pair is redis-py's Python and lockwatch's."""

    def __enter__(self) -> None:
        lock = redis.lock.Lock
        self.saved = vars(lock)["do_acquire"], vars(lock)["do_release"]  # not bound: as installed
        lock.do_acquire = lambda self, token: True  # type: ignore[method-assign]
        lock.do_release = lambda self, token: None  # type: ignore[method-assign]

    def __exit__(self, *exc: object) -> None:
        redis.lock.Lock.do_acquire, redis.lock.Lock.do_release = self.saved  # type: ignore[method-assign]


class _StubFileLock:
    """The surface lockwatch's filelock wrappers touch (re-entrant, a file name, the defaults,
    filelock's ``with``), with no file behind it. What the wrappers read of the lock costs what
    the real lock's costs: each property asks a real ``FileLock`` (``real``, never acquired)
    the same question first."""

    def __init__(self, lock_file: str, real: filelock.FileLock) -> None:
        self.lock_file = lock_file
        self.depth = 0
        self._real = real

    @property
    def is_locked(self) -> bool:
        self._real.is_locked  # noqa: B018 (its cost)
        return self.depth > 0

    @property
    def blocking(self) -> bool:
        return self._real.blocking

    @property
    def timeout(self) -> float:
        return self._real.timeout

    def is_thread_local(self) -> bool:
        return self._real.is_thread_local()

    def _acquire(self) -> None:
        pass

    def acquire(self, timeout: float | None = None, *, blocking: bool | None = None) -> object:
        self._acquire()
        self.depth += 1
        return self

    def release(self, force: bool = False) -> None:
        self.depth -= 1

    # filelock's own: a ``with`` block runs through the same frames of filelock's code (which
    # the wrappers walk past to find the acquisition site) as with the real lock.
    __enter__ = filelock.FileLock.__enter__
    __exit__ = filelock.FileLock.__exit__
    _release_in_context = getattr(filelock.FileLock, "_release_in_context", None)


def _watched_stub() -> type:
    """:class:`_StubFileLock` with lockwatch's filelock wrappers, installed as the patch table
    installs them (``__init__`` wrapped through wrapt, the others plain functions)."""
    base = _StubFileLock
    init = vars(base)["__init__"]
    return type(
        "WatchedStubFileLock",
        (base,),
        {
            "__init__": PatchWrapper(
                init, _filelock.init_factory(init, filelock.SoftFileLock), base, "__init__"
            ),
            "acquire": _filelock.acquire_factory(base.acquire, filelock.Timeout),
            "release": _filelock.release_factory(base.release),
            "_acquire": _filelock.attempt_factory(base._acquire),
        },
    )


def stub_extra_cpu_ns(real: filelock.FileLock, n: int, rounds: int) -> float:
    """lockwatch's CPU per pair of the filelock wrappers: watched stand-in minus plain (both
    asking ``real`` what they read)."""
    inst = LockwatchInstrumentor()
    inst.instrument(manifest=False, hold_metric_floor_ms=0)
    try:
        plain = _StubFileLock("stub-1.lock", real)
        watched = _watched_stub()("stub-1.lock", real)
        best = {False: math.inf, True: math.inf}
        for _ in range(rounds):
            best[False] = min(best[False], cpu_ns(plain, n))
            best[True] = min(best[True], cpu_ns(watched, n))
    finally:
        inst.uninstrument()
        RECORDER.reset()
    return best[True] - best[False]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a short run")
    args = parser.parse_args()
    n, rounds = (200, 8) if args.quick else (500, 30)
    with tempfile.TemporaryDirectory() as tmp, redis_server(Path(tmp)) as port:
        client = redis.Redis(port=port)
        rows = {
            "redis-py Lock": lambda: client.lock("lock:bench:1", timeout=10),
            "filelock.FileLock": lambda: filelock.FileLock(str(Path(tmp) / "bench.lock")),
            "filelock.SoftFileLock": lambda: filelock.SoftFileLock(str(Path(tmp) / "soft.lock")),
        }
        print(f"{'pair (uncontended)':24} {'pair':>10} {'lockwatch':>10} {'share':>7}")
        for name, make in rows.items():
            m = max(10, n // 10) if "Soft" in name else n
            pair = statistics.median(wall_ns(make(), m) for _ in range(max(3, rounds // 5)))
            if name.startswith("redis"):
                with _NoRoundTrip():
                    extra = extra_cpu_ns(make, n, rounds)
            else:
                extra = stub_extra_cpu_ns(make(), n, rounds)  # type: ignore[arg-type]
            print(f"{name:24} {pair / 1e3:8.1f}us {extra / 1e3:8.2f}us {100 * extra / pair:6.2f}%")
        client.close()


if __name__ == "__main__":
    main()
