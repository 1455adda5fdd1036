"""``otel-lockwatch demo``: a worker pool that shows, in seconds and with no collector, what
lockwatch finds.

The demo instruments its own process (an SDK ``TracerProvider`` and ``MeterProvider``, with
``LockwatchInstrumentor``), runs the built-in workload of ``_demo_workload`` on a
``ThreadPoolExecutor(max_workers=--workers)`` for ``--seconds`` (each unit of work in a task
span, so that its lock waits are the task's children), shuts the providers down (the
manifest exporter writes the manifest to ``--manifest`` then), prints what the pool did and the
manifest's report (the same text as ``otel-lockwatch report``), and undoes the instrumentation.

The workload holds the four things lockwatch is for, so the verdict is always the same:
``CYCLIC_ORDERING_DETECTED`` (a lock-order cycle outranks starvation, which outranks a hot lock),
with ``global_config`` in the hot-lock register, the ``reporter`` worker in the starvation
signatures, and the ``accounts`` / ``ledger`` cycle with its two witnesses.

Nothing leaves the process unless ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set: then the traces and
metrics also go there over OTLP (``OTEL_EXPORTER_OTLP_PROTOCOL``: ``http/protobuf``, the
default, or ``grpc`` with the ``grpc`` extra installed), the other ``OTEL_EXPORTER_OTLP_*``
variables apply as usual, and ``OTEL_SERVICE_NAME`` (default ``otel-lockwatch-demo``) names the
service.

Progress goes to stderr: a one-line bar redrawn in place on a terminal, a start and an end line
otherwise (no control codes). The summary and the report go to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import IO, Any

from otel_lockwatch._settings import SETTINGS

__all__ = [
    "DESCRIPTION",
    "HELP",
    "Progress",
    "add_arguments",
    "load_workload",
    "run",
]

HELP = "run a built-in worker pool under lockwatch and print its contention report"
DESCRIPTION = (
    "Run a built-in worker pool under lockwatch for a few seconds and print the contention "
    "report of the manifest it leaves: per-entity publishes serialized by striped sections "
    "(an event path with lock, a periodic sweep with try_lock, a subscriber whose view never "
    "regresses), a global configuration lock that becomes hot, a reporter that starves behind a "
    "long-holding compactor, and an accounts/ledger ordering cycle that never deadlocks. No "
    "collector needed; with OTEL_EXPORTER_OTLP_ENDPOINT set, traces and metrics are also "
    "exported there over OTLP (OTEL_EXPORTER_OTLP_PROTOCOL http/protobuf, the default, or grpc)."
)

DEFAULT_WORKERS = 16
DEFAULT_SECONDS = 3.0
DEFAULT_MANIFEST = SETTINGS["manifest_path"].default
#: The thresholds the demo runs under whatever the environment says (a fixed showcase).
DEFAULT_HOT_LOCK_THRESHOLD_PCT = SETTINGS["hot_lock_threshold_pct"].default
DEFAULT_STARVATION_RATIO = SETTINGS["starvation_ratio"].default
DEFAULT_SERVICE_NAME = "otel-lockwatch-demo"
#: The name the workload module is loaded under (not ``otel_lockwatch.*``: see the workload).
WORKLOAD_MODULE = "lockwatch_demo"
#: Seconds between two redraws of the progress bar.
_TICK_S = 0.1
_BAR_WIDTH = 24


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the ``demo`` options to its parser.

    Args:
        p: the subcommand's parser.
    """
    from otel_lockwatch.cli._common import positive_int as _positive_int

    p.add_argument(
        "-w",
        "--workers",
        metavar="N",
        type=_positive_int,
        default=DEFAULT_WORKERS,
        help=f"the pool's size (at least 4; default {DEFAULT_WORKERS})",
    )
    p.add_argument(
        "-s",
        "--seconds",
        metavar="S",
        type=_positive_float,
        default=DEFAULT_SECONDS,
        help=f"how long the pool works (default {DEFAULT_SECONDS:g})",
    )
    p.add_argument(
        "-m",
        "--manifest",
        metavar="PATH",
        default=DEFAULT_MANIFEST,
        help=f"where to write the manifest ({{pid}} is replaced; default {DEFAULT_MANIFEST})",
    )


