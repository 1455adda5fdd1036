"""Recorder snapshots built from raw acquisitions, for tests with a known ground truth."""

from __future__ import annotations

from otel_lockwatch.record._histogram import LogHistogram


def locks_and_workers(events, idle_ns: int = 0) -> tuple[dict, dict]:
    """The ``locks`` and ``workers`` parts of a snapshot of ``(worker, lock, wait_ns, hold_ns)``
    acquisitions; each worker's observed time is its waits and holds plus ``idle_ns``."""
    locks: dict = {}
    workers: dict = {}
    for worker, lock, wait, hold in events:
        entry = locks.setdefault(
            lock,
            {
                "kind": "threading.Lock",
                "acquisitions": 0,
                "contentions": 0,
                "skipped": 0,
                "timeouts": 0,
                "wait_ns": LogHistogram(),
                "hold_ns": LogHistogram(),
                "workers": {},
            },
        )
        entry["acquisitions"] += 1
        entry["contentions"] += wait > 0
        entry["wait_ns"].add(wait)
        entry["hold_ns"].add(hold)
        w = entry["workers"].setdefault(
            worker, {"acquisitions": 0, "contentions": 0, "wait_ns": 0, "hold_ns": 0}
        )
        w["acquisitions"] += 1
        w["contentions"] += wait > 0
        w["wait_ns"] += wait
        w["hold_ns"] += hold
        ww = workers.setdefault(worker, {"observed_ns": idle_ns, "wait_ns": 0})
        ww["observed_ns"] += wait + hold
        ww["wait_ns"] += wait
    return locks, workers


# --------------------------------------------------------------------------------------------
# Pools: the data parts the recorder leaves for a checkout / checkin pool under a known load


class PoolRun:
    """A worker pool on a FIFO pool of ``capacity`` slots, simulated event by event.

    ``workers`` workers start together; each runs ``tasks`` tasks of ``think_ns`` outside the
    pool then ``hold_ns`` holding one slot. A worker that finds no slot free waits for the
    first one given back (first come, first served). The result is what the recorder would
    count, with the exact ground truth.

    Attributes:
        waits: ``{worker: [wait_ns, ...]}``, one per checkout that blocked.
        holds: every checkout -> checkin time.
        observed: ``{worker: ns}``, from its first to its last event.
        in_use_peak: the most slots held at once.
    """

    def __init__(
        self,
        workers: int,
        capacity: int,
        *,
        tasks: int = 10,
        hold_ns: int = 10_000_000,
        think_ns: int = 0,
        prefix: str = "w",
    ) -> None:
        import heapq

        names = [f"{prefix}{i}" for i in range(workers)]
        self.names = names
        self.capacity = capacity
        self.tasks = tasks
        self.waits: dict[str, list[int]] = {w: [] for w in names}
        self.holds: list[int] = []
        self.observed: dict[str, int] = {}
        free = capacity
        in_use_peak = 0
        queue: list[tuple[str, int]] = []  # FIFO of (worker, asked at)
        left = dict.fromkeys(names, tasks)
        # (time, seq, event, worker): "ask" for a slot, "done" giving one back.
        events: list[tuple[int, int, str, str]] = []
        seq = 0
        for w in names:
            events.append((think_ns, seq, "ask", w))
            seq += 1
        heapq.heapify(events)
        while events:
            now, _, what, w = heapq.heappop(events)
            if what == "ask":
                if free:
                    free -= 1
                    in_use_peak = max(in_use_peak, capacity - free)
                    heapq.heappush(events, (now + hold_ns, seq, "done", w))
                    seq += 1
                else:
                    queue.append((w, now))
                continue
            self.holds.append(hold_ns)
            left[w] -= 1
            if left[w]:
                heapq.heappush(events, (now + think_ns, seq, "ask", w))
                seq += 1
            else:
                self.observed[w] = now
            if queue:  # the slot goes straight to the first waiter
                nxt, asked = queue.pop(0)
                self.waits[nxt].append(now - asked)
                heapq.heappush(events, (now + hold_ns, seq, "done", nxt))
                seq += 1
            else:
                free += 1
        self.in_use_peak = in_use_peak

    def signal_waits(self) -> dict:
        """The ``signal_waits`` of the pool's class: every worker gives back what it takes."""
        samples = [v for vs in self.waits.values() for v in vs]
        return {
            "count": len(samples),
            "timeouts": 0,
            "wait_ns": LogHistogram(samples),
            "workers": {
                w: {"waits": len(vs), "wait_ns": sum(vs), "signals": self.tasks}
                for w, vs in self.waits.items()
            },
        }

    def pool(self, capacity: int | None = None) -> dict:
        """The ``pool`` entry (queues and semaphores)."""
        return {
            "capacity": self.capacity if capacity is None else capacity,
            "in_use_peak": self.in_use_peak,
            "checkouts": len(self.holds),
            "hold_ns": LogHistogram(self.holds),
        }

    def workers(self) -> dict:
        """The ``workers`` part: observed from the start, no mutex wait."""
        return {w: {"observed_ns": self.observed[w], "wait_ns": 0} for w in self.names}


