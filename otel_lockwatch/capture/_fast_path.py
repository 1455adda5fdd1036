"""Which lock path runs, the C extension (``_speedups``) or the pure-Python reference, and the
contract between them: written here once (``docs/ARCHITECTURE.md`` and the C file point here),
and held to by ``tests/test_fast_path_contract.py`` on each path.

The choice is made once, at import. The C path exists because on the uncontended path a Python
function call costs more than the bookkeeping it runs; the Python path is the reference, is
written for reading (one routine per step, in ``_bookkeeping``), serves every call the C path
hands back, and owns every slow path. ``LOCKWATCH_DISABLE_EXTENSIONS=1`` keeps to Python (like
wrapt's ``WRAPT_DISABLE_EXTENSIONS``).

The contract:

- What the C path takes over: ``LockBase`` / ``RLockBase`` (the bases of ``LockProxy`` /
  ``RLockProxy``: an acquire or ``with`` with the default timeout, its wait when the try failed,
  the release) and
  ``SectionAcquire`` / ``SectionRelease`` (the instrumented ``StripedSections._acquire`` /
  ``_release``: method descriptors with ``__wrapped__``, so ``unwrap`` restores them like a
  function), and on the hand-off paths ``took`` / ``gave`` (every checkout and checkin),
  ``SemaphoreAcquire`` / ``SemaphoreRelease`` (a watched ``threading.Semaphore`` with a free
  permit) and ``ConditionNotify`` (a watched condition's ``notify``). Any other call (a timeout,
  a worker whose state does not exist yet, lockwatch itself running on the worker, no Python
  caller) is handed, arguments unchanged, to the Python implementation, which finds the same
  caller (a C call pushes no frame).
- What it calls back: the slow paths only, each with one event whose fields have names (a
  struct sequence, never an argument list whose order both sides must agree on): the
  lock-order check on a chain-cache miss, a section's wait and, before a lock proxy's wait, its
  look for a holder inside lockwatch's window (``_switched_out.window_event``) get an
  ``Acquisition`` (:data:`ACQUISITION_FIELDS`; a field a path has no use for is None), a hold
  at or above the metric floor a ``Release`` (:data:`RELEASE_FIELDS`); ``_bookkeeping``'s,
  ``_switched_out``'s and ``_sections``' ``*_event`` functions receive them and call the Python
  path's routines. A lock proxy's wait itself is C (the lock's own blocking acquire, the counts,
  one tuple of ``record._waits.UNFILED_FIELDS`` appended to ``RECORDER.waits``, as the Python
  path's ``record_wait`` appends it). A release whose hold
  is below the span threshold (not a section's, once the process's outbox has started) does not
  call back: the C path queues its record itself, the tuple of ``_outbox.RECORD_FIELDS`` that
  ``Outbox.put`` makes. A thread's first acquisition registers its state itself (what
  ``RECORDER.new_thread_state()`` does, on the recorder's tables: ``record._recorder.THREAD_FIELDS``
  and ``record._peak.PEAK_FIELDS`` name what it reads, ``setup_threads()`` checks they do) and
  keeps a ``_speedups.ThreadEnd`` in the thread's locals, whose deallocation at the thread's end
  does ``Recorder._thread_ended``'s common case; both call ``new_thread_state()``,
  ``PeakWorkers.ended`` (the exact count) and ``Recorder._fold_ended()`` (a batch) for what
  they leave to Python (a thread ``threading`` does not know, a compaction, the first
  ``(other)``). A worker's first acquisition of a lock class calls :func:`new_stats`, then goes
  on in C. Besides: a worker's
  first ``HandoffStats`` of a class (``handoff_stats(state, lock_class)``), the current
  OpenTelemetry context when it is not the SDK's ``ContextVar``, and the one error path
  (``OUTBOX.failed``: an error in its bookkeeping after the lock changed hands goes there, never
  to the host; the lock's own results and exceptions pass through unchanged). Each module passes
  its own: ``_bookkeeping`` to ``setup()`` and ``setup_threads()``, ``_threading`` to
  ``setup_locks()``, ``_sections`` to ``setup_sections()``, ``_handoffs`` to
  ``setup_handoffs()``; each call runs when its module is imported, before anything of that
  module can be used.
- The held stack (``WorkerState.held``): one :data:`HeldEntry` per hold, in acquisition order,
  read by field name (:data:`HELD_ENTRY_FIELDS`; the C path's is a struct sequence, the Python
  path's :class:`PyHeldEntry`, both made as ``HeldEntry((lock_class, frame, lasti, lock,
  canonical))``). **Both paths push an entry once the lock is taken**, after the raw acquire
  succeeded and before the hold's notes, and pop it after the raw release; never for a try that
  failed, never while the worker waits (``WorkerState.waiting`` says that). So a reader of
  another worker's stack (the live gauges, a snapshot) never finds a lock the worker does not
  hold or only tries or waits for, and a signal handler or finalizer that runs on the worker
  around its raw acquire never orders its own acquisitions after a lock the worker does not
  hold. A reader may miss a hold for the few instructions before its push, or see it a moment
  after its release. The C path makes no new entry for a ``Lock`` whose last entry nothing else
  refers to (its frame and offset are set in place), but on the free-threaded build, where
  another thread may be reading it (``_speedups.c``'s header). **Nothing of a holder outlives
  its hold**: after the release and its bookkeeping, the hold's ``_lw_entry`` is None on both
  paths, or (C, GIL build, kept for that reuse) an entry whose ``frame`` is None. A frame kept
  alive past its call keeps the call's locals (``tests/test_lifetimes.py``); a waiter that
  arrived during the hold keeps its own reference to the entry, and so the holder's site.
- What it reads and writes: every field a release needs is read before the raw release (another
  thread may take the lock, and overwrite them, the moment it is free). It reads and writes
  fields of ``WorkerState``, ``Stats``, ``Hold``, ``ArrayTrack``, ``StripedSections`` and
  ``HandoffStats`` by name (each named once in C, beside the constant it is read by; the setup
  calls pass the classes, with their tables of field names, which must name each: a field's
  place in its table does not matter), at the offsets of their member descriptors, as the
  interpreter does, for objects of exactly those classes (any other object takes ordinary
  attribute access). A C proxy keeps its hold in members of :data:`_bookkeeping.HOLD_FIELDS`'
  names, as a Python hold does. ``speedups.direct_slots()`` lists what it reads.
- What it owns: the counters a pair and a lock proxy's wait write (``_speedups.STATS_OWNED``, by
  name: a prefix of ``STATS_FIELDS``), as C integers
  of ``_speedups.StatsBase`` (the base of :func:`new_stats`'s class on this path), with the hold
  histogram's first 512 buckets counted in a fixed C array (``hold_histogram`` reads a new dict
  of them and the rest, and an assignment replaces both); the rest of the Stats table is
  members of ``StatsBase`` too, so a new Stats is made whole in C (``Stats.__init__``'s values,
  ``_speedups.NO_SAMPLE`` the minimums', checked equal to the recorder's at import), and a
  merge adds the owned counters and the hold histogram in one C call (``add_owned``); and each
  thread's ``WorkerState``,
  cached under a pthread key, read once from ``RECORDER.tls`` per thread (and thread state),
  again after ``forget_states()``; an ended thread's entry is released by the next thread that
  reads its own.
- Its state is its module's (PEP 489: ``PyModule_GetState``; every type made from a spec; a lock
  proxy and a section function keep a pointer to it, which their type keeps alive): no mutable
  state at file level. A subinterpreter imports a module of its own, with its own state, and
  runs the C path on it.
- A fork: the child calls ``speedups.forget_states()`` after the recorder's own after-fork
  routine, before any watched lock is taken there (every thread reads its ``WorkerState`` anew,
  and the deferrals of the threads the fork left behind are closed). It is registered here.
- On 3.11 and 3.12 it takes a ``_thread.lock`` or ``_thread.RLock`` (by a thread that does not
  own it) without calling its ``acquire``: what ``acquire(False)`` does, on the lock object's
  fields (CPython's layout, checked on a real lock at import; on a mismatch, and from 3.13, the
  method is called).
- Its clock is ``CLOCK_MONOTONIC``, which is ``time.perf_counter_ns()`` on Linux.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import itemgetter
from typing import Any

try:  # the field descriptor of collections.namedtuple: a C getter, no Python call per read
    from _collections import _tuplegetter  # type: ignore[import-not-found]
except ImportError:  # another interpreter: a property over an itemgetter (~60 % slower a read)

    def _tuplegetter(index: int, doc: str) -> Any:
        return property(itemgetter(index), doc=doc)


from .._session import RECORDER, at_fork
from .._settings import extensions_disabled
from ..record._stats import NO_SAMPLE, STATS_FIELDS, STATS_TABLE, Stats

__all__ = [
    "ACQUISITION_FIELDS",
    "HELD_ENTRY_FIELDS",
    "RELEASE_FIELDS",
    "SPEEDUPS",
    "HeldEntry",
    "PyHeldEntry",
    "new_stats",
    "speedups",
]

#: The fields of a held-stack entry, in order (``HeldEntry``): read by name everywhere.
HELD_ENTRY_FIELDS = ("lock_class", "frame", "lasti", "lock", "canonical")
#: The fields of the event the C path passes to a slow path of an acquisition (the order check,
#: a wait): ``_speedups.Acquisition``.
ACQUISITION_FIELDS = (
    "worker",  # the worker's WorkerState
    "stats",  # its Stats for the lock's class (None for the order check)
    "lock_class",
    "frame",  # the acquisition site's frame
    "lock",  # the raw lock to wait on (None for a section, and for the order check)
    "hold",  # the object that keeps the hold: a lock proxy, or a section array
    "canonical",  # taken by lock_many in canonical order
    "timeout",  # a wait's timeout
    "index",  # a section's wait: the section's index, its key and the array's own _acquire
    "key",
    "original",
)
#: The fields of the event the C path passes to the slow path of a release (a hold at or above
#: the metric floor): ``_speedups.Release``.
RELEASE_FIELDS = ("worker", "entry", "start_ns", "end_ns", "context", "index")


class PyHeldEntry(tuple):
    """A held-stack entry on the pure-Python path: ``HeldEntry((lock_class, frame, lasti, lock,
    canonical))``, read by name (the fields of :data:`HELD_ENTRY_FIELDS`).

    A tuple made by the type's own constructor from one tuple, as the C path's struct sequence
    is: ``tuple.__new__`` costs ~90 ns more than a tuple display, where a ``NamedTuple``'s
    ``__new__`` (a Python function) or a ``__slots__`` class's ``__init__`` cost 370-600 ns on
    every acquisition of the pure path (``tuple.__new__(PyHeldEntry, ...)`` bound once is no
    faster than the type's call). Its fields are read through ``collections.namedtuple``'s C
    descriptor (``_tuplegetter``): 21 ns a read, against 33 ns for a ``property`` over an
    ``itemgetter`` and 19 ns for an index (the thread's CPU time, best of 25 interleaved
    rounds of 10^5, Python 3.11).
    """

    __slots__ = ()
    __match_args__ = ("lock_class", "frame", "lasti", "lock", "canonical")  # HELD_ENTRY_FIELDS
    lock_class: Any = _tuplegetter(0, "The lock's class (``LockClass``).")
    frame: Any = _tuplegetter(1, "The frame that acquired it.")
    lasti: int = _tuplegetter(2, "Its instruction offset then (``f_lasti``).")
    lock: Any = _tuplegetter(3, "The object that keeps the hold (its identity).")
    canonical: bool = _tuplegetter(4, "Taken by ``lock_many`` in canonical order.")


def _load() -> Any:
    """The C fast path, or None: not built (no compiler, another interpreter or platform), or
    turned off with ``LOCKWATCH_DISABLE_EXTENSIONS=1``."""
    if extensions_disabled():
        return None
    try:
        from . import _speedups
    except ImportError:
        return None
    # A build older than this file (its Stats' defaults are C's): the Python path.
    return _speedups if getattr(_speedups, "NO_SAMPLE", None) == NO_SAMPLE else None


#: The ``_speedups`` module when the uncontended path runs in C, else None.
speedups = _load()
#: True when the uncontended path runs in C; False for the pure-Python path.
SPEEDUPS = speedups is not None
#: The type of a held-stack entry on this path (the C path's struct sequence, or
#: :class:`PyHeldEntry`): every path that pushes an entry makes it with this.
HeldEntry: Any = PyHeldEntry if speedups is None else speedups.HeldEntry
if speedups is not None:
    # The C path caches each thread's WorkerState: in a forked child, the recorder gives the
    # forking thread a fresh one (first in the session's fork order), which it then reads again.
    at_fork("fast path", after_in_child=speedups.forget_states)


def _stats_class() -> Callable[[], Stats]:
    """What makes a worker's :class:`Stats` on this path: the class itself, or on the C path its
    variant whose counters a pair writes (``_speedups.STATS_OWNED``) are C integers of
    ``StatsBase``, which has the rest of the table as members too and makes a new one whole
    (the values of ``Stats.__init__``, with no Python call)."""
    if speedups is None:
        return Stats
    base: Any = speedups.StatsBase
    not_owned = tuple((name, how) for name, how in STATS_TABLE if name not in speedups.STATS_OWNED)

    class CStats(base):
        __slots__ = tuple(name for name in STATS_FIELDS if not hasattr(base, name))

        def merge(self, other: Stats) -> None:
            # The owned counters and the hold histograms in C (bucket by bucket), where both
            # are C Stats; else every field as Python reads it.
            Stats.merge(self, other, not_owned if self.add_owned(other) else STATS_TABLE)

    return CStats


#: Makes a worker's :class:`Stats` for a lock class (every path that makes one calls this).
new_stats = _stats_class()
if speedups is not None:
    # An ended thread's fold into its name's retired state: its C Stats added in C.
    RECORDER.use_fold(speedups.fold)
