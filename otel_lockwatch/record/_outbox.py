"""The outbox: what the lock path hands to OpenTelemetry, and the one error path.

The lock path never calls the OpenTelemetry SDK. A wait that blocked, or a hold at or above the
metric floor, is appended to a bounded queue (a ``deque.append``: no lock), and the emitter
(``telemetry._emitter``) drains the queue into spans and histogram values from its own thread,
every 50 ms and at every flush. So an exporter that is down or slow never blocks a lock path.
When the queue is full the oldest record is dropped and counted in ``dropped``.

A record's code sites are what the lock path has at hand, not text: ``site`` is the waiter's
``(module, code, offset)`` (or a ``module:function:line`` string), ``holder`` the holder's
``(code, offset)``; the emitter makes them span attributes. A contended acquisition runs its
bookkeeping while it holds the lock it waited for, on everyone's critical path, so what can wait
for the emitter does (docs/performance.md).

``failed()`` is the single path for an error inside lockwatch on any thread: counted, logged
once, never raised into the host program.
"""

from __future__ import annotations

import collections
import logging
from _thread import get_ident as _get_ident
from collections.abc import Callable
from typing import Any

from ._threads import current_thread_name

__all__ = ["RECORD_FIELDS", "Outbox"]

#: A queued record: a tuple of these, in this order (made by :meth:`Outbox.put`; the C path
#: queues a hold's below the span threshold itself, the same tuple: ``_speedups.c``'s
#: ``hold_queued``, held to it by ``tests/test_outbox_records.py``), unpacked by the emitter.
RECORD_FIELDS = (
    "name",  # "lock.wait" or "lock.hold"
    "lock_class",
    "start_ns",
    "end_ns",
    "context",  # the OpenTelemetry context at the acquisition (a span's parent)
    "outcome",  # a wait's "acquired" or "timed_out"; None for a hold
    "span",  # whether it lasted the span threshold or more
    "extra",  # more span attributes, or None
    "site",  # where it waited or was held (a span's), or None
    "thread_name",  # a span's; None without one
    "thread_id",  # a span's; None without one
    "holder",  # a wait's span: where the holder acquired the lock; else None
)

logger = logging.getLogger("otel_lockwatch")


class Outbox:
    """The bounded queue of slow-path records, and the internal-error counter (the process's one
    is ``_session.OUTBOX``). What consumes it hands in its callbacks (``on_first_record``,
    ``on_cycle``): this layer never calls OpenTelemetry."""

    QUEUE_SIZE = 65536

    def __init__(self) -> None:
        self.queue: collections.deque[tuple] = collections.deque(maxlen=self.QUEUE_SIZE)
        #: Whether anything consumes the queue (set by the emitter while instruments exist).
        self.accepting = False
        #: Called on the first record of a process (the emitter starts its thread there).
        self.on_first_record: Callable[[], None] | None = None
        #: Called with a newly found cycle's report and locks (the emitter adds a span event).
        self.on_cycle: Callable[[str, tuple[str, ...]], None] | None = None
        self.dropped = 0
        self.errors = 0
        self._warned = False
        #: False until the first record of this process (a forked child starts again): then the
        #: queue is cleared and ``on_first_record`` runs. A flag the fork hook resets, rather than
        #: the process id: ``os.getpid()`` is a system call, on every record. (The C path reads
        #: it, with ``accepting`` and ``queue``, to queue a hold's record itself.)
        self.started = False

    def after_fork_in_child(self) -> None:
        """In a forked child (the session's fork handler): its first record starts again."""
        self.started = False

    def reset(self) -> None:
        """Forget what is queued and counted (``_session.discard``)."""
        self.queue.clear()
        self.dropped = 0
        self.errors = 0
        self._warned = False

    def failed(self, exc: BaseException) -> None:
        """An error inside lockwatch: counted, logged once, never raised into the host."""
        self.errors += 1
        if not self._warned:
            self._warned = True
            logger.warning(
                "otel-lockwatch: internal error (reported once; the program is unaffected): %r",
                exc,
                exc_info=exc,
            )

    def begin(self) -> None:
        """The first record of this process (first use, or a forked child): the queue starts
        empty (a child drops its parent's records: the parent emits them) and
        ``on_first_record`` runs (the emitter's thread starts)."""
        self.started = True
        self.queue.clear()
        start = self.on_first_record
        if start is not None:
            start()

    def wait(
        self,
        cls: Any,
        t0: int,
        t1: int,
        ctx: Any,
        outcome: str,
        span_ns: int,
        extra: dict[str, Any] | None,
        site: str | tuple | None,
        holder: tuple | None = None,
        thread: tuple[str, int] | None = None,
    ) -> None:
        """Queue a wait that blocked: its metric value always, its span when long enough
        (``site``: where it waited; ``holder``: where the holder acquired the lock; ``thread``:
        the waiter's name and id, when another thread queues it: ``_waits``)."""
        self.put("lock.wait", cls, t0, t1, ctx, outcome, span_ns, extra, site, holder, thread)

    def put(
        self,
        name: str,
        cls: Any,
        t0: int,
        t1: int,
        ctx: Any,
        outcome: str | None,
        span_ns: int,
        extra: dict[str, Any] | None,
        site: str | tuple | None,
        holder: tuple | None = None,
        thread: tuple[str, int] | None = None,
    ) -> None:
        """Queue a ``lock.wait`` or a ``lock.hold`` (one at or above the metric floor; called
        directly on a release, the hot path's one call here): its metric value always, its span
        when it lasted ``span_ns`` or more; nothing while no emitter consumes the queue."""
        if not self.accepting:
            return
        if not self.started:
            self.begin()
        span = t1 - t0 >= span_ns
        ident: int | None
        if not span:
            ident = thread_name = None
        elif thread is not None:
            thread_name, ident = thread
        else:  # the span names the thread; a metric value alone does not
            ident = _get_ident()
            thread_name = current_thread_name(ident)
        queue = self.queue
        if len(queue) >= self.QUEUE_SIZE:
            self.dropped += 1
        queue.append(  # RECORD_FIELDS
            (name, cls, t0, t1, ctx, outcome, span, extra, site, thread_name, ident, holder)
        )

    def cycle(self, text: str, locks: tuple[str, ...]) -> None:
        """A newly found cycle, for the current span (through ``on_cycle``, when set)."""
        on_cycle = self.on_cycle
        if on_cycle is not None:
            on_cycle(text, locks)
