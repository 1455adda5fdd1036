"""The lock-order graph: which lock classes were taken while holding which, and the cycles.

Lock classes are names. When a worker that holds a lock of class ``A`` blocks to acquire one of
class ``B``, the program has shown the order ``A -> B``. If it also shows ``B -> A`` (in another
worker, or another run of the same code path), two workers can each hold one and wait for the
other: a deadlock that did not happen this time but another schedule makes happen. The graph keeps
every order seen as an edge, with its first example (the *witness*), and reports each cycle when
the edge that closes it arrives, before any deadlock.

Public surface, over three modules (``otel_lockwatch.record``)::

    _order.LockOrderGraph(max_classes=4096, max_edges=65536, max_cycles=1024)
        .add_edge(holding, acquiring, witness) -> Cycle | None
        .would_close_cycle(holding, acquiring, witness) -> Cycle | None
        .witness(a, b)  .edges()  .cycles()  len(graph)
        .truncated  .max_classes  .max_edges  .max_cycles
        .to_json() -> {"edges": [...], "cycles": [...]}    .from_json(d, ...)
    _witness.EdgeWitness(holding, acquiring, worker, sites, at, trace_id, span_id)
        .to_json() -> dict            .from_json(d) -> EdgeWitness
    _witness.Cycle(locks, edges)      # edge i goes locks[i] -> locks[(i + 1) % n]
        .to_json() -> {"cycle": [...], "edges": [...]}     .from_json(d)
        .from_edges(witnesses)        # validates the chain, rotates to the canonical start
        .format() -> str              # lockdep-style report (also str(cycle))
    _witness.utc_timestamp(ns=None) -> str                 # "2026-11-30T02:40:00.123Z"
    _cycles.find_cycles(edges, max_cycles=1024) -> list[Cycle]     # offline, canonical
    _cycles.merge_order_data(datas, max_cycles=1024) -> {"edges": [...], "cycles": [...]}

This module is the live graph; the witness and cycle values are in ``_witness``, the offline
search and the merge in ``_cycles``. The notes below cover all three.

Design notes
============

Sources
-------
* Linux lockdep (``Documentation/locking/lockdep-design.rst``, ``kernel/locking/lockdep.c``):
  locks are grouped into *classes*, a dependency ``prev -> next`` is recorded when ``next`` is
  acquired with ``prev`` held, and ``check_noncircular()`` searches the existing dependencies
  breadth-first from ``next`` for ``prev`` before the new one is added. lockdep keeps the first
  stack trace of each dependency, reports each problem once, and caches the chains of held locks
  it has already validated (the *chain cache*), so a repeated nesting costs a hash lookup.
* Guava's ``CycleDetectingLockFactory``: each lock node keeps its allowed prior locks with an
  ``ExampleStackTrace`` (the first example only) and its disallowed ones; a new order triggers a
  search for the reverse path; the ``Policies`` ``THROW`` / ``WARN`` / ``DISABLED`` are the model of
  ``OTEL_PYTHON_LOCKWATCH_ON_CYCLE``. ``THROW`` refuses the acquisition before it blocks, which is
  what :meth:`LockOrderGraph.would_close_cycle` serves. ThreadSanitizer's deadlock detector
  reports the same "lock-order-inversion" from one run.

Algorithm
---------
The graph is an adjacency map ``holding -> {acquiring: witness}`` in insertion order. For a new
edge ``u -> v`` :meth:`~LockOrderGraph.add_edge` runs a breadth-first search from ``v`` over the
recorded edges looking for ``u``. Found: the BFS path ``v ~> u`` is a shortest one, so
``u -> v ~> u`` is the shortest cycle through the new edge (when the edge closes several cycles,
that is the one reported). ``u == v`` is a cycle of length 1 (see *self-edges*). The edge is then
recorded whatever the answer: the graph holds every order seen, cyclic or not.

Reported once: a simple cycle's lock sequence determines its edges, and one of them is the new
edge, which no earlier cycle could contain; the reported cycles are also kept in a set keyed by
their canonical lock tuple, so a cycle restored by :meth:`~LockOrderGraph.from_json` is not
reported again. An existing edge returns ``None`` at once, and its later witnesses are dropped.

A cycle is written from its lexicographically smallest lock name (*canonical rotation*: the names
of a simple cycle are distinct, so the start is unique), so ``A -> B -> A`` found from ``A`` or
from ``B`` is one cycle. ``A -> B -> C -> A`` and ``A -> C -> B -> A`` are two different cycles.

Offline (``_cycles``: :func:`~._cycles.find_cycles`, used by
:func:`~._cycles.merge_order_data`), the cycles are a function of the edge *set*, not of the
order the edges came in: Tarjan's strongly connected components, then for each edge inside a
cyclic component, in sorted order, the shortest cycle through it (BFS inside the component,
successors in sorted order), deduplicated and sorted by ``(length, names)``. Every edge
that lies on any cycle is therefore shown in at least one reported cycle, and merging is
commutative and associative: the union of edge sets is, the witness of an edge is the minimum of
its candidates under a total order (earliest ``at``, then the canonical JSON), and the cycles are
recomputed from the union, never carried over from the inputs. ``A -> B`` seen in one process and
``B -> A`` in another is a cycle of the merge.

What a witness is
-----------------
:class:`~._witness.EdgeWitness` is the first example of an edge: who (``worker``: a thread name, or
``task:<name>``), where (``sites``: the holding lock's acquisition site and the acquiring site,
each ``"module:function:line"``), when (``at``: ISO-8601 UTC with milliseconds), and in which
trace (``trace_id``, 32 hex digits, and ``span_id``, 16, of the span current at the acquisition,
or ``None``). It answers "where does my code take B while holding A?", which is what a fix needs.

Rules the caller applies before calling the graph
-------------------------------------------------
The graph knows only edges; the per-worker held-lock stacks (``_recorder.py``, fed by the lock
paths in ``capture/``: ``_bookkeeping.py`` and the C fast path) decide which acquisitions make
them, as lockdep and ThreadSanitizer do:

* a blocking acquire of ``B`` adds ``H -> B`` for *each* lock ``H`` held by the worker (not only
  the top of the stack: a lock taken by a try-acquire between them would hide ``H -> B``);
* a non-blocking try-acquire adds no edge *to* the tried lock (it cannot block), but once held it
  is on the stack and orders the next blocking acquire;
* re-entering an RLock already held by the worker adds nothing;
* ``Condition.wait()`` takes its lock off the stack for the duration of the wait;
* a lock released before the next acquire is off the stack and leaves no edge;
* two locks of one class held at once give the self-edge ``A -> A``: two sections of one array
  taken outside ``lock_many`` (reversed or colliding keys deadlock), two distributed locks of one
  key template, two ``threading.Lock`` of one site nested in both address orders (one order is
  canonical: ``record._nesting``). ``lock_many``'s ascending index order is canonical: no edge
  between the sections of one call (a ``lock_many`` nested in another is two calls);
* the graph is called on a chain-cache miss only (per worker: the wrappers keep the pairs
  already sent to the graph in a plain set in the worker's state, ``WorkerState.chain``).

Under the ``raise`` policy the caller asks :meth:`~LockOrderGraph.would_close_cycle` before
blocking, raises ``PotentialDeadlockError(cycle.format(), cycle.locks)`` when it answers a cycle,
and may then :meth:`~LockOrderGraph.add_edge` the refused edge so the manifest keeps the cycle;
``would_close_cycle`` still answers the cycle on every later attempt (it also considers an edge
already recorded), so the acquisition keeps being refused. A pair whose check answered a cycle
must not go into the chain cache.

Complexity and bounds
---------------------
``add_edge`` on an existing edge is one dict lookup; on a new edge (at most ``max_edges`` in a
graph's life), one BFS, O(classes + edges); ``would_close_cycle`` is one BFS. ``find_cycles`` is
O(E + V) plus one BFS per edge inside a cyclic component, up to ``max_cycles`` distinct cycles.

Memory is O(classes + edges) <= O(classes ** 2), and capped: past ``max_classes`` lock classes or
``max_edges`` edges, new ones are not recorded (an add that would exceed a cap returns ``None``),
``truncated`` becomes ``True`` and one warning per cap is logged on the ``otel_lockwatch`` logger,
naming the cap and its value. Witnesses keep one example per edge. There is at most one cycle per
recorded edge, and at most ``max_cycles`` are kept (a cycle is a tuple of up to ``max_classes``
names): past it, a new cycle is still returned by ``add_edge`` (the policy sees it), not kept.

Thread safety and self-observation
----------------------------------
Mutations and reads hold one lock made by ``_thread.RLock()``, never ``threading.RLock``: the
instrumentation patches that factory, and the graph must not observe itself. Nothing that can
take an instrumented lock runs while it is held: the cap warning is logged after it is released
(logging handlers hold ``threading.RLock`` locks). The lock is re-entrant because a signal
handler or a finalizer runs on a thread between any two bytecodes, inside this lock too: the
SIGTERM handler that writes the final manifest reads the graph, and with a plain lock it would
wait forever for the read it interrupted. A re-entrant *mutation* cannot happen: edges are added
only while the thread is marked as running lockwatch's own code, where the lock paths record
nothing; a re-entrant read sees the graph as it is (a read interrupted mid-mutation may see an
edge without its cycle, never a crash).

Open questions
--------------
* An incremental topological order (Pearce and Kelly, 2006) would make most inserts cheaper than
  a BFS; inserts happen on chain-cache misses only, so BFS has been enough so far. Johnson's
  enumeration of elementary cycles (1975) would show every cycle offline, at a cost exponential
  at worst; one shortest cycle per cyclic edge is shown instead.
"""

