"""Lock classes: what a lock is called, and which locks are watched at all.

Lockdep's rule: every lock created at one code site is one *class*, because the code that
creates a lock decides how it is used. A lock created at ``app.pool:setup:42`` is named
``app.pool:setup:42``; ``name_lock(lock, "global_config")`` gives it (and with it its class) a
name a person chooses. Statistics, spans, metrics and the lock-order graph are all kept per
class, so their cardinality is bounded by the code, never by the data: an entity key is never a
name.

Locks created by OpenTelemetry, ``logging`` and otel-lockwatch itself are never watched: the SDK
creates a ``Lock`` for every span, so watching them would recurse.

A lock the standard library creates on the user's behalf (``http.cookiejar.CookieJar()`` creating
its lock) is named after the first frame outside the standard library, where the user built it;
the standard library's frame becomes the class's *role* (``record._lock_class.ROLES``), not part
of its name. A module is in the standard library when its file lies under ``sysconfig``'s
``stdlib`` path and not under a site-packages directory (frozen modules count too); anyio's,
which makes primitives on its caller's behalf too, counts as one here.

Two locks created on one line (``a, b = Lock(), Lock()``) are two classes: the column of the call
(Python 3.11+) is added to the name of every lock created at a column other than the first one
seen on that line (``app:setup:12:col17``), so locks created one per line keep their names.
"""

from __future__ import annotations

import contextlib
import os
import sys
import sysconfig
from typing import Any, TypeVar

from opentelemetry.instrumentation.utils import is_instrumentation_enabled

from ..record._lock_class import LockClass, lock_class, note_role

__all__ = [
    "MACHINERY",
    "WATCHED_FILES",
    "LockClass",
    "class_of_note",
    "creation_note",
    "excluded_caller",
    "lock_class",
    "made_by_machinery",
    "name_lock",
    "site_of",
    "watched_site",
]

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
    "queue",
    "multiprocessing",
    "importlib",
    "_weakrefset",
    "filelock",
)
# How many frames above the creation site are searched for an excluded caller.
_EXCLUSION_DEPTH = 6


def _membership(packages: tuple[str, ...], known: dict[str, bool]) -> Any:
    """``is_in(module)``: whether ``module`` is one of ``packages`` or inside one (not
    ``asyncio_pool``), answered once per module name and noted in ``known`` (every lock and
    condition created while instrumented asks, for several frames: a pool's futures make one per
    task)."""

    def is_in(module: str) -> bool:
        answer = known.get(module)
        if answer is None:
            answer = known[module] = any(
                module == package or module.startswith(package + ".") for package in packages
            )
        return answer

    return is_in


#: Module name -> whether it is in ``_INTERNAL_PACKAGES`` (the machinery), as answered so far: the
#: C path's ``CreationGate`` reads it to send the machinery's creations straight to the original.
MACHINERY: dict[str, bool] = {}
_internal = _membership(_INTERNAL_PACKAGES, MACHINERY)
_excluded = _membership(EXCLUDED_PACKAGES, {})


def _module_of(frame: Any) -> str:
    return frame.f_globals.get("__name__", "?")


def site_of(frame: Any) -> str:
    """``module:function:line`` of a frame."""
    return f"{_module_of(frame)}:{frame.f_code.co_name}:{frame.f_lineno}"


def _prefix(path: str) -> str:
    return os.path.join(os.path.normcase(os.path.abspath(path)), "")


_paths = sysconfig.get_paths()
_STDLIB = tuple({_prefix(_paths[k]) for k in ("stdlib", "platstdlib") if _paths.get(k)})
_SITE = tuple({_prefix(_paths[k]) for k in ("purelib", "platlib") if _paths.get(k)})
_stdlib_files: dict[str, bool] = {}


# Libraries of concurrency primitives that make a lock, an event or a future on their caller's
# behalf, as the standard library does (``anyio.Event()`` makes an ``asyncio.Event``): what they
# make is named after their caller (httpcore's async pool, not anyio), their frame its role.
_PRIMITIVE_PACKAGES = ("anyio",)
_primitive = _membership(_PRIMITIVE_PACKAGES, {})


