"""The most workers alive at once: the nominal pool size when nothing configured one.

Ten batches of four threads, one batch after the other, are a pool of four, not of forty: what
sizes a pool is how many workers run side by side, not how many ever existed. A worker is
*alive* from its first watched acquisition (when the recorder registers it) to its end:

- a thread ends when its thread-local storage is cleared, which the interpreter does as the
  thread finishes, before a ``join()`` returns: a token kept in the recorder's thread-locals
  counts the thread down as it goes (no polling, nothing on the lock path);
- an asyncio task ends when it is done (a done callback).

The count is kept under a lock of its own, taken only when a worker starts or ends (and when a
snapshot reads it), never on the lock path; counting walks the live workers, so a thread's start
and end cost a few nanoseconds per live thread. The lock is re-entrant: a thread's end may run
while that thread is inside it (a finalizer). A reset starts the count again from zero (the
workers alive then count again once they record something); a forked child starts from its one
thread.
"""

from __future__ import annotations

import _thread
from functools import partial
from typing import Any

__all__ = ["PeakWorkers"]


class _Alive:
    """Kept in a thread's locals: freed when the thread ends, and counts it down then."""

    __slots__ = ("peak", "state", "generation")

    def __init__(self, peak: PeakWorkers, state: Any, generation: int) -> None:
        self.peak = peak
        self.state = state
        self.generation = generation

    def __del__(self) -> None:
        try:
            self.peak.ended(self.state, self.generation)
            self.peak.thread_ended(self.state)
        except Exception:  # at interpreter shutdown: nothing left to count
            pass


class PeakWorkers:
    """Counts the workers alive, and keeps the most seen at once.

    Only a state that recorded something is a worker (lockwatch's own threads register states
    too, to mark themselves busy): the count is taken over the live states whenever one ends (the
    ending one still counted) and when the peak is read, so the moment the most workers are alive
    is seen by the first end after it at the latest. (Not when one starts: a state registers
    before it records anything, so it adds nothing to the count then.)
    """

    def __init__(self, thread_ended: Any = None) -> None:
        #: Called with a thread's state when the thread ends (the recorder folds it away).
        self.thread_ended = thread_ended or (lambda state: None)
        self._lock = _thread.RLock()
        self._generation = 0
        self._live: dict[int, Any] = {}  # id(state) -> state, registered since the last reset
        self._kept: list[Any] = []  # states alive at the last reset or fork
        self._peak = 0

    def started(self, state: Any, owner: Any, tls: Any) -> None:
        """``state`` was registered: ``owner`` is its thread (whose locals are ``tls``, the
        caller's) or its asyncio task; None for a state of no worker (folded ones)."""
        if owner is None:
            return
        with self._lock:
            self._live[id(state)] = state
            generation = self._generation
        if hasattr(owner, "add_done_callback"):  # an asyncio task
            owner.add_done_callback(partial(self._task_done, state, generation))
        else:
            tls.alive = _Alive(self, state, generation)

    def _task_done(self, state: Any, generation: int, task: Any) -> None:
        self.ended(state, generation)

    def ended(self, state: Any, generation: int) -> None:
        with self._lock:
            if generation == self._generation:  # else: registered before a reset
                self._bump()
                self._live.pop(id(state), None)

    def _bump(self) -> None:
        # Under the lock. A worker alive at the last reset counts again once it records.
        n = sum(1 for state in list(self._live.values()) if state.stats)
        n += sum(1 for state in self._kept if state.stats and state.alive())
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
