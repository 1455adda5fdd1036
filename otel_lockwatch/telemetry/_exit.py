"""Writing the manifest: at exit, on SIGTERM, at the tracer provider's shutdown, and periodically.

``ManifestExporter`` is an SDK ``SpanExporter``. The instrumentor puts it in front of the tracer
provider's processors, so that at the provider's shutdown it runs *first*: it evaluates the
manifest, writes it atomically, and sends the ``lockwatch.manifest`` span while the user's own
exporters are still up to carry it to Jaeger or Tempo. Without an SDK tracer provider the same
writing happens at exit.

When the manifest is written:

- normal exit, ``sys.exit``, an unhandled exception, SIGINT (the default handler unwinds the
  program, then ``atexit`` runs);
- SIGTERM: a handler writes it, then chains to the handler that was installed before (the
  default one ends the process with SIGTERM, as it would have);
- the tracer provider's shutdown;
- every ``checkpoint_interval_s`` seconds (an option; 0 for never), so a SIGKILL loses at most
  one interval.

Every write is atomic (a temporary file, then a rename): an interrupted write never leaves a
truncated manifest, and the previous one survives.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .._session import OUTBOX, RECORDER, current
from .._settings import SETTINGS
from ..capture import _multiprocess
from ..manifest import _evaluate, _io
from ..manifest._model import Manifest
from ._bounded import run_bounded
from ._emitter import Telemetry
from ._exit_hooks import ExitHooks, exit_hooks
from ._fleet import ManifestRecords

__all__ = ["ManifestExporter", "evaluate_recording", "write_manifest"]

logger = logging.getLogger("otel_lockwatch")


def _options() -> Any:
    """The options of the ``instrument()`` in force (its session's), or None."""
    session = current()
    return session.options if session is not None else None


def _flush(timeout_s: float, then: Any = None, *, abandon: bool = True) -> bool:
    """The session's emitter flushed within ``timeout_s`` (then ``then`` called, if given);
    without an emitter, ``then`` alone, within the same deadline."""
    session = current()
    emitter: Telemetry | None = session.emitter if session is not None else None
    if emitter is not None:
        return emitter.flush(timeout_s, then, abandon=abandon)
    return then is None or run_bounded(then, timeout_s, _EXIT_THREAD)


def _manifest_path() -> str:
    """The ``manifest_path`` option: ``instrument()``'s while instrumented, else the
    environment's or the default; a child process's own file (``_multiprocess``)."""
    opts = _options()
    path = opts.manifest_path if opts is not None else SETTINGS["manifest_path"].resolve()
    return _multiprocess.manifest_path(path)


def _service_name(provider: Any = None) -> str | None:
    provider = provider if provider is not None else trace.get_tracer_provider()
    resource = getattr(provider, "resource", None)
    name = getattr(resource, "attributes", {}).get("service.name") if resource is not None else None
    return name or os.environ.get("OTEL_SERVICE_NAME") or None


def evaluate_recording(data: Any = None, **kwargs: Any) -> Manifest:
    """The manifest so far, as a :class:`Manifest` object: the process's recording evaluated
    with the session's thresholds (the public ``otel_lockwatch.evaluate``; the manifest layer's
    :func:`..manifest._evaluate.evaluate` evaluates a given data part with given thresholds).

    Args:
        data: a recorder snapshot (or a manifest's data part) to evaluate instead of the
            process's own recording.
        kwargs: ``hot_lock_threshold_pct``, ``starvation_ratio``, ``pool_size``,
            ``service_name``; defaults from ``instrument()`` options, then the environment.

    Raises:
        ValueError: a threshold out of range (see :func:`..manifest._evaluate.evaluate`).
    """
    if data is None:
        data = RECORDER.snapshot()
        opts = _options()
        if opts is not None:
            kwargs.setdefault("hot_lock_threshold_pct", opts.hot_lock_threshold_pct)
            kwargs.setdefault("starvation_ratio", opts.starvation_ratio)
            if opts.pool_size is not None:
                kwargs.setdefault("pool_size", opts.pool_size)
        name = _service_name()
        if name:
            kwargs.setdefault("service_name", name)
        try:
            return _evaluate.evaluate(data, **kwargs)
        except ValueError as exc:
            # The timeline is sampled before the totals, so it is never ahead of them, unless a
            # total went down between the two (seen once, without the GIL, on the pure-Python
            # path: docs/development.md). Its own recording is not lost to that: the manifest
            # goes without its timeline, and says so.
            if "timeline" not in data:
                raise
            rest = {key: value for key, value in data.items() if key != "timeline"}
            try:
                manifest = _evaluate.evaluate(rest, **kwargs)
            except ValueError:
                raise exc from None
            logger.warning("otel-lockwatch: the manifest leaves its timeline out: %s", exc)
            return manifest
    return _evaluate.evaluate(data, **kwargs)


def write_manifest(path: str | os.PathLike[str] | None = None) -> Path:
    """Evaluate the manifest so far and write it atomically.

    Args:
        path: where (``{pid}`` is replaced by the process id); default the ``manifest_path``
            option.

    Returns:
        The path written.
    """
    return _io.dump_manifest(evaluate_recording(), _manifest_path() if path is None else path)


class ManifestExporter(SpanExporter):
    """Writes the contention manifest when the tracer provider shuts down (and at exit, on
    SIGTERM, and at checkpoints) and sends its ``lockwatch.manifest`` log record each time;
    sends the ``lockwatch.manifest`` span at the final write.

    Args:
        path: the manifest's path (``{pid}`` is replaced); default from the options.
        checkpoint_interval_s: seconds between checkpoints; 0 for none.
        tracer_provider: the provider whose tracer carries the manifest span.
        logger_provider: the provider the manifest's log record goes to; None for the global
            one.
        log_records: whether to send the log record at all.
    """

    def __init__(
        self,
        path: str | None = None,
        checkpoint_interval_s: float = 0.0,
        tracer_provider: Any = None,
        logger_provider: Any = None,
        log_records: bool = True,
    ) -> None:
        self._path = path
        self._interval = checkpoint_interval_s
        self._provider = tracer_provider
        self._records = ManifestRecords(logger_provider, log_records)
        self._span_sent = False
        self._stop = threading.Event()
        self._checkpointer: threading.Thread | None = None
        self._lock = _raw_lock()  # one file write at a time; never held while evaluating
        self._tickets = itertools.count(1)  # the order writes began evaluating in
        self._on_disk = 0  # the ticket of the evaluation on disk
        self.last_path: Path | None = None
        self.writes = 0

    # SpanExporter ---------------------------------------------------------------------------
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        self.write(final=False)
        return True

    def shutdown(self) -> None:
        self.close()

    # ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the checkpoints (if any) and the exit hooks."""
        exit_hooks().register(self)
        if self._interval and self._interval > 0 and self._checkpointer is None:
            self._checkpointer = threading.Thread(
                target=self._run, name="otel-lockwatch-checkpoint", daemon=True
            )
            self._checkpointer.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.write(final=False)

    def after_fork_in_child(self) -> None:
        """A forked child's own exporter state (the session's fork handler, for its exporter): a
        fresh write lock, the manifest span not yet sent, and its own checkpoint thread when an
        interval is set."""
        self._lock = _raw_lock()
        self._tickets = itertools.count(1)
        self._on_disk = 0
        self._span_sent = False
        self.last_path = None
        self.writes = 0
        stopped = self._stop.is_set()
        self._stop = threading.Event()
        self._checkpointer = None
        if stopped:
            self._stop.set()
        elif self._interval and self._interval > 0:
            self._checkpointer = threading.Thread(
                target=self._run, name="otel-lockwatch-checkpoint", daemon=True
            )
            self._checkpointer.start()

    def stop(self) -> None:
        """Stop the checkpoints and the exit hooks without writing (``uninstrument()``)."""
        hooks = exit_hooks()
        with hooks.signals_deferred():
            self._stop.set()
            hooks.unregister(self)
            hooks.uninstall_if_idle()

    def close(self) -> None:
        """The final write (idempotent for the span; the file is rewritten with the latest data).

        When the process is exiting, the tracer provider's span processors are then shut down
        within what is left of ``exit_timeout_s``: a batch processor whose collector is down
        would otherwise hold the exit for as long as its exporter retries (the SDK's own exit
        hook waits up to 30 s per processor). Their later shutdown by the SDK finds them done.
        """
        started = time.monotonic()
        hooks = exit_hooks()
        with hooks.signals_deferred():
            self.write(final=True)
            self._stop.set()
            hooks.unregister(self)
            if hooks.exiting:
                budget = _exit_timeout_s() - (time.monotonic() - started)
                # The log processors too, unless the final record was flushed in time: then the
                # logs provider's own exit hook carries what a later final write sends.
                logs = () if self._records.flushed else self._records.processors()
                _shutdown_processors(_span_processors(self._provider) + logs, budget)

    def write(self, final: bool) -> Path | None:
        """Evaluate and write the manifest now; ``final`` also sends the manifest span once.

        The evaluation runs outside the exporter's lock, which guards only the file and the
        span: the SIGTERM handler may run this on a main thread that holds a recorder lock
        (interrupted inside the recorder), and a checkpoint holding the exporter's lock while
        it waited for that recorder lock would never let the handler in. Two writes evaluated
        concurrently leave the later evaluation on disk.

        The log record of a checkpoint is sent after the lock is released (a processor that
        exports as it is called must not hold up the final write); its sequence is the order
        its evaluation began in, so a late one never passes for the latest. The final record is
        sent with the span, within the deadline.
        """
        if _multiprocess.skip_write():  # a child process that recorded no lock activity
            return None
        st = RECORDER.thread_state()
        was_in_lockwatch = st.in_lockwatch
        st.in_lockwatch = True
        hooks = exit_hooks()
        try:
            with hooks.signals_deferred():
                ticket = next(self._tickets)
                name = _service_name(self._provider)
                manifest = evaluate_recording(service_name=name) if name else evaluate_recording()
                path = (
                    _manifest_path()
                    if self._path is None
                    else _multiprocess.manifest_path(self._path)  # a child's own file
                )
                if final and hooks.exiting:
                    hooks.arm_second_signal()  # a 2nd signal ends it, once the manifest is on disk
                with self._lock:
                    newest = ticket > self._on_disk or self.last_path is None
                    if newest:
                        self.last_path = _io.dump_manifest(manifest, path)
                        self._on_disk = ticket
                        self.writes += 1
                    written = self.last_path  # else a later evaluation is on disk already
                    assert written is not None  # this write's or an earlier one's
                    if final and hooks.exiting:
                        hooks.manifest_on_disk()
                    if final and not self._span_sent:
                        self._span_sent = True

                        # The manifest first, the telemetry after, within a deadline: the SDK's
                        # export may block as long as its exporter retries a collector that is
                        # down.
                        def send() -> None:
                            _send_manifest_span(manifest, written, self._provider)
                            self._records.send(manifest, ticket, True, _exit_timeout_s())

                        sent = _flush(_exit_timeout_s(), send)
                        if not sent:
                            logger.warning(
                                "otel-lockwatch: spans still unsent after %g s were dropped "
                                "(the manifest is written to %s)",
                                _exit_timeout_s(),
                                written,
                            )
                    elif final and newest:  # a later final write: its record, as bounded
                        budget = _exit_timeout_s()
                        run_bounded(
                            lambda: self._records.send(manifest, ticket, True, budget),
                            budget,
                            _EXIT_THREAD,
                        )
            if newest and not final:  # signals are not deferred while a processor exports
                self._records.send(manifest, ticket, False)
            return written
        except OSError as exc:  # the path's fault, not lockwatch's: say so at every failed write
            logger.warning("otel-lockwatch: could not write the manifest: %s", exc)
            return None
        except Exception as exc:  # never into the host: the one error path
            logged_before = OUTBOX.errors > 0
            OUTBOX.failed(exc)  # logged if it is the first
            if final and logged_before:  # a lost manifest is always said
                logger.warning("otel-lockwatch: the manifest was not written: %r", exc)
            return None
        finally:
            st.in_lockwatch = was_in_lockwatch


ExitHooks.exit_work_code = frozenset(
    f.__code__ for f in (ManifestExporter.write, ManifestExporter.close, ManifestExporter.stop)
)


def _raw_lock() -> Any:
    import _thread

    return _thread.allocate_lock()


def _send_manifest_span(manifest: Manifest, path: Path, provider: Any) -> None:
    from .._version import __version__

    tracer = trace.get_tracer("otel_lockwatch", __version__, provider)
    doc = manifest.to_dict()
    attrs = {
        "lockwatch.verdict": str(doc["verdict"]),
        "lockwatch.recommended_pool_size": doc["recommended_pool_size"],
        "lockwatch.nominal_pool_size": doc["nominal_pool_size"],
        "lockwatch.effective_throughput_pct": float(doc["effective_throughput_pct"]),
        "lockwatch.manifest.path": str(path),
        "lockwatch.manifest.digest": doc["manifest_digest"],
    }
    with tracer.start_as_current_span("lockwatch.manifest", attributes=attrs) as span:
        for hot in doc.get("hot_lock_register", []):
            span.add_event(
                "lockwatch.hot_lock",
                {
                    "lockwatch.lock.name": hot["lock"],
                    "lockwatch.wait_ms": float(hot["wait_ms"]),
                    "lockwatch.wait_share_pct": float(hot["wait_share_pct"]),
                },
            )
        for sig in doc.get("starvation_signatures", []):
            span.add_event(
                "lockwatch.starvation",
                {
                    "lockwatch.worker": sig["worker"],
                    "lockwatch.lock.name": sig["lock"],
                    "lockwatch.wait_ms": float(sig["wait_ms"]),
                    "lockwatch.median_wait_ms": float(sig["median_wait_ms"]),
                },
            )
        for cyc in doc.get("pre_deadlock_ordering_witness", []):
            span.add_event(
                "lockwatch.cycle",
                {
                    "lockwatch.cycle": list(cyc["cycle"]),
                    "lockwatch.workers": sorted({e["worker"] for e in cyc["edges"]}),
                },
            )


class FrontProcessor(SpanProcessor):
    """Put in front of the provider's processors: at ``force_flush`` and ``shutdown`` it first
    emits lockwatch's queued spans, then (at shutdown) has the manifest exporter write, while the
    processors behind it are still up to carry what it sends."""

    def __init__(self, exporter: ManifestExporter | None) -> None:
        self.exporter = exporter

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        pass

    def shutdown(self) -> None:
        if self.exporter is not None:
            self.exporter.shutdown()  # the manifest, then the spans, within the deadline
        else:
            _flush(_exit_timeout_s())

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return _flush(timeout_millis / 1000, abandon=False)


def install_first(provider: Any, exporter: ManifestExporter | None) -> SpanProcessor | None:
    """Put a FrontProcessor in front of the provider's others; None if not an SDK provider."""
    processor = FrontProcessor(exporter)
    multi = getattr(provider, "_active_span_processor", None)
    lock = getattr(multi, "_lock", None)
    if multi is not None and lock is not None and hasattr(multi, "_span_processors"):
        with lock:
            multi._span_processors = (processor,) + tuple(multi._span_processors)
        return processor
    add = getattr(provider, "add_span_processor", None)
    if add is None:
        return None
    add(processor)
    return processor


def _exit_timeout_s() -> float:
    options = _options()
    if options is not None:
        return float(options.exit_timeout_s)
    return float(SETTINGS["exit_timeout_s"].resolve())


def _span_processors(provider: Any) -> tuple[Any, ...]:
    """An SDK tracer provider's span processors (none for another provider)."""
    multi = getattr(provider, "_active_span_processor", None)
    return tuple(getattr(multi, "_span_processors", ()))


def _shutdown_processors(processors: tuple[Any, ...], budget_s: float) -> None:
    """Shut down span or log record processors (not lockwatch's own) within ``budget_s``.

    Each processor's ``shutdown()`` runs on a helper thread; one still running when the budget
    is spent has its exporter shut down, which ends the exporter's retries at once (the OTLP
    exporters wait on a shutdown event between attempts), and is given a short grace to return.
    """
    deadline = time.monotonic() + max(0.0, budget_s)
    for processor in processors:
        if type(processor).__module__.startswith("otel_lockwatch."):
            continue  # ours: the front processor has written already
        if not callable(getattr(processor, "shutdown", None)):
            continue
        done = run_bounded(processor.shutdown, deadline - time.monotonic(), _EXIT_THREAD)
        if not done:
            exporter = (
                getattr(processor, "span_exporter", None)
                or getattr(processor, "_exporter", None)
                or getattr(getattr(processor, "_batch_processor", None), "_exporter", None)
            )
            if exporter is not None and callable(getattr(exporter, "shutdown", None)):
                run_bounded(exporter.shutdown, _EXPORTER_GRACE_S, _EXIT_THREAD)


_EXPORTER_GRACE_S = 1.0
_EXIT_THREAD = "otel-lockwatch-exit"
