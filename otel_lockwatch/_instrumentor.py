"""Instrument the locks of worker pools with OpenTelemetry.

Usage::

    from otel_lockwatch import LockwatchInstrumentor, name_lock

    LockwatchInstrumentor().instrument(tracer_provider=tp, meter_provider=mp)
    config_lock = name_lock(threading.Lock(), "global_config")

or with no code change: ``opentelemetry-instrument python app.py`` (the instrumentor is
registered as ``lockwatch``; ``OTEL_PYTHON_DISABLED_INSTRUMENTATIONS=lockwatch`` turns it off).

What is patched, and how it is undone (every ``_instrument_x`` has its ``_uninstrument_x``):

- ``StripedSections._acquire`` / ``_release`` and their async twins: every section entry point
  goes through them, so arrays created before and after ``instrument()`` are covered.
- ``threading.Lock`` and ``threading.RLock`` (factories): a lock created afterwards by watched
  code is a proxy that records; locks created before, and by OpenTelemetry, ``logging``,
  otel-lockwatch and the stdlib's own machinery, are the plain locks they always were.
- ``threading.Condition``: its lock (an RLock unless one is given) is watched; ``wait()`` releases
  it and re-acquires it as the stdlib does.
- ``threading.Semaphore`` / ``BoundedSemaphore``, ``asyncio.Lock`` / ``asyncio.Semaphore``: their
  methods, for instances created while instrumented.
- ``concurrent.futures.ThreadPoolExecutor``: its ``max_workers`` is the pool's nominal size.

A ``HeldLockSpanProcessor`` (and the manifest exporter) are added to an SDK tracer provider.
"""

from __future__ import annotations

import asyncio
import asyncio.locks
import concurrent.futures
import logging
import threading
from collections.abc import Collection
from typing import Any

import wrapt
from opentelemetry import trace
from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]
from opentelemetry.instrumentation.utils import unwrap as _unwrap_proxy

from ._settings import Options, load_options
from .capture import _asyncio as _asyncio_wrappers
from .capture import _multiprocess, _wrappers
from .capture._naming import lock_class, watched_site
from .record._outbox import OUTBOX
from .record._recorder import RECORDER
from .sections import _asyncio as _async_sections
from .sections import _threaded as _sections
from .telemetry import _exit
from .telemetry._emitter import TELEMETRY

__all__ = ["LockwatchInstrumentor"]

logger = logging.getLogger("otel_lockwatch")

# Patch targets: (owner, attribute).
_SECTION_TARGETS = (
    (_sections.StripedSections, "_acquire"),
    (_sections.StripedSections, "_release"),
)
_ASYNC_SECTION_TARGETS = (
    (_async_sections.AsyncStripedSections, "_acquire"),
    (_async_sections.AsyncStripedSections, "_release"),
)
_THREADING_FACTORIES = ((threading, "Lock"), (threading, "RLock"))
_CONDITION_TARGET = (threading.Condition, "__init__")
_SEMAPHORE_TARGETS = (
    (threading.Semaphore, "__init__"),
    (threading.Semaphore, "acquire"),
    (threading.Semaphore, "__enter__"),
    (threading.Semaphore, "release"),
    (threading.BoundedSemaphore, "release"),
)
_ASYNCIO_TARGETS = (
    (asyncio.locks.Lock, "__init__"),
    (asyncio.locks.Lock, "acquire"),
    (asyncio.locks.Lock, "release"),
    (asyncio.locks.Semaphore, "__init__"),
    (asyncio.locks.Semaphore, "acquire"),
)
_EXECUTOR_TARGET = (concurrent.futures.ThreadPoolExecutor, "__init__")


def _install(owner: Any, name: str, factory: Any, args: tuple = ()) -> None:
    """Replace ``owner.name`` with ``factory(original, *args)``: a plain function on the hot path
    (wrapt installs it; ``unwrap`` below restores it through its ``__wrapped__``)."""
    wrapt.wrap_object(owner, name, factory, args, {})


