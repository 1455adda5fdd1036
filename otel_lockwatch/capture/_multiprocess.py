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

**fork.** The child inherits the instrumentation. At the fork (the session's fork handler) the child
marks itself a child, and the session's exporter resets its per-process state (its write lock,
the manifest-span flag, the checkpoint thread, restarted when an interval is set). A multiprocessing
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

from .._session import OUTBOX, PROCESS, RECORDER, Session, at_fork, current
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


# -- which process is this, and where does it write -----------------------------------------------
def is_child() -> bool:
    """True in a multiprocessing child, a bootstrapped interpreter, an ``os.fork()`` child."""
    return PROCESS.child or multiprocessing.parent_process() is not None


def mark_child() -> None:
    """Mark this process a child (called by the bootstrap ``sitecustomize``)."""
    PROCESS.child = True


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
    return not any(state.stats for state in RECORDER.states)


# -- pool sizes -----------------------------------------------------------------------------------
def pool_init_factory(original: Any, attribute: str) -> Any:
    """The wrapt wrapper of a process pool's ``__init__``: its ``attribute`` (``max_workers``,
    ``processes``) is the pool's nominal size."""

    def __init__(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> None:
        wrapped(*args, **kwargs)
        if current() is None:
            return
        try:
            if _mp_locks.creation_site(instance) is not None:
                RECORDER.note_pool(getattr(instance, attribute), "executor")
        except Exception as exc:
            OUTBOX.failed(exc)

    return __init__


# -- processes ------------------------------------------------------------------------------------
def _after_fork_in_child() -> None:
    # The session's fork handler: every fork child, multiprocessing's or a plain os.fork().
    PROCESS.child = True


def _on_process_start(process: Any) -> None:
    # multiprocessing.util.register_after_fork: run by Process._bootstrap in every child (fork,
    # spawn and forkserver), after it cleared the finalizers it inherited.
    if current() is None:
        return
    _mp_util.Finalize(None, write_at_process_end, exitpriority=EXIT_PRIORITY)
    # A forked worker's emitter starts now rather than at its first record (a raw os.fork()
    # child's waits for that: a program's child sees only the threads it started): it is also
    # what sends again a SIGTERM that landed just before the worker blocked on its call queue,
    # whose handler would never run (exit hooks' lost SIGTERM). A worker that had not recorded
    # anything when the executor terminated it waited for good (its pool's shutdown with it).
    # Only the parent's records, copied by the fork, are dropped (those the parent emits).
    if not OUTBOX.started:
        OUTBOX.begin()


def write_at_process_end() -> None:
    """The child's final write, run by multiprocessing before ``os._exit``."""
    session = current()
    if session is not None and session.exporter is not None:
        session.exporter.close()


def _register_process_hooks() -> None:
    if PROCESS.mp_after_fork_pid != os.getpid():
        # Inherited across a fork (the registry is copied); registered afresh in a new interpreter.
        _mp_util.register_after_fork(PROCESS, _on_process_start)  # weakly: the process's
        PROCESS.mp_after_fork_pid = os.getpid()


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


def _install_bootstrap(session: Session) -> None:
    pythonpath = os.environ.get("PYTHONPATH", "")
    if _under_opentelemetry_instrument(pythonpath):
        return  # its sitecustomize instruments every child, with the lockwatch entry point
    entries = [p for p in pythonpath.split(os.pathsep) if p]
    if BOOTSTRAP_DIR not in entries:
        session.created_pythonpath = "PYTHONPATH" not in os.environ
        os.environ["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR, *entries])
        session.added_pythonpath = True
    if session.options is not None:
        os.environ[CHILD_OPTIONS_ENV] = json.dumps(child_options(session.options), sort_keys=True)
        session.set_child_options = True


def _remove_bootstrap(session: Session) -> None:
    if session.added_pythonpath:
        entries = [
            p
            for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and p != BOOTSTRAP_DIR
        ]
        if entries or not session.created_pythonpath:
            os.environ["PYTHONPATH"] = os.pathsep.join(entries)
        else:
            os.environ.pop("PYTHONPATH", None)
        session.added_pythonpath = False
    if session.set_child_options:
        os.environ.pop(CHILD_OPTIONS_ENV, None)
        session.set_child_options = False


# -- instrument / uninstrument --------------------------------------------------------------------
def instrument(session: Session) -> None:
    """Make every child process report (multiprocessing locks and pools are watched while
    ``session`` is current).

    Args:
        session: the ``instrument()``'s session: its options are handed to spawned children,
            its exporter writes a forked child's manifest.
    """
    _register_process_hooks()
    _install_bootstrap(session)


def uninstrument(session: Session) -> None:
    """Undo :func:`instrument` as far as possible: the watched locks' methods, the ``PYTHONPATH``
    entry and the options variable. (The after-fork routines stay, inert without a session;
    the patch table removes the patches.)"""
    _mp_locks.untag_all()
    _remove_bootstrap(session)


at_fork("multiprocess", after_in_child=_after_fork_in_child)
