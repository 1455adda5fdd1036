"""The per-thread recorder: what every watched acquisition and release leaves behind.

Each thread (each asyncio task) owns a :class:`WorkerState`: the stack of locks it holds, its
lock-order chain cache, and one :class:`Stats` per lock class it touched. The lock wrappers
write only to the state of the thread they run in, so the hot path takes no process-wide lock
(it would itself become the hot lock); a wait's sites are filed later (``_waits``). A reader (the
manifest, a metric callback) walks every state and merges them: :meth:`Recorder.snapshot`.
Histograms are ``dict`` bucket -> count (``_histogram.bucket_of``); the fields of :class:`Stats`
and :class:`WorkerState` are declared once, in tables that also tell the C path their names.
"""

from __future__ import annotations

import _thread
import logging
import os
import threading
import time
import weakref
from itertools import chain
from time import perf_counter_ns
from types import MappingProxyType
from typing import Any

from ._data import expand_lock_workers, merge_data
from ._distributed import DistributedRecord
from ._handoff_stats import HandoffStats, handoff_parts
from ._live import counter_totals, live_counts
from ._lock_class import ROLES, LockClass
from ._peak import PeakWorkers, ThreadEnd
from ._retired import Fold, compacted, fold_batch
from ._sites import KEEP
from ._state_parts import state_parts, track_section
from ._stats import Stats
from ._threads import ForeignThread, current_thread_or_none
from ._timeline import Timeline
from ._waits import UnfiledWaits
from ._witness import utc_timestamp

__all__ = [
    "MAX_WORKERS",
    "THREAD_FIELDS",
    "WORKER_FIELDS",
    "Recorder",
    "WorkerState",
]

logger = logging.getLogger("otel_lockwatch")

#: Distinct workers kept by name; later ones share one "(other)" entry (bounded cardinality).
MAX_WORKERS = 1024
#: Ended workers whose names have a retired state, folded into it together (one copy of the
#: retired state a batch): the most ended states the recorder keeps besides the retired ones.
FOLD_BATCH = 64


#: The fields of :class:`WorkerState`. The C fast path is given the class with this table; it names
#: the fields it reads and checks that this table has them (``capture._fast_path``).
WORKER_FIELDS = (
    "held",  # held-stack entries, in acquisition order
    "stats",  # lock class -> Stats
    "in_lockwatch",  # True while lockwatch itself runs on this worker: nothing is recorded
    "last",  # its last lock event but a release (perf_counter_ns): see last_event_ns()
    "handoffs",  # lock class -> HandoffStats (record._handoff_stats)
    "first",  # its first
    "worker",  # its name
    "chain",  # the lock-order chain cache: (holding, acquiring) pairs already in the graph
    "spans",  # (lock name, span name) -> spans started under that lock
    "thread",  # the thread or task it belongs to, weakly (a retired state's: one that has ended)
    "retired",  # observed time (ns) of the ended workers folded into this state
    "waiting",  # the lock class this worker is blocked on right now (set by the slow path), or None
)


