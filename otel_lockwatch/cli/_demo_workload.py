"""The demo's workload: a worker pool that does, on a small scale, the four things lockwatch is for.

``otel-lockwatch demo`` loads this file as the top-level module ``lockwatch_demo`` and runs
:func:`run` in a thread of its own. Both are deliberate: otel-lockwatch never watches the locks
its own modules create (nor locks created with one of its frames a few calls up), and this module
plays the part of a user's program, so it must not look like otel-lockwatch to the
instrumentation. Import it through ``otel_lockwatch.cli._demo.load_workload()``.

The pool has ``workers`` threads (a real ``ThreadPoolExecutor``, so the manifest knows its nominal
size), each given a role by its index:

``sweeper`` (worker 0)
    The periodic path of the section pattern (a sweep that may skip an entity, beside an event
    path that must not): ``SWEEP_INTERVAL_S`` (20 ms) after each sweep it walks every entity with
    ``sections.try_lock(key)``, skips an entity whose section is held (a later sweep re-reads
    state at least as new) and publishes what changed. Between sweeps it publishes events like a
    publisher.
``reporter`` (worker 1)
    Repeatedly needs the ``stats_snapshot`` lock for a moment. The compactor holds that lock for
    long stretches, so the reporter spends most of its time waiting: the starved worker.
``compactor`` (worker 2)
    A low-priority background job holding ``stats_snapshot`` ``COMPACT_HOLD_S`` at a time. Once,
    first thing, it takes ``accounts`` then ``ledger``.
``connections``
    A connection pool: a ``queue.LifoQueue`` of ``CONNECTIONS`` (2) connections. The sweeper
    loads each sweep's entities over one, the reporter writes each snapshot over one: two users
    of two connections, a pool that never runs dry, reported with what its capacity supports.
``publisher-NN`` (workers 3 and up)
    The event path: re-read the configuration under ``global_config`` (one lock for the whole
    pool: it becomes the hot lock), then change an entity and publish it under its section with
    ``sections.lock(key)``. ``publisher-03`` once takes ``ledger`` then ``accounts``, after the
    compactor has released its pair: the A -> B / B -> A ordering precursor. The two never
    overlap, so the run never deadlocks, yet the lock-order graph has its cycle.

Each unit of work (a publish, a sweep, a snapshot, a compaction, the one-off reconciliation of
``accounts`` and ``ledger``) runs inside a task span of its own, named for it, as a traced
service's requests would: exported to a collector, the ``lock.wait`` spans of a unit sit under
its task span, not in one-span traces of their own. The tracer is the demo's (without one, the
global tracer provider's: a no-op unless the caller set one up).

Every send for an entity happens with the entity's section held, from loading the state to
recording what was sent, so the subscriber's view of an entity never moves backward; the
subscriber counts the sends that would have (``regressions``, always 0).

Locks created on one source line are one lock class (lockdep's rule), so each lock here is
created on a line of its own.
"""

from __future__ import annotations

import itertools
import queue
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from opentelemetry import trace

from otel_lockwatch import StripedSections, name_lock

#: The fewest workers that can play every role.
MIN_WORKERS = 4
#: Entities published, and sections serializing them (fewer sections than entities: collisions).
ENTITIES = 256
SECTIONS = 64
#: How long a publisher holds ``global_config`` to re-read the configuration.
CONFIG_HOLD_S = 0.001
#: How long a send takes (the section is held across it, as the pattern requires).
SEND_S = 0.0005
#: How long the compactor holds ``stats_snapshot``, and how long it lets go between holds.
COMPACT_HOLD_S = 0.02
COMPACT_PAUSE_S = 0.001
#: How long the reporter works between two snapshots (writing each out included), on average:
#: each pause is drawn between half and one and a half times this. A snapshot then arrives at a
#: random point of the compactor's 21 ms cycle and waits about 9.5 ms for its hold: 10-13 % of
#: the reporter's life in 1 s runs (103-127 ms), clearly starvation (the 5 % floor is
#: ``starvation_min_wait_pct_of_observed``), and less than ``global_config``'s waits. A fixed
#: pause fell into step with the compactor: at 100 ms the waits took 5.6-6.4 % (a loaded
#: machine's 1 s demo could miss the starvation), at 50 ms about 21 % (as much as
#: ``global_config``'s on the free-threaded build).
REPORT_PAUSE_S = 0.075
#: Time between two sweeps; a sweep loads the entities in batches, each load taking a moment.
SWEEP_INTERVAL_S = 0.02
SWEEP_BATCH = 32
SWEEP_BATCH_LOAD_S = 0.0002
#: The connection pool's size, and how long the reporter holds a connection to write a snapshot.
CONNECTIONS = 2
REPORT_WRITE_S = 0.002
#: How long publisher-03 waits at most for the compactor's accounts -> ledger.
ORDERING_WAIT_S = 10.0


