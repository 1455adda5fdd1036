"""otel-lockwatch: watch the locks of worker pools with OpenTelemetry.

The package is layered; each layer only uses the ones above it:

- ``_fnv``, ``_sections``: the striped-section primitive (a fixed array of locks indexed by
  FNV-1a of an entity id).
- ``_naming``, ``_recorder``, ``_histogram``, ``_wrappers``, ``_asyncio_wrappers``: the hot path
  (lock proxies and patched section paths feeding a per-thread recorder).
- ``_order``, ``_processor``, ``_telemetry``: the lock-order graph, the span processor, and what
  goes out through OpenTelemetry.
- ``_manifest``, ``_exporter``: the contention manifest and its writing at exit.
- ``_instrumentor``: wires it all (``LockwatchInstrumentor``).
- ``_report``, ``_cli``, ``pytest_plugin``: the command and the pytest plugin.
"""

from ._version import __version__
from .capture._naming import name_lock
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
from .sections._array import AsyncStripedSections, SectionStatistics, StripedSections

__all__ = [
    "AsyncStripedSections",
    "LockwatchError",
    "LockOrderSpanProcessor",
    "LockwatchInstrumentor",
    "Manifest",
    "ManifestExporter",
    "ManifestError",
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
    "recommended_workers",
    "write_manifest",
]


def __getattr__(name: str):  # what imports the OpenTelemetry SDK is loaded on first use
    if name in ("evaluate", "write_manifest"):
        from .telemetry import _exit as _exporter

        return getattr(_exporter, name)
    if name == "LockwatchInstrumentor":
        from ._instrumentor import LockwatchInstrumentor

        return LockwatchInstrumentor
    if name == "ManifestExporter":
        from .telemetry._exit import ManifestExporter

        return ManifestExporter
    if name == "LockOrderSpanProcessor":
        from .telemetry._held_spans import LockOrderSpanProcessor

        return LockOrderSpanProcessor
    raise AttributeError(f"module 'otel_lockwatch' has no attribute {name!r}")
