"""The outbox: what the lock path hands to OpenTelemetry, and the one error path.

The lock path never calls the OpenTelemetry SDK. A wait that blocked, or a hold at or above the
metric floor, is appended to a bounded queue (a ``deque.append``: no lock), and the emitter
(``telemetry._emitter``) drains the queue into spans and histogram values from its own thread,
every 50 ms and at every flush. So an exporter that is down or slow never blocks a lock path.
When the queue is full the oldest record is dropped and counted in ``dropped``.

``failed()`` is the single path for an error inside lockwatch on any thread: counted, logged
once, never raised into the host program.
"""

from __future__ import annotations

import _thread
import collections
import logging
import os
from collections.abc import Callable
from typing import Any

from opentelemetry import trace

from ._recorder import current_thread_or_none

__all__ = ["OUTBOX", "Outbox"]

logger = logging.getLogger("otel_lockwatch")


class Outbox:
    """The bounded queue of slow-path records, and the internal-error counter."""

    QUEUE_SIZE = 65536

    def __init__(self) -> None:
        self.queue: collections.deque[tuple] = collections.deque(maxlen=self.QUEUE_SIZE)
        #: Whether anything consumes the queue (set by the emitter while instruments exist).
        self.accepting = False
        #: Called on the first record of a process (the emitter starts its thread there).
        self.on_first_record: Callable[[], None] | None = None
        self.dropped = 0
        self.errors = 0
        self._warned = False
        self._pid = 0

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

    def wait(
        self,
        cls: Any,
        t0: int,
        t1: int,
        ctx: Any,
        outcome: str,
        span_ns: int,
        extra: dict[str, Any] | None,
        site: str | None,
    ) -> None:
        """Queue a wait that blocked: its metric value always, its span when long enough."""
        if self.accepting:
            self._put("lock.wait", cls, t0, t1, ctx, outcome, span_ns, extra, site)

    def hold(
        self,
        cls: Any,
        t0: int,
        t1: int,
        ctx: Any,
        span_ns: int,
        extra: dict[str, Any] | None,
        site: str | None,
    ) -> None:
        """Queue a hold at or above the metric floor; its span when long enough."""
        if self.accepting:
            self._put("lock.hold", cls, t0, t1, ctx, None, span_ns, extra, site)

    def _put(
        self,
        name: str,
        cls: Any,
        t0: int,
        t1: int,
        ctx: Any,
        outcome: str | None,
        span_ns: int,
        extra: dict[str, Any] | None,
        site: str | None,
    ) -> None:
        if self._pid != os.getpid():  # first use, or a forked child
            self._pid = os.getpid()
            self.queue.clear()  # a child drops its parent's records: the parent emits them
            start = self.on_first_record
            if start is not None:
                start()
        thread = current_thread_or_none()  # None for a foreign thread (no dummy registered)
        queue = self.queue
        if len(queue) >= self.QUEUE_SIZE:
            self.dropped += 1
        queue.append(
            (
                name,
                cls,
                t0,
                t1,
                ctx,
                outcome,
                t1 - t0 >= span_ns,
                extra,
                site,
                thread.name if thread is not None else f"Dummy-{_thread.get_ident()}",
                thread.ident if thread is not None else _thread.get_ident(),
            )
        )

    def cycle_event(self, text: str, locks: tuple[str, ...]) -> None:
        """A span event on the current span for a newly found cycle."""
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(
                "lockwatch.potential_deadlock",
                {"lockwatch.cycle": list(locks), "lockwatch.report": text},
            )


OUTBOX = Outbox()
