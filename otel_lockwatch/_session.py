"""The session: the one owner of lockwatch's state in a process.

Two kinds of state, both held here and nowhere else:

- **The process's parts**, made once and kept for the life of the process, because the lock
  paths hold references to them (an acquire reads ``RECORDER`` as a module global: one load,
  where ``current().recorder`` would be two): :data:`RECORDER` (the worker states, with the
  lock-order graph and the distributed record) and :data:`OUTBOX` (the slow path's queue and
  the one error path). :data:`PROCESS` holds the process-wide parts of the layers above (the
  exit hooks, the standby threads, whether this process is a child), each made on first use
  by the layer it belongs to.
- **A session**: what one ``instrument()`` owns, from ``instrument()`` to ``uninstrument()``
  (:func:`begin`, :func:`end`): the options, the recorder, outbox, order graph and distributed
  record it records into, the emitter and the manifest exporter the telemetry layer hands it,
  the span processors it added, what it changed in the environment for child processes.
  :func:`current` is the one holder of the current session (None while uninstrumented).
- **The thresholds** (:data:`THRESHOLDS`): what the lock paths read of the session's options on
  every call of theirs (the span thresholds, the hold metric floor, the cycle policy, the
  contention points kept), written by :func:`begin` and by nothing else. A process part like
  the recorder, because a lock made under one session keeps recording after it ends: the lock
  paths read it as a module global and an attribute (one ``LOAD_ATTR_SLOT`` more than the
  rebound module globals it replaces, on the pure path's release only; the C path keeps its
  copy of the floor, set through :meth:`Thresholds.follow`).

Layers talk through the session or through explicit hand-offs: the emitter gives the outbox
its "first record" and "cycle" callbacks; the record layer never imports OpenTelemetry.

**Fork.** One handler (``os.register_at_fork``, registered here) runs each part's after-fork
routine in :data:`FORK_ORDER` (its before-fork routine in the reverse order), whatever order the
modules were imported in. The parts of this layer and below are registered here; the capture and
telemetry parts register theirs by name (:func:`at_fork`) when imported, and a name not in the
order is refused.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from ._settings import Options
from .record import _lock_class
from .record._distributed import DistributedRecord
from .record._outbox import Outbox
from .record._recorder import Recorder

__all__ = [
    "DISTRIBUTED",
    "FORK_ORDER",
    "OUTBOX",
    "PROCESS",
    "RECORDER",
    "Session",
    "THRESHOLDS",
    "Thresholds",
    "at_fork",
    "begin",
    "current",
    "discard",
    "end",
    "fork_parts",
]

logger = logging.getLogger("otel_lockwatch")


class Thresholds:
    """What the lock paths read of the session's options on every call (see the module's
    docstring); the defaults until the first :func:`begin`, the last session's after its end."""

    __slots__ = (
        "_followers",
        "hold_metric_ns",
        "hold_span_ns",
        "on_cycle",
        "sites_kept",
        "wait_span_ns",
    )

    def __init__(self, options: Options) -> None:
        self._followers: list[Callable[[Thresholds], None]] = []
        self.set(options)

    def set(self, options: Options) -> None:
        """Take the thresholds of ``options``, and tell each follower."""
        # a wait at least this long (ns) becomes a ``lock.wait`` span
        self.wait_span_ns = round(options.wait_span_threshold_ms * 1_000_000)
        # a hold at least this long (ns) becomes a ``lock.hold`` span
        self.hold_span_ns = round(options.hold_span_threshold_ms * 1_000_000)
        # a release from this hold (ns) on takes the slow path (never above the span threshold)
        floor_ns = round(options.hold_metric_floor_ms * 1_000_000)
        self.hold_metric_ns = min(floor_ns, self.hold_span_ns)
        # the cycle policy: ``warn``, ``raise`` or ``ignore``
        self.on_cycle = options.on_cycle
        # the contention points kept per lock class and worker, and in a snapshot's data
        self.sites_kept = 4 * options.contention_points
        for follower in self._followers:
            follower(self)

    def follow(self, follower: Callable[[Thresholds], None]) -> None:
        """Call ``follower(self)`` now and at every later :meth:`set`: for a path that keeps a
        copy of its own (the C path's hold metric floor, in its module's state)."""
        self._followers.append(follower)
        follower(self)


#: What the lock paths read of the options of the session in force.
THRESHOLDS = Thresholds(Options())


#: The process's recorder: every worker's state, the lock-order graph, the distributed record.
RECORDER = Recorder(THRESHOLDS)
#: The distributed record (the recorder's: leases, release failures, key templates).
DISTRIBUTED: DistributedRecord = RECORDER.distributed
#: The slow path's queue to the emitter, and the one error path (``OUTBOX.failed``).
OUTBOX = Outbox()
RECORDER.waits.hand_to(OUTBOX)  # a filed wait's record goes there (record._waits)


class Process:
    """The process-wide parts of the layers above this one, each made on first use by its layer
    (they outlive a session: an ``atexit`` registration, a signal handler, idle threads)."""

    def __init__(self) -> None:
        self.exit_hooks: Any = None  # telemetry._exit_hooks.ExitHooks
        self.standby: Any = None  # telemetry._bounded.Standby
        self.child = False  # a forked or bootstrapped child process (capture._multiprocess)
        self.mp_after_fork_pid = 0  # the pid whose multiprocessing after-fork registry has ours

    def part(self, name: str, make: Callable[[], Any]) -> Any:
        """The part ``name``, made by ``make`` on first use."""
        part = getattr(self, name)
        if part is None:
            part = make()
            setattr(self, name, part)
        return part


