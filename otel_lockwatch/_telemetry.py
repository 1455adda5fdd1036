"""What lockwatch sends through OpenTelemetry: spans of long waits and holds, and metrics.

Everything here runs on the *slow* path only: after a wait that blocked, or at the release of a
hold longer than a threshold. The uncontended path never reaches this module; its acquisitions
are counted exactly by the recorder and reported through observable counters read at collection.

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
  from the recorder.

Attributes are bounded by the code: ``lockwatch.lock.name`` (a lock class), ``.kind``, the
outcome, and on spans the section index (< the array's count), thread and code site. An entity
key is never an attribute.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Tracer

from ._version import __version__

__all__ = ["TELEMETRY", "Telemetry"]

logger = logging.getLogger("otel_lockwatch")

SCHEMA_URL = "https://opentelemetry.io/schemas/1.21.0"
# Buckets advised for the duration histograms, in seconds: microseconds to tens of seconds.
DURATION_BUCKETS = (
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
    1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)


class Telemetry:
    """The instruments, the tracer, and the thresholds that decide what reaches them."""

    def __init__(self) -> None:
        self.tracer: Tracer | None = None
        self.wait_hist: Any = None
        self.hold_hist: Any = None
        self._observables: list[Any] = []
        self.errors = 0
        self._warned = False

    def configure(self, tracer_provider: Any, meter_provider: Any, recorder: Any) -> None:
        """Create the tracer and instruments (None providers: the global ones)."""
        from opentelemetry import metrics
        from opentelemetry.metrics import CallbackOptions, Observation

        self.tracer = trace.get_tracer("otel_lockwatch", __version__, tracer_provider, schema_url=SCHEMA_URL)
        meter = metrics.get_meter("otel_lockwatch", __version__, meter_provider, schema_url=SCHEMA_URL)
        advice = {"explicit_bucket_boundaries_advisory": list(DURATION_BUCKETS)}
        try:
            self.wait_hist = meter.create_histogram(
                "lockwatch.lock.wait.duration", unit="s",
                description="Time a worker waited to acquire a lock (waits that blocked).",
                **advice)
            self.hold_hist = meter.create_histogram(
                "lockwatch.lock.hold.duration", unit="s",
                description="Time a lock was held (holds at or above the metric floor).",
                **advice)
        except TypeError:  # an API without bucket advice
            self.wait_hist = meter.create_histogram("lockwatch.lock.wait.duration", unit="s")
            self.hold_hist = meter.create_histogram("lockwatch.lock.hold.duration", unit="s")

        def acquisitions(options: CallbackOptions) -> list[Observation]:
            return [
                Observation(n, {"lockwatch.lock.name": name, "lockwatch.lock.kind": kind, "lockwatch.outcome": outcome})
                for (name, kind, outcome), n in recorder.totals().items() if outcome != "contended"
            ]

        def contentions(options: CallbackOptions) -> list[Observation]:
            return [
                Observation(n, {"lockwatch.lock.name": name, "lockwatch.lock.kind": kind})
                for (name, kind, outcome), n in recorder.totals().items() if outcome == "contended"
            ]

        self._observables = [
            meter.create_observable_counter(
                "lockwatch.lock.acquisitions", callbacks=[acquisitions], unit="{acquisition}",
                description="Lock acquisition attempts, by outcome (acquired, skipped by a try, timed out)."),
            meter.create_observable_counter(
                "lockwatch.lock.contentions", callbacks=[contentions], unit="{acquisition}",
                description="Blocking acquisitions that had to wait for another holder."),
        ]

    def disable(self) -> None:
        self.tracer = None
        self.wait_hist = None
        self.hold_hist = None
        self._observables = []

    def failed(self, exc: BaseException) -> None:
        """An error inside lockwatch: counted, logged once, never raised into the host."""
        self.errors += 1
        if not self._warned:
            self._warned = True
            logger.warning("otel-lockwatch: internal error (reported once; the program is unaffected): %r", exc,
                           exc_info=exc)

    # -- slow path ---------------------------------------------------------------------------
    def wait(self, cls: Any, t0: int, t1: int, ctx: Context | None, outcome: str, span_ns: int,
             extra: dict[str, Any] | None, site: str | None) -> None:
        """Record a wait that blocked: metric always, span when long enough."""
        seconds = (t1 - t0) / 1e9
        hist = self.wait_hist
        if hist is not None:
            attrs = cls.attrs if outcome == "acquired" else {**cls.attrs, "lockwatch.outcome": outcome}
            hist.record(seconds, attrs)
        if self.tracer is not None and t1 - t0 >= span_ns:
            self._span("lock.wait", cls, t0, t1, ctx, outcome, extra, site)

    def hold(self, cls: Any, t0: int, t1: int, ctx: Context | None, span_ns: int,
             extra: dict[str, Any] | None, site: str | None) -> None:
        hist = self.hold_hist
        if hist is not None:
            hist.record((t1 - t0) / 1e9, cls.attrs)
        if self.tracer is not None and t1 - t0 >= span_ns:
            self._span("lock.hold", cls, t0, t1, ctx, None, extra, site)

    def _span(self, name: str, cls: Any, t0: int, t1: int, ctx: Context | None, outcome: str | None,
              extra: dict[str, Any] | None, site: str | None) -> None:
        offset = time.time_ns() - time.perf_counter_ns()  # perf_counter -> epoch, read now
        thread = threading.current_thread()
        attrs: dict[str, Any] = {
            "lockwatch.lock.name": cls.name,
            "lockwatch.lock.kind": cls.kind,
            "thread.name": thread.name,
            "thread.id": thread.ident or 0,
        }
        if outcome is not None:
            attrs["lockwatch.outcome"] = outcome
        if site:
            module, _, rest = site.partition(":")
            function, _, line = rest.rpartition(":")
            attrs["code.namespace"] = module
            attrs["code.function"] = function
            if line.isdigit():
                attrs["code.lineno"] = int(line)
        if extra:
            attrs.update(extra)
        assert self.tracer is not None
        span = self.tracer.start_span(name, context=ctx, kind=trace.SpanKind.INTERNAL,
                                      attributes=attrs, start_time=t0 + offset)
        span.end(end_time=t1 + offset)

    def cycle_event(self, text: str, locks: tuple[str, ...]) -> None:
        """A span event on the current span for a newly found cycle."""
        span = trace.get_current_span()
        if span.is_recording():
            span.add_event("lockwatch.potential_deadlock",
                           {"lockwatch.cycle": list(locks), "lockwatch.report": text})


TELEMETRY = Telemetry()
