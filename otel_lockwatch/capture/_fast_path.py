"""Which lock path runs: the C extension (``_speedups``) or the pure-Python reference.

The choice is made once, at import. The C path exists because on the uncontended path a Python
function call costs more than the bookkeeping it runs; the Python path is the reference, is
written for reading (one routine per step, in ``_bookkeeping``), serves every call the C path
hands back, and owns every slow path. ``LOCKWATCH_DISABLE_EXTENSIONS=1`` keeps to Python (like
wrapt's ``WRAPT_DISABLE_EXTENSIONS``).

The contract between the two, each half declared once beside the Python code it mirrors:

- What the C path takes over: ``LockBase`` / ``RLockBase`` (the bases of ``LockProxy`` /
  ``RLockProxy``: an acquire or ``with`` with the default timeout, the release) and
  ``SectionAcquire`` / ``SectionRelease`` (the instrumented ``StripedSections._acquire`` /
  ``_release``), and on the signal paths ``took`` / ``gave`` (every checkout and checkin),
  ``SemaphoreAcquire`` / ``SemaphoreRelease`` (a watched ``threading.Semaphore`` with a free
  permit) and ``ConditionNotify`` (a watched condition's ``notify``). Any other call (a timeout,
  a worker whose state does not exist yet, lockwatch itself running on the worker, no Python
  caller) is handed, arguments unchanged, to the Python implementation, which finds the same
  caller (a C call pushes no frame).
- What it calls back: the slow paths only (the lock-order check, a wait, a hold at or above the
  metric floor), the current OpenTelemetry context, and the one error path. Each module passes
  its own: ``_bookkeeping`` to ``setup()``, ``_threading`` to ``setup_locks()``, ``_sections``
  to ``setup_sections()``, ``_signal_waits`` to ``setup_signals()``; each call runs when its
  module is imported, before anything of that module can be used.
- What it reads and writes: the ``__slots__`` of ``WorkerState``, ``Stats``, ``Hold``,
  ``ArrayTrack``, ``StripedSections`` and ``SignalStats``, at the offsets of their member
  descriptors, as the interpreter does, for objects of exactly those classes (any other object
  takes ordinary attribute access). The field names come from the tables those calls pass
  (``record._recorder.WORKER_FIELDS`` and ``STATS_FIELDS``, ``_bookkeeping.HOLD_FIELDS``,
  ``_sections.TRACK_FIELDS`` and ``ARRAY_FIELDS``, ``record._signals.SIGNAL_FIELDS``), never from
  C, and C addresses the leading fields of each table by position: renaming a field is one edit
  of its table.
- What it owns: the counters a pair writes, as C integers of ``_speedups.StatsBase`` (the base of
  :func:`new_stats`'s class on this path), named from the ``Stats`` table, with the hold
  histogram's first 512 buckets counted in a fixed C array (``hold_histogram`` reads a new dict
  of them and the rest, and an assignment replaces both); and each
  thread's ``WorkerState``, cached in a C thread-local (read again after a fork).
- Its clock is ``CLOCK_MONOTONIC``, which is ``time.perf_counter_ns()`` on Linux; an error in its
  bookkeeping after the lock changed hands goes to ``OUTBOX.failed``.
- One interpreter owns it (``claim()``): a subinterpreter gets the Python path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._session import at_fork
from .._settings import extensions_disabled
from ..record._recorder import STATS_FIELDS, Stats

__all__ = ["SPEEDUPS", "new_stats", "speedups"]


def _load() -> Any:
    """The C fast path, or None: not built (no compiler, another interpreter or platform), turned
    off with ``LOCKWATCH_DISABLE_EXTENSIONS=1``, or owned by another interpreter."""
    if extensions_disabled():
        return None
    try:
        from . import _speedups
    except ImportError:
        return None
    # Its state is process-wide: one interpreter has it, a subinterpreter runs in Python.
    return _speedups if _speedups.claim() else None


#: The ``_speedups`` module when the uncontended path runs in C, else None.
speedups = _load()
#: True when the uncontended path runs in C; False for the pure-Python path.
SPEEDUPS = speedups is not None
if speedups is not None:
    # The C path caches each thread's WorkerState: in a forked child, the recorder gives the
    # forking thread a fresh one (first in the session's fork order), which it then reads again.
    at_fork("fast path", after_in_child=speedups.forget_states)


def _stats_class() -> Callable[[], Stats]:
    """What makes a worker's :class:`Stats` on this path: the class itself, or on the C path its
    variant whose leading fields (the counters a pair writes) are C integers of ``StatsBase``,
    named from the table by ``setup()``, the rest of the table slots."""
    if speedups is None:
        return Stats

    base: Any = speedups.StatsBase

    class CStats(base):
        __slots__ = STATS_FIELDS[speedups.STATS_OWNED :]
        __init__ = Stats.__init__
        merge = Stats.merge

    return CStats


#: Makes a worker's :class:`Stats` for a lock class (every path that makes one calls this).
new_stats = _stats_class()
