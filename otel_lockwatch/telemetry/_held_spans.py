"""``HeldLockSpanProcessor``: spans started while a lock is held, counted per lock.

The held-lock stacks live in the recorder and are fed directly by the lock wrappers on every
acquire and release (no span is needed on that path). This processor adds what only spans can
tell: a span started while the thread holds locks (an HTTP call, a database query: any
instrumented I/O) is blocking work inside a critical section. It is counted against each lock
held, by span name, and reported in the manifest's ``blocking_under_lock``. It has nothing to do
with the lock-order graph (it was once named ``LockOrderSpanProcessor``, a name the package
still answers to, with a ``DeprecationWarning``).

Spans lockwatch emits itself (``lock.wait``, ``lock.hold``, the manifest span) are not counted:
they are started while the recorder marks the thread as running lockwatch's own code.
"""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

__all__ = ["HeldLockSpanProcessor"]

#: Distinct span names counted per lock, at most (span names are code-chosen, but be safe).
MAX_SPAN_NAMES = 256


class HeldLockSpanProcessor(SpanProcessor):
    """Counts spans started under held locks; the instrumentor adds it to an SDK tracer provider.

    Args:
        recorder: the recorder whose per-thread held stacks are read (``_session.RECORDER``).
    """

    def __init__(self, recorder: Any) -> None:
        self._recorder = recorder

    @property
    def graph(self) -> Any:
        """The process's lock-order graph (``otel_lockwatch.record._order.LockOrderGraph``)."""
        return self._recorder.graph

    def _states(self) -> tuple[Any, Any]:
        """The calling thread's state and, inside an asyncio task, the task's (or None).

        A task is a worker of its own: the asyncio locks it holds are on its state's stack, the
        ``threading`` locks its thread holds on the thread's.
        """
        thread_state = getattr(self._recorder.tls, "st", None)
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no running event loop on this thread
            return thread_state, None
        return thread_state, getattr(task, "_lockwatch_state", None) if task is not None else None

    def held_locks(self) -> list[str]:
        """The lock classes the caller holds, outermost first: its thread's, then its asyncio
        task's."""
        return [
            entry.lock_class.name for st in self._states() if st is not None for entry in st.held
        ]

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        scope = getattr(span, "instrumentation_scope", None)
        if scope is not None and scope.name == "otel_lockwatch":
            return  # lockwatch's own (the emitter's spans: a look at the thread costs 2 us each)
        thread_state, task_state = self._states()
        if thread_state is not None and thread_state.in_lockwatch:
            return  # lockwatch's own spans
        held = [st for st in (thread_state, task_state) if st is not None and st.held]
        if not held:
            return
        worker = task_state if task_state is not None else thread_state
        name = span.name
        spans = worker.spans
        seen = set()
        for st in held:
            for entry in st.held:
                lock_name = entry.lock_class.name
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
