"""The most workers alive at once: the nominal pool size when nothing configured one.

Ten batches of four threads, one batch after the other, are a pool of four, not of forty: what
sizes a pool is how many workers run side by side, not how many ever existed. A worker is
*alive* from its first watched acquisition (when the recorder registers it) to its end:

- a thread ends when its thread-local storage is cleared, which the interpreter does as the
  thread finishes, before a ``join()`` returns: the recorder's :class:`ThreadEnd` kept in its
  thread-locals counts the thread down as it goes, and has its state folded away (no polling,
  nothing on the lock path: one hook per thread);
- an asyncio task ends when it is done (a done callback).

A worker's start and end add it to and take it from the live ones (a dict store, a pop: no lock);
an end counts the live workers that recorded something (on a copy: no lock), and only when that
passes the peak (an upper bound: those kept from the last reset are counted without asking
whether they are alive) is the exact count taken, under a lock of the peak's own, as when a
snapshot reads it; never on the lock path. So a thread's end costs a few nanoseconds per live
thread, and a lock's acquire and release only when the peak may grow. The lock is re-entrant: a
thread's end may run while that thread is inside it (a finalizer). A reset starts the count
again from zero (the workers alive then count again once they record something); a forked child
starts from its one thread.
"""

from __future__ import annotations

import _thread
import sys
from functools import partial
from typing import Any

__all__ = ["PEAK_FIELDS", "PeakWorkers", "ThreadEnd"]

#: What the C fast path reads of :class:`PeakWorkers` to start and end a thread it registers
#: (``record._recorder.THREAD_FIELDS``): the same steps as :meth:`PeakWorkers.started` and
#: :meth:`PeakWorkers.ended`, whose exact count (under the lock) it leaves to ``ended``.
PEAK_FIELDS = ("_live", "_generation", "_peak", "_kept", "ended")


class ThreadEnd(tuple):
    """``ThreadEnd((ended, state, generation))``: kept in a thread's locals, freed when the
    thread ends, and calls ``ended(state, generation)`` then (the recorder's one hook per thread:
    it counts the thread down here and folds its state away). A tuple made by the type's own C
    constructor: no Python ``__init__`` per thread."""

    __slots__ = ()

    def __del__(self) -> None:
        # Not while the interpreter finalizes (the main thread's locals are freed then): nothing
        # is left to count, and the count's lock may be held by a thread that can never run again
        # (the free-threaded build parks one that tries to, forever: a hang at exit, December 2026).
        if sys.is_finalizing():
            return
        try:  # noqa: SIM105 (suppress() would cost a context manager per thread)
            self[0](self[1], self[2])
        except Exception:  # (a thread's end reports nothing: the C ThreadEnd clears its errors)
            pass


class PeakWorkers:
    """Counts the workers alive, and keeps the most seen at once.

    Only a state that recorded something is a worker (lockwatch's own threads register states
    too, to mark themselves busy): the count is taken over the live states whenever one ends (the
    ending one still counted) and when the peak is read, so the moment the most workers are alive
    is seen by the first end after it at the latest. (Not when one starts: a state registers
    before it records anything, so it adds nothing to the count then.)
    """

    def __init__(self) -> None:
        self._lock = _thread.RLock()
        self._generation = 0
        self._live: dict[int, Any] = {}  # id(state) -> state, registered since the last reset
        self._kept: list[Any] = []  # states alive at the last reset or fork
        self._peak = 0

    def started(self, state: Any) -> int:
        """``state`` was registered for a worker: the generation to end it with (a thread's
        :class:`ThreadEnd`, which the recorder keeps in its locals, calls :meth:`ended` with
        it; a task's, :meth:`task_started`)."""
        # Stored before the generation is read: a reset in between leaves the state out of the
        # new live ones (it is among the kept ones: the recorder registered it first), and its
        # end pops nothing.
        self._live[id(state)] = state
        return self._generation

    def task_started(self, state: Any, task: Any) -> None:
        """``state`` was registered for the asyncio task ``task``: counted down when it is
        done."""
        task.add_done_callback(partial(self._task_done, state, self.started(state)))

    def _task_done(self, state: Any, generation: int, task: Any) -> None:
        self.ended(state, generation)

    def ended(self, state: Any, generation: int) -> None:
        if generation != self._generation:
            return  # registered before a reset
        # At most the workers alive now, the ending one still counted; only when that may pass
        # the peak is the exact count taken, under the lock.
        if self._count(exact=False) > self._peak:
            lock = self._lock  # (acquire / release: no bound __enter__ / __exit__ made)
            lock.acquire()
            try:
                if generation == self._generation:
                    self._bump()
            finally:
                lock.release()
        self._live.pop(id(state), None)

    def _count(self, exact: bool) -> int:
        """The workers alive that recorded something: those registered since the last reset (a
        copy of them: starts and ends take no lock) and those kept from it (a worker alive then
        counts again once it records), asked whether they are still alive when ``exact`` (else
        an upper bound)."""
        n = 0
        for state in self._live.copy().values():
            if state.stats:
                n += 1
        for state in self._kept:
            if state.stats and (not exact or state.alive()):
                n += 1
        return n

    def _bump(self) -> None:
        # Under the lock.
        n = self._count(exact=True)
        if n > self._peak:
            self._peak = n

    def peak(self) -> int:
        """The most workers alive at once since the last reset."""
        with self._lock:
            self._bump()
            return self._peak

    def reset(self, kept: list[Any]) -> None:
        """Start again; ``kept`` are the states of the workers still alive."""
        with self._lock:
            self._generation += 1
            self._live = {}
            self._kept = list(kept)
            self._peak = 0

    def after_fork_in_child(self, current: Any) -> None:
        """In a forked child: only ``current`` (the forking thread's state, or None) is left."""
        self._lock = _thread.RLock()
        self._generation += 1
        self._live = {}
        self._kept = [current] if current is not None else []
        self._peak = 0
