"""Multi-process pools: every process reports, cross-process locks are watched.

A ``ProcessPoolExecutor``, a ``multiprocessing.Pool`` or a pre-fork server spreads one pool's
contention over many processes. Each process records its own locks and writes its own manifest;
``otel-lockwatch merge`` (``merge_manifests``) adds them up exactly. This module makes that happen
for the three start methods, and watches the locks that cross processes.

**File naming.** The parent writes the configured path. A child
(``multiprocessing.parent_process()`` is not None, or a plain ``os.fork()`` child) writing a path
without ``{pid}`` inserts ``.{pid}`` before the suffix: ``lockwatch-manifest.json`` becomes
``lockwatch-manifest.12345.json``. A child that recorded no lock activity at all (the forkserver
process, an idle pool worker) writes no manifest.

**fork.** The child inherits the instrumentation. At the fork (``os.register_at_fork``) the child
marks itself a child and resets the exporter's per-process state (its write lock, the
manifest-span flag, the checkpoint thread, restarted when an interval is set). A multiprocessing
child ends through ``os._exit`` after ``multiprocessing.util._exit_function()``, which runs the
``multiprocessing.util.Finalize`` callbacks; ``Process._bootstrap`` clears the finalizers it
inherited and then runs the ``util.register_after_fork`` callbacks, so the manifest's finalizer
is registered by such a callback (with ``exitpriority=100``: before the queues and semaphores are
torn down). A plain ``os.fork()`` child that exits normally runs the inherited ``atexit`` hook and
writes its own pid-suffixed file.

**spawn and forkserver.** Their children are new interpreters, instrumented at startup as
``opentelemetry-instrument`` does it: ``instrument()`` prepends ``otel_lockwatch/_bootstrap`` (a
``sitecustomize``) to ``PYTHONPATH`` and puts its options in
``OTEL_PYTHON_LOCKWATCH_CHILD_OPTIONS`` (JSON). The bootstrap instruments only multiprocessing's
own interpreters (``python -c "from multiprocessing.spawn import ..."`` and the forkserver), never
a ``python script.py`` subprocess, then chains to any other ``sitecustomize``. Under
``opentelemetry-instrument`` nothing is added: its own ``sitecustomize`` instruments every child.

**Cross-process locks** are watched by ``_mp_locks``; :func:`instrument` turns their tagging on.

**Pool size.** ``ProcessPoolExecutor``'s ``max_workers`` and ``multiprocessing.Pool``'s
``processes`` are the nominal pool size (``"executor"``), which a merged manifest keeps.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import multiprocessing.util as _mp_util
import os
from typing import Any

from ..record._outbox import OUTBOX
from ..record._recorder import RECORDER
from . import _mp_locks

__all__ = [
    "BOOTSTRAP_DIR",
    "CHILD_OPTIONS_ENV",
    "EXIT_PRIORITY",
    "child_options",
    "instrument",
    "is_child",
    "manifest_path",
    "mark_child",
    "pool_init_factory",
    "skip_write",
    "uninstrument",
    "write_at_process_end",
]

#: The options a bootstrapped child instruments itself with (JSON: ``instrument()`` kwargs).
CHILD_OPTIONS_ENV = "OTEL_PYTHON_LOCKWATCH_CHILD_OPTIONS"
#: The directory holding the bootstrap ``sitecustomize`` prepended to ``PYTHONPATH``.
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bootstrap")
#: ``opentelemetry-instrument``'s own sitecustomize directory, when it runs the program.
_OTEL_AUTO_DIR = os.path.join("opentelemetry", "instrumentation", "auto_instrumentation")
#: multiprocessing's finalizers run in decreasing priority: the manifest goes first.
EXIT_PRIORITY = 100


class _State:
    """This module's per-process state (one object, so the at-fork hook and tests see one truth)."""

    active = False  # instrumented now
    child = False  # a forked or bootstrapped child (parent_process() covers the rest)
    at_fork_registered = False
    after_fork_pid = 0  # the pid whose multiprocessing after-fork registry holds our callback
    added_path = False  # we prepended BOOTSTRAP_DIR to PYTHONPATH
    created_pythonpath = False  # PYTHONPATH did not exist before
    set_options = False  # we set CHILD_OPTIONS_ENV
    exporter: Any = None  # what writes this process's manifest (given by instrument())


_STATE = _State()


class _Anchor:
    """A long-lived object for ``multiprocessing.util.register_after_fork`` (weak values)."""


_ANCHOR = _Anchor()


# -- which process is this, and where does it write -----------------------------------------------
def is_child() -> bool:
    """True in a multiprocessing child, a bootstrapped interpreter, an ``os.fork()`` child."""
    return _STATE.child or multiprocessing.parent_process() is not None


def mark_child() -> None:
    """Mark this process a child (called by the bootstrap ``sitecustomize``)."""
    _STATE.child = True


def manifest_path(path: str | os.PathLike[str]) -> str:
    """The path this process writes: a child inserts ``.{pid}`` before the suffix, unless the path
    already holds ``{pid}`` (``m.json`` -> ``m.{pid}.json``; ``dump_manifest`` fills it in)."""
    text = os.fspath(path)
    if "{pid}" in text or not is_child():
        return text
    head, name = os.path.split(text)
    stem, dot, suffix = name.rpartition(".")
    # No suffix (or a dot file): append.
    name = name + ".{pid}" if not dot or not stem else f"{stem}.{{pid}}.{suffix}"
    return os.path.join(head, name)