#: The process-wide parts of the upper layers.
PROCESS = Process()


class Session:
    """What one ``instrument()`` owns (see the module's docstring)."""

    def __init__(self, options: Any) -> None:
        self.options = options  # _settings.Options
        self.thresholds = THRESHOLDS
        self.recorder = RECORDER
        self.outbox = OUTBOX
        self.distributed = DISTRIBUTED
        self.emitter: Any = None  # telemetry._emitter.Telemetry, handed in by the instrumentor
        self.exporter: Any = None  # telemetry._exit.ManifestExporter, or None (no manifest)
        self.processors: list[tuple[Any, Any]] = []  # (tracer provider, span processor) added
        self.patches: list[tuple[Any, Any]] = []  # capture._patches.install()'s, to uninstall
        # what capture._multiprocess changed in the environment for child processes, to undo
        self.added_pythonpath = False
        self.created_pythonpath = False
        self.set_child_options = False

    @property
    def graph(self) -> Any:
        """The lock-order graph (``record._order.LockOrderGraph``) it records into."""
        return self.recorder.graph


_current: Session | None = None


def current() -> Session | None:
    """The session of the ``instrument()`` in force, or None while uninstrumented."""
    return _current


def begin(options: Any) -> Session:
    """Begin the session of an ``instrument()`` with its resolved options: the lock paths read
    its thresholds from now on (:data:`THRESHOLDS`)."""
    global _current
    THRESHOLDS.set(options)
    _current = Session(options)
    return _current


def end() -> Session | None:
    """End the current session (``uninstrument()``); it is returned, for what is left to undo."""
    global _current
    session, _current = _current, None
    return session


def discard() -> None:
    """Forget everything the process recorded: a fresh start (tests, between two sessions)."""
    RECORDER.reset()  # with its order graph and distributed record
    OUTBOX.reset()


# -- fork ------------------------------------------------------------------------------------------
#: The order the parts' after-fork routines run in, in a forked child (and after a fork, in the
#: parent). The recorder first: it gives the forking thread its fresh state, which the C path
#: reads again once it forgot its cached one; the exporter, then the exit hooks, last: what the
#: exporter restarts (a checkpoint thread) may take a lock, and the exit hooks do a SIGTERM's
#: exit work only once every other part is the child's (a SIGTERM handled before only ends it).
FORK_ORDER = (
    "recorder",  # record._recorder: one worker (the forking thread), its held stack kept
    "lock classes",  # record._lock_class: the interning lock made anew
    "outbox",  # record._outbox: the child's first record starts its emitter
    "distributed",  # record._distributed: the child's own leases and failures
    "fast path",  # capture._fast_path: the C path forgets its cached worker states
    "collection",  # capture._collection: the parent's threads' collector deferrals closed
    "multiprocess",  # capture._multiprocess: this process is a child
    "exporter",  # telemetry: the emitter's emit lock; the exporter's write lock and checkpoints
    "exit hooks",  # telemetry._exit_hooks: the child's wake-up pipe and signal deferral
)

_before: dict[str, Callable[[], None]] = {}
_in_child: dict[str, Callable[[], None]] = {}
_in_parent: dict[str, Callable[[], None]] = {}


def at_fork(
    part: str,
    *,
    before: Callable[[], None] | None = None,
    after_in_child: Callable[[], None] | None = None,
    after_in_parent: Callable[[], None] | None = None,
) -> None:
    """Have the fork handler run ``part``'s routines at its place in :data:`FORK_ORDER` (the
    ``before`` routines, in the forking thread just before the fork, in the reverse order; a
    second registration of a part replaces the first).

    Raises:
        ValueError: ``part`` is not in :data:`FORK_ORDER`.
    """
    if part not in FORK_ORDER:
        raise ValueError(f"no part {part!r} in the fork order {FORK_ORDER}")
    tables = ((_before, before), (_in_child, after_in_child), (_in_parent, after_in_parent))
    for table, routine in tables:
        if routine is None:
            table.pop(part, None)
        else:
            table[part] = routine


def fork_parts() -> tuple[str, ...]:
    """The parts whose after-fork routine a forked child runs, in the order it runs them."""
    return tuple(part for part in FORK_ORDER if part in _in_child)


def _run(table: dict[str, Callable[[], None]], order: tuple[str, ...] = FORK_ORDER) -> None:
    for part in order:
        routine = table.get(part)
        if routine is None:
            continue
        try:
            routine()
        except Exception as exc:  # one part's trouble: the others still run; never raised
            OUTBOX.failed(exc)


def _before_fork() -> None:
    _run(_before, FORK_ORDER[::-1])


def _after_fork_in_child() -> None:
    _run(_in_child)


def _after_fork_in_parent() -> None:
    _run(_in_parent)


def _exporter_after_fork_in_child() -> None:
    session = _current
    if session is None:
        return
    if session.emitter is not None:  # its emit lock, which a parent's thread may have held
        session.emitter.after_fork_in_child()
    if session.exporter is not None:
        session.exporter.after_fork_in_child()


at_fork("recorder", after_in_child=RECORDER.after_fork_in_child)
at_fork("lock classes", after_in_child=_lock_class.after_fork_in_child)
at_fork("outbox", after_in_child=OUTBOX.after_fork_in_child)
at_fork("distributed", after_in_child=DISTRIBUTED.after_fork_in_child)
at_fork("exporter", after_in_child=_exporter_after_fork_in_child)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_before_fork,
        after_in_child=_after_fork_in_child,
        after_in_parent=_after_fork_in_parent,
    )
