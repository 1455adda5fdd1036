"""Offline lock-order cycles: the canonical cycles of an edge set, and the merge of several.

The live graph (``_order.LockOrderGraph``) reports a cycle when the edge that closes it arrives,
so what it reports depends on the order the edges came in. Offline, the cycles must be a
function of the edge *set* only, so that merging the lock-order data of several processes is
commutative and associative: :func:`find_cycles` runs Tarjan's strongly connected components,
then, for each edge inside a cyclic component in sorted order, a breadth-first search for the
shortest cycle through it (successors in sorted order). :func:`merge_order_data` takes the union
of the inputs' edges, keeps each edge's earliest witness, and recomputes the cycles from the
union. The design notes of the lock-order graph (``_order``'s module docstring) say why.

Public surface::

    find_cycles(edges, max_cycles=1024) -> list[Cycle]     # canonical, sorted
    merge_order_data(datas, max_cycles=1024) -> {"edges": [...], "cycles": [...]}
    EdgeUnion().add(data) ... .result(max_cycles)       # the same, one input at a time
    shortest_path(successors, src, dst) -> list[EdgeWitness] | None   # BFS, shared with _order
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ._witness import Cycle, EdgeWitness, read_order_data

__all__ = ["EdgeUnion", "find_cycles", "merge_order_data", "shortest_path"]

_logger = logging.getLogger("otel_lockwatch")


def shortest_path(
    successors: Callable[[str], Iterable[tuple[str, EdgeWitness]]], src: str, dst: str
) -> list[EdgeWitness] | None:
    """Breadth-first: the shortest path ``src ~> dst`` as its edges' witnesses, or None.

    Shared by the live graph's check (over all its edges) and the offline search (inside one
    strongly connected component): the path of fewest edges, the first found among equals in
    the order ``successors`` yields them.
    """
    parent: dict[str, EdgeWitness | None] = {src: None}
    queue = deque((src,))
    while queue:
        node = queue.popleft()
        for nxt, w in successors(node):
            if nxt in parent:
                continue
            parent[nxt] = w
            if nxt == dst:
                path = []
                cur: EdgeWitness | None = w
                while cur is not None:
                    path.append(cur)
                    cur = parent[cur.holding]
                path.reverse()
                return path
            queue.append(nxt)
    return None


def _cyclic_components(succ: dict[str, dict[str, EdgeWitness]]) -> dict[str, int]:
    """Map each class on a cycle to the id of its strongly connected component (Tarjan's
    algorithm, iterative). Classes on no cycle (a singleton without a self-edge) are absent."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    comp: dict[str, int] = {}
    ncomp = 0
    for root in sorted(succ):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(succ[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(succ[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    members = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.append(member)
                        if member == node:
                            break
                    if len(members) > 1 or node in succ[node]:
                        for member in members:
                            comp[member] = ncomp
                        ncomp += 1
    return comp


def find_cycles(edges: Iterable[EdgeWitness], max_cycles: int = 1024) -> list[Cycle]:
    """Find the cycles of an edge set canonically: the result depends on the set only.

    For each edge on a cycle, in sorted ``(holding, acquiring)`` order, the shortest cycle
    through it (ties broken by visiting successors in sorted order); deduplicated; sorted by
    ``(length, lock names)``. Every edge that lies on some cycle is on a returned one, unless
    ``max_cycles`` distinct cycles were found first (then a warning is logged).

    Args:
        edges: witnesses, one per edge (a repeated pair keeps its first witness).
        max_cycles: stop after this many distinct cycles.

    Raises:
        ValueError: ``max_cycles`` is not a positive integer.
    """
    if isinstance(max_cycles, bool) or not isinstance(max_cycles, int) or max_cycles < 1:
        raise ValueError(f"max_cycles must be a positive integer, got {max_cycles!r}")
    succ: dict[str, dict[str, EdgeWitness]] = {}
    for w in edges:
        succ.setdefault(w.holding, {}).setdefault(w.acquiring, w)
        succ.setdefault(w.acquiring, {})
    comp = _cyclic_components(succ)
    # Sorted successor lists inside each component, so the BFS tie-break is canonical.
    inner = {
        node: [(nxt, succ[node][nxt]) for nxt in sorted(succ[node]) if comp.get(nxt) == c]
        for node, c in comp.items()
    }
    found: dict[tuple[str, ...], Cycle] = {}
    for node in sorted(inner):
        for nxt, w in inner[node]:
            if len(found) >= max_cycles:
                _logger.warning(
                    "lock-order cycle search stopped at max_cycles=%d; some cyclic edges "
                    "are not shown in a cycle",
                    max_cycles,
                )
                return sorted(found.values(), key=_cycle_sort_key)
            if nxt == node:
                cycle = Cycle((node,), (w,))
            else:
                cycle = Cycle.from_edges([w, *_bfs_path(inner, nxt, node)])
            found.setdefault(cycle.locks, cycle)
    return sorted(found.values(), key=_cycle_sort_key)


def _bfs_path(
    inner: dict[str, list[tuple[str, EdgeWitness]]], src: str, dst: str
) -> list[EdgeWitness]:
    """Shortest path ``src ~> dst`` inside one strongly connected component (it exists)."""
    path = shortest_path(inner.__getitem__, src, dst)
    if path is None:
        raise AssertionError(f"no path {src} ~> {dst} inside a strongly connected component")
    return path


def _cycle_sort_key(c: Cycle) -> tuple[int, tuple[str, ...]]:
    return (len(c.locks), c.locks)


def _witness_sort_key(w: EdgeWitness) -> tuple[str, str]:
    """A total order on witnesses: earliest ``at`` first, then the canonical JSON."""
    return (w.at, json.dumps(w.to_json(), sort_keys=True))


class EdgeUnion:
    """The union of lock-order edges, folded one input at a time: each edge keeps its earliest
    witness (by ``at``, ties broken by the witness's canonical JSON), so the union depends on
    the set of inputs only. Its size is the number of distinct edges, whatever the number of
    inputs; :meth:`result` finds the cycles of the union."""

    __slots__ = ("_best",)

    def __init__(self) -> None:
        self._best: dict[tuple[str, str], EdgeWitness] = {}

    def add(self, data: Any) -> None:
        """Fold one ``{"edges": [...], "cycles": [...]}`` in (its cycles are checked for shape
        and then ignored).

        Raises:
            ValueError: the input is malformed.
        """
        edges, _ = read_order_data(data)
        best = self._best
        for w in edges:
            key = (w.holding, w.acquiring)
            old = best.get(key)
            if old is None or _witness_sort_key(w) < _witness_sort_key(old):
                best[key] = w

    def result(self, max_cycles: int = 1024) -> dict[str, Any]:
        """``{"edges": [...], "cycles": [...]}`` of the union (see :func:`merge_order_data`)."""
        merged = [self._best[key] for key in sorted(self._best)]
        return {
            "edges": [w.to_json() for w in merged],
            "cycles": [c.to_json() for c in find_cycles(merged, max_cycles=max_cycles)],
        }


def merge_order_data(datas: Iterable[Any], max_cycles: int = 1024) -> dict[str, Any]:
    """Merge the lock-order data of several processes (or runs) into one.

    The edges are the union; an edge seen in several inputs keeps its earliest witness (by
    ``at``, ties broken by the witness's canonical JSON). The cycles are recomputed from the
    union with :func:`find_cycles` (so ``A -> B`` from one process and ``B -> A`` from another
    make a cycle); the inputs' own cycles are checked for shape and then ignored. The result
    depends on the set of inputs only: merging is commutative and associative, and merging a
    result again changes nothing.

    Args:
        datas: ``{"edges": [...], "cycles": [...]}`` dicts (``LockOrderGraph.to_json()``, or
            the ``lock_order`` part of manifests, or earlier merges).
        max_cycles: passed to :func:`find_cycles`.

    Returns:
        ``{"edges": [...], "cycles": [...]}``, edges sorted by ``(holding, acquiring)``, cycles
        sorted by ``(length, lock names)``.

    Raises:
        ValueError: an input is malformed.
    """
    union = EdgeUnion()
    for d in datas:
        union.add(d)
    return union.result(max_cycles)
