"""Spans started while a lock is held count against it, for asyncio tasks as for threads."""

from __future__ import annotations

import asyncio
import threading

from otel_lockwatch import HeldLockSpanProcessor, name_lock
from otel_lockwatch._session import RECORDER


def _processor(watched) -> HeldLockSpanProcessor:
    (processor,) = [
        p
        for p in watched.tracer_provider._active_span_processor._span_processors
        if isinstance(p, HeldLockSpanProcessor)
    ]
    return processor


def test_a_span_started_while_a_task_holds_an_asyncio_lock_is_counted(watched):
    """Regression: on_start read only the thread's state, so a task's asyncio locks were
    invisible to it (held_locks() saw them, the manifest did not)."""
    tracer = watched.tracer_provider.get_tracer("app")
    processor = _processor(watched)
    seen: list[list[str]] = []

    async def main() -> None:
        lock = name_lock(asyncio.Lock(), "alock")
        async with lock:
            seen.append(processor.held_locks())
            with tracer.start_as_current_span("db.query"):
                pass
        with tracer.start_as_current_span("after"):
            pass

    asyncio.run(main())
    assert seen == [["alock"]]
    assert RECORDER.snapshot()["blocking_under_lock"] == {"alock": {"db.query": 1}}


def test_a_task_counts_its_threads_locks_too(watched):
    """A task running while its thread holds a threading lock: the span counts against both."""
    tracer = watched.tracer_provider.get_tracer("app")
    outer = name_lock(threading.Lock(), "outer")

    async def main() -> None:
        lock = name_lock(asyncio.Lock(), "alock")
        async with lock:
            with outer, tracer.start_as_current_span("http.get"):
                pass

    asyncio.run(main())
    assert RECORDER.snapshot()["blocking_under_lock"] == {
        "alock": {"http.get": 1},
        "outer": {"http.get": 1},
    }
