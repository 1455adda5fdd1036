"""Hand-off waits and the pools they guard, per worker: what the condition, queue, semaphore,
event and future paths leave behind (``WorkerState.handoffs``).

A *hand-off wait* ends only when another worker hands something over: ``Condition.wait`` ends at
a ``notify``, a ``get`` on an empty queue at a ``put`` (a ``put`` on a full one at a ``get``), a
semaphore's blocking ``acquire`` at a ``release``, an event's ``wait`` at its ``set``. The mutex
paths record into the worker's ``Stats``; these paths record into the worker's ``handoffs``,
one :class:`HandoffStats` per lock class, kept apart so that a hand-off wait is never a mutex
wait (the evaluation decides which are contention: ``manifest._pools``). The data parts keep the
published names, which say "signal" for a hand-off for historical reasons: ``signal_waits`` (the
hand-off waits), and each worker's ``signals`` (its gives that end waits).

Every operation is seen from two sides, a *take* and a *give*:

==============  ==============================  ==============================
class           take (a checkout; may wait)     give (a hand-over; may wait)
==============  ==============================  ==============================
Condition       ``wait`` (not counted as take)  ``notify`` / ``notify_all``
queue           ``get``                         ``put`` (waits when full)
semaphore       ``acquire``                     ``release``
==============  ==============================  ==============================

A worker's ``signals`` in the data part are the gives that end the waits it made, direction by
direction: a worker that waited to take hands off by giving (it puts back the connection it got),
a worker that waited to give (a producer on a full queue) hands off by taking. A worker that waited
both ways counts both directions when it both took and gave, else the direction it waited longer
in. A worker that never waited reports its gives.

For queues and semaphores the pool is kept too: the capacity (a queue: the most items it held;
a semaphore: its initial value), the fewest items or permits left after a take, the takes, and
the hold from a take to the same worker's next give (paired last in, first out, so nested
checkouts pair as they nest; the last :data:`PENDING_MAX` takes are remembered, since a consumer
never gives back). Capacity and the fewest left are merged over the class's workers before the
peak in use is computed: one worker may only ever put, another only ever get.

A worker's statistics are written by that worker only, like its ``Stats``; :func:`handoff_parts`
turns every worker's into data parts when a snapshot is asked for.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

from ._histogram import LogHistogram, from_buckets

__all__ = [
    "HANDOFF_FIELDS",
    "PENDING_MAX",
    "POOLED_KINDS",
    "HandoffStats",
    "handoff_parts",
    "merge_handoffs",
]

#: Takes remembered per worker and class for their hold time.
PENDING_MAX = 16
#: The kinds whose classes are pools of items or permits (a bare condition has no capacity).
POOLED_KINDS = (
    "queue.Queue",
    "queue.LifoQueue",
    "queue.PriorityQueue",
    "threading.Semaphore",
    "threading.BoundedSemaphore",
    "asyncio.Semaphore",
    "asyncio.BoundedSemaphore",
)
_NONE = 1 << 62  # the minimum of no sample
#: A :class:`HandoffStats`'s fields. The leading nine (to ``hold_max_ns``) are those a take and
#: a give write, which the C path (``capture._speedups``) addresses in this order.
HANDOFF_FIELDS = (
    "takes",
    "gives",
    "most",
    "fewest",
    "pending",
    "hold_total_ns",
    "hold_histogram",
    "hold_min_ns",
    "hold_max_ns",
    "waits",
    "wait_ns",
    "give_waits",
    "give_wait_ns",
    "timeouts",
    "wait_histogram",
    "wait_min_ns",
    "wait_max_ns",
)


class HandoffStats:
    """One worker's hand-off waits and pool use on one lock class."""

    __slots__ = HANDOFF_FIELDS

    def __init__(self) -> None:
        self.waits = 0  # blocked hand-off waits to take (Condition.wait, get on empty, acquire)
        self.wait_ns = 0  # their total
        self.give_waits = 0  # blocked hand-off waits to give (put on a full queue)
        self.give_wait_ns = 0
        self.timeouts = 0  # waits (either way) that gave up
        self.wait_histogram: dict[int, int] = {}  # every blocked hand-off wait: bucket -> count
        self.wait_min_ns = _NONE
        self.wait_max_ns = 0
        self.takes = 0  # gets, acquires
        self.gives = 0  # puts, releases, notifies
        self.most = -1  # the capacity seen (-1: unknown)
        self.fewest = _NONE  # the fewest items or permits left after a take
        self.pending: deque[int] = deque(maxlen=PENDING_MAX)  # takes not given back yet
        self.hold_total_ns = 0  # take -> give
        self.hold_histogram: dict[int, int] = {}
        self.hold_min_ns = _NONE
        self.hold_max_ns = 0

    def merge(self, other: HandoffStats) -> None:
        """Add ``other``'s counts to these (an ended worker folded into a retired state)."""
        for name in (
            "waits",
            "wait_ns",
            "give_waits",
            "give_wait_ns",
            "timeouts",
            "takes",
            "gives",
            "hold_total_ns",
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in (
            (self.wait_histogram, other.wait_histogram),
            (self.hold_histogram, other.hold_histogram),
        ):
            for bucket, n in list(theirs.items()):
                mine[bucket] = mine.get(bucket, 0) + n
        self.wait_min_ns = min(self.wait_min_ns, other.wait_min_ns)
        self.wait_max_ns = max(self.wait_max_ns, other.wait_max_ns)
        self.hold_min_ns = min(self.hold_min_ns, other.hold_min_ns)
        self.hold_max_ns = max(self.hold_max_ns, other.hold_max_ns)
        self.most = max(self.most, other.most)
        self.fewest = min(self.fewest, other.fewest)

    def gives_ending_waits(self) -> int:
        """The worker's gives that end waits (its ``signals`` in the data), by the rule of the
        module docstring."""
        if self.waits and self.give_waits:
            if self.takes and self.gives:
                return self.takes + self.gives
            return self.gives if self.wait_ns >= self.give_wait_ns else self.takes
        return self.takes if self.give_waits else self.gives


def merge_handoffs(into: dict[Any, HandoffStats], other: dict[Any, HandoffStats]) -> None:
    """Add a worker's hand-off statistics (lock class -> :class:`HandoffStats`) to ``into``'s."""
    for lock_class, theirs in list(other.items()):
        mine = into.get(lock_class)
        if mine is None:
            mine = into[lock_class] = HandoffStats()
        mine.merge(theirs)


def _empty_lock(kind: str) -> dict[str, Any]:
    return {
        "kind": kind,
        "acquisitions": 0,
        "contentions": 0,
        "skipped": 0,
        "timeouts": 0,
        "wait_ns": LogHistogram(),
        "hold_ns": LogHistogram(),
        "workers": {},
    }


def handoff_parts(states: Iterable[Any]) -> Iterator[dict[str, Any]]:
    """The data parts of every worker's hand-off waits and pool use (merged by ``merge_data``).

    One part per (worker, class) with that worker's ``signal_waits`` (and ``pool`` checkouts and
    holds); then one part per pooled class with its ``capacity`` and ``in_use_peak``, from the
    capacity and the fewest left over all its workers.

    Args:
        states: the ``WorkerState`` of every worker (their ``handoffs`` are read).
    """
    extent: dict[Any, list[int]] = {}  # pooled class -> [most, fewest]
    for state in states:
        for lock_class, stats in list(state.handoffs.items()):
            pooled = lock_class.kind in POOLED_KINDS
            waits = stats.waits + stats.give_waits
            gives = stats.gives_ending_waits()
            wait_ns = stats.wait_ns + stats.give_wait_ns
            lock = _empty_lock(lock_class.kind)
            lock["signal_waits"] = {
                "count": waits,
                "timeouts": stats.timeouts,
                "wait_ns": from_buckets(
                    stats.wait_histogram, wait_ns, stats.wait_min_ns, stats.wait_max_ns
                ),
                "workers": (
                    {state.worker: {"waits": waits, "wait_ns": wait_ns, "signals": gives}}
                    if waits or gives
                    else {}
                ),
            }
            if pooled:
                lock["pool"] = {
                    "capacity": None,
                    "in_use_peak": None,
                    "checkouts": stats.takes,
                    "hold_ns": from_buckets(
                        stats.hold_histogram,
                        stats.hold_total_ns,
                        stats.hold_min_ns,
                        stats.hold_max_ns,
                    ),
                }
                known = extent.setdefault(lock_class, [-1, _NONE])
                known[0] = max(known[0], stats.most)
                known[1] = min(known[1], stats.fewest)
            yield {"locks": {lock_class.name: lock}}
    for lock_class, (most, fewest) in extent.items():
        capacity = most if most >= 0 else None
        in_use = None if capacity is None or fewest == _NONE else max(0, capacity - fewest)
        lock = _empty_lock(lock_class.kind)
        lock["pool"] = {
            "capacity": capacity,
            "in_use_peak": in_use,
            "checkouts": 0,
            "hold_ns": LogHistogram(),
        }
        yield {"locks": {lock_class.name: lock}}