def load_workload() -> ModuleType:
    """The workload module, loaded once as the top-level module ``lockwatch_demo``."""
    module = sys.modules.get(WORKLOAD_MODULE)
    path = Path(__file__).with_name("_demo_workload.py")
    if module is not None and getattr(module, "__file__", None) == str(path):
        return module
    spec = importlib.util.spec_from_file_location(WORKLOAD_MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[WORKLOAD_MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[WORKLOAD_MODULE]
        raise
    return module


# --------------------------------------------------------------------------------------------
# OpenTelemetry


def _otlp_exporters(environ: Any) -> tuple[Any, Any, str] | None:
    """The OTLP span and metric exporters when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, with a
    description of where they send; None otherwise (nothing leaves the process)."""
    from otel_lockwatch.cli._common import DEFAULT_OTLP_PROTOCOL, CommandError

    endpoint = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    if not endpoint:
        return None
    protocol = (environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or DEFAULT_OTLP_PROTOCOL).strip().lower()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
        except ImportError:
            raise CommandError(
                "OTEL_EXPORTER_OTLP_PROTOCOL is grpc, which needs the grpc extra: "
                "pip install 'otel-lockwatch[grpc]'"
            ) from None
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (  # type: ignore[assignment]
            OTLPMetricExporter,
        )
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # type: ignore[assignment]
            OTLPSpanExporter,
        )
    else:
        raise CommandError(
            f"OTEL_EXPORTER_OTLP_PROTOCOL must be grpc or http/protobuf, got {protocol!r}"
        )
    return OTLPSpanExporter(), OTLPMetricExporter(), f"{endpoint} ({protocol})"


def _providers(environ: Any) -> tuple[Any, Any, str | None]:
    """An SDK tracer provider and meter provider, exporting over OTLP only with an endpoint."""
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    otlp = _otlp_exporters(environ)
    attributes = {} if environ.get("OTEL_SERVICE_NAME") else {SERVICE_NAME: DEFAULT_SERVICE_NAME}
    resource = Resource.create(attributes)
    # shutdown_on_exit=False: the demo shuts its providers down itself, and a test process
    # that runs it must not keep them in an atexit hook.
    tracer_provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    readers = []
    where = None
    if otlp is not None:
        span_exporter, metric_exporter, where = otlp
        tracer_provider.add_span_processor(BatchSpanProcessor(span_exporter))
        readers.append(PeriodicExportingMetricReader(metric_exporter))
    meter_provider = MeterProvider(
        metric_readers=readers, resource=resource, shutdown_on_exit=False
    )
    return tracer_provider, meter_provider, where


# --------------------------------------------------------------------------------------------
# Progress


class Progress:
    """Progress on ``stream``: a bar redrawn in place on a terminal, plain lines otherwise."""

    def __init__(self, stream: IO[str], seconds: float) -> None:
        self._stream = stream
        self._seconds = seconds
        try:
            self.animated = bool(stream.isatty())
        except (AttributeError, ValueError):
            self.animated = False
        self._drawn = False
        self._lock = threading.Lock()  # created in otel_lockwatch: never watched

    def line(self, text: str) -> None:
        """Print a line of its own (above the bar on a terminal)."""
        with self._lock:
            if self._drawn:
                self._stream.write("\r\x1b[K")
                self._drawn = False
            self._stream.write(text + "\n")
            self._stream.flush()

    def update(self, elapsed: float, counts: dict[str, int]) -> None:
        """Redraw the bar (a terminal only)."""
        if not self.animated:
            return
        done = min(1.0, elapsed / self._seconds)
        filled = round(done * _BAR_WIDTH)
        bar = "#" * filled + "-" * (_BAR_WIDTH - filled)
        text = (
            f"  [{bar}] {min(elapsed, self._seconds):4.1f}/{self._seconds:g} s  "
            f"events {counts['published']:,}  sweeps {counts['sweeps']:,}  "
            f"snapshots {counts['snapshots']:,}  regressions {counts['regressions']}"
        )
        with self._lock:
            self._stream.write("\r\x1b[K" + text)
            self._stream.flush()
            self._drawn = True

    def clear(self) -> None:
        with self._lock:
            if self._drawn:
                self._stream.write("\r\x1b[K")
                self._stream.flush()
                self._drawn = False


class _LiveFindings(logging.Handler):
    """Shows lockwatch's own warnings (a new lock-order cycle) as they happen, one line each."""

    def __init__(self, progress: Progress) -> None:
        super().__init__(logging.WARNING)
        self.progress = progress
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            first = record.getMessage().splitlines()[0]
        except Exception:  # never let a log line break the demo
            return
        self.messages.append(first)
        self.progress.line("  " + first)


# --------------------------------------------------------------------------------------------
# The command


def _target_dir_ok(path: str) -> None:
    from otel_lockwatch.cli._common import CommandError

    directory = Path(path.replace("{pid}", str(os.getpid()))).parent
    if not directory.is_dir():
        raise CommandError(f"cannot write the manifest to {path}: no directory {directory}")


@contextlib.contextmanager
def _service_name_default() -> Iterator[None]:
    """``OTEL_SERVICE_NAME`` set to the demo's name for the run, unless the user set one.

    The manifest exporter takes ``service.name`` from the *global* tracer provider's resource,
    else from ``OTEL_SERVICE_NAME``, never from the provider it was given; the demo's provider
    is not global (a test process may run the demo more than once), so without this the
    manifest would say ``unknown_service``.
    """
    if os.environ.get("OTEL_SERVICE_NAME"):
        yield
        return
    os.environ["OTEL_SERVICE_NAME"] = DEFAULT_SERVICE_NAME
    try:
        yield
    finally:
        os.environ.pop("OTEL_SERVICE_NAME", None)


@contextlib.contextmanager
def _live_findings(progress: Progress) -> Iterator[_LiveFindings]:
    """lockwatch's warnings shown as they happen, for the duration of the block."""
    handler = _LiveFindings(progress)
    logger = logging.getLogger("otel_lockwatch")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def _work(
    workload: ModuleType, workers: int, seconds: float, progress: Progress, tracer: Any
) -> dict[str, Any]:
    """Run the workload in a thread of its own (see ``_demo_workload``), its units of work in
    task spans of ``tracer``, showing progress until it ends; returns the box with its ``pool``
    or its ``error``."""
    box: dict[str, Any] = {}
    pools: list[Any] = []
    thread = threading.Thread(
        target=workload.run_into,
        args=(box, workers, seconds, pools.append, tracer),
        name="demo-driver",
        daemon=True,
    )
    began = time.monotonic()
    thread.start()
    try:
        while thread.is_alive():
            thread.join(_TICK_S)
            if pools:
                progress.update(time.monotonic() - began, pools[0].counts())
    except KeyboardInterrupt:
        if pools:
            pools[0].deadline = 0.0  # every worker stops at its next check
        thread.join()
        raise
    finally:
        progress.clear()
    return box


def run(args: argparse.Namespace, out: IO[str], err: IO[str]) -> int:
    """Run the demo: instrument, work, write the manifest, print the report.

    Args:
        args: the parsed ``demo`` options (``workers``, ``seconds``, ``manifest``).
        out: where the summary and the report go.
        err: where the progress goes.

    Returns:
        0 once the report is printed.

    Raises:
        CommandError: fewer than 4 workers, a manifest path that cannot be written, an unknown
            OTLP protocol, or lockwatch already instrumenting this process.
    """
    from otel_lockwatch import _session
    from otel_lockwatch._instrumentor import LockwatchInstrumentor
    from otel_lockwatch.cli import _common as _cli
    from otel_lockwatch.cli import _report_text
    from otel_lockwatch.manifest._io import load_manifest

    workload = load_workload()
    if args.workers < workload.MIN_WORKERS:
        raise _cli.CommandError(
            f"argument -w/--workers: the demo needs at least {workload.MIN_WORKERS} workers "
            f"(a sweeper, a reporter, a compactor and a publisher), got {args.workers}"
        )
    _target_dir_ok(args.manifest)
    instrumentor = LockwatchInstrumentor()
    if instrumentor.is_instrumented_by_opentelemetry:
        raise _cli.CommandError(
            "lockwatch already instruments this process (opentelemetry-instrument?); "
            "run the demo on its own"
        )
    tracer_provider, meter_provider, otlp_where = _providers(os.environ)

    progress = Progress(err, args.seconds)
    progress.line(
        f"{_cli.PROG} demo: {args.workers} workers for {args.seconds:g} s "
        f"(the manifest goes to {args.manifest})"
    )
    if otlp_where is not None:
        progress.line(f"{_cli.PROG} demo: exporting traces and metrics over OTLP to {otlp_where}")

    began = time.monotonic()
    with _service_name_default(), _live_findings(progress) as findings:
        _session.discard()  # the demo's manifest holds the demo's workload only
        instrumentor.instrument(
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            manifest=True,
            manifest_path=args.manifest,
            checkpoint_interval_s=0,
            # A fixed showcase: the user's environment does not change the demo's verdict.
            on_cycle="warn",
            hot_lock_threshold_pct=DEFAULT_HOT_LOCK_THRESHOLD_PCT,
            starvation_ratio=DEFAULT_STARVATION_RATIO,
        )
        session = _session.current()
        exporter = session.exporter if session is not None else None
        try:
            tracer = tracer_provider.get_tracer(WORKLOAD_MODULE)
            box = _work(workload, args.workers, args.seconds, progress, tracer)
        finally:
            # The tracer provider's shutdown runs the manifest exporter first: it writes the
            # manifest and sends the lockwatch.manifest span while the OTLP exporter is still up.
            tracer_provider.shutdown()
            meter_provider.shutdown()
            instrumentor.uninstrument()
    elapsed = time.monotonic() - began
    if "error" in box:
        raise box["error"]
    pool = box["pool"]
    written = exporter.last_path if exporter is not None else None
    if written is None:
        why = findings.messages[-1] if findings.messages else "no manifest was written"
        raise _cli.CommandError(f"cannot write the manifest to {args.manifest}: {why}")
    manifest = load_manifest(written).to_dict()
    _session.discard()  # leave nothing of the demo behind in this process

    counts = pool.counts()
    progress.line(f"{_cli.PROG} demo: done in {elapsed:.1f} s")
    out.write(_summary(workload, pool, counts, written))
    out.write("\n")
    out.write(_report_text.render_text(manifest, color=_cli.use_color(out), source=str(written)))
    return _cli.EXIT_OK


def _summary(workload: ModuleType, pool: Any, counts: dict[str, int], written: Path) -> str:
    """What the pool did, role by role, and where the manifest is."""
    w, keys = pool.workers, len(pool.keys)
    hold_ms = workload.COMPACT_HOLD_S * 1000
    sweep_ms = workload.SWEEP_INTERVAL_S * 1000
    rows = [
        (
            "sweeper",
            f"{counts['sweeps']:,} sweeps of {keys} entities with try_lock ("
            f"{sweep_ms:g} ms apart), {counts['sweep_skips']:,} skipped: their section was held",
        ),
        (
            "publisher-NN",
            f"{counts['published']:,} events from {w - 3} publisher{'s' if w > 4 else ''} and "
            "the sweeper: global_config, then sections.lock(key)",
        ),
        (
            "reporter",
            f"{counts['snapshots']:,} snapshots of stats_snapshot, which the compactor "
            f"holds {hold_ms:g} ms at a time",
        ),
        (
            "compactor",
            "accounts -> ledger once; later publisher-03 ledger -> accounts: no deadlock",
        ),
        (
            "connections",
            f"a LifoQueue of {workload.CONNECTIONS}: the sweeper loads, the reporter writes "
            f"its snapshots over one ({counts['sweeps'] + counts['snapshots']:,} checkouts)",
        ),
        (
            "subscriber",
            f"{counts['received']:,} sends received for {keys} entities, "
            f"{counts['regressions']} regressions (a view moving backward)",
        ),
    ]
    lines = [f"pool: {w} workers, ThreadPoolExecutor(max_workers={w}), {pool.seconds:g} s"]
    lines += [f"  {role:<13} {text}" for role, text in rows]
    lines.append(f"manifest: {written}")
    return "\n".join(lines) + "\n"
