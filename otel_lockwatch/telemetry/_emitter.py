"""What lockwatch sends through OpenTelemetry: spans of long waits and holds, and metrics.

Everything here runs on the *slow* path only: after a wait that blocked, or at the release of a
hold longer than a threshold. The uncontended path never reaches this module; its acquisitions
are counted exactly by the recorder and reported through observable counters read at collection.

Even the slow path does not call the SDK: it appends a record to the outbox
(``record._outbox``), and the emitter thread here turns records into spans and histogram values
every 50 ms, and at every flush (the tracer provider's ``force_flush`` and ``shutdown``, the
manifest's final write, ``uninstrument()``). So an exporter that is down or slow never blocks a
lock path, and a contended acquisition costs a few microseconds beyond its wait.

- ``lock.wait``: a wait of at least ``wait_span_threshold`` (default 1 ms), created after the
  fact with its true start and end, parented to the span current at the acquisition.
- ``lock.hold``: a hold of at least ``hold_span_threshold`` (default 10 ms), parented to the span
  current at the acquisition.
- ``lockwatch.lock.wait.duration``: every wait that blocked (a contended acquisition or a
  timeout), in seconds.
- ``lockwatch.lock.hold.duration``: every hold of at least ``hold_metric_floor`` (default
  0.1 ms), in seconds. Shorter holds are counted, and the manifest has their exact distribution,
  but recording each through the SDK would cost more than the hold itself (the SDK's histogram
  takes a lock per measurement).
- ``lockwatch.lock.acquisitions`` / ``lockwatch.lock.contentions``: exact counters, observed
  from the recorder; ``lockwatch.lock.lease_overruns`` / ``lockwatch.lock.release_failures``
  for distributed locks (``_distributed``).
- ``lockwatch.lock.waiting`` / ``lockwatch.lock.holders``: gauges of the threads and tasks
  blocked on, and holding, each lock class at the moment of collection (a pile-up shows while it
  happens). Observed from the workers' held stacks and the class a blocked worker's slow path
  notes: the uncontended path does nothing more for them.

Attributes are bounded by the code: ``lockwatch.lock.name`` (a lock class), ``.kind``, the
outcome, and on spans the section index (< the array's count), thread and code site. An entity
key is never an attribute.
"""

from __future__ import annotations

import _thread
import logging
import os
import threading
import time
from collections.abc import Callable
from time import perf_counter_ns as _pc
from time import sleep as _sleep
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Tracer

from .._session import OUTBOX, RECORDER
from .._version import __version__
from ..record._sites import code_attributes, code_site
from ._bounded import run_bounded
from ._distributed import distributed_counters
from ._exit_hooks import exit_hooks

__all__ = ["Telemetry"]

logger = logging.getLogger("otel_lockwatch")

