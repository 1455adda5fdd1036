"""Lock classes: what a lock is called, and which locks are watched at all.

Lockdep's rule: every lock created at one code site is one *class*, because the code that
creates a lock decides how it is used. A lock created at ``app.pool:setup:42`` is named
``app.pool:setup:42``; ``name_lock(lock, "global_config")`` gives it (and with it its class) a
name a person chooses. Statistics, spans, metrics and the lock-order graph are all kept per
class, so their cardinality is bounded by the code, never by the data: an entity key is never a
name.

Locks created by OpenTelemetry, ``logging`` and otel-lockwatch itself are never watched: the SDK
creates a ``Lock`` for every span, so watching them would recurse.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, TypeVar

from ..record._lock_class import LockClass, lock_class

__all__ = ["LockClass", "lock_class", "name_lock", "site_of", "watched_site"]

T = TypeVar("T")

# Locks created by these packages are never watched, nor locks created anywhere while one of them
# is among the few callers above (an OpenTelemetry exporter creating a queue.Queue).
EXCLUDED_PACKAGES = (
    "opentelemetry",
    "otel_lockwatch",
    "logging",
    "wrapt",
    "grpc",
    "google.protobuf",
)
# Locks created directly by these are never watched either: they are the internals of primitives
# that are patched where users create them, or of the import machinery (filelock's are the
# plumbing of a file lock, which is watched as itself).
_INTERNAL_PACKAGES = EXCLUDED_PACKAGES + (
    "threading",
    "concurrent.futures",
    "asyncio",
    "multiprocessing",
    "importlib",
    "_weakrefset",
    "filelock",
)
# How many frames above the creation site are searched for an excluded caller.
_EXCLUSION_DEPTH = 6


def _in(module: str, packages: tuple[str, ...]) -> bool:
    """Whether ``module`` is one of ``packages`` or inside one (not ``asyncio_pool``)."""
    return any(module == package or module.startswith(package + ".") for package in packages)


def _module_of(frame: Any) -> str:
    return frame.f_globals.get("__name__", "?")


def site_of(frame: Any) -> str:
    """``module:function:line`` of a frame."""
    return f"{_module_of(frame)}:{frame.f_code.co_name}:{frame.f_lineno}"


def watched_site(depth: int = 1) -> str | None:
    """The creation site of a lock being created now, or None when it must not be watched.

    A lock is not watched when the code creating it belongs to OpenTelemetry, ``logging``,
    otel-lockwatch or the standard library's own concurrency machinery (``threading``,
    ``concurrent.futures``, ``asyncio``, ``multiprocessing``: their internal locks are plumbing,
    and the primitives they build are watched where they are patched), or when OpenTelemetry or
    otel-lockwatch is among the few callers above it (an exporter creating a ``queue.Queue``).

    Args:
        depth: 1 when the caller of this function is the factory called by the creating code.
    """
    frame = sys._getframe(depth + 1)
    if _in(_module_of(frame), _INTERNAL_PACKAGES):
        return None
    probe = frame.f_back
    for _ in range(_EXCLUSION_DEPTH):
        if probe is None:
            break
        if _in(_module_of(probe), EXCLUDED_PACKAGES):
            return None
        probe = probe.f_back
    return site_of(frame)


def name_lock(lock: T, name: str) -> T:
    """Name a lock, a semaphore or a section array; returns it, so it can wrap the constructor.

    ``lock = name_lock(threading.Lock(), "global_config")``. The name becomes the lock's class:
    its statistics, spans, metrics and lock-order edges are reported under it, and locks given
    one name are one class. Naming a lock that is not instrumented (created before
    ``instrument()``, or while lockwatch is not loaded) is harmless and does nothing.

    Args:
        lock: a lock created while instrumented, an asyncio lock, or a section array.
        name: a non-empty name, chosen by the code (never an entity id: names are metric
            attributes).

    Raises:
        TypeError: ``name`` is not a non-empty ``str``.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"lock name must be a non-empty str, got {name!r}")
    namer = getattr(type(lock), "_lockwatch_rename", None)
    if namer is not None:
        namer(lock, name)
        return lock
    cls = getattr(lock, "_lockwatch_class", None)
    if isinstance(cls, LockClass):
        with contextlib.suppress(AttributeError):  # a type without room for it: nothing to name
            lock._lockwatch_class = lock_class(name, cls.kind, cls.site)  # type: ignore[attr-defined]
        return lock
    sections_name = getattr(lock, "_name", None)
    if isinstance(sections_name, str) and hasattr(lock, "_release") and hasattr(lock, "index"):
        lock._name = name  # type: ignore[attr-defined]  # a section array: its name is its class
    return lock
