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

from ._settings import Options, load_options
from .capture import _multiprocess, _patches
from .capture._bookkeeping import configure
from .record._recorder import RECORDER
from .record._sites import configure as configure_points
from .telemetry import _exit
from .telemetry._emitter import TELEMETRY

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
        return _exit.ACTIVE.options

    def instrumentation_dependencies(self) -> Collection[str]:
        return []

    def _instrument(self, **kwargs: Any) -> None:
        options = load_options(kwargs)
        _exit.ACTIVE.options = options
        configure(
            wait_span_ns=int(options.wait_span_threshold_ms * 1e6),
            hold_span_ns=int(options.hold_span_threshold_ms * 1e6),
            hold_metric_ns=int(options.hold_metric_floor_ms * 1e6),
            on_cycle=options.on_cycle,
        )
        configure_points(options.contention_points)
        if options.pool_size is not None:
            RECORDER.note_pool(options.pool_size, "env")
        TELEMETRY.configure(kwargs.get("tracer_provider"), kwargs.get("meter_provider"), RECORDER)
        _patches.install()
        self._add_processors(kwargs.get("tracer_provider"))
        self._start_manifest(kwargs.get("tracer_provider"), options, kwargs.get("logger_provider"))
        _multiprocess.instrument(options, _exit.ACTIVE.exporter)

    def _uninstrument(self, **kwargs: Any) -> None:
        _multiprocess.uninstrument()
        self._remove_processors()
        _patches.uninstall()
        TELEMETRY.disable()
        _exit.ACTIVE.options = None

    # -- span processors -------------------------------------------------------------------
    _added: list[tuple[Any, Any]] = []

    def _add_processors(self, tracer_provider: Any) -> None:
        from .telemetry._held_spans import HeldLockSpanProcessor

        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        add = getattr(provider, "add_span_processor", None)
        if add is None:  # not an SDK provider: the tracking runs all the same, without span hooks
            return
        processor = HeldLockSpanProcessor(RECORDER)
        add(processor)
        LockwatchInstrumentor._added.append((provider, processor))

    def _start_manifest(
        self, tracer_provider: Any, options: Options, logger_provider: Any = None
    ) -> None:
        from .telemetry._exit import ManifestExporter, install_first

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
            LockwatchInstrumentor._added.append((provider, processor))
        if exporter is not None:
            exporter.start()
            _exit.ACTIVE.exporter = exporter

    def _remove_processors(self) -> None:
        exporter = _exit.ACTIVE.exporter
        if exporter is not None:
            exporter.stop()
            _exit.ACTIVE.exporter = None
        for provider, processor in LockwatchInstrumentor._added:
            _remove_processor(provider, processor)
        LockwatchInstrumentor._added = []


def _remove_processor(provider: Any, processor: Any) -> None:
    # The SDK has no remove_span_processor: rebuild its tuple without ours, under its lock.
    multi = getattr(provider, "_active_span_processor", None)
    processors = getattr(multi, "_span_processors", None)
    lock = getattr(multi, "_lock", None)
    if multi is None or processors is None or lock is None:
        return
    with lock:
        multi._span_processors = tuple(p for p in processors if p is not processor)