from __future__ import annotations

import _thread
import logging
from typing import Any

from ._cycles import shortest_path
from ._nesting import NestingOrders
from ._witness import Cycle, EdgeWitness, read_order_data

__all__ = ["OVERFLOW", "LockOrderGraph"]

#: Unrelated locks past a cap of names (key templates) share it: no node, no edge to or from it.
OVERFLOW = "(other)"

_logger = logging.getLogger("otel_lockwatch")


class LockOrderGraph:
    """The lock-order graph of one process: edges with their first witness, and the cycles.

    Thread-safe. See the module docstring for the algorithm and the rules its callers follow.

    Args:
        max_classes: the most lock classes recorded; later classes are dropped.
        max_edges: the most edges recorded; later edges are dropped.
        max_cycles: the most cycles kept for :meth:`cycles` and :meth:`to_json`; a later cycle
            is still returned by :meth:`add_edge` (so the policy sees it) but not kept.

    Raises:
        ValueError: a cap is not a positive integer.
    """

    __slots__ = (
        "nestings",
        "_cycle_keys",
        "_cycles",
        "_lock",
        "_max_classes",
        "_max_cycles",
        "_max_edges",
        "_nedges",
        "_pending",
        "_succ",
        "_truncated",
        "_version",
        "_warned",
        "_witnesses",
    )

    def __init__(
        self, max_classes: int = 4096, max_edges: int = 65536, max_cycles: int = 1024
    ) -> None:
        for name, value in (
            ("max_classes", max_classes),
            ("max_edges", max_edges),
            ("max_cycles", max_cycles),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self._max_classes = max_classes
        self._max_edges = max_edges
        self._max_cycles = max_cycles
        # Never threading.Lock: the instrumentation patches it and would watch the graph.
        self._lock = _thread.RLock()
        # holding -> {acquiring: witness}; a class appears as a key once it is on any edge.
        self._succ: dict[str, dict[str, EdgeWitness]] = {}
        self._witnesses: list[EdgeWitness] = []  # insertion order
        self._nedges = 0
        self._cycles: list[Cycle] = []
        self._cycle_keys: set[tuple[str, ...]] = set()
        self._truncated = False
        self._warned: set[str] = set()  # the caps already warned about, once each
        self.nestings = NestingOrders(max_classes)  # per process: never serialized
        # What a reader on this thread sees mid-update (a signal handler or a finalizer that
        # runs inside add_edge, or between to_json's copies): the edges being added, and a
        # count of completed additions. See to_json.
        self._pending: list[tuple[str, str]] = []
        self._version = 0

    # -- reading ---------------------------------------------------------------------------

    @property
    def max_classes(self) -> int:
        """The cap on lock classes."""
        return self._max_classes

    @property
    def max_edges(self) -> int:
        """The cap on edges."""
        return self._max_edges

    @property
    def max_cycles(self) -> int:
        """The cap on cycles kept."""
        return self._max_cycles

    @property
    def truncated(self) -> bool:
        """Whether a cap was reached and some class, edge or cycle was not recorded."""
        return self._truncated

    def witness(self, a: str, b: str) -> EdgeWitness | None:
        """Return the first witness of ``a -> b``, or ``None`` when the edge is not recorded."""
        with self._lock:
            succ = self._succ.get(a)
            return None if succ is None else succ.get(b)

    def edges(self) -> list[EdgeWitness]:
        """Return the witnesses of all recorded edges, in insertion order."""
        with self._lock:
            return list(self._witnesses)

    def cycles(self) -> list[Cycle]:
        """Return the reported cycles, in discovery order."""
        with self._lock:
            return list(self._cycles)

    def __len__(self) -> int:
        return self._nedges

    def __repr__(self) -> str:
        full = ", truncated" if self._truncated else ""
        return (
            f"<LockOrderGraph {len(self._succ)} classes, {self._nedges} edges, "
            f"{len(self._cycles)} cycles{full}>"
        )

    # -- the check -------------------------------------------------------------------------

    def _path(self, src: str, dst: str) -> list[EdgeWitness] | None:
        """Shortest path ``src ~> dst`` over the recorded edges, as witnesses; lock held."""
        succ = self._succ
        if src not in succ or dst not in succ:
            return None
        return shortest_path(lambda node: succ[node].items(), src, dst)

    def _closing(self, holding: str, acquiring: str, witness: EdgeWitness) -> Cycle | None:
        """The shortest cycle through ``holding -> acquiring`` (with ``witness``); lock held."""
        if holding == acquiring:
            return Cycle((holding,), (witness,))
        path = self._path(acquiring, holding)
        if path is None:
            return None
        return Cycle.from_edges([witness, *path])

    @staticmethod
    def _check_witness(holding: str, acquiring: str, witness: EdgeWitness) -> None:
        if witness.holding != holding or witness.acquiring != acquiring:
            raise ValueError(
                f"witness is for {witness.holding!r} -> {witness.acquiring!r}, "
                f"not {holding!r} -> {acquiring!r}"
            )

    def would_close_cycle(self, holding: str, acquiring: str, witness: EdgeWitness) -> Cycle | None:
        """Return the cycle that acquiring ``acquiring`` while holding ``holding`` would be on,
        without recording anything.

        The shortest cycle through ``holding -> acquiring``, over the recorded edges (the edge
        itself may already be one of them), with ``witness`` for this edge and the recorded
        witnesses for the others. Unlike :meth:`add_edge` it does not deduplicate: it answers
        every time, so the ``raise`` policy refuses every attempt.

        Args:
            holding: the lock class held.
            acquiring: the lock class about to be acquired (blocking).
            witness: describes this acquisition.

        Raises:
            ValueError: ``witness`` is for another pair.
        """
        self._check_witness(holding, acquiring, witness)
        if holding == OVERFLOW or acquiring == OVERFLOW:
            return None
        with self._lock:
            return self._closing(holding, acquiring, witness)

    # -- recording -------------------------------------------------------------------------

    def add_edge(self, holding: str, acquiring: str, witness: EdgeWitness) -> Cycle | None:
        """Record the order ``holding -> acquiring`` with its first witness.

        Args:
            holding: the lock class held.
            acquiring: the lock class acquired (blocking) while ``holding`` was held.
            witness: the example; kept only if the edge is new.

        Returns:
            The cycle the new edge closes (the shortest one, in canonical rotation), or ``None``:
            for an edge already recorded, an edge that closes no cycle, a cycle already reported,
            an edge to or from :data:`OVERFLOW`, or an edge dropped because ``max_classes`` or
            ``max_edges`` is reached. A cycle found past ``max_cycles`` is returned but not kept.

        Raises:
            ValueError: ``witness`` is for another pair.
        """
        if holding == OVERFLOW or acquiring == OVERFLOW:
            return None
        result = warning = None
        with self._lock:
            succ = self._succ.get(holding)
            if succ is not None and acquiring in succ:
                return None
            self._check_witness(holding, acquiring, witness)
            over = self._edge_cap(holding, acquiring)
            if over is not None:
                warning = self._reached(over)
            else:
                cycle = self._closing(holding, acquiring, witness)
                self._pending.append((holding, acquiring))
                try:
                    self._record(holding, acquiring, witness)
                    if cycle is not None and cycle.locks not in self._cycle_keys:
                        result = cycle
                        if len(self._cycles) < self._max_cycles:
                            self._cycle_keys.add(cycle.locks)
                            self._cycles.append(cycle)
                        else:
                            warning = self._reached("max_cycles")
                finally:
                    self._pending.pop()
                    self._version += 1
        if warning is not None:  # logged outside the graph lock: handlers take locks
            _logger.warning("%s", warning)
        return result

    def _edge_cap(self, holding: str, acquiring: str) -> str | None:
        """The cap a new edge would exceed, or ``None`` when it fits. Lock held."""
        new_classes = (holding not in self._succ) + (
            acquiring != holding and acquiring not in self._succ
        )
        if len(self._succ) + new_classes > self._max_classes:
            return "max_classes"
        if self._nedges >= self._max_edges:
            return "max_edges"
        return None

    def _reached(self, cap: str) -> str | None:
        """Mark the graph truncated; return the warning to log the first time ``cap`` is
        reached, ``None`` after. Lock held."""
        self._truncated = True
        if cap in self._warned:
            return None
        self._warned.add(cap)
        if cap == "max_cycles":
            return (
                f"lock-order graph reached max_cycles={self._max_cycles}; further cycles are "
                "still reported to the on-cycle policy but not kept"
            )
        value, what = (
            (self._max_classes, "lock classes")
            if cap == "max_classes"
            else (self._max_edges, "lock-order edges")
        )
        return (
            f"lock-order graph reached {cap}={value}; new {what} are not recorded "
            "and cycles through them are not reported"
        )

    def _record(self, holding: str, acquiring: str, witness: EdgeWitness) -> None:
        """Insert a new edge; lock held, caps checked."""
        self._succ.setdefault(holding, {})[acquiring] = witness
        self._succ.setdefault(acquiring, {})
        self._witnesses.append(witness)
        self._nedges += 1

    # -- serialization ---------------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        """Return ``{"edges": [witness dicts in insertion order], "cycles": [cycle dicts in
        discovery order]}``, the ``lock_order`` part of the recorder snapshot.

        The lock keeps other threads out, not this one: a signal handler or a finalizer may add
        an edge between any two bytecodes here, or this may run inside such an addition. So the
        edges and cycles are copied (each copy one C call) until no addition completed between
        the copies, and an edge still being added is left out with its cycles: every cycle's
        edges are among the edges, and the edges close a cycle only when one is reported.
        """
        with self._lock:
            for _ in range(100):
                version = self._version
                cycles = list(self._cycles)
                witnesses = list(self._witnesses)
                pending = set(self._pending)
                if version == self._version:
                    break
            if pending:
                witnesses = [w for w in witnesses if (w.holding, w.acquiring) not in pending]
                cycles = [
                    c
                    for c in cycles
                    if not any((e.holding, e.acquiring) in pending for e in c.edges)
                ]
            return {
                "edges": [w.to_json() for w in witnesses],
                "cycles": [c.to_json() for c in cycles],
            }

    @classmethod
    def from_json(
        cls, d: Any, max_classes: int = 4096, max_edges: int = 65536, max_cycles: int = 1024
    ) -> LockOrderGraph:
        """Rebuild a graph from :meth:`to_json`'s output: its edges in order, its cycles as
        reported (they are not reported again).

        Args:
            d: ``{"edges": [...], "cycles": [...]}``.
            max_classes: the cap on lock classes (edges beyond a cap are dropped, as live).
            max_edges: the cap on edges.
            max_cycles: the cap on cycles kept.

        Raises:
            ValueError: the data is malformed, an edge is repeated, or a cycle uses an edge that
                is not in ``edges``.
        """
        edges, cycles = read_order_data(d)
        graph = cls(max_classes=max_classes, max_edges=max_edges, max_cycles=max_cycles)
        warnings = []
        with graph._lock:
            for w in edges:
                if graph._has_edge_locked(w.holding, w.acquiring):
                    raise ValueError(f"edge {w.holding} -> {w.acquiring} is listed twice")
                over = graph._edge_cap(w.holding, w.acquiring)
                if over is None:
                    graph._record(w.holding, w.acquiring, w)
                else:
                    warnings.append(graph._reached(over))
            for c in cycles:
                for e in c.edges:
                    if not graph._has_edge_locked(e.holding, e.acquiring):
                        if graph._truncated:
                            break
                        raise ValueError(
                            f"cycle {' -> '.join(c.locks)} uses the edge {e.holding} -> "
                            f"{e.acquiring}, which is not among the edges"
                        )
                else:
                    if c.locks in graph._cycle_keys:
                        continue
                    if len(graph._cycles) < graph._max_cycles:
                        graph._cycle_keys.add(c.locks)
                        graph._cycles.append(c)
                    else:
                        warnings.append(graph._reached("max_cycles"))
        for warning in warnings:
            if warning is not None:
                _logger.warning("%s", warning)
        return graph

    def _has_edge_locked(self, a: str, b: str) -> bool:
        """Whether the order ``a -> b`` is recorded; the caller holds the graph's lock."""
        succ = self._succ.get(a)
        return succ is not None and b in succ
