"""otel-lockwatch: watch the locks of worker pools with OpenTelemetry.

The package is layered along the data flow. Lowest first; each layer imports only from itself
and the layers below it (``tests/test_layout.py`` holds it to that):

- ``exceptions``, ``_settings``, ``environment_variables``: the error classes and the options,
  which every layer may use.
- ``sections``: the striped-section primitive, a fixed array of locks indexed by FNV-1a of an
  entity key (``StripedSections`` for threads, ``AsyncStripedSections`` for tasks).
- ``record``: what the lock path writes, with no process-wide lock: per-thread (per-task)
  statistics and held stacks, log-linear histograms, the lock-order graph with its witnesses
  and cycles, the outbox of slow-path records.
- ``_session``: the one owner of the state: the process's recorder and outbox, the session of
  an ``instrument()`` (its options, emitter, exporter), the one fork handler.
- ``capture``: the patches and what they run: lock proxies, the instrumented section and
  semaphore methods, asyncio and multiprocessing locks, lock naming, the optional C fast path.
- ``manifest``: the contention manifest: evaluation of the recorded data (verdict, hot locks,
  starvation, pool size), its file format, admission checks, merging across processes.
- ``telemetry``: what goes out through OpenTelemetry: the emitter of ``lock.wait`` /
  ``lock.hold`` spans and metrics, the processor that counts spans started under a held lock,
  the writer of the manifest at exit.
- ``_instrumentor``: ``LockwatchInstrumentor``, which wires them together.
- ``cli``, ``pytest_plugin``, and this module: the ``otel-lockwatch`` command, the pytest plugin,
  and the public names below. What needs the OpenTelemetry SDK is imported on first use.
"""

import warnings

from ._version import __version__
from .capture._naming import name_lock
from .capture._ordered import ordered
from .exceptions import (
    LockwatchError,
    ManifestError,
    PotentialDeadlockError,
    SectionReentryError,
    SectionTimeout,
)
from .manifest._admission import may_spawn_pool_size, recommended_workers
from .manifest._io import load_manifest
from .manifest._merge import merge_manifests
from .manifest._model import Manifest, Verdict
from .sections._array import SectionStatistics
from .sections._asyncio import AsyncStripedSections
from .sections._threaded import StripedSections

__all__ = [
    "AsyncStripedSections",
    "HeldLockSpanProcessor",
    "LockwatchError",
    "LockwatchInstrumentor",
    "Manifest",
    "ManifestError",
    "ManifestExporter",
    "PotentialDeadlockError",
    "SectionReentryError",
    "SectionStatistics",
    "SectionTimeout",
    "StripedSections",
    "Verdict",
    "__version__",
    "evaluate",
    "load_manifest",
    "may_spawn_pool_size",
    "merge_manifests",
    "name_lock",
    "ordered",
    "recommended_workers",
    "write_manifest",
]


def __getattr__(name: str):  # what imports the OpenTelemetry SDK is loaded on first use
    if name == "evaluate":  # the process's recording, with the session's thresholds
        from .telemetry._exit import evaluate_recording

        return evaluate_recording
    if name == "write_manifest":
        from .telemetry._exit import write_manifest

        return write_manifest
    if name == "LockwatchInstrumentor":
        from ._instrumentor import LockwatchInstrumentor

        return LockwatchInstrumentor
    if name == "ManifestExporter":
        from .telemetry._exit import ManifestExporter

        return ManifestExporter
    if name == "HeldLockSpanProcessor":
        from .telemetry._held_spans import HeldLockSpanProcessor

        return HeldLockSpanProcessor
    if name == "LockOrderSpanProcessor":  # its old name: it never had to do with lock order
        warnings.warn(
            "LockOrderSpanProcessor is deprecated; use HeldLockSpanProcessor, the same class "
            "(it counts the spans started while a lock is held)",
            DeprecationWarning,
            stacklevel=2,
        )
        from .telemetry._held_spans import HeldLockSpanProcessor

        return HeldLockSpanProcessor
    raise AttributeError(f"module 'otel_lockwatch' has no attribute {name!r}")