class WorkerState:
    """What one worker (thread or task) holds and has recorded (fields: :data:`WORKER_FIELDS`)."""

    __slots__ = (*WORKER_FIELDS, "__weakref__")

    def __init__(
        self,
        worker: str,
        stats: dict[LockClass, Stats] | None = None,
        thread: Any = None,
    ) -> None:
        self.held: list[Any] = []
        self.stats: dict[LockClass, Stats] = {} if stats is None else stats
        self.in_lockwatch = False
        self.first = self.last = perf_counter_ns()
        self.worker = worker
        self.chain: set[tuple[LockClass, LockClass]] = set()
        self.spans: dict[tuple[str, str], int] = {}
        self.thread: Any = None if thread is None else weakref.ref(thread)
        self.retired = 0
        self.waiting: LockClass | None = None
        self.handoffs: dict[LockClass, HandoffStats] = {}

    def alive(self) -> bool:
        """Whether the thread or task this state belongs to can still record."""
        owner = self.thread() if self.thread is not None else None
        if owner is None:
            return self.thread is None  # no owner given (a test's state): keep it
        done = getattr(owner, "done", None)
        return not done() if done is not None else owner.is_alive()

    def last_event_ns(self) -> int:
        """The end of the worker's observed life so far: its last lock event. A release notes
        its time in the ``Stats`` it writes anyway (``last_release_ns``), not in ``last`` (a
        new int a release: a fifth of the C path's release); a retired state's is fixed when it
        retires (the statistics folded into it since carry other workers' releases)."""
        last = self.last
        if self.thread is _ended:
            return last
        for s in list(self.stats.values()):
            if s.last_release_ns > last:
                last = s.last_release_ns
        return last

    def retire(self) -> None:
        """Make this ended worker's state its name's retired state, in place: the states of
        its name's later ended workers are folded into a copy of it (``_retired``: its own
        observed time stays ``last - first``; theirs adds to ``retired``). What only a live
        worker uses, and the containers it never wrote, go: each object a retired state keeps
        is one more for the cyclic collector to count and walk."""
        self.last = self.last_event_ns()
        self.thread = _ended
        self.held = _NOTHING_HELD
        self.chain = _NO_CHAIN
        if not self.spans:
            self.spans = _NOTHING_WRITTEN
        if not self.handoffs:
            self.handoffs = _NOTHING_WRITTEN

    def clear(self) -> None:
        """Forget what was recorded, the held stack included (a release of a lock held across
        the reset finds nothing to pop, which is harmless)."""
        self.held.clear()
        self.stats.clear()
        self.chain.clear()
        self.spans.clear()
        self.handoffs.clear()
        self.first = self.last = time.perf_counter_ns()


def _ended() -> None:
    """The owner of a retired state: a weak reference to a worker that has ended."""
    return None


# A retired state's containers in place of those only a live worker writes (shared: nobody writes
# a retired state; a fold writes the copy it makes).
_NOTHING_HELD: Any = ()
_NO_CHAIN: Any = frozenset()
_NOTHING_WRITTEN: Any = MappingProxyType({})  # no spans, no hand-offs


#: What the C fast path reads of the recorder to register a thread and end it
#: (``capture._fast_path``): the same steps as :meth:`Recorder.new_thread_state` and
#: :meth:`Recorder._thread_ended`, on these tables; it checks at set-up that they are named here.
THREAD_FIELDS = (
    "_lock",  # taken to register (blocking) and to end (if free)
    "_by_id",  # the states: a new one put in, an ended one that recorded nothing taken out
    "_names",  # the names given out (MAX_WORKERS, then "(other)")
    "_compact_at",  # a registration at this many states: the Python path's (a compaction)
    "_retired",  # name -> retired state: a name's first ended, retired in place (not counted)
    "_retired_keys",  # and its key's owner
    "_ended",  # a later one: with the ended ones, folded a batch at a time by _fold_ended()
    "peak",  # PeakWorkers (its own PEAK_FIELDS)
    "_fold_ended",
)