def _factory(kind: str, proxy: type) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
        lock = wrapped(*args, **kwargs)
        try:
            site = watched_site(1)
            if site is None:
                return lock
            return proxy(lock, lock_class(site, kind, site))
        except Exception as exc:  # never into the host: the plain lock still works
            OUTBOX.failed(exc)
            return lock

    return wrapper


def _condition_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
    lock = args[0] if args else kwargs.get("lock")
    if lock is None:
        try:
            site = watched_site(1)
            if site is not None:
                raw = _ORIGINALS["RLock"]()
                lock = _wrappers.RLockProxy(raw, lock_class(site, "threading.Condition", site))
                args, kwargs = (lock,), {}
        except Exception as exc:
            OUTBOX.failed(exc)
    wrapped(*args, **kwargs)
    if type(lock) is _wrappers.LockProxy:
        # Condition's own _is_owned() would try-acquire the lock: ask the proxy instead.
        instance._is_owned = lock._lw_is_owned


def _tag_init(kind: str) -> Any:
    def wrapper(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
        wrapped(*args, **kwargs)
        try:
            site = watched_site(1)
            if site is not None:
                instance._lockwatch_class = lock_class(site, kind, site)
        except Exception as exc:
            OUTBOX.failed(exc)

    return wrapper


def _executor_init(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
    wrapped(*args, **kwargs)
    try:
        if watched_site(1) is not None:
            RECORDER.note_pool(instance._max_workers, "executor")
    except Exception as exc:
        OUTBOX.failed(exc)


_ORIGINALS: dict[str, Any] = {}


def unwrap(owner: Any, name: str) -> None:
    """Undo a patch: wrapt's proxies through OpenTelemetry's ``unwrap``; the plain functions that
    the hot-path factories install carry their original in ``__wrapped__``."""
    current = vars(owner).get(name) if isinstance(owner, type) else getattr(owner, name, None)
    if isinstance(current, wrapt.ObjectProxy):
        _unwrap_proxy(owner, name)
        return
    original = getattr(current, "__wrapped__", None)
    if original is not None:
        setattr(owner, name, original)


class LockwatchInstrumentor(BaseInstrumentor):
    """An OpenTelemetry instrumentor for locks.

    ``instrument(tracer_provider=..., meter_provider=..., **options)``.

    Options (each also an ``OTEL_PYTHON_LOCKWATCH_*`` variable; see ``environment_variables``):
    ``wait_span_threshold_ms``, ``hold_span_threshold_ms``, ``hold_metric_floor_ms``,
    ``on_cycle``, ``manifest``, ``manifest_path``, ``checkpoint_interval_s``, ``pool_size``,
    ``hot_lock_threshold_pct``, ``starvation_ratio``.
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
        _wrappers.configure(
            wait_span_ns=int(options.wait_span_threshold_ms * 1e6),
            hold_span_ns=int(options.hold_span_threshold_ms * 1e6),
            hold_metric_ns=int(options.hold_metric_floor_ms * 1e6),
            on_cycle=options.on_cycle,
        )
        if options.pool_size is not None:
            RECORDER.note_pool(options.pool_size, "env")
        TELEMETRY.configure(kwargs.get("tracer_provider"), kwargs.get("meter_provider"), RECORDER)
        self._instrument_sections()
        self._instrument_threading()
        self._instrument_asyncio()
        self._instrument_executor()
        self._add_processors(kwargs.get("tracer_provider"), options)
        self._start_manifest(kwargs.get("tracer_provider"), options)
        _multiprocess.instrument(options, _exit.ACTIVE.exporter)

    def _uninstrument(self, **kwargs: Any) -> None:
        _multiprocess.uninstrument()
        self._remove_processors()
        self._uninstrument_executor()
        self._uninstrument_asyncio()
        self._uninstrument_threading()
        self._uninstrument_sections()
        TELEMETRY.disable()
        _exit.ACTIVE.options = None

    # -- sections --------------------------------------------------------------------------
    def _instrument_sections(self) -> None:
        g = vars(_sections)
        _install(_sections.StripedSections, "_acquire", _wrappers.section_acquire_factory, (g,))
        _install(_sections.StripedSections, "_release", _wrappers.section_release_factory)
        _install(
            _async_sections.AsyncStripedSections,
            "_acquire",
            _asyncio_wrappers.async_section_acquire_factory,
            (vars(_async_sections),),
        )
        _install(
            _async_sections.AsyncStripedSections,
            "_release",
            _asyncio_wrappers.async_section_release_factory,
        )

    def _uninstrument_sections(self) -> None:
        for owner, name in _SECTION_TARGETS + _ASYNC_SECTION_TARGETS:
            unwrap(owner, name)

    # -- threading -------------------------------------------------------------------------
    def _instrument_threading(self) -> None:
        _ORIGINALS.setdefault("Lock", threading.Lock)
        _ORIGINALS.setdefault("RLock", threading.RLock)
        wrapt.wrap_function_wrapper(
            threading, "Lock", _factory("threading.Lock", _wrappers.LockProxy)
        )
        wrapt.wrap_function_wrapper(
            threading, "RLock", _factory("threading.RLock", _wrappers.RLockProxy)
        )
        wrapt.wrap_function_wrapper(threading.Condition, "__init__", _condition_init)
        wrapt.wrap_function_wrapper(
            threading.Semaphore, "__init__", _tag_init("threading.Semaphore")
        )
        wrapt.wrap_function_wrapper(
            threading.BoundedSemaphore, "__init__", _tag_init("threading.BoundedSemaphore")
        )
        _install(threading.Semaphore, "acquire", _wrappers.semaphore_acquire_factory)
        _install(
            threading.Semaphore, "__enter__", _wrappers.semaphore_acquire_factory
        )  # `with` binds the original
        _install(threading.Semaphore, "release", _wrappers.semaphore_release_factory)
        _install(threading.BoundedSemaphore, "release", _wrappers.semaphore_release_factory)

    def _uninstrument_threading(self) -> None:
        for owner, name in (
            _THREADING_FACTORIES
            + (_CONDITION_TARGET,)
            + _SEMAPHORE_TARGETS
            + ((threading.BoundedSemaphore, "__init__"),)
        ):
            unwrap(owner, name)
        _ORIGINALS.clear()

    # -- asyncio ---------------------------------------------------------------------------
    def _instrument_asyncio(self) -> None:
        wrapt.wrap_function_wrapper(asyncio.locks.Lock, "__init__", _tag_init("asyncio.Lock"))
        _install(asyncio.locks.Lock, "acquire", _asyncio_wrappers.lock_acquire_factory)
        _install(asyncio.locks.Lock, "release", _asyncio_wrappers.lock_release_factory)
        wrapt.wrap_function_wrapper(
            asyncio.locks.Semaphore, "__init__", _tag_init("asyncio.Semaphore")
        )
        _install(asyncio.locks.Semaphore, "acquire", _asyncio_wrappers.semaphore_acquire_factory)

    def _uninstrument_asyncio(self) -> None:
        for owner, name in _ASYNCIO_TARGETS:
            unwrap(owner, name)

    # -- executors -------------------------------------------------------------------------
    def _instrument_executor(self) -> None:
        wrapt.wrap_function_wrapper(
            concurrent.futures.ThreadPoolExecutor, "__init__", _executor_init
        )

    def _uninstrument_executor(self) -> None:
        unwrap(*_EXECUTOR_TARGET)

    # -- span processors -------------------------------------------------------------------
    _added: list[tuple[Any, Any]] = []

    def _add_processors(self, tracer_provider: Any, options: Options) -> None:
        from .telemetry._held_spans import HeldLockSpanProcessor

        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        add = getattr(provider, "add_span_processor", None)
        if add is None:  # not an SDK provider: the tracking runs all the same, without span hooks
            return
        processor = HeldLockSpanProcessor(RECORDER)
        add(processor)
        LockwatchInstrumentor._added.append((provider, processor))

    def _start_manifest(self, tracer_provider: Any, options: Options) -> None:
        from .telemetry._exit import ManifestExporter, install_first

        provider = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        exporter = None
        if options.manifest:
            exporter = ManifestExporter(
                options.manifest_path, options.checkpoint_interval_s, provider
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
