"""Waits counted where they happen, filed off the lock path.

A blocking acquisition that waited does its bookkeeping with the lock it waited for held: every
instruction there lengthens the hold, and under contention the holds are everyone's critical
path. So the waiter does only what must be current at once: the counts of its ``Stats`` (the
contentions, the wait's total, extremes and histogram bucket: what the live gauges, the totals
and the timeline read) and one tuple appended to :class:`UnfiledWaits` (a ``deque.append``, no
lock). The rest is filed later by whoever comes first of

- the emitter thread, every 50 ms (``telemetry._emitter``, a slice at a time);
- a snapshot (the manifest), before it reads anything;
- the fold of ended threads' states into retired ones (``Recorder``), before it copies them;

and it is: the wait's contention and contending points (``SiteTable.add`` on the waiter's
``Stats``) and its record for OpenTelemetry (``Outbox.wait``: a metric value, a span when the
wait lasted the span threshold). Measured (``benchmarks/bench_locks.py --contended``, 16
workers on one lock held 1 ms): that part of the bookkeeping took about 55 us a wait on the
waiter, right after its wake-up (cold caches: ten times what it takes in a loop), and the
instrumented pool lost 6 to 7 % of its throughput to it (docs/performance.md).

What the waiter takes at once is what a later look could not give: the waiter's site
(``(code, offset)``, not its frame: a frame kept past the wait would keep its locals alive), the
holder's site as its held-stack entry has it now (a released entry loses its frame), and, for a
span, the module and the thread's name and id.

A filer holds :attr:`UnfiledWaits.lock`: one filer at a time, so that a table is never written by
two threads at once; re-entrant, so that a signal handler or a finalizer that snapshots on a
thread in the middle of filing files the rest itself rather than wait for itself. A queue that
reaches :attr:`UnfiledWaits.LIMIT` (an emitter that cannot keep up) makes the waiter file its own
wait, if no filer is at work; the queue is bounded by what the filers take out meanwhile.
"""

from __future__ import annotations

import _thread
import collections
from collections.abc import Callable
from typing import Any

from ._sites import KEEP, UNKNOWN, SiteTable

__all__ = ["UNFILED_FIELDS", "UnfiledWaits"]

#: A wait not filed yet: a tuple of these, in this order (made by ``capture._bookkeeping``'s
#: ``record_wait``).
UNFILED_FIELDS = (
    "stats",  # the waiter's Stats for the class (its sites go there)
    "lock_class",
    "start_ns",
    "end_ns",
    "ok",  # whether it got the lock (else it timed out)
    "context",  # the OpenTelemetry context at the acquisition (a span's parent)
    "extra",  # more span attributes, or None
    "span_ns",  # the span threshold the waiter read
    "waiter",  # the waiter's (code, offset), or UNKNOWN
    "holder",  # the holder's (code, offset) at the waiter's arrival, or None
    "site",  # a span's (module, code, offset), or None
    "thread",  # a span's (thread, thread id): its Thread (or its name), or None
)


class UnfiledWaits:
    """The waits counted on the lock path whose sites and records are still to be filed (the
    recorder's ``waits``). ``thresholds`` (the session's, or None) gives a new ``SiteTable`` its
    bound; the outbox is handed in by the session (:meth:`hand_to`: the outbox module imports
    the recorder's)."""

    LIMIT = 65536

    def __init__(self, thresholds: Any = None) -> None:
        self.queue: collections.deque[tuple] = collections.deque()
        self.lock = _thread.RLock()
        self.thresholds = thresholds
        self.queue_record: Callable[..., None] | None = None
        self.failed: Callable[[BaseException], None] | None = None

    def hand_to(self, outbox: Any) -> None:
        """File each wait's record into ``outbox`` (its ``wait``), errors to its ``failed``."""
        self.queue_record = outbox.wait
        self.failed = outbox.failed

    def add(self, wait: tuple) -> None:
        """A wait counted on the lock path (an :data:`UNFILED_FIELDS` tuple), to be filed."""
        queue = self.queue
        if len(queue) < self.LIMIT or not self.lock.acquire(False):
            queue.append(wait)
            return
        try:
            self._file(wait)
        finally:
            self.lock.release()

    def file(self, limit: int = -1, blocking: bool = True) -> bool:
        """File up to ``limit`` waits (all, when negative), oldest first. Returns False when not
        ``blocking`` and another filer is at work (nothing filed)."""
        if not self.lock.acquire(blocking):
            return False
        try:
            popleft, file_one = self.queue.popleft, self._file
            while limit != 0:
                try:
                    wait = popleft()
                except IndexError:
                    break
                try:
                    file_one(wait)
                except Exception as exc:  # never into the filer (a snapshot, the emitter)
                    if self.failed is not None:
                        self.failed(exc)
                limit -= 1
            return True
        finally:
            self.lock.release()

    def _file(self, wait: tuple) -> None:
        stats, lock_class, t0, t1, ok, context, extra, span_ns, waiter, holder, site, thread = wait
        sites = stats.sites
        if sites is None:
            thresholds = self.thresholds
            sites = stats.sites = SiteTable(KEEP if thresholds is None else thresholds.sites_kept)
        sites.add(waiter, UNKNOWN if holder is None else holder, t1 - t0)
        if thread is not None and not isinstance(thread[0], str):  # its Thread: its name now
            thread = (thread[0].name, thread[1])
        queue_record = self.queue_record
        if queue_record is not None:
            queue_record(
                lock_class,
                t0,
                t1,
                context,
                "acquired" if ok else "timed_out",
                span_ns,
                extra,
                site,
                holder if site is not None else None,
                thread,
            )

    def clear(self) -> None:
        """Forget what is not filed (a reset)."""
        self.queue.clear()

    def after_fork_in_child(self) -> None:
        """A forked child files none of its parent's waits (the parent does), and its lock may
        have been held by a thread that does not exist here."""
        self.lock = _thread.RLock()
        self.queue.clear()