class Recorder:
    """The process's recorder (``_session.RECORDER``): worker states, section arrays, pool size, the
    order graph and the distributed record. ``thresholds`` (the session's ``THRESHOLDS``, handed
    in: this layer imports nothing of the session's) gives the snapshot its ``sites_kept``."""

    def __init__(self, thresholds: Any = None) -> None:
        self.thresholds = thresholds
        self.tls = threading.local()
        # Re-entrant, as the order graph's lock: a signal handler or a finalizer may re-enter
        # the recorder (a new thread's registration, a snapshot) from inside it on this thread.
        self._lock = _thread.RLock()
        self._by_id: dict[int, WorkerState] = {}  # every state, in registration order
        self._retired: dict[str, WorkerState] = {}  # worker name -> its retired state
        # worker name -> the state that had its retired state's place in _by_id first: the
        # place's key is its id (kept: the id stays taken, so no new state gets that key)
        self._retired_keys: dict[str, WorkerState] = {}
        # ended workers whose names have a retired state, still in _by_id: folded in batches
        self._ended: list[WorkerState] = []
        self._nothing = WorkerState("(folded)")  # a place being dropped: counts nothing
        self._names: set[str] = set()  # names given out: MAX_WORKERS at most, then "(other)"
        # Fold ended workers away when this many states exist besides the retired ones (at most
        # one a name, MAX_WORKERS + 1: a compaction leaves them as they are).
        self._compact_at = 256
        # tasks of a type without a __dict__ (a custom task factory's): their states, weakly
        self._task_side: weakref.WeakKeyDictionary[Any, WorkerState] = weakref.WeakKeyDictionary()
        self._arrays: list[Any] = []  # ArrayTrack of every instrumented section array
        self.pool_size: int | None = None
        self.pool_source: str | None = None
        self.start_ns = time.time_ns()
        self.graph: Any = None  # LockOrderGraph, set by reset()
        # Lock class name -> how many of its locks were gone while held (their held-stack
        # entries dropped by the order check): lockdep's "held lock freed".
        self.held_locks_freed: dict[str, int] = {}
        self.window_yields = 0  # acquisitions made by yielding: capture._switched_out
        self.peak = PeakWorkers()  # the most workers alive at once
        self.timeline = Timeline()  # wait and hold per class per slice of time, sampled
        # leases, release failures, key templates of the distributed locks (their own lock)
        self.distributed = DistributedRecord()
        self.waits = UnfiledWaits(thresholds)  # waits whose sites and records are to be filed
        self._fold: Fold | None = None  # an ended worker's fold's faster common case: use_fold
        self.reset()

    # -- states ------------------------------------------------------------------------------
    @property
    def states(self) -> list[WorkerState]:
        """Every worker state (a copy, made in one step)."""
        return list(self._by_id.values())

    _states = states

    def _keep(self, states: list[WorkerState], retired: dict[str, WorkerState]) -> None:
        self._by_id = {id(state): state for state in states}
        self._retired = retired
        self._retired_keys = dict(retired)
        self._ended = []

    def reset(self) -> None:
        """Forget everything recorded (tests; a fresh start).

        The thread-local storage is kept (the hot path holds a reference to it): the states of
        live threads and tasks are cleared and stay registered; those of ended ones go.
        """
        from ._order import LockOrderGraph

        # The timeline too: a sample of states read before the reset would count the workers it
        # forgets into the fresh timeline, past the next snapshot's totals (its data refused).
        with self.timeline.exclusive(), self._lock:
            keep = []
            for state in self._states:
                if state.thread is not None and state.alive():
                    state.clear()
                    keep.append(state)
            self._keep(keep, {})
            self._names = {state.worker for state in keep}
            self._compact_at = 256
            self._arrays = []
            self.pool_size = None
            self.pool_source = None
            self.start_ns = time.time_ns()
            self.graph = LockOrderGraph()
            self.held_locks_freed = {}
            self.window_yields = 0
            self.peak.reset(keep)
            self.timeline.reset()
            self.distributed.reset()
            self.waits.clear()

    def register(self, worker: str, owner: Any = None) -> WorkerState:
        """A new state for the worker ``worker`` (its name: past :data:`MAX_WORKERS` names,
        ``(other)``) whose thread or task is ``owner`` (None: a state of no worker); the caller
        has it counted by the peak."""
        lock = self._lock  # (acquire / release: no bound __enter__ / __exit__ made per thread)
        lock.acquire()
        try:
            if len(self._by_id) - len(self._retired) >= self._compact_at:
                self._compact()
            if worker not in self._names:
                if len(self._names) >= MAX_WORKERS:
                    if "(other)" not in self._names:
                        logger.warning(
                            "otel-lockwatch: more than %d workers; later ones are reported as "
                            "'(other)'",
                            MAX_WORKERS,
                        )
                    worker = "(other)"
                self._names.add(worker)
            state = WorkerState(worker, None, owner)
            self._by_id[id(state)] = state
            return state
        finally:
            lock.release()

    def _thread_ended(self, state: WorkerState, generation: int) -> None:
        """A thread ended (its :class:`ThreadEnd`, before a ``join()`` returns). The peak counts
        it down; its state leaves (a thread per request keeps no state per ended thread): a
        name's first becomes its retired state, later ones are folded into it :data:`FOLD_BATCH`
        at a time, their waits filed first (``_waits``). One that ended holding a lock stays
        until a compaction, as does one that ends while another thread has the recorder or
        files (never waited for: a forked child's fork handlers run after the interpreter cleared
        the other threads' locals; a lock's holder may be gone)."""
        self.peak.ended(state, generation)
        if not self._lock.acquire(False):
            return
        try:
            if state.held or self._by_id.get(id(state)) is not state:
                return  # (or gone already: a reset, a compaction, a fork)
            if not (state.stats or state.spans or state.handoffs):
                del self._by_id[id(state)]  # it recorded nothing (lockwatch's own threads)
                return
            if state.worker not in self._retired:
                state.retire()
                self._retired[state.worker] = self._retired_keys[state.worker] = state
                return
            self._ended.append(state)
            if len(self._ended) >= FOLD_BATCH:
                self._fold_ended()
        finally:
            self._lock.release()

    def use_fold(self, common: Fold | None) -> None:
        """Fold ended workers with ``common`` first (``_retired.Fold``: the C path gives its
        own, which adds its C ``Stats`` in C); None: the Python fold alone."""
        self._fold = common

    def _fold_ended(self) -> None:
        """Fold the ended states waiting in ``_ended`` into their names' retired states, unless a
        filer is at work (then the next end tries again). Under ``self._lock``."""
        if self.waits.file(blocking=False):
            ended, self._ended = self._ended, []
            fold_batch(
                ended, self._retired, self._retired_keys, self._by_id, self._nothing, self._fold
            )

    def _compact(self) -> None:
        """Fold the states of ended threads and tasks into one retired state per worker name, so
        that memory follows the live workers, not every thread a process ever started
        (:func:`_retired.compacted`). Under ``self._lock``; not while a filer is at work."""
        if not self.waits.file(blocking=False):
            return
        keep, retired = compacted(self._states, self._retired, self._fold)
        self._keep(keep, retired)
        self._compact_at = max(256, 2 * (len(keep) - len(retired)))

    def thread_state(self) -> WorkerState:
        """The calling thread's state, created on first use."""
        try:
            return self.tls.st
        except AttributeError:
            return self.new_thread_state()

    def new_thread_state(self) -> WorkerState:
        """The calling thread's state, made now: it has none (the lock paths ask this once they
        found none, rather than :meth:`thread_state`, which would look again). Its
        :class:`ThreadEnd` goes in the thread's locals with it."""
        tls = self.tls
        thread: Any = current_thread_or_none()
        if thread is None:  # a foreign thread: see ForeignThread
            thread = tls.token = ForeignThread(_thread.get_ident())
        state = self.register(thread.name, thread)
        tls.alive = ThreadEnd((self._thread_ended, state, self.peak.started(state)))
        tls.st = state
        return state

    def task_state(self, task: Any) -> WorkerState:
        """The state of an asyncio task (a task is a worker)."""
        state = getattr(task, "_lockwatch_state", None)
        if state is None:
            state = self._task_side.get(task)
        if state is None:
            try:
                name = task.get_name()
            except Exception:
                name = repr(task)
            state = self.register(f"task:{name}", task)
            self.peak.task_started(state, task)
            try:
                task._lockwatch_state = state
            except AttributeError:  # a task type without __dict__: keep a side table
                self._task_side[task] = state
        return state

    def after_fork_in_child(self) -> None:
        """In a forked child (the session's fork handler, first of the parts)."""
        # The child has one thread: the one that forked. Locks it holds stay held; every other
        # thread's state is gone, and the child's manifest must hold only the child's work.
        self._lock = _thread.RLock()
        current = getattr(self.tls, "st", None)
        self._keep([], {})
        self._names = set()
        self._compact_at = 256
        self.start_ns = time.time_ns()
        if self.graph is not None:
            self.graph._lock = _thread.RLock()
        if current is not None:
            fresh = WorkerState(current.worker, thread=threading.current_thread())
            fresh.held = current.held
            fresh.chain = current.chain
            self._by_id[id(fresh)] = fresh
            self._names.add(fresh.worker)
            self.tls.st = fresh
        self.peak.after_fork_in_child(self.tls.st if current is not None else None)
        self.timeline.after_fork()
        self.waits.after_fork_in_child()

    def exclusive(self) -> Any:
        """The recorder, held for a ``with`` block (re-entrant): while it is held, no worker
        registers, no ended thread's state is folded (its thread ends without waiting: the
        state stays until a compaction) and no compaction runs. For a reader that needs the
        set of states to stay put, and for a test of what happens while another thread has the
        recorder (a fork: the child's recorder starts with a lock of its own)."""
        return self._lock

    def note_array(self, track: Any) -> None:
        """Remember a section array's tracking (its count and the most sections held at once)."""
        with self._lock:
            self._arrays.append(track)

    def note_pool(self, size: int, source: str) -> None:
        if isinstance(size, int) and size > 0 and (self.pool_size is None or size > self.pool_size):
            self.pool_size = size
            self.pool_source = source

    # -- reading -----------------------------------------------------------------------------
    def totals(self) -> dict[tuple[str, str, str], int]:
        """Counter totals by (lock name, kind, outcome); contentions as outcome "contended"."""
        return counter_totals(self._states)

    def sample_timeline(self, periodic: bool = False) -> dict[str, Any]:
        """Sample every worker's totals into the timeline (the emitter's tick, each snapshot),
        the states read under its lock: a reset (which holds it) is wholly before or after."""
        with self.timeline.exclusive():
            return self.timeline.sample_states(self._states, periodic)

    def live(self) -> dict[tuple[str, str], tuple[int, int]]:
        """Workers waiting on and holding each lock class right now (see ``_live``)."""
        return live_counts(self._states)

    def snapshot(self) -> dict[str, Any]:
        """The mergeable data of a manifest (see docs/ARCHITECTURE.md, "Recorder snapshot").

        One data part per worker state and per (worker, lock class) statistics, merged by
        ``_data.merge_data`` (the routine that merges manifests too); then what belongs to the
        process: its section arrays, lock-order graph, pool size and identity.
        """
        self.waits.file()  # every wait's sites, before anything is read
        now = time.perf_counter_ns()
        timeline = self.sample_timeline()  # before the totals are read: never ahead of them
        states = [state for state in self._states if state.stats]  # else: not a worker
        tracks = list(self._arrays)
        data = merge_data(
            chain(
                chain.from_iterable(state_parts(state, now) for state in states),
                ({"sections": {t.name: track_section(t)}} for t in tracks),
                handoff_parts(states),
            ),
            KEEP if self.thresholds is None else self.thresholds.sites_kept,
        )
        self.distributed.attach(data["locks"])  # key templates, leases, release failures
        expand_lock_workers(data)
        sections = data["sections"]
        for state in states:  # contended waits on a colliding key, joined to the arrays
            for cls, s in list(state.stats.items()):
                if s.collisions and cls.name in sections:
                    sections[cls.name]["collision_waits"] += s.collisions
        data["lock_order"] = (
            self.graph.to_json() if self.graph is not None else {"edges": [], "cycles": []}
        )
        for name in data["locks"].keys() & ROLES.keys():
            data["locks"][name]["role"] = ROLES[name]
        data.update(timeline)
        data["pool"] = {"nominal": self.pool_size, "source": self.pool_source}
        data["pool"]["peak_workers"] = self.peak.peak()
        data["process"] = {
            "pid": os.getpid(),
            "start": utc_timestamp(self.start_ns),
            "end": utc_timestamp(),
        }
        return data