SCHEMA_URL = "https://opentelemetry.io/schemas/1.21.0"
# Buckets advised for the duration histograms, in seconds: microseconds to tens of seconds.
DURATION_BUCKETS = (
    1e-6,
    2.5e-6,
    5e-6,
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    1e-2,
    2.5e-2,
    5e-2,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class Telemetry:
    """The instruments, the tracer, and the thresholds that decide what reaches them: the
    emitter of a session (``_session.Session.emitter``), from :meth:`enable` (``instrument()``)
    to :meth:`disable` (``uninstrument()``)."""

    INTERVAL_S = 0.05
    #: The emitter's work between two yields of the interpreter lock, in ns of wall time.
    SLICE_NS = 30_000
    #: How long the emitter sleeps between two slices, in s (see :meth:`drain`).
    SLICE_PAUSE_S = 30e-6
    #: Records (or waits to file) queued from which the emitter does not pause between slices.
    BACKLOG = 4096
    #: Waits filed (``record._waits``) between two looks at the clock.
    FILE_BATCH = 4

    def __init__(
        self, clock: Callable[[], int] = _pc, pause: Callable[[float], None] = _sleep
    ) -> None:
        """``clock`` (ns) times the drain's slices, ``pause(0)`` lets the interpreter lock go
        between two (a test gives its own)."""
        self.clock = clock
        self.pause = pause
        self.tracer: Tracer | None = None
        self.wait_hist: Any = None
        self.hold_hist: Any = None
        self._observables: list[Any] = []
        self._emitter: threading.Thread | None = None
        self._emitter_pid = 0
        self._stop = threading.Event()
        self._abandoned = False
        # Held from a record's popleft to the end of its emit (drain): a flush on another thread
        # returns only once the record the emitter thread took is emitted too. Re-entrant: a
        # signal handler may flush on a thread inside an emit. Never threading's: it is watched.
        self._emitting = _thread.RLock()

    def after_fork_in_child(self) -> None:
        """In a forked child (the session's fork handler): the emit lock made anew (the parent's
        emitter thread, which does not exist here, may have held it at the fork)."""
        self._emitting = _thread.RLock()

    # -- the emitter -----------------------------------------------------------------------
    @property
    def running(self) -> bool:
        """Whether this process's emitter thread runs, and is not told to stop."""
        return (
            self._emitter is not None
            and self._emitter_pid == os.getpid()
            and self._emitter.is_alive()
            and not self._stop.is_set()  # a stopped emitter may still be alive, about to end
        )

    def _ensure_emitter(self) -> None:
        if self.running:
            return
        self._stop = threading.Event()
        self._emitter_pid = os.getpid()
        self._emitter = threading.Thread(
            target=self._run, name="otel-lockwatch-emitter", daemon=True
        )
        self._emitter.start()

    def _run(self) -> None:
        RECORDER.thread_state().in_lockwatch = True  # nothing lockwatch does here is recorded
        stop = self._stop
        while not stop.wait(self.INTERVAL_S):
            self.drain(yielding=True)
            try:
                RECORDER.sample_timeline(periodic=True)  # the timeline, off the lock path
            except Exception as exc:  # never into the host
                OUTBOX.failed(exc)
            exit_hooks().check_lost_sigterm()

    def flush(
        self,
        timeout_s: float | None = None,
        then: Callable[[], None] | None = None,
        *,
        abandon: bool = True,
    ) -> bool:
        """Emit every queued record now (and then call ``then``, if given).

        Without a timeout this runs on the calling thread. With one it runs on a helper thread
        the caller waits for at most ``timeout_s``: the SDK's export can block for as long as its
        exporter retries (a collector that is down, behind a ``SimpleSpanProcessor``), and the
        caller may be a process trying to exit. When the time is up the emitter is abandoned:
        what is still queued is dropped (counted in ``OUTBOX.dropped``) and nothing more is
        accepted (unless ``abandon`` is False: a ``force_flush`` that ran out of time leaves
        the rest to the emitter thread).

        Returns:
            True when everything was emitted in time.
        """
        if timeout_s is None:
            self._drain_as_lockwatch(then)
            return True
        if run_bounded(lambda: self._drain_as_lockwatch(then), timeout_s, "otel-lockwatch-flush"):
            return True
        if abandon:
            self.abandon()
        return False

    def abandon(self) -> None:
        """Stop emitting for good: drop what is queued and accept nothing more (the process is
        leaving and its exporter does not answer)."""
        self._abandoned = True
        OUTBOX.accepting = False
        self._stop.set()
        queue = OUTBOX.queue
        OUTBOX.dropped += len(queue)
        queue.clear()

    def _drain_as_lockwatch(self, then: Callable[[], None] | None) -> None:
        st = RECORDER.thread_state()
        was_in_lockwatch = st.in_lockwatch
        st.in_lockwatch = True  # the SDK's locks taken here are not the host's: not recorded
        try:
            self.drain()
            if then is not None and not self._abandoned:
                then()
        except Exception as exc:  # never into the host
            OUTBOX.failed(exc)
        finally:
            st.in_lockwatch = was_in_lockwatch

    def drain(self, yielding: bool = False) -> None:
        """File the waits the lock paths left (``record._waits``: their records join the queue),
        then emit what is queued. ``yielding`` (the emitter thread): the interpreter lock is let
        go for :attr:`SLICE_PAUSE_S` every :attr:`SLICE_NS` of work, so that a lock holder waking
        up (from a sleep, an I/O) takes it within a slice, not after the emitter's switch
        interval (5 ms) of records: under contention the holder is everyone's critical path. A
        pause, not ``sleep(0)``: a thread that lets the lock go and asks for it again at once
        takes it back before the woken holder runs (docs/performance.md). Past
        :attr:`BACKLOG` records or waits queued the emitter does not pause: it catches up. A
        drain returns once every record queued before it is emitted, on whichever thread took
        it (a flush waits for the record the emitter thread is emitting)."""
        emit, clock = self.emit, self.clock
        waits, queue = RECORDER.waits, OUTBOX.queue
        slice_ends = clock() + self.SLICE_NS
        while waits.queue and not self._abandoned:
            waits.file(self.FILE_BATCH)
            if yielding and clock() >= slice_ends:
                self._pause(len(waits.queue) + len(queue))
                slice_ends = clock() + self.SLICE_NS
        emitting = self._emitting
        while not self._abandoned:
            with emitting:
                try:
                    record = queue.popleft()
                except IndexError:
                    return
                try:
                    emit(*record)
                except Exception as exc:
                    OUTBOX.failed(exc)
            if yielding and clock() >= slice_ends:
                self._pause(len(queue))
                slice_ends = clock() + self.SLICE_NS

    def _pause(self, backlog: int) -> None:
        self.pause(self.SLICE_PAUSE_S if backlog < self.BACKLOG else 0.0)

    def enable(self, tracer_provider: Any, meter_provider: Any, recorder: Any) -> None:
        """Create the tracer and instruments (None providers: the global ones), start the emitter
        and hand the outbox its callbacks: the first record of a (forked) process starts the
        emitter, a cycle found becomes a span event."""
        self._abandoned = False
        from opentelemetry import metrics
        from opentelemetry.metrics import CallbackOptions, Observation

        self.tracer = trace.get_tracer(
            "otel_lockwatch", __version__, tracer_provider, schema_url=SCHEMA_URL
        )
        meter = metrics.get_meter(
            "otel_lockwatch", __version__, meter_provider, schema_url=SCHEMA_URL
        )
        advice = {"explicit_bucket_boundaries_advisory": list(DURATION_BUCKETS)}
        try:
            self.wait_hist = meter.create_histogram(
                "lockwatch.lock.wait.duration",
                unit="s",
                description="Time a worker waited to acquire a lock (waits that blocked).",
                **advice,
            )
            self.hold_hist = meter.create_histogram(
                "lockwatch.lock.hold.duration",
                unit="s",
                description="Time a lock was held (holds at or above the metric floor).",
                **advice,
            )
        except TypeError:  # an API without bucket advice
            self.wait_hist = meter.create_histogram("lockwatch.lock.wait.duration", unit="s")
            self.hold_hist = meter.create_histogram("lockwatch.lock.hold.duration", unit="s")

        def acquisitions(options: CallbackOptions) -> list[Observation]:
            return [
                Observation(
                    n,
                    {
                        "lockwatch.lock.name": name,
                        "lockwatch.lock.kind": kind,
                        "lockwatch.outcome": outcome,
                    },
                )
                for (name, kind, outcome), n in recorder.totals().items()
                if outcome != "contended"
            ]

        def contentions(options: CallbackOptions) -> list[Observation]:
            return [
                Observation(n, {"lockwatch.lock.name": name, "lockwatch.lock.kind": kind})
                for (name, kind, outcome), n in recorder.totals().items()
                if outcome == "contended"
            ]

        def live(index: int) -> Callable[[CallbackOptions], list[Observation]]:
            def observe(options: CallbackOptions) -> list[Observation]:
                return [
                    Observation(
                        now[index], {"lockwatch.lock.name": name, "lockwatch.lock.kind": kind}
                    )
                    for (name, kind), now in recorder.live().items()
                ]

            return observe

        self._ensure_emitter()
        OUTBOX.on_first_record = self._ensure_emitter
        OUTBOX.on_cycle = self.cycle_event
        OUTBOX.accepting = True
        self._observables = [
            meter.create_observable_counter(
                "lockwatch.lock.acquisitions",
                callbacks=[acquisitions],
                unit="{acquisition}",
                description="Lock acquisition attempts, by outcome (acquired, skipped, timed_out).",
            ),
            meter.create_observable_counter(
                "lockwatch.lock.contentions",
                callbacks=[contentions],
                unit="{acquisition}",
                description="Blocking acquisitions that had to wait for another holder.",
            ),
            meter.create_observable_gauge(
                "lockwatch.lock.waiting",
                callbacks=[live(0)],
                unit="{worker}",
                description="Threads and tasks blocked acquiring a lock of the class right now.",
            ),
            meter.create_observable_gauge(
                "lockwatch.lock.holders",
                callbacks=[live(1)],
                unit="{worker}",
                description="Threads and tasks holding a lock of the class right now.",
            ),
        ]
        self._observables += distributed_counters(meter)

    def disable(self) -> None:
        """Stop accepting and emitting (what is queued is emitted first); the outbox's callbacks
        are taken back."""
        OUTBOX.accepting = False
        if OUTBOX.on_first_record == self._ensure_emitter:
            OUTBOX.on_first_record = None
            OUTBOX.on_cycle = None
        self.flush()
        self._stop.set()
        self.tracer = None
        self.wait_hist = None
        self.hold_hist = None
        self._observables = []

    @staticmethod
    def cycle_event(text: str, locks: tuple[str, ...]) -> None:
        """A span event on the current span for a newly found cycle (the outbox's ``on_cycle``)."""
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event(
                "lockwatch.potential_deadlock",
                {"lockwatch.cycle": list(locks), "lockwatch.report": text},
            )

    # -- the emitter's side ----------------------------------------------------------------
    def emit(
        self,
        name: str,
        cls: Any,
        t0: int,
        t1: int,
        ctx: Context | None,
        outcome: str | None,
        span: bool,
        extra: dict[str, Any] | None,
        site: str | tuple | None,
        thread_name: str | None,
        thread_id: int | None,
        holder: tuple | None = None,
    ) -> None:
        hist = self.wait_hist if name == "lock.wait" else self.hold_hist
        if hist is not None:
            attrs = (
                cls.attrs
                if outcome in (None, "acquired")
                else {**cls.attrs, "lockwatch.outcome": outcome}
            )
            hist.record((t1 - t0) / 1e9, attrs)
        if span and self.tracer is not None:
            self._span(
                name, cls, t0, t1, ctx, outcome, extra, site, thread_name or "", thread_id, holder
            )

    def _span(
        self,
        name: str,
        cls: Any,
        t0: int,
        t1: int,
        ctx: Context | None,
        outcome: str | None,
        extra: dict[str, Any] | None,
        site: str | tuple | None,
        thread_name: str,
        thread_id: int | None,
        holder: tuple | None = None,
    ) -> None:
        offset = time.time_ns() - time.perf_counter_ns()  # perf_counter -> epoch, read now
        attrs: dict[str, Any] = {
            **cls.attrs,  # name, kind (and a distributed lock's key template)
            "thread.name": thread_name,
            "thread.id": thread_id or 0,
        }
        if outcome is not None:
            attrs["lockwatch.outcome"] = outcome
        if site:
            attrs.update(site_attributes(site))
        if extra:
            attrs.update(extra)
        if holder is not None:  # who held the lock the span waited for
            attrs.update(site_attributes(holder, "lockwatch.holder."))
        assert self.tracer is not None
        span = self.tracer.start_span(
            name,
            context=ctx,
            kind=trace.SpanKind.INTERNAL,
            attributes=attrs,
            start_time=t0 + offset,
        )
        span.end(end_time=t1 + offset)


#: A site's span attributes by site and prefix, made once each (emptied past 4096).
_site_attributes: dict[tuple[Any, str], dict[str, Any]] = {}


def site_attributes(site: str | tuple, prefix: str = "") -> dict[str, Any]:
    """The span attributes (``code.*`` after ``prefix``) of a site an outbox record names: a
    ``module:function:line`` string, a waiter's ``(module, code, offset)`` or a holder's
    ``(code, offset)`` (its module the code's file's, as ``record._sites.code_site`` says)."""
    key = (site, prefix)
    attrs = _site_attributes.get(key)
    if attrs is None:
        if isinstance(site, str):
            text = site
        elif len(site) == 3:  # a frame's module, as ``capture._naming.site_of`` names it
            module, code, offset = site
            text = f"{module}:{code.co_name}:{code_site(code, offset).rpartition(':')[2]}"
        else:
            text = code_site(*site)
        if len(_site_attributes) >= 4096:
            _site_attributes.clear()
        attrs = _site_attributes[key] = code_attributes(text, prefix)
    return attrs