def _in_stdlib(frame: Any) -> bool:
    """Whether the frame runs code of the standard library, or of a library of primitives that
    makes them on its caller's behalf (:data:`_PRIMITIVE_PACKAGES`): its file, once per file."""
    filename = frame.f_code.co_filename
    known = _stdlib_files.get(filename)
    if known is None:
        if filename.startswith("<frozen "):
            known = True
        else:
            path = os.path.normcase(os.path.abspath(filename))
            known = path.startswith(_STDLIB) and not path.startswith(_SITE)
            known = known or _primitive(_module_of(frame))
        _stdlib_files[filename] = known
    return known


def _role(frame: Any) -> str:
    """``module.qualified_name`` of a standard-library frame: what it made the lock for."""
    code = frame.f_code
    return f"{_module_of(frame)}.{getattr(code, 'co_qualname', code.co_name)}"


_columns: dict[tuple[Any, int], int | None] = {}  # (code, instruction offset) -> column
_first_column: dict[
    tuple[str, int | None], int | None
] = {}  # (file, line) -> first column created at


def _column(frame: Any) -> int | None:
    """The column of the call the frame is making (None before Python 3.11)."""
    code, lasti = frame.f_code, frame.f_lasti
    key = (code, lasti)
    try:
        return _columns[key]
    except KeyError:
        pass
    column = None
    positions = getattr(code, "co_positions", None)
    if positions is not None and lasti >= 0:
        for i, position in enumerate(positions()):
            if i == lasti // 2:
                column = position[2]
                break
    _columns[key] = column
    return column


def creation_site(frame: Any) -> str:
    """The site of a lock created by the call ``frame`` is making: ``module:function:line``, and
    ``:col<N>`` when a lock was created on that line before at another column."""
    return _call_site(_module_of(frame), frame.f_code, frame.f_lineno, _column(frame))


def _call_site(module: str, code: Any, line: int | None, column: int | None) -> str:
    site = f"{module}:{code.co_name}:{line}"
    if column is None:
        return site
    first = _first_column.setdefault((code.co_filename, line), column)
    return site if first == column else f"{site}:col{column}"


def made_by_machinery(depth: int = 1) -> bool:
    """Whether the code creating a lock now is the standard library's or lockwatch's own
    concurrency machinery (a ``Future``'s condition): :func:`watched_site`'s first answer,
    alone, for a factory that can then skip the rest (``depth`` as there)."""
    return _internal(sys._getframe(depth + 1).f_globals.get("__name__", "?"))


def watched_site(depth: int = 1) -> str | None:
    """The creation site of a lock being created now, or None when it must not be watched.

    The site is the creating frame's (:func:`creation_site`), or, for a lock the standard
    library creates, the first frame outside it (the standard library's frame is noted as the
    class's role). A lock is not watched when the code creating it belongs to OpenTelemetry,
    ``logging``, otel-lockwatch or the standard library's own concurrency machinery
    (``threading``, ``concurrent.futures``, ``asyncio``, ``multiprocessing``, ``queue``: their
    internal locks are plumbing, and the primitives they build are watched where they are
    patched), or when OpenTelemetry or otel-lockwatch is among the few callers above it (an
    exporter creating a ``queue.Queue``).

    Args:
        depth: 1 when the caller of this function is the factory called by the creating code.
    """
    return _site_of_call(sys._getframe(depth + 1), True)


def _site_of_call(frame: Any, probe: bool) -> str | None:
    """:func:`watched_site` of the call ``frame`` is making; ``probe``: look for an excluded
    caller above it too."""
    if _internal(_module_of(frame)):
        return None
    creator = None
    while frame is not None and _in_stdlib(frame):  # made on the user's behalf: name the user
        if creator is None:
            creator = frame
        frame = frame.f_back
        if frame is None or _internal(_module_of(frame)):
            return None  # the standard library's own (no user frame), or its machinery's
    if probe and excluded_caller(frame.f_back):
        return None
    site = creation_site(frame)
    if creator is not None:
        note_role(site, _role(creator))
    return site