class Subscriber:
    """What the publishes reach: the last version seen per entity, and every regression.

    ``receive`` is only ever called with the entity's section held, so the calls for one entity
    are serialized; ``list.append`` is atomic, so the regressions of different entities are not
    lost.
    """

    def __init__(self, keys: list[str]) -> None:
        self.seen: dict[str, int] = dict.fromkeys(keys, -1)
        self.received: dict[str, int] = dict.fromkeys(keys, 0)
        self.regressions: list[tuple[str, int, int]] = []

    def receive(self, key: str, version: int) -> None:
        last = self.seen[key]
        if version < last:
            self.regressions.append((key, last, version))
        self.seen[key] = version
        self.received[key] += 1


class Pool:
    """The shared state of one run: the locks, the entities, the subscriber, the counters."""

    def __init__(self, workers: int, seconds: float, tracer: Any = None) -> None:
        if workers < MIN_WORKERS:
            raise ValueError(f"workers must be at least {MIN_WORKERS}, got {workers}")
        self.workers = workers
        self.tracer = tracer if tracer is not None else trace.get_tracer(__name__)
        self.seconds = seconds
        self.keys = [f"unit-{i}" for i in range(ENTITIES)]
        self.sections = StripedSections(SECTIONS, name="entity_sections")
        self.config_lock = name_lock(threading.Lock(), "global_config")
        self.stats_lock = name_lock(threading.Lock(), "stats_snapshot")
        self.accounts = name_lock(threading.Lock(), "accounts")
        self.ledger = name_lock(threading.Lock(), "ledger")
        self.connections: queue.LifoQueue[int] = name_lock(queue.LifoQueue(), "connections")
        for connection in range(CONNECTIONS):
            self.connections.put(connection)
        self.store: dict[str, int] = dict.fromkeys(self.keys, 0)
        self.last_sent: dict[str, int] = {}
        self.subscriber = Subscriber(self.keys)
        self._versions = itertools.count(1)
        self.ordering_first_done = threading.Event()
        self.start = time.monotonic()
        self.deadline = self.start + seconds
        # Per-worker counters, each written only by its worker: no lock, summed when read.
        self.published = [0] * workers
        self.sweeps = 0
        self.sweep_skips = 0
        self.snapshots = 0

    # -- the section pattern ---------------------------------------------------------------
    def _send(self, key: str) -> None:
        """Load, decide, send, record: called with the key's section held."""
        version = self.store[key]
        if self.last_sent.get(key) != version:
            self.subscriber.receive(key, version)
            self.last_sent[key] = version

    def publish_event(self, worker: int, key: str) -> None:
        """The event path: the message must go out, so it queues for the section."""
        with self.config_lock:
            time.sleep(CONFIG_HOLD_S)  # hold: re-reading the configuration
        with self.sections.lock(key):
            # The state change and its publish, under the entity's section.
            self.store[key] = next(self._versions)
            self._send(key)
            time.sleep(SEND_S)  # hold: the send's round trip
        self.published[worker] += 1

    def sweep(self) -> None:
        """The periodic path: skip a held section rather than queue behind it."""
        connection = self.connections.get()  # the entities are loaded over a connection
        try:
            for i, key in enumerate(self.keys):
                if i % SWEEP_BATCH == 0:
                    time.sleep(SWEEP_BATCH_LOAD_S)  # loading the next batch of entities
                with self.sections.try_lock(key) as held:
                    if not held:
                        self.sweep_skips += 1
                        continue
                    self._send(key)
        finally:
            self.connections.put(connection)
        self.sweeps += 1

    # -- the roles -------------------------------------------------------------------------
    def _running(self) -> bool:
        return time.monotonic() < self.deadline

    def _task(self, name: str) -> Any:
        """The task span of one unit of work: its lock waits and holds become its children."""
        return self.tracer.start_as_current_span(name)

    def sweeper(self, worker: int) -> None:
        rng = random.Random(worker)
        next_sweep = time.monotonic()
        while self._running():
            if time.monotonic() >= next_sweep:
                with self._task("sweep"):
                    self.sweep()
                # From the sweep's end: a sweep slowed down (a loaded machine) is never followed
                # at once by the next, and the sweeper keeps publishing between them.
                next_sweep = time.monotonic() + SWEEP_INTERVAL_S
            with self._task("publish"):
                self.publish_event(worker, rng.choice(self.keys))
        with self._task("sweep"):
            self.sweep()

    def reporter(self, worker: int) -> None:
        rng = random.Random(worker)
        while self._running():
            with self._task("snapshot"), self.stats_lock:
                self.snapshots += 1
            connection = self.connections.get()
            time.sleep(REPORT_WRITE_S)  # hold: writing the snapshot out (part of the pause)
            self.connections.put(connection)
            time.sleep(REPORT_PAUSE_S * rng.uniform(0.5, 1.5) - REPORT_WRITE_S)

    def compactor(self, worker: int) -> None:
        # Nested, not `with a, b:`, so the two acquisitions have sites of their own.
        with self._task("reconcile"), self.accounts:  # noqa: SIM117
            with self.ledger:
                pass
        self.ordering_first_done.set()
        while self._running():
            with self._task("compact"), self.stats_lock:
                time.sleep(COMPACT_HOLD_S)  # hold: compacting
            time.sleep(COMPACT_PAUSE_S)

    def publisher(self, worker: int) -> None:
        rng = random.Random(worker)
        if worker == 3 and self.ordering_first_done.wait(ORDERING_WAIT_S):
            with self._task("reconcile"), self.ledger:  # noqa: SIM117
                with self.accounts:
                    pass
        while self._running():
            with self._task("publish"):
                self.publish_event(worker, rng.choice(self.keys))

    def work(self, worker: int) -> None:
        """Worker ``worker``'s task: name the thread after its role, then play it."""
        role = {0: "sweeper", 1: "reporter", 2: "compactor"}.get(worker, f"publisher-{worker:02d}")
        threading.current_thread().name = role
        getattr(self, role.split("-")[0])(worker)

    # -- reading ---------------------------------------------------------------------------
    def counts(self) -> dict[str, Any]:
        """The counters so far (read while running: a consistent-enough view for progress)."""
        return {
            "published": sum(self.published),
            "received": sum(self.subscriber.received.values()),
            "sweeps": self.sweeps,
            "sweep_skips": self.sweep_skips,
            "snapshots": self.snapshots,
            "regressions": len(self.subscriber.regressions),
        }