def lock_entry(kind: str, per_worker: dict | None = None, hold_ns: int = 0) -> dict:
    """A lock class's mutex part: ``per_worker`` is ``{worker: acquisitions}``, all
    uncontended, each held ``hold_ns``."""
    per_worker = per_worker or {}
    n = sum(per_worker.values())
    wait = LogHistogram()
    hold = LogHistogram()
    if n:
        wait.add_n(0, n)
        hold.add_n(hold_ns, n)
    return {
        "kind": kind,
        "acquisitions": n,
        "contentions": 0,
        "skipped": 0,
        "timeouts": 0,
        "wait_ns": wait,
        "hold_ns": hold,
        "workers": {
            w: {"acquisitions": a, "contentions": 0, "wait_ns": 0, "hold_ns": a * hold_ns}
            for w, a in per_worker.items()
        },
    }


#: The three ways to build a pool of slots, as the recorder sees each.
POOL_KINDS = ("semaphore", "condition", "lifo_queue")


def pool_data(run: PoolRun, kind: str, name: str = "app.db:make_pool:12") -> dict:
    """The data part a :class:`PoolRun` leaves with a pool built as ``kind`` (one of
    :data:`POOL_KINDS`): a ``threading.BoundedSemaphore`` (no mutex part), a
    ``threading.Condition`` around a list (its mutex taken at checkout and checkin, no
    ``pool`` entry: a Condition knows no capacity) or a ``queue.LifoQueue`` (its mutex too)."""
    per_worker = {w: 2 * run.tasks for w in run.names}  # checkout and checkin
    if kind == "semaphore":
        entry = lock_entry("threading.BoundedSemaphore")
        entry["pool"] = run.pool()
    elif kind == "condition":
        entry = lock_entry("threading.Condition", per_worker, hold_ns=2_000)
    elif kind == "lifo_queue":
        entry = lock_entry("queue.LifoQueue", per_worker, hold_ns=2_000)
        entry["pool"] = run.pool()
    else:
        raise ValueError(f"kind must be one of {POOL_KINDS}, got {kind!r}")
    entry["signal_waits"] = run.signal_waits()
    return {
        "locks": {name: entry},
        "workers": run.workers(),
        "pool": {"nominal": None, "source": None, "peak_workers": len(run.names)},
    }


def producer_consumer(
    consumers: int = 4,
    items: int = 100,
    *,
    interval_ns: int = 10_000_000,
    work_ns: int = 1_000_000,
    kind: str = "queue.Queue",
    name: str = "app.jobs:make_queue:7",
) -> dict:
    """The data part of one producer putting ``items`` work items ``interval_ns`` apart into a
    work queue (or releasing a semaphore: ``kind="threading.Semaphore"``) and ``consumers``
    consumers taking them, each working ``work_ns`` on one. A consumer waits, idle, for the
    next item; it never puts (releases), so its waits are idle, and the producer never waits.
    """
    free_since = dict.fromkeys((f"consumer-{i}" for i in range(consumers)), 0)
    waits: dict[str, list[int]] = {c: [] for c in free_since}
    end = dict.fromkeys(free_since, 0)
    for i in range(items):
        t = (i + 1) * interval_ns
        c = min(free_since, key=lambda c: (free_since[c], c))  # the longest idle takes it
        start = max(t, free_since[c])
        if start == t and free_since[c] < t:
            waits[c].append(t - free_since[c])
        free_since[c] = end[c] = start + work_ns
    samples = [v for vs in waits.values() for v in vs]
    handoff_workers = {
        c: {"waits": len(vs), "wait_ns": sum(vs), "signals": 0} for c, vs in waits.items()
    }
    handoff_workers["producer"] = {"waits": 0, "wait_ns": 0, "signals": items}
    entry = lock_entry(kind, {"producer": items, **{c: len(v) + 1 for c, v in waits.items()}})
    entry["signal_waits"] = {
        "count": len(samples),
        "timeouts": 0,
        "wait_ns": LogHistogram(samples),
        "workers": handoff_workers,
    }
    entry["pool"] = {"capacity": 1, "in_use_peak": 1, "checkouts": items, "hold_ns": LogHistogram()}
    workers = {c: {"observed_ns": end[c], "wait_ns": 0} for c in free_since}
    workers["producer"] = {"observed_ns": items * interval_ns, "wait_ns": 0}
    return {
        "locks": {name: entry},
        "workers": workers,
        "pool": {"nominal": None, "source": None, "peak_workers": consumers + 1},
    }


def merged_as_shares(manifests, cut: int) -> str:
    """The JSON of the merge of ``manifests`` folded as ``otel-lockwatch merge --jobs`` folds
    them: those before ``cut`` in one fold, the others in another, that one pickled (as a
    process sends it back) and added to the first."""
    import pickle

    from otel_lockwatch.manifest._merge import ManifestFold

    first, second = ManifestFold(), ManifestFold()
    for m in manifests[:cut]:
        first.add(m)
    for m in manifests[cut:]:
        second.add(m)
    first.add_fold(pickle.loads(pickle.dumps(second)))
    return first.result().to_json()
