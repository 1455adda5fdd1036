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
- Its clock is ``CLOCK_MONOTONIC``, which is ``time.perf_counter_ns()`` on Linux; an error in its
  bookkeeping after the lock changed hands goes to ``OUTBOX.failed``.
- One interpreter owns it (``claim()``): a subinterpreter gets the Python path.
"""

from __future__ import annotations

from typing import Any

from .._settings import extensions_disabled

__all__ = ["SPEEDUPS", "speedups"]


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