def run(workers: int, seconds: float, started: Callable[[Pool], None], tracer: Any = None) -> Pool:
    """Build the pool, hand it to ``started``, and run its workers to the deadline on a
    ``ThreadPoolExecutor(max_workers=workers)``, each unit of work in a task span of ``tracer``.
    Call it in a thread with no otel_lockwatch frame above it (see the module docstring).

    Raises:
        ValueError: fewer than ``MIN_WORKERS`` workers.
        Exception: whatever a worker raised (the first one), after every worker has ended.
    """
    pool = Pool(workers, seconds, tracer)
    started(pool)
    with ThreadPoolExecutor(max_workers=pool.workers, thread_name_prefix="demo") as executor:
        futures = [executor.submit(pool.work, i) for i in range(pool.workers)]
    for future in futures:
        future.result()
    return pool


def run_into(
    box: dict[str, Any],
    workers: int,
    seconds: float,
    started: Callable[[Pool], None],
    tracer: Any = None,
) -> None:
    """:func:`run` as a thread's target: the pool goes to ``box["pool"]``, an exception to
    ``box["error"]``. The target itself must live here: a thread whose target is a function of
    otel_lockwatch would make every lock of the workload look like otel-lockwatch's own."""
    try:
        box["pool"] = run(workers, seconds, started, tracer)
    except BaseException as exc:  # handed to the thread that waits for this one
        box["error"] = exc
