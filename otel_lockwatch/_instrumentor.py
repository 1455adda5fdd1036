"""Instrument the locks of worker pools with OpenTelemetry.

Usage::

    from otel_lockwatch import LockwatchInstrumentor, name_lock

    LockwatchInstrumentor().instrument(tracer_provider=tp, meter_provider=mp)
    config_lock = name_lock(threading.Lock(), "global_config")

or with no code change: ``opentelemetry-instrument python app.py`` (the instrumentor is
registered as ``lockwatch``; ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=lockwatch`` turns it off).

What is patched is one table (``capture._patches.PATCHES``: the section arrays' two methods, the
``threading`` factories and primitives, ``asyncio``'s locks, ``multiprocessing``'s ``SemLock`` and
the pools' sizes); ``instrument()`` installs it and ``uninstrument()`` puts back exactly what was
there. Locks created before ``instrument()``, and by OpenTelemetry, ``logging``, otel-lockwatch
and the stdlib's own machinery, stay the plain locks they always were.

A ``HeldLockSpanProcessor`` (and the manifest exporter) are added to an SDK tracer provider; the
manifest's log record goes to the ``logger_provider`` given, else the global one.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from . import _session
from ._session import Session
from ._settings import Options, load_options
from .capture import _multiprocess, _patches
from .telemetry._emitter import Telemetry

__all__ = ["LockwatchInstrumentor"]


class LockwatchInstrumentor(BaseInstrumentor):
    """An OpenTelemetry instrumentor for locks.

    ``instrument(tracer_provider=..., meter_provider=..., logger_provider=..., **options)``
    (the logger provider carries the manifest's log record; by default the global one).

    Options (each also an ``OTEL_PYTHON_LOCKWATCH_*`` variable; see ``environment_variables``):
    ``wait_span_threshold_ms``, ``hold_span_threshold_ms``, ``hold_metric_floor_ms``,
    ``on_cycle``, ``manifest``, ``manifest_log_record``, ``manifest_path``,
    ``checkpoint_interval_s``, ``pool_size``, ``hot_lock_threshold_pct``, ``starvation_ratio``.
    """

    @property
    def options(self) -> Options | None:
        """The options in force while instrumented (None otherwise)."""
        session = _session.current()
        return session.options if session is not None else None

    def instrumentation_dependencies(self) -> Collection[str]:
        return []

    def _instrument(self, **kwargs: Any) -> None:
        session = _session.begin(load_options(kwargs))
        note_pool_size(session)
        session.emitter = Telemetry()
        session.emitter.enable(
            kwargs.get("tracer_provider"), kwargs.get("meter_provider"), session.recorder
        )
        session.patches = _patches.install()
        self._add_processors(session, kwargs.get("tracer_provider"))
        self._start_manifest(session, kwargs.get("tracer_provider"), kwargs.get("logger_provider"))
        _multiprocess.instrument(session)

    def _uninstrument(self, **kwargs: Any) -> None:
        session = _session.end()  # from now on nothing new is watched
        if session is None:
            return
        _multiprocess.uninstrument(session)
        self._remove_processors(session)
        _patches.uninstall(session.patches)
        session.emitter.disable()

    # -- span processors -------------------------------------------------------------------
    def _add_processors(self, session: Session, tracer_provider: Any) -> None:
        from .telemetry._held_spans import HeldLockSpanProcessor

        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        add = getattr(provider, "add_span_processor", None)
        if add is None:  # not an SDK provider: the tracking runs all the same, without span hooks
            return
        processor = HeldLockSpanProcessor(session.recorder)
        add(processor)
        session.processors.append((provider, processor))

    def _start_manifest(self, session: Session, tracer_provider: Any, logger_provider: Any) -> None:
        from .telemetry._exit import ManifestExporter, install_first

        options = session.options
        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        exporter = None
        if options.manifest:
            exporter = ManifestExporter(
                options.manifest_path,
                options.checkpoint_interval_s,
                provider,
                logger_provider,
                options.manifest_log_record,
            )
        processor = install_first(provider, exporter)
        if processor is not None:
            session.processors.append((provider, processor))
        if exporter is not None:
            exporter.start()
            session.exporter = exporter

    def _remove_processors(self, session: Session) -> None:
        exporter, session.exporter = session.exporter, None
        if exporter is not None:
            exporter.stop()
        for provider, processor in session.processors:
            _remove_processor(provider, processor)
        session.processors = []


def note_pool_size(session: Session) -> None:
    """Hand the one option of an ``instrument()`` that the recorder keeps to it: the nominal pool
    size (the lock paths read their thresholds, cycle policy and contention points kept from the
    session's ``THRESHOLDS``, which ``begin()`` set)."""
    options = session.options
    if options.pool_size is not None:
        session.recorder.note_pool(options.pool_size, "env")


def _remove_processor(provider: Any, processor: Any) -> None:
    # The SDK has no remove_span_processor: rebuild its tuple without ours, under its lock.
    multi = getattr(provider, "_active_span_processor", None)
    processors = getattr(multi, "_span_processors", None)
    lock = getattr(multi, "_lock", None)
    if multi is None or processors is None or lock is None:
        return
    with lock:
        multi._span_processors = tuple(p for p in processors if p is not processor)