def skip_write() -> bool:
    """True for a child that recorded no lock activity at all: it writes no manifest."""
    if not is_child():
        return False
    return not any(state.stats for state in list(RECORDER._states))


# -- pool sizes -----------------------------------------------------------------------------------
def pool_init_factory(original: Any, attribute: str) -> Any:
    """The wrapt wrapper of a process pool's ``__init__``: its ``attribute`` (``max_workers``,
    ``processes``) is the pool's nominal size."""

    def __init__(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
        wrapped(*args, **kwargs)
        if not _STATE.active:
            return
        try:
            if _mp_locks.creation_site(instance) is not None:
                RECORDER.note_pool(getattr(instance, attribute), "executor")
        except Exception as exc:
            OUTBOX.failed(exc)

    return __init__


# -- processes ------------------------------------------------------------------------------------
def _after_fork_in_child() -> None:
    # os.register_at_fork: every fork child, multiprocessing's or a plain os.fork().
    _STATE.child = True
    if not _STATE.active:
        return
    exporter = _STATE.exporter
    if exporter is not None:
        try:
            exporter._after_fork_in_child()
        except Exception as exc:
            OUTBOX.failed(exc)


def _on_process_start(anchor: Any) -> None:
    # multiprocessing.util.register_after_fork: run by Process._bootstrap in every child (fork,
    # spawn and forkserver), after it cleared the finalizers it inherited.
    if _STATE.active:
        _mp_util.Finalize(None, write_at_process_end, exitpriority=EXIT_PRIORITY)


def write_at_process_end() -> None:
    """The child's final write, run by multiprocessing before ``os._exit``."""
    exporter = _STATE.exporter
    if exporter is not None and _STATE.active:
        exporter.close()


def _register_process_hooks() -> None:
    if not _STATE.at_fork_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(
            after_in_child=_after_fork_in_child
        )  # can't be unregistered: checks _STATE
        _STATE.at_fork_registered = True
    if _STATE.after_fork_pid != os.getpid():
        # Inherited across a fork (the registry is copied); registered afresh in a new interpreter.
        _mp_util.register_after_fork(_ANCHOR, _on_process_start)
        _STATE.after_fork_pid = os.getpid()


# -- spawn / forkserver: the bootstrap ------------------------------------------------------------
def _under_opentelemetry_instrument(pythonpath: str) -> bool:
    return any(
        os.path.normpath(p).endswith(_OTEL_AUTO_DIR) for p in pythonpath.split(os.pathsep) if p
    )


def child_options(options: Any) -> dict[str, Any]:
    """The ``instrument()`` keyword arguments a bootstrapped child uses: the parent's options,
    with the manifest path made absolute (a child may start in another directory)."""
    values = {k: v for k, v in dataclasses.asdict(options).items() if v is not None}
    if "manifest_path" in values:
        values["manifest_path"] = os.path.abspath(values["manifest_path"])
    return values


def _install_bootstrap(options: Any) -> None:
    pythonpath = os.environ.get("PYTHONPATH", "")
    if _under_opentelemetry_instrument(pythonpath):
        return  # its sitecustomize instruments every child, with the lockwatch entry point
    entries = [p for p in pythonpath.split(os.pathsep) if p]
    if BOOTSTRAP_DIR not in entries:
        _STATE.created_pythonpath = "PYTHONPATH" not in os.environ
        os.environ["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *entries])
        _STATE.added_path = True
    if options is not None:
        os.environ[CHILD_OPTIONS_ENV] = json.dumps(child_options(options), sort_keys=True)
        _STATE.set_options = True


def _remove_bootstrap() -> None:
    if _STATE.added_path:
        entries = [
            p
            for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and p != BOOTSTRAP_DIR
        ]
        if entries or not _STATE.created_pythonpath:
            os.environ["PYTHONPATH"] = os.pathsep.join(entries)
        else:
            os.environ.pop("PYTHONPATH", None)
        _STATE.added_path = False
    if _STATE.set_options:
        os.environ.pop(CHILD_OPTIONS_ENV, None)
        _STATE.set_options = False


# -- instrument / uninstrument --------------------------------------------------------------------
def instrument(options: Any = None, exporter: Any = None) -> None:
    """Watch multiprocessing locks and pools, and make every child process report.

    Args:
        options: the instrumentor's resolved ``Options`` (handed to spawned children).
        exporter: the ``ManifestExporter`` that writes this process's manifest, or None.
    """
    _STATE.active = True
    _STATE.exporter = exporter
    _mp_locks.watch(True)
    _register_process_hooks()
    _install_bootstrap(options)


def uninstrument() -> None:
    """Undo :func:`instrument` as far as possible: the watched locks' methods, the ``PYTHONPATH``
    entry and the options variable. (The at-fork hooks stay, inert; the patch table removes the
    patches.)"""
    _STATE.active = False
    _STATE.exporter = None
    _mp_locks.watch(False)
    _remove_bootstrap()
