"""``HeldLockSpanProcessor``: spans started while a lock is held, counted per lock.

The held-lock stacks live in the recorder and are fed directly by the lock wrappers on every
acquire and release (no span is needed on that path). This processor adds what only spans can
tell: a span started while the thread holds locks (an HTTP call, a database query: any
instrumented I/O) is blocking work inside a critical section. It is counted against each lock
held, by span name, and reported in the manifest's ``blocking_under_lock``. It has nothing to do
with the lock-order graph (it was once named ``LockOrderSpanProcessor``, a name the package
still answers to, with a ``DeprecationWarning``).

Spans lockwatch emits itself (``lock.wait``, ``lock.hold``, the manifest span) are not counted:
they are started while the recorder marks the thread busy.
"""

from __future__ import annotations

from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

__all__ = ["HeldLockSpanProcessor"]

#: Distinct span names counted per lock, at most (span names are code-chosen, but be safe).
MAX_SPAN_NAMES = 256


class HeldLockSpanProcessor(SpanProcessor):
    """Counts spans started under held locks; the instrumentor adds it to an SDK tracer provider.

    Args:
        recorder: the recorder whose per-thread held stacks are read (``_recorder.RECORDER``).
    """

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder

    @property
    def graph(self) -> Any:
        """The process's lock-order graph (``otel_lockwatch.record._order.LockOrderGraph``)."""
        return self._recorder.graph

    def held_locks(self) -> list[str]:
        """The lock classes the calling thread (or asyncio task) holds, outermost first."""
        import asyncio

        try:
            task = asyncio.current_task()
        except RuntimeError:
            task = None
        state = getattr(task, "_lockwatch_state", None) if task is not None else None
        if state is None:
            state = getattr(self._recorder.tls, "st", None)
        return [entry[0].name for entry in state.held] if state is not None else []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        st = getattr(self._recorder.tls, "st", None)
        if st is None or st.busy or not st.held:
            return
        name = span.name
        spans = st.spans
        seen = set()
        for entry in st.held:
            lock_name = entry[0].name
            if lock_name in seen:
                continue
            seen.add(lock_name)
            key = (lock_name, name)
            if key in spans:
                spans[key] += 1
            elif len(spans) < MAX_SPAN_NAMES:
                spans[key] = 1

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True