_CALL_CACHE_MAX = 4096  # calls remembered per kind (a code object and an offset each)


#: File name -> module name of the files found to hold watched code (neither the standard
#: library's, a library of primitives', nor the machinery's): an object made per request there
#: notes its creating call with one lookup (:func:`creation_note`).
WATCHED_FILES: dict[str, str] = {}


def creation_note(frame: Any, kind: str) -> Any:
    """What an object made per request (an event, a future) notes at its creation, for its
    class to be found at its first wait that blocks (:func:`class_of_note`).

    The creating call ``(code, offset, module)`` when ``frame`` (the creating frame) runs
    watched code, its file then remembered in :data:`WATCHED_FILES`; the class itself when the
    standard library or a library of primitives made it on its caller's behalf (the caller is
    found now: its frame is gone by the wait); None when it is not watched (the machinery's,
    OpenTelemetry's, lockwatch's). The callers above are not probed: the wait that blocks
    probes its own (:func:`excluded_caller`).
    """
    module = _module_of(frame)
    if _internal(module):
        return None
    if _in_stdlib(frame):
        site = _site_of_call(frame, False)
        return None if site is None else lock_class(site, kind, site)
    code = frame.f_code
    if not code.co_filename.startswith("<"):  # exec'd code: one file name for many modules
        WATCHED_FILES[code.co_filename] = module
    return code, frame.f_lasti, module


def class_of_note(note: Any, kind: str, cache: dict) -> LockClass | None:
    """The class of an object by its :func:`creation_note`: named by its creating call, as
    :func:`watched_site` names a lock (remembered in ``cache`` per call: at most
    :data:`_CALL_CACHE_MAX`)."""
    if note is None or isinstance(note, LockClass):
        return note
    try:
        return cache[note]
    except KeyError:
        pass
    code, offset, module = note
    line, column = None, None
    for i, position in enumerate(code.co_positions()):
        if i == offset // 2:
            line, column = position[0], position[2]
            break
    site = _call_site(module, code, line, column)
    found = lock_class(site, kind, site)
    if len(cache) < _CALL_CACHE_MAX:
        cache[note] = found
    return found


def excluded_caller(frame: Any) -> bool:
    """Whether OpenTelemetry, ``logging`` or lockwatch is among the few callers from ``frame``
    up (an exporter waiting on a pool), or OpenTelemetry's instrumentation is suppressed in the
    current context: such a creation is not watched, such a wait not recorded.

    The SDK suppresses instrumentation around every export (its span, metric and log
    processors), as contrib instrumentations honour: an exporter's own pools are made and
    waited on there, further down than the callers probed (the OTLP/HTTP exporter's urllib3
    pool is made nine frames below it)."""
    for _ in range(_EXCLUSION_DEPTH):
        if frame is None:
            break
        if _excluded(_module_of(frame)):
            return True
        frame = frame.f_back
    return not is_instrumentation_enabled()


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
    previous = getattr(lock, "_lockwatch_class", None)
    if isinstance(previous, LockClass):
        named = lock_class(name, previous.kind, previous.site)
        with contextlib.suppress(AttributeError):  # a type without room for it: nothing to name
            lock._lockwatch_class = named  # type: ignore[attr-defined]
        inner = getattr(lock, "_lock", None)  # a Condition's own lock, of the Condition's class
        if inner is not None and getattr(inner, "_lockwatch_class", None) is previous:
            inner._lockwatch_class = named
        return lock
    sections_name = getattr(lock, "_name", None)
    if isinstance(sections_name, str) and hasattr(lock, "_release") and hasattr(lock, "index"):
        lock._name = name  # type: ignore[attr-defined]  # a section array: its name is its class
    return lock
